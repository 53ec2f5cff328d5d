#pragma once

#include <cstdint>

#include "absl/time/time.h"

#include "lib/config/config.h"

namespace dispatchd::sched {

// A token bucket (refill `per_second`, capacity `burst`) kept as the generic cell rate algorithm:
// one timestamp, the theoretical arrival time of the next conforming take. A take at `now` conforms
// when `tat - now <= (burst - 1) * interval`, and then moves `tat` one interval on. All arithmetic
// is in absl::Duration (integer quarter-nanoseconds), so no rounding drifts: over any window of
// length t, at most `burst + per_second * t` takes succeed, whatever the order of calls.
//
// Not thread-safe: the scheduler owns its buckets.
class TokenBucket {
 public:
  // A full bucket at `now`.
  TokenBucket(config::RateLimit limit, absl::Time now);

  // Takes one token if there is one.
  bool TryTake(absl::Time now);
  // Takes `n` tokens (n >= 1) if the bucket holds them all; none otherwise. A take of more
  // than `burst` never succeeds.
  bool TryTake(absl::Time now, int64_t n);
  // The earliest time TryTake(·, n) can succeed, for n <= burst.
  absl::Time NextTokensAt(int64_t n) const { return tat_ + (n - 1) * interval_ - tolerance_; }
  // True if TryTake(now) would succeed.
  bool Ready(absl::Time now) const { return tat_ - now <= tolerance_; }
  // The earliest time TryTake can succeed (`now` or earlier if it can now).
  absl::Time NextTokenAt() const { return tat_ - tolerance_; }
  // Whole and fractional tokens in the bucket at `now`, in [0, burst].
  double TokensAt(absl::Time now) const;
  // New rate and capacity from `now` on, keeping the tokens the bucket holds (capped at the new
  // capacity): a change never grants a fresh burst.
  void Reconfigure(config::RateLimit limit, absl::Time now);

  const config::RateLimit& limit() const { return limit_; }

 private:
  config::RateLimit limit_;
  absl::Duration interval_;   // 1 / per_second
  absl::Duration tolerance_;  // (burst - 1) * interval
  absl::Time tat_;
};

}  // namespace dispatchd::sched
