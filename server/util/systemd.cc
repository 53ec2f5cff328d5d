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
    : healthy_(std::move(healthy)),
      notify_(std::move(notify)),
      ticker_(period, [this] { Check(); }) {
  if (period > absl::ZeroDuration()) {
    Log("main")->info("watchdog: a keep-alive every {} while healthy",
                      absl::FormatDuration(period));
  }
}

void Watchdog::Check() {
  std::string why;
  const bool healthy = healthy_(&why);
  if (healthy) {
    notify_("WATCHDOG=1");
    if (!was_healthy_) Log("main")->info("watchdog: healthy again, keep-alives resume");
  } else if (was_healthy_) {
    Log("main")->warn("watchdog: not feeding the service manager's watchdog: {}", why);
  }
  was_healthy_ = healthy;
}

}  // namespace dispatchd::server
