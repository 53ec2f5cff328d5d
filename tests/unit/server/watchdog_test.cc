// server::Watchdog and SystemdWatchdogPeriod: keep-alives only while healthy, none without a
// period, and the period read from the environment as systemd sets it.
#include <atomic>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include <stdlib.h>
#include <unistd.h>

#include "server/util/systemd.h"

namespace dispatchd::server {
namespace {

// Keep-alives and health checks seen, and whether the next check answers healthy.
struct Probe {
  std::atomic<int> checks{0};
  std::atomic<int> keepalives{0};
  std::atomic<bool> healthy{true};
  std::atomic<bool> other_state{false};

  Watchdog::Healthy HealthFn() {
    return [this](std::string* why) {
      ++checks;
      if (!healthy) *why = "stuck for the test";
      return healthy.load();
    };
  }
  Watchdog::Notify NotifyFn() {
    return [this](absl::string_view state) {
      if (state == "WATCHDOG=1") {
        ++keepalives;
      } else {
        other_state = true;
      }
    };
  }
};

// Polls `done` every millisecond for up to 10 s.
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

TEST(WatchdogTest, FeedsEveryPeriodWhileHealthy) {
  Probe p;
  Watchdog dog(absl::Milliseconds(5), p.HealthFn(), p.NotifyFn());
  ASSERT_TRUE(Eventually([&] { return p.keepalives >= 5; }));
  dog.Stop();
  EXPECT_EQ(p.keepalives.load(), p.checks.load()) << "one keep-alive per healthy check";
  EXPECT_FALSE(p.other_state) << "the watchdog sends nothing but WATCHDOG=1";
}

TEST(WatchdogTest, StopsFeedingWhileUnhealthyAndResumes) {
  Probe p;
  p.healthy = false;
  Watchdog dog(absl::Milliseconds(5), p.HealthFn(), p.NotifyFn());
  ASSERT_TRUE(Eventually([&] { return p.checks >= 5; }));
  EXPECT_EQ(p.keepalives.load(), 0) << "no keep-alive while unhealthy";
  p.healthy = true;
  ASSERT_TRUE(Eventually([&] { return p.keepalives >= 3; }));
}

TEST(WatchdogTest, StopEndsTheKeepAlives) {
  Probe p;
  Watchdog dog(absl::Milliseconds(5), p.HealthFn(), p.NotifyFn());
  ASSERT_TRUE(Eventually([&] { return p.keepalives >= 1; }));
  dog.Stop();
  const int after_stop = p.keepalives;
  absl::SleepFor(absl::Milliseconds(50));
  EXPECT_EQ(p.keepalives.load(), after_stop);
  dog.Stop();  // idempotent
}

TEST(WatchdogTest, ZeroPeriodStartsNothing) {
  Probe p;
  {
    Watchdog dog(absl::ZeroDuration(), p.HealthFn(), p.NotifyFn());
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(p.checks.load(), 0);
  EXPECT_EQ(p.keepalives.load(), 0);
}

// Sets or unsets an environment variable for the life of the object.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = getenv(name)) old_ = old, had_ = true;
    if (value == nullptr) {
      unsetenv(name);
    } else {
      setenv(name, value, 1);
    }
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, old_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::string old_;
  bool had_ = false;
};

TEST(SystemdWatchdogPeriodTest, HalfOfWatchdogUsec) {
  ScopedEnv usec("WATCHDOG_USEC", "30000000");
  ScopedEnv pid("WATCHDOG_PID", std::to_string(getpid()).c_str());
  EXPECT_EQ(SystemdWatchdogPeriod(), absl::Seconds(15));
}

TEST(SystemdWatchdogPeriodTest, ZeroWithoutWatchdogUsec) {
  ScopedEnv usec("WATCHDOG_USEC", nullptr);
  ScopedEnv pid("WATCHDOG_PID", nullptr);
  EXPECT_EQ(SystemdWatchdogPeriod(), absl::ZeroDuration());
}

TEST(SystemdWatchdogPeriodTest, ZeroWhenMeantForAnotherProcess) {
  ScopedEnv usec("WATCHDOG_USEC", "30000000");
  ScopedEnv pid("WATCHDOG_PID", std::to_string(getpid() + 1).c_str());
  EXPECT_EQ(SystemdWatchdogPeriod(), absl::ZeroDuration());
}

}  // namespace
}  // namespace dispatchd::server
