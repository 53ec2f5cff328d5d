#pragma once

// How dispatchctl prints: JSON, aligned tables and key-value lists, numbers, rates and times, and
// the human views of a job, the workers and the daemon's stats. Everything prints to stdout.

#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "google/protobuf/message.h"
#include "google/protobuf/timestamp.pb.h"

#include "dispatchd/v1/admin_service.pb.h"
#include "dispatchd/v1/job.pb.h"

namespace dispatchd::client::ctl {

namespace v1 = ::dispatchd::v1;

// `m` as one line of JSON, with the proto field names and every field, set or not; "{}" if it
// cannot be printed.
std::string ToJson(const google::protobuf::Message& m);

// RFC3339 in UTC with milliseconds.
std::string FormatUtcTime(absl::Time t);
// RFC3339 in UTC with milliseconds; "-" when unset.
std::string FormatTimestamp(const google::protobuf::Timestamp& t);
// A job state without its JOB_STATE_ prefix (SUCCEEDED), or STATE_<n> for a state this build
// does not know.
std::string StateName(v1::JobState s);
// A number with at most `decimals` decimals and no trailing zeros: 2, 0.5, 1.25.
std::string FormatNumber(double v, int decimals = 2);
// A rate in dispatches per second as the config would spell it: "2/s", or "30/min" below 1/s.
std::string FormatRate(double per_second);
// A fraction as a whole percentage: 0.25 is "25%".
std::string FormatPercent(double fraction);
// A head-of-line wait reason for a table cell: "-" when nothing waits.
std::string WaitCell(const std::string& reason, int64_t queued);

// Prints rows as columns separated by two spaces, each as wide as its widest cell.
void PrintTable(const std::vector<std::vector<std::string>>& rows);
// Prints `key: value` lines, the values aligned.
void PrintKeyValues(const std::vector<std::pair<std::string, std::string>>& kvs);

// A job as `status` shows it: its state, attempts, worker and times; why a queued job waits, its
// place in line and its tenant's and key's shares; its error and its result, if that is short and
// printable.
void PrintJob(const v1::Job& job);
// A job's result bytes as they are, for `run`; on a terminal, with a newline if they lack one.
void PrintRunResult(const v1::Job& job);
// The connected workers as a table, for `workers`.
void PrintWorkers(const v1::ListWorkersResponse& r);
// The daemon's stats, for `stats`: tiers, types, models, tenants and keys, each a table, then the
// leader and the slots.
void PrintStats(const v1::StatsResponse& r);

// On a terminal, a last line that says how long the job has been in its state, rewritten every
// 250 ms below the lines of its state changes, and erased when the watch ends.
//
//   std::optional<ProgressLine> progress;
//   if (isatty(STDOUT_FILENO)) progress.emplace();
//   progress->Event(line, "RUNNING", since);
//
// Thread-safe: a thread of its own redraws the line while Event() prints from another.
class ProgressLine {
 public:
  ProgressLine();
  ~ProgressLine();
  ProgressLine(const ProgressLine&) = delete;
  ProgressLine& operator=(const ProgressLine&) = delete;

  // Prints `line` above the progress line, which then counts from `since`.
  void Event(const std::string& line, const std::string& state, absl::Time since)
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  void DrawLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::string state_ ABSL_GUARDED_BY(mu_);
  absl::Time since_ ABSL_GUARDED_BY(mu_);
  std::thread thread_;
};

}  // namespace dispatchd::client::ctl
