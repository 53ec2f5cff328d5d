#pragma once

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/util/clock.h"

namespace dispatchd::testing {

// A Clock that moves only when told. Thread-safe.
//   FakeClock clock{absl::FromUnixSeconds(1'700'000'000)}; clock.Advance(absl::Seconds(5));
class FakeClock final : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::FromUnixSeconds(1'700'000'000)) : now_(start) {}

  absl::Time TimeNow() override {
    absl::MutexLock l(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock l(&mu_);
    now_ += d;
  }

 private:
  absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dispatchd::testing
