#pragma once

#include <functional>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "server/util/ticker.h"

namespace dispatchd::server {

// The service manager's side of a `Type=notify` unit (sd_notify(3)): readiness, status lines,
// stopping, and the watchdog. Outside systemd (no $NOTIFY_SOCKET) every call does nothing.
//
//   NotifySystemd("READY=1\nSTATUS=serving on 127.0.0.1:7411");
//   Watchdog dog(SystemdWatchdogPeriod(), [&](std::string* why) { return Healthy(why); });
//   ...
//   NotifySystemd("STOPPING=1");
void NotifySystemd(absl::string_view state);

// How often to feed the watchdog: half of $WATCHDOG_USEC (`WatchdogSec=` in the unit) when the
// service manager asks for keep-alives from this process, else zero.
absl::Duration SystemdWatchdogPeriod();

// Feeds a watchdog from a thread of its own: every `period` it asks `healthy`, and sends
// `WATCHDOG=1` only when the answer is yes. A daemon whose threads have stopped making progress
// therefore stops feeding, and the service manager kills and restarts it once `WatchdogSec`
// passes without a keep-alive. The first unhealthy answer of a run of them is logged with the
// reason `healthy` gives, and so is the recovery.
//
// With a zero `period` no thread starts. `notify` defaults to NotifySystemd (tests pass their
// own). Stop (or the destructor) joins the thread. Thread-safe.
class Watchdog {
 public:
  using Healthy = std::function<bool(std::string* why)>;
  using Notify = std::function<void(absl::string_view state)>;

  Watchdog(absl::Duration period, Healthy healthy, Notify notify = NotifySystemd);
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void Stop() { ticker_.Stop(); }

 private:
  void Check();

  Healthy healthy_;
  Notify notify_;
  bool was_healthy_ = true;  // confined to the ticker's thread
  Ticker ticker_;            // last: its thread uses the members above
};

}  // namespace dispatchd::server
