#include "server/util/ticker.h"

#include <utility>

#include "server/util/thread_name.h"

namespace dispatchd::server {

Ticker::Ticker(absl::Duration period, std::function<void()> tick)
    : period_(period), tick_(std::move(tick)) {
  if (period_ <= absl::ZeroDuration()) return;
  thread_ = std::thread([this] {
    SetThreadName("ticker");
    while (true) {
      tick_();
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) return;
    }
  });
}

Ticker::~Ticker() { Stop(); }

void Ticker::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

}  // namespace dispatchd::server
