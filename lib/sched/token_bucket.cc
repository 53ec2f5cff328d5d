#include "lib/sched/token_bucket.h"

#include <algorithm>
#include <cmath>

#include "lib/util/check.h"

namespace dispatchd::sched {
namespace {

absl::Duration IntervalOf(const config::RateLimit& limit) {
  DISPATCHD_CHECK(limit.per_second > 0 && limit.burst >= 1,
                  "token bucket needs a rate and a burst");
  // Rounded up to whole nanoseconds, so the bucket never runs faster than configured.
  return absl::Nanoseconds(std::ceil(1e9 / limit.per_second));
}

}  // namespace

TokenBucket::TokenBucket(config::RateLimit limit, absl::Time now)
    : limit_(limit),
      interval_(IntervalOf(limit)),
      tolerance_((limit.burst - 1) * interval_),
      tat_(now) {}

bool TokenBucket::TryTake(absl::Time now) {
  if (!Ready(now)) return false;
  tat_ = std::max(tat_, now) + interval_;
  return true;
}

bool TokenBucket::TryTake(absl::Time now, int64_t n) {
  if (n > limit_.burst) return false;
  const absl::Time start = std::max(tat_, now);
  // The n-th take conforms when the first would and n - 1 more intervals still fit.
  if (start + (n - 1) * interval_ - now > tolerance_) return false;
  tat_ = start + n * interval_;
  return true;
}

double TokenBucket::TokensAt(absl::Time now) const {
  // The bucket is full when tat <= now; each interval of `tat - now` is one token owed.
  absl::Duration owed = std::max(tat_ - now, absl::ZeroDuration());
  double tokens = limit_.burst - absl::FDivDuration(owed, interval_);
  return std::clamp(tokens, 0.0, static_cast<double>(limit_.burst));
}

void TokenBucket::Reconfigure(config::RateLimit limit, absl::Time now) {
  double tokens = std::min(TokensAt(now), static_cast<double>(limit.burst));
  limit_ = limit;
  interval_ = IntervalOf(limit);
  tolerance_ = (limit.burst - 1) * interval_;
  tat_ = now + (limit.burst - tokens) * interval_;
}

}  // namespace dispatchd::sched
