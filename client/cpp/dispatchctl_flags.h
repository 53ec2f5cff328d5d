#pragma once

// The flags of dispatchctl's commands that need more than CLI11 checks: durations, the job spec of
// submit and run, and the rate limit of set-rate-limit.
//
//   SpecFlags flags;
//   flags.Register(app.add_subcommand("submit", "..."));
//   // after parsing:
//   absl::StatusOr<v1::JobSpec> spec = flags.Build();
//
// Plain values; not thread-safe.

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include <CLI/CLI.hpp>

#include "dispatchd/v1/job.pb.h"

namespace dispatchd::client::ctl {

namespace v1 = ::dispatchd::v1;

// A duration flag; INVALID_ARGUMENT naming the flag if it does not parse or is not positive.
absl::StatusOr<absl::Duration> ParseDurationFlag(absl::string_view flag, const std::string& text);

// Flags shared by submit and run.
struct SpecFlags {
  std::string type;
  std::optional<std::string> payload;
  std::string payload_file;
  std::string resource, fairness_key, idempotency_key;
  int max_attempts = 0;
  std::string job_timeout, dispatch_deadline, not_before;
  std::vector<std::string> labels;

  // Adds the flags to `cmd`, which fills this struct when it parses.
  void Register(CLI::App* cmd);
  // The job spec the flags give (the payload read from its file or stdin); INVALID_ARGUMENT
  // naming the flag that is wrong.
  absl::StatusOr<v1::JobSpec> Build() const;
};

// Flags of set-rate-limit.
struct RateLimitFlags {
  std::string model;
  std::optional<double> rpm, rps;
  std::optional<int> burst;
  bool clear = false;
};

}  // namespace dispatchd::client::ctl
