#pragma once

// dispatchctl's exit codes, and how an error or a job's state maps onto them.
//
//   if (!r.ok()) return Fail(r.status());  // prints the error, returns its exit code
//   return ExitForState(job->state());
//
// Stateless; Fail() and Usage() write to stderr.

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "dispatchd/v1/job.pb.h"

namespace dispatchd::client::ctl {

namespace v1 = ::dispatchd::v1;

enum ExitCode : int {
  kOk = 0,
  kJobFailed = 1,
  kUsage = 2,
  kJobCancelledOrExpired = 3,
  kJobActive = 4,
  kNotFound = 5,
  kResourceExhausted = 6,
  kFailedPrecondition = 7,
  kRpcFailed = 8,
  kNotServing = 9,
};

inline constexpr char kExitCodes[] =
    "Exit codes:\n"
    "  0  ok (submit: queued; run/status/watch: the job SUCCEEDED; cancel: the job is now\n"
    "     CANCELLED; workers/stats/top/drain/set-rate-limit/set-weight/reload: ok; health:\n"
    "     SERVING)\n"
    "  1  the job FAILED\n"
    "  2  usage error, or INVALID_ARGUMENT from the daemon\n"
    "  3  the job was CANCELLED or EXPIRED\n"
    "  4  the job is still active (status; also run/watch/cancel when it has not ended)\n"
    "  5  NOT_FOUND (e.g. an unknown job id, or a model no configured type uses)\n"
    "  6  RESOURCE_EXHAUSTED: admission refused, try again later (the retry-after is printed)\n"
    "  7  FAILED_PRECONDITION (e.g. cancelling a job that already ended, a config file that\n"
    "     reload refused)\n"
    "  8  daemon unreachable, DEADLINE_EXCEEDED, or any other RPC failure\n"
    "  9  health: the daemon answers but is NOT_SERVING\n"
    "Errors are printed as `dispatchctl: <GRPC_CODE>: <message>` on stderr.";

// The exit code for a failed call (kOk for OK).
int ExitForStatus(const absl::Status& s);
// The exit code for a job in state `s`: kOk once it SUCCEEDED, kJobActive while it has not ended.
int ExitForState(v1::JobState s);
// Whether a job in state `s` has ended.
bool IsTerminal(v1::JobState s);
// Prints `dispatchctl: <GRPC_CODE>: <message>` (and the retry-after, if any) on stderr; returns
// ExitForStatus(s).
int Fail(const absl::Status& s);
// Prints a usage error on stderr; returns kUsage.
int Usage(absl::string_view message);

}  // namespace dispatchd::client::ctl
