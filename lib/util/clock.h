#pragma once

#include "absl/time/time.h"

namespace dispatchd {

// Source of the current time. lib/ never reads the wall clock itself: long-lived components take
// a Clock&, pure functions take `now`. Named after absl::Clock so an abseil upgrade is an alias.
// Implementations are thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time TimeNow() = 0;
};

}  // namespace dispatchd
