#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dispatchd::job {

// Where a job is in its life; mirrors dispatchd.v1.JobState. See IsLegalTransition for the graph.
enum class JobState {
  kQueued,
  kDispatched,
  kRunning,
  kSucceeded,
  kFailed,
  kCancelled,
  kExpired,
};

// "QUEUED", "RUNNING", ...: the spelling used in the database, logs and dispatchctl.
absl::string_view ToString(JobState state);
std::optional<JobState> ParseJobState(absl::string_view name);

// True for SUCCEEDED, FAILED, CANCELLED and EXPIRED: the row is the record of truth and never
// changes again.
bool IsTerminal(JobState state);

// True if the state machine allows `from` -> `to`.
bool IsLegalTransition(JobState from, JobState to);

using Labels = absl::flat_hash_map<std::string, std::string>;

// What a client asks to run, after defaults from the job type are applied.
struct JobSpec {
  std::string type;
  std::string payload;
  std::string resource_id;
  std::string fairness_key;
  std::string idempotency_key;
  int32_t max_attempts = 0;                       // 0: the type's default
  absl::Duration timeout = absl::ZeroDuration();  // zero: the type's default
  absl::Duration dispatch_deadline = absl::InfiniteDuration();
  absl::Time not_before = absl::InfinitePast();
  Labels labels;
};

// `spec` as the store keeps it, and reads it back: not_before and the dispatch deadline in whole
// microseconds, the timeout in whole milliseconds.
JobSpec AsStored(JobSpec spec);

// An attempt that ended without ending its job: a worker accepted it (or failed it before its
// accept was written), then it failed with attempts left, or its worker was lost, and the job
// went back to the queue.
struct EndedAttempt {
  int32_t attempt = 0;  // 1 for the first
  std::string worker_id;
  absl::Time dispatched_at = absl::InfinitePast();
  // The accept, or for a failure that came before it, the end less the run time the worker
  // reported; InfinitePast when neither is known.
  absl::Time started_at = absl::InfinitePast();
  absl::Time ended_at = absl::InfinitePast();
  std::string error;
};

// A job as recorded by the store.
struct Job {
  std::string id;
  // Arrival order in the store, assigned when the row is inserted (0: not stored yet). FIFO
  // within a queue follows it.
  int64_t seq = 0;
  JobSpec spec;
  // The principal that submitted it; empty when the daemon has no authentication. Only it (and
  // an admin) may read, watch or cancel the job, and its idempotency keys are its own.
  std::string owner;
  JobState state = JobState::kQueued;
  int32_t attempt = 0;  // attempts started (accepted by a worker)
  std::string worker_id;
  std::string result;
  std::string error;
  absl::Time created_at = absl::InfinitePast();
  absl::Time dispatched_at = absl::InfinitePast();
  absl::Time started_at = absl::InfinitePast();
  absl::Time finished_at = absl::InfinitePast();
  absl::Time updated_at = absl::InfinitePast();
  // Every attempt that ended without ending the job, oldest first (none for a job retried before
  // the store kept them). The attempt offered or running now, or the one the job ended with, is
  // the fields above: worker_id, dispatched_at, started_at, finished_at and error.
  std::vector<EndedAttempt> earlier_attempts;
};

}  // namespace dispatchd::job
