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

// A written reservation, dropped: the dispatcher holds its job.
void Count(absl::StatusOr<Reservation> r) {
  ASSERT_TRUE(r.ok()) << r.status();
  r->Written();
}

TEST(AdmissionGateTest, AClosedGateRefusesEveryoneUnavailableAndKeepsWhatItHeld) {
  AdmissionGate gate(Limits(100, 100));
  absl::Duration retry;
  absl::StatusOr<Reservation> before = gate.TryAdmit("gen", "alice", &retry);
  ASSERT_TRUE(before.ok());
  gate.Close("stopping: the daemon is stopping");
  for (const char* owner : {"alice", ""}) {
    absl::StatusOr<Reservation> after = gate.TryAdmit("other", owner, &retry);
    EXPECT_EQ(after.status().code(), absl::StatusCode::kUnavailable) << owner;
    EXPECT_EQ(after.status().message(), "stopping: the daemon is stopping");
  }
  // A reservation taken before the close is still good: its job is written and counted.
  before->Written();
}

TEST(AdmissionGateTest, TenantMaxActiveRefusesOnlyThatTenantsPrincipals) {
  config::Config c = Limits(100, 100);
  c.tenants.push_back({.name = "t", .principals = {"alice", "carol"}, .max_active = 2});
  AdmissionGate gate(c);
  absl::Duration retry;
  absl::StatusOr<Reservation> first = gate.TryAdmit("gen", "alice", &retry);
  absl::StatusOr<Reservation> second = gate.TryAdmit("other", "carol", &retry);
  ASSERT_TRUE(first.ok() && second.ok());
  absl::StatusOr<Reservation> third = gate.TryAdmit("gen", "alice", &retry);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              StartsWith("tenants[t].max_active: 2 jobs active (limit 2)"));
  EXPECT_GT(retry, absl::ZeroDuration());
  // Another tenant, and the local caller, are not held back.
  EXPECT_TRUE(gate.TryAdmit("gen", "bob", &retry).ok());
  EXPECT_TRUE(gate.TryAdmit("gen", &retry).ok());
  // A reservation given back makes room; a counted one holds it until the dispatcher publishes.
  *first = Reservation();
  Count(gate.TryAdmit("gen", "alice", &retry));
  second->Written();
  *second = Reservation();
  EXPECT_FALSE(gate.TryAdmit("gen", "alice", &retry).ok());
  gate.PublishTenants({{"t", 1}});
  absl::StatusOr<Reservation> held = gate.TryAdmit("gen", "alice", &retry);
  EXPECT_TRUE(held.ok());
  // A standby's counts come per owner.
  gate.PublishOwners({{"alice", 1}, {"carol", 1}, {"bob", 50}});
  EXPECT_FALSE(gate.TryAdmit("gen", "carol", &retry).ok());  // 2 active + 1 reserved
  EXPECT_THAT(gate.LimitedTenants(), ::testing::ElementsAre("t"));
}

TEST(AdmissionGateTest, MaxQueueDepthRefusesOnlyThatType) {
  AdmissionGate gate(Limits(100, 2));
  absl::Duration retry;
  absl::StatusOr<Reservation> first = gate.TryAdmit("gen", &retry);
  absl::StatusOr<Reservation> second = gate.TryAdmit("gen", &retry);
  ASSERT_TRUE(first.ok() && second.ok());
  absl::StatusOr<Reservation> third = gate.TryAdmit("gen", &retry);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.status().message()),
              StartsWith("max_queue_depth: type \"gen\" has 2 jobs queued"));
  EXPECT_TRUE(gate.TryAdmit("other", &retry).ok());
  // A reservation that goes out of scope unwritten (nothing was written) frees its room.
  { Reservation gone = *std::move(first); }
  absl::StatusOr<Reservation> again = gate.TryAdmit("gen", &retry);
  EXPECT_TRUE(again.ok());
  // Moving a reservation moves its room, and settles it once.
  Reservation moved = *std::move(second);
  Reservation twice = std::move(moved);
  EXPECT_FALSE(moved.holds());
  EXPECT_TRUE(twice.holds());
  EXPECT_FALSE(gate.TryAdmit("gen", &retry).ok());
}

TEST(AdmissionGateTest, CountedJobsHoldRoomUntilTheDispatcherReportsThemGone) {
  AdmissionGate gate(Limits(2, 100));
  absl::Duration retry;
  Count(gate.TryAdmit("gen", &retry));
  Count(gate.TryAdmit("gen", &retry));
  EXPECT_EQ(gate.TryAdmit("other", &retry).status().code(), absl::StatusCode::kResourceExhausted);
  // The dispatcher finished one of them.
  gate.Publish(1, {{"gen", 1}});
  EXPECT_TRUE(gate.TryAdmit("other", &retry).ok());
}

TEST(AdmissionGateTest, RetryHintFollowsTheDrainRate) {
  AdmissionGate gate(Limits(10, 100));
  gate.Publish(10, {{"gen", 10}});
  absl::Duration retry;
  absl::Status refused = gate.TryAdmit("gen", &retry).status();
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
  std::vector<std::vector<Reservation>> held(8);  // each thread keeps what it got
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      absl::Duration retry;
      for (int i = 0; i < 100; ++i) {
        absl::StatusOr<Reservation> r = gate.TryAdmit("gen", &retry);
        if (!r.ok()) continue;
        ++admitted;
        held[t].push_back(*std::move(r));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(admitted, 50);
}

}  // namespace
}  // namespace dispatchd::sched
