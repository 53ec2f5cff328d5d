#include "lib/job/job.h"

namespace dispatchd::job {

absl::string_view ToString(JobState state) {
  switch (state) {
    case JobState::kQueued:
      return "QUEUED";
    case JobState::kDispatched:
      return "DISPATCHED";
    case JobState::kRunning:
      return "RUNNING";
    case JobState::kSucceeded:
      return "SUCCEEDED";
    case JobState::kFailed:
      return "FAILED";
    case JobState::kCancelled:
      return "CANCELLED";
    case JobState::kExpired:
      return "EXPIRED";
  }
  return "UNKNOWN";
}

std::optional<JobState> ParseJobState(absl::string_view name) {
  for (JobState s :
       {JobState::kQueued, JobState::kDispatched, JobState::kRunning, JobState::kSucceeded,
        JobState::kFailed, JobState::kCancelled, JobState::kExpired}) {
    if (ToString(s) == name) return s;
  }
  return std::nullopt;
}

bool IsTerminal(JobState state) {
  return state == JobState::kSucceeded || state == JobState::kFailed ||
         state == JobState::kCancelled || state == JobState::kExpired;
}

bool IsLegalTransition(JobState from, JobState to) {
  using S = JobState;
  switch (from) {
    case S::kQueued:
      return to == S::kDispatched || to == S::kCancelled || to == S::kExpired;
    case S::kDispatched:
      // RUNNING on accept; QUEUED when refused or the worker left before accepting; a worker that
      // reports a result before its accept was recorded finishes the job directly.
      return to == S::kRunning || to == S::kQueued || to == S::kCancelled || to == S::kSucceeded ||
             to == S::kFailed;
    case S::kRunning:
      return to == S::kSucceeded || to == S::kFailed || to == S::kCancelled || to == S::kQueued;
    case S::kSucceeded:
    case S::kFailed:
    case S::kCancelled:
    case S::kExpired:
      return false;
  }
  return false;
}

JobSpec AsStored(JobSpec spec) {
  if (spec.not_before != absl::InfinitePast()) {
    spec.not_before = absl::FromUnixMicros(absl::ToUnixMicros(spec.not_before));
  }
  if (spec.dispatch_deadline != absl::InfiniteDuration()) {
    spec.dispatch_deadline = absl::Trunc(spec.dispatch_deadline, absl::Microseconds(1));
  }
  spec.timeout = absl::Trunc(spec.timeout, absl::Milliseconds(1));
  return spec;
}

}  // namespace dispatchd::job
