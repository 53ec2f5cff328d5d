#pragma once

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "lib/config/config.h"
#include "lib/job/job.h"

namespace dispatchd::sched {

// Validates a client's job spec against the configuration and fills in the type's defaults
// (max_attempts, timeout). Errors are InvalidArgument naming the field, e.g.
// `spec.type: unknown job type "gold" (configured: echo, embed)`. Pure; thread-compatible.
absl::StatusOr<job::JobSpec> ResolveSpec(const config::Config& config, job::JobSpec spec);

// Delay before the retry that follows `attempt` failed attempts: retry_backoff doubled per
// attempt, capped at max_backoff.
absl::Duration RetryBackoff(const config::JobTypeConfig& type, int attempt);

// The delay actually used: uniform in [RetryBackoff/2, RetryBackoff] ("equal jitter"), drawn
// from a hash of (job_id, attempt), so that jobs failed together by one fault do not come back
// in lockstep, while the same job and attempt always get the same delay.
absl::Duration RetryBackoff(const config::JobTypeConfig& type, int attempt,
                            absl::string_view job_id);

}  // namespace dispatchd::sched
