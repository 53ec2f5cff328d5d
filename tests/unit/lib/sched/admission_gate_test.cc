#include "lib/sched/admission_gate.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dispatchd::sched {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

config::Config Limits(int64_t max_active, int max_depth) {
  config::Config c;
  c.max_active = max_active;
  c.types.push_back({.name = "gen", .max_queue_depth = max_depth});
  c.types.push_back({.name = "other"});
  return c;
}

TEST(AdmissionGateTest, TenantMaxActiveRefusesOnlyThatTenantsPrincipals) {
  config::Config c = Limits(100, 100);
  c.tenants.push_back({.name = "t", .principals = {"alice", "carol"}, .max_active = 2});
  AdmissionGate gate(c);
  absl::Duration retry;
  ASSERT_TRUE(gate.TryAdmit("gen", "alice", &retry).ok());
  ASSERT_TRUE(gate.TryAdmit("other", "carol", &retry).ok());
  absl::Status third = gate.TryAdmit("gen", "alice", &retry);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()),
              StartsWith("tenants[t].max_active: 2 jobs active (limit 2)"));
  EXPECT_GT(retry, absl::ZeroDuration());
  // Another tenant, and the local caller, are not held back.
  EXPECT_TRUE(gate.TryAdmit("gen", "bob", &retry).ok());
  EXPECT_TRUE(gate.TryAdmit("gen", &retry).ok());
  // A reservation given back makes room; a counted one holds it until the dispatcher publishes.
  gate.Release("gen", "alice");
  ASSERT_TRUE(gate.TryAdmit("gen", "alice", &retry).ok());
  gate.Counted("gen", "alice");
  gate.Counted("other", "carol");
  EXPECT_FALSE(gate.TryAdmit("gen", "alice", &retry).ok());
  gate.PublishTenants({{"t", 1}});
  EXPECT_TRUE(gate.TryAdmit("gen", "alice", &retry).ok());
  // A standby's counts come per owner.
  gate.PublishOwners({{"alice", 1}, {"carol", 1}, {"bob", 50}});
  EXPECT_FALSE(gate.TryAdmit("gen", "carol", &retry).ok());  // 2 active + 1 reserved
  EXPECT_THAT(gate.LimitedTenants(), ::testing::ElementsAre("t"));
}

TEST(AdmissionGateTest, MaxQueueDepthRefusesOnlyThatType) {
  AdmissionGate gate(Limits(100, 2));
  absl::Duration retry;
  ASSERT_TRUE(gate.TryAdmit("gen", &retry).ok());
  ASSERT_TRUE(gate.TryAdmit("gen", &retry).ok());
  absl::Status third = gate.TryAdmit("gen", &retry);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()), StartsWith("max_queue_depth: type \"gen\" has 2 jobs queued"));
  EXPECT_TRUE(gate.TryAdmit("other", &retry).ok());
  // A reservation given back (nothing was written) frees its room.
  gate.Release("gen");
  EXPECT_TRUE(gate.TryAdmit("gen", &retry).ok());
}

TEST(AdmissionGateTest, CountedJobsHoldRoomUntilTheDispatcherReportsThemGone) {
  AdmissionGate gate(Limits(2, 100));
  absl::Duration retry;
  ASSERT_TRUE(gate.TryAdmit("gen", &retry).ok());
  gate.Counted("gen");
  ASSERT_TRUE(gate.TryAdmit("gen", &retry).ok());
  gate.Counted("gen");
  EXPECT_EQ(gate.TryAdmit("other", &retry).code(), absl::StatusCode::kResourceExhausted);
  // The dispatcher finished one of them.
  gate.Publish(1, {{"gen", 1}});
  EXPECT_TRUE(gate.TryAdmit("other", &retry).ok());
}

TEST(AdmissionGateTest, RetryHintFollowsTheDrainRate) {
  AdmissionGate gate(Limits(10, 100));
  gate.Publish(10, {{"gen", 10}});
  absl::Duration retry;
  absl::Status refused = gate.TryAdmit("gen", &retry);
  EXPECT_THAT(std::string(refused.message()), StartsWith("max_active: 10 jobs active (limit 10)"));
  EXPECT_EQ(retry, absl::Seconds(1));  // no drain observed yet
  // 20 jobs a second for 10 s: one job above the ceiling clears in about 50 ms (floored at 100).
  for (int s = 0; s <= 10; ++s) gate.Drained(20, kT0 + absl::Seconds(s));
  EXPECT_EQ(gate.RetryAfter(1), absl::Milliseconds(100));
  EXPECT_GT(gate.RetryAfter(40), absl::Milliseconds(1500));
  EXPECT_LT(gate.RetryAfter(40), absl::Milliseconds(3000));
  EXPECT_EQ(gate.RetryAfter(1'000'000), absl::Seconds(60));
}

TEST(AdmissionGateTest, ConcurrentAdmitsNeverOvershoot) {
  AdmissionGate gate(Limits(50, 1000));
  std::atomic<int> admitted = 0;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      absl::Duration retry;
      for (int i = 0; i < 100; ++i) admitted += gate.TryAdmit("gen", &retry).ok();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(admitted, 50);
}

}  // namespace
}  // namespace dispatchd::sched
