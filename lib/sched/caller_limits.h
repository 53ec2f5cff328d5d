#pragma once

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/config/config.h"
#include "lib/sched/token_bucket.h"

namespace dispatchd::sched {

// What one principal may hold open and how fast it may submit (`limits.*`): counts of open
// worker streams and Watch subscriptions, and a token bucket of submitted jobs, per principal
// name. The limits are passed on each call, so a reload applies to the next one. Principals come
// from the configuration (a tokens file, certificate entries) or are the one local principal, so
// the maps stay small. Thread-safe.
class CallerLimits {
 public:
  enum class Stream { kWorker, kWatch };

  // Counts one more open stream of `kind` for `principal`: RESOURCE_EXHAUSTED naming the limit
  // when it already holds `limit`. Each OK is matched by one Close.
  absl::Status Open(Stream kind, absl::string_view principal, int limit) ABSL_LOCKS_EXCLUDED(mu_);
  void Close(Stream kind, absl::string_view principal) ABSL_LOCKS_EXCLUDED(mu_);
  // Streams of `kind` that `principal` holds open.
  int OpenCount(Stream kind, absl::string_view principal) const ABSL_LOCKS_EXCLUDED(mu_);

  // Takes `jobs` tokens from `principal`'s submit bucket (`rate`; none when not limited), all or
  // none. RESOURCE_EXHAUSTED naming limits.submit_rate when the bucket is short, with the wait
  // until it holds them in `*retry_after`; INVALID_ARGUMENT when `jobs` exceeds the burst, which
  // no wait would cure.
  absl::Status TakeSubmits(absl::string_view principal, int64_t jobs, const config::RateLimit& rate,
                           absl::Time now, absl::Duration* retry_after) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  using Counts = absl::flat_hash_map<std::string, int>;
  Counts& CountsOf(Stream kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return kind == Stream::kWorker ? workers_ : watches_;
  }

  mutable absl::Mutex mu_;
  Counts workers_ ABSL_GUARDED_BY(mu_);
  Counts watches_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, TokenBucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dispatchd::sched
