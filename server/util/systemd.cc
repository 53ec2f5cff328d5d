#include "server/util/systemd.h"

#include <cstdint>
#include <string>

#include <systemd/sd-daemon.h>

#include "server/util/log.h"

namespace dispatchd::server {

void NotifySystemd(absl::string_view state) {
  // sd_notify returns 0 when $NOTIFY_SOCKET is unset (not run by a service manager) and a
  // negative errno when the message cannot be sent; neither stops the daemon.
  const std::string message(state);
  if (int rc = sd_notify(0, message.c_str()); rc < 0) {
    Log("main")->warn("cannot notify the service manager ({}): error {}", message, -rc);
  }
}

absl::Duration SystemdWatchdogPeriod() {
  uint64_t usec = 0;
  // > 0 only when $WATCHDOG_USEC is set and $WATCHDOG_PID, if set, names this process.
  if (sd_watchdog_enabled(0, &usec) <= 0 || usec == 0) return absl::ZeroDuration();
  return absl::Microseconds(static_cast<int64_t>(usec)) / 2;
}

Watchdog::Watchdog(absl::Duration period, Healthy healthy, Notify notify)
    : period_(period), healthy_(std::move(healthy)), notify_(std::move(notify)) {
  if (period_ > absl::ZeroDuration()) {
    Log("main")->info("watchdog: a keep-alive every {} while healthy",
                      absl::FormatDuration(period_));
    thread_ = std::thread([this] { Run(); });
  }
}

Watchdog::~Watchdog() { Stop(); }

void Watchdog::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Run() {
  bool was_healthy = true;
  while (true) {
    std::string why;
    const bool healthy = healthy_(&why);
    if (healthy) {
      notify_("WATCHDOG=1");
      if (!was_healthy) Log("main")->info("watchdog: healthy again, keep-alives resume");
    } else if (was_healthy) {
      Log("main")->warn("watchdog: not feeding the service manager's watchdog: {}", why);
    }
    was_healthy = healthy;
    absl::MutexLock l(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period_)) return;
  }
}

}  // namespace dispatchd::server
