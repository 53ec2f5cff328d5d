#include "lib/sched/token_bucket.h"

#include <cstdio>
#include <vector>

#include "gtest/gtest.h"

#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

config::RateLimit Rpm(double rpm, int burst) { return {.per_second = rpm / 60, .burst = burst}; }

TEST(TokenBucketTest, StartsFullThenSpacesTakesByTheInterval) {
  TokenBucket b(Rpm(20, 5), kStart);
  for (int i = 0; i < 5; ++i) EXPECT_TRUE(b.TryTake(kStart)) << i;
  EXPECT_FALSE(b.TryTake(kStart));
  EXPECT_EQ(b.NextTokenAt(), kStart + absl::Seconds(3));
  EXPECT_FALSE(b.TryTake(kStart + absl::Seconds(3) - absl::Nanoseconds(1)));
  EXPECT_TRUE(b.TryTake(kStart + absl::Seconds(3)));
  EXPECT_FALSE(b.TryTake(kStart + absl::Seconds(3)));
}

TEST(TokenBucketTest, TakesSeveralTokensAllOrNone) {
  TokenBucket b({.per_second = 10, .burst = 5}, kStart);
  EXPECT_FALSE(b.TryTake(kStart, 6));  // more than the bucket can ever hold
  EXPECT_TRUE(b.TryTake(kStart, 4));
  EXPECT_FALSE(b.TryTake(kStart, 2));  // one left: none taken
  EXPECT_EQ(b.NextTokensAt(2), kStart + absl::Milliseconds(100));
  EXPECT_TRUE(b.TryTake(kStart + absl::Milliseconds(100), 2));
  EXPECT_DOUBLE_EQ(b.TokensAt(kStart + absl::Milliseconds(100)), 0);
  EXPECT_TRUE(b.TryTake(kStart + absl::Seconds(10), 5));
}

TEST(TokenBucketTest, RefillStopsAtBurst) {
  TokenBucket b(Rpm(60, 2), kStart);
  ASSERT_TRUE(b.TryTake(kStart));
  ASSERT_TRUE(b.TryTake(kStart));
  absl::Time later = kStart + absl::Hours(1);
  EXPECT_DOUBLE_EQ(b.TokensAt(later), 2);
  EXPECT_TRUE(b.TryTake(later));
  EXPECT_TRUE(b.TryTake(later));
  EXPECT_FALSE(b.TryTake(later));
}

TEST(TokenBucketTest, ReconfigureKeepsTokensAndNeverGrantsAFreshBurst) {
  TokenBucket b(Rpm(60, 10), kStart);
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(b.TryTake(kStart));
  EXPECT_DOUBLE_EQ(b.TokensAt(kStart), 2);
  b.Reconfigure(Rpm(600, 50), kStart);  // faster and bigger: still 2 tokens now
  EXPECT_DOUBLE_EQ(b.TokensAt(kStart), 2);
  EXPECT_TRUE(b.TryTake(kStart));
  EXPECT_TRUE(b.TryTake(kStart));
  EXPECT_FALSE(b.TryTake(kStart));
  EXPECT_TRUE(b.TryTake(kStart + absl::Milliseconds(100)));     // the new rate: 10/s
  b.Reconfigure(Rpm(60, 1), kStart + absl::Milliseconds(100));  // smaller burst caps tokens
  EXPECT_LE(b.TokensAt(kStart + absl::Hours(1)), 1);
}

// The acceptance run: 10 minutes of fake time at 20 rpm, burst 5, 50 one-slot workers and a deep
// backlog. Dispatches must never exceed burst + rate * t in any window of length t, and must reach
// 99% of what the bucket allows.
void RunTenMinutes(bool step_by_wakeup) {
  config::Config c;
  c.types.push_back({.name = "llm", .model = "m", .rate = Rpm(20, 5)});
  Scheduler s(c, kStart);
  for (int i = 0; i < 50; ++i) {
    s.AddWorker({.id = "w" + std::to_string(i), .types = {"llm"}, .slots = 1});
  }
  for (int i = 0; i < 1000; ++i) {
    s.Enqueue({.id = "j" + std::to_string(i), .type = "llm", .arrival = kStart});
  }
  const absl::Time end = kStart + absl::Minutes(10);
  std::vector<absl::Time> dispatched;
  std::vector<std::pair<absl::Time, std::string>> running;
  for (absl::Time now = kStart; now <= end;) {
    // Jobs run for 2 s; finishing them keeps workers free, so only the bucket limits the rate.
    for (auto it = running.begin(); it != running.end();) {
      if (it->first <= now) {
        s.Finished(it->second, now, absl::Seconds(2));
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    for (const Dispatch& d : s.Decide(now)) {
      dispatched.push_back(now);
      running.push_back({now + absl::Seconds(2), d.job_id});
    }
    absl::Time next = now + absl::Milliseconds(100);
    if (step_by_wakeup) {
      next = s.NextWakeup(now);
      for (const auto& [when, id] : running) next = std::min(next, when);
      if (next <= now) next = now + absl::Nanoseconds(1);
    }
    now = next;
  }
  const double rate = 20.0 / 60;
  for (size_t i = 0; i < dispatched.size(); ++i) {
    for (size_t j = i; j < dispatched.size(); ++j) {
      double t = absl::ToDoubleSeconds(dispatched[j] - dispatched[i]);
      ASSERT_LE(static_cast<double>(j - i + 1), 5 + rate * t + 1e-9)
          << "window [" << i << ", " << j << "] of " << t << " s";
    }
  }
  const double theoretical = 5 + rate * 600;  // 205 dispatches
  std::printf("%zu dispatches in 10 minutes, %.1f%% of the %.0f the bucket allows\n",
              dispatched.size(), 100.0 * dispatched.size() / theoretical, theoretical);
  EXPECT_GE(dispatched.size(), 0.99 * theoretical) << "got " << dispatched.size();
  EXPECT_LE(dispatched.size(), theoretical);
}

TEST(TokenBucketTest, TenMinutesAt20RpmBurst5With50WorkersStepByWakeup) { RunTenMinutes(true); }
TEST(TokenBucketTest, TenMinutesAt20RpmBurst5With50Workers100msTicks) { RunTenMinutes(false); }

}  // namespace
}  // namespace dispatchd::sched
