#include "lib/sched/memory_throttle.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

constexpr int64_t kGiB = int64_t{1} << 30;

MemoryUse Ram(int percent) {
  return {.ram_used_bytes = percent * kGiB, .ram_total_bytes = 100 * kGiB};
}

MemoryUse Gpu(int percent) {
  return {.gpus = {{.used_bytes = 10 * kGiB, .total_bytes = 100 * kGiB},
                   {.used_bytes = percent * kGiB, .total_bytes = 100 * kGiB}}};
}

// The defaults from the in-process queue's design: RAM 90/80, GPU 85/75.
const config::MemoryThrottleConfig kLimits;

TEST(MemoryThrottleTest, RamThrottlesAtThresholdAndResumesOnlyBelowResume) {
  std::string why;
  EXPECT_FALSE(NextThrottleState(false, Ram(89), kLimits, nullptr));
  EXPECT_TRUE(NextThrottleState(false, Ram(90), kLimits, &why));
  EXPECT_THAT(why, HasSubstr("RAM at 90.0% (throttle 90%, resume 80%)"));
  EXPECT_TRUE(NextThrottleState(true, Ram(85), kLimits, nullptr));  // between: stays
  EXPECT_TRUE(NextThrottleState(true, Ram(80), kLimits, nullptr));
  EXPECT_FALSE(NextThrottleState(true, Ram(79), kLimits, nullptr));   // below resume
  EXPECT_FALSE(NextThrottleState(false, Ram(85), kLimits, nullptr));  // between: stays off
}

TEST(MemoryThrottleTest, AnyGpuOverItsThresholdThrottles) {
  EXPECT_FALSE(NextThrottleState(false, Gpu(84), kLimits, nullptr));
  EXPECT_TRUE(NextThrottleState(false, Gpu(85), kLimits, nullptr));
  EXPECT_TRUE(NextThrottleState(true, Gpu(76), kLimits, nullptr));
  EXPECT_FALSE(NextThrottleState(true, Gpu(74), kLimits, nullptr));
}

TEST(MemoryThrottleTest, GpuMemoryTheWorkerHoldsItselfDoesNotThrottle) {
  // A server that preallocates 90% of the GPU for itself, as vLLM does.
  MemoryUse own = {
      .gpus = {{.used_bytes = 92 * kGiB, .total_bytes = 100 * kGiB, .worker_bytes = 90 * kGiB}}};
  EXPECT_FALSE(NextThrottleState(false, own, kLimits, nullptr));
  // A throttled worker is released once only its own memory is left.
  EXPECT_FALSE(NextThrottleState(true, own, kLimits, nullptr));
  // Another process's 85% throttles it, its own share aside.
  MemoryUse others = {
      .gpus = {{.used_bytes = 95 * kGiB, .total_bytes = 100 * kGiB, .worker_bytes = 10 * kGiB}}};
  std::string why;
  EXPECT_TRUE(NextThrottleState(false, others, kLimits, &why));
  EXPECT_THAT(why, HasSubstr("GPU memory at 85.0%"));
  // Without the worker's share, all the memory in use counts.
  MemoryUse unknown = {.gpus = {{.used_bytes = 92 * kGiB, .total_bytes = 100 * kGiB}}};
  EXPECT_TRUE(NextThrottleState(false, unknown, kLimits, nullptr));
}

TEST(MemoryThrottleTest, NothingReportedNeverThrottles) {
  EXPECT_FALSE(NextThrottleState(false, MemoryUse{}, kLimits, nullptr));
  EXPECT_FALSE(NextThrottleState(true, MemoryUse{}, kLimits, nullptr));
}

TEST(MemoryThrottleTest, ThrottledWorkerGetsNoJobsAndJobsSaySo) {
  config::Config c;
  c.types.push_back({.name = "gen"});
  const absl::Time now = absl::FromUnixSeconds(1'700'000'000);
  Scheduler s(c, now);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 2});
  s.SetThrottled("w", true);
  s.Enqueue({.id = "j", .type = "gen", .arrival = now});
  EXPECT_THAT(s.Decide(now), IsEmpty());
  EXPECT_EQ(s.WhyWaiting("j", now).reason, WaitReason::kMemory);
  EXPECT_TRUE(s.Workers()[0].throttled);
  s.SetThrottled("w", false);
  EXPECT_THAT(s.Decide(now), SizeIs(1));
}

}  // namespace
}  // namespace dispatchd::sched
