// The worker SDK's handler threads (client/cpp/worker_handler_pool.h): no task waits for another
// to end, and every task handed over runs.

#include <atomic>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

#include "client/cpp/worker_handler_pool.h"

namespace dispatchd::client::worker_internal {
namespace {

constexpr absl::Duration kWait = absl::Seconds(10);

// Counts arrivals; Arrive() waits until `n` have arrived, or until kWait after construction.
class Rendezvous {
 public:
  explicit Rendezvous(int n) : n_(n), deadline_(absl::Now() + kWait) {}
  bool Arrive() {
    absl::MutexLock l(&mu_);
    ++arrived_;
    auto all = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return arrived_ >= n_; };
    return mu_.AwaitWithDeadline(absl::Condition(&all), deadline_);
  }

 private:
  const int n_;
  const absl::Time deadline_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
};

TEST(HandlerPoolTest, TasksHandedOverTogetherAllRunAtOnce) {
  // Each task waits for all the others to start: run one after another, none would see them.
  constexpr int kTasks = 16;
  Rendezvous all(kTasks);
  std::atomic<int> met = 0;
  {
    HandlerPool pool;
    for (int i = 0; i < kTasks; ++i) {
      ASSERT_TRUE(pool.Start([&] {
        if (all.Arrive()) ++met;
      }));
    }
  }
  EXPECT_EQ(met.load(), kTasks);
}

TEST(HandlerPoolTest, ATaskHandedOverWhileOthersRunStartsWithoutWaitingForThem) {
  absl::Notification release, third_ran;
  std::atomic<int> blockers_ended = 0;
  // Written by the third task, which may still run after a failed wait.
  std::atomic<int> ended_before_third = -1;
  Rendezvous started(3);  // the two tasks and this thread
  // Declared after what its tasks touch, so that it is destroyed first: its destructor waits for
  // the blocked tasks, which still run after the last check.
  HandlerPool pool;
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(pool.Start([&] {
      started.Arrive();
      release.WaitForNotificationWithTimeout(kWait);
      ++blockers_ended;
    }));
  }
  ASSERT_TRUE(started.Arrive());
  ASSERT_TRUE(pool.Start([&] {
    ended_before_third = blockers_ended.load();
    third_ran.Notify();
  }));
  EXPECT_TRUE(third_ran.WaitForNotificationWithTimeout(kWait));
  release.Notify();
  // Run behind a blocked task, it would have started only once that one gave up waiting.
  EXPECT_EQ(ended_before_third.load(), 0);
}

TEST(HandlerPoolTest, DestroyingThePoolRunsEveryTaskHandedOver) {
  std::atomic<int> ran = 0;
  {
    HandlerPool pool;
    ASSERT_TRUE(pool.Start([&] {
      absl::SleepFor(absl::Milliseconds(20));
      ++ran;
    }));
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(pool.Start([&] { ++ran; }));
  }
  EXPECT_EQ(ran.load(), 51);
}

}  // namespace
}  // namespace dispatchd::client::worker_internal
