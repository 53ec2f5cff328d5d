#include "client/cpp/dispatchctl_exit.h"

#include <iostream>
#include <optional>

#include "absl/time/time.h"

#include "client/cpp/dispatch_client.h"

namespace dispatchd::client::ctl {

int ExitForStatus(const absl::Status& s) {
  switch (s.code()) {
    case absl::StatusCode::kOk:
      return kOk;
    case absl::StatusCode::kInvalidArgument:
      return kUsage;
    case absl::StatusCode::kNotFound:
      return kNotFound;
    case absl::StatusCode::kResourceExhausted:
      return kResourceExhausted;
    case absl::StatusCode::kFailedPrecondition:
      return kFailedPrecondition;
    default:
      return kRpcFailed;
  }
}

int ExitForState(v1::JobState s) {
  switch (s) {
    case v1::JOB_STATE_SUCCEEDED:
      return kOk;
    case v1::JOB_STATE_FAILED:
      return kJobFailed;
    case v1::JOB_STATE_CANCELLED:
    case v1::JOB_STATE_EXPIRED:
      return kJobCancelledOrExpired;
    default:
      return kJobActive;
  }
}

bool IsTerminal(v1::JobState s) {
  return s == v1::JOB_STATE_SUCCEEDED || s == v1::JOB_STATE_FAILED ||
         s == v1::JOB_STATE_CANCELLED || s == v1::JOB_STATE_EXPIRED;
}

int Fail(const absl::Status& s) {
  std::cerr << "dispatchctl: " << absl::StatusCodeToString(s.code()) << ": " << s.message() << "\n";
  if (std::optional<absl::Duration> after = RetryAfter(s); after.has_value()) {
    std::cerr << "dispatchctl: retry after " << absl::FormatDuration(*after) << "\n";
  }
  return ExitForStatus(s);
}

int Usage(absl::string_view message) {
  std::cerr << "dispatchctl: " << message << "\nRun with --help for more information.\n";
  return kUsage;
}

}  // namespace dispatchd::client::ctl
