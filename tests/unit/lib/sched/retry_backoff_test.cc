// Retry backoff: doubles per attempt up to max_backoff, with "equal jitter" drawn from the job id
// and attempt, so that jobs failed together by one fault do not come back in lockstep.
#include <set>
#include <string>

#include "gtest/gtest.h"

#include "lib/sched/admission.h"

namespace dispatchd::sched {
namespace {

config::JobTypeConfig Type() {
  return {.name = "t", .retry_backoff = absl::Seconds(1), .max_backoff = absl::Seconds(10)};
}

TEST(RetryBackoffTest, CeilingDoublesPerAttemptUpToMaxBackoff) {
  EXPECT_EQ(RetryBackoff(Type(), 1), absl::Seconds(1));
  EXPECT_EQ(RetryBackoff(Type(), 2), absl::Seconds(2));
  EXPECT_EQ(RetryBackoff(Type(), 4), absl::Seconds(8));
  EXPECT_EQ(RetryBackoff(Type(), 5), absl::Seconds(10));
  EXPECT_EQ(RetryBackoff(Type(), 50), absl::Seconds(10));
}

TEST(RetryBackoffTest, JitteredDelayStaysWithinHalfToFullCeilingAndIsStable) {
  for (int attempt = 1; attempt <= 6; ++attempt) {
    const absl::Duration ceiling = RetryBackoff(Type(), attempt);
    for (int i = 0; i < 200; ++i) {
      const std::string id = "j_" + std::to_string(i);
      const absl::Duration d = RetryBackoff(Type(), attempt, id);
      EXPECT_GE(d, ceiling / 2) << id;
      EXPECT_LE(d, ceiling) << id;
      EXPECT_EQ(d, RetryBackoff(Type(), attempt, id)) << "same job and attempt, same delay";
    }
  }
}

TEST(RetryBackoffTest, JobsFailedTogetherComeBackSpreadOut) {
  std::set<int64_t> millis;
  for (int i = 0; i < 100; ++i) {
    millis.insert(absl::ToInt64Milliseconds(RetryBackoff(Type(), 3, "job-" + std::to_string(i))));
  }
  // 100 jobs over a 2 s window (2 s to 4 s): nearly all distinct at millisecond resolution.
  EXPECT_GE(millis.size(), 90u);
  EXPECT_GE(*millis.begin(), 2000);
  EXPECT_LE(*millis.rbegin(), 4000);
  EXPECT_GE(*millis.rbegin() - *millis.begin(), 1500) << "spread over most of the window";
}

}  // namespace
}  // namespace dispatchd::sched
