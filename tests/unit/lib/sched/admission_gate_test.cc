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
