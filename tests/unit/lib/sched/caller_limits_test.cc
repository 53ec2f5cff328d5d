#include "lib/sched/caller_limits.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/status_matchers.h"

namespace dispatchd::sched {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using Stream = CallerLimits::Stream;

const absl::Time kStart = absl::FromUnixSeconds(1'700'000'000);

TEST(CallerLimitsTest, StreamsAreCountedPerPrincipalAndKind) {
  CallerLimits limits;
  EXPECT_THAT(limits.Open(Stream::kWorker, "gpu", 2), IsOk());
  EXPECT_THAT(limits.Open(Stream::kWorker, "gpu", 2), IsOk());
  EXPECT_THAT(
      limits.Open(Stream::kWorker, "gpu", 2),
      StatusIs(absl::StatusCode::kResourceExhausted, "limits.worker_streams_per_principal"));
  // Another principal, and another kind, count apart.
  EXPECT_THAT(limits.Open(Stream::kWorker, "gpu2", 2), IsOk());
  EXPECT_THAT(limits.Open(Stream::kWatch, "gpu", 1), IsOk());
  EXPECT_THAT(limits.Open(Stream::kWatch, "gpu", 1),
              StatusIs(absl::StatusCode::kResourceExhausted, "limits.watches_per_principal"));
  EXPECT_EQ(limits.OpenCount(Stream::kWorker, "gpu"), 2);
  limits.Close(Stream::kWorker, "gpu");
  EXPECT_EQ(limits.OpenCount(Stream::kWorker, "gpu"), 1);
  EXPECT_THAT(limits.Open(Stream::kWorker, "gpu", 2), IsOk());
}

TEST(CallerLimitsTest, ALoweredLimitRefusesNewStreamsAndKeepsOpenOnes) {
  CallerLimits limits;
  for (int i = 0; i < 3; ++i) ASSERT_THAT(limits.Open(Stream::kWatch, "alice", 3), IsOk());
  EXPECT_FALSE(limits.Open(Stream::kWatch, "alice", 2).ok());  // a reload lowered it
  limits.Close(Stream::kWatch, "alice");
  EXPECT_FALSE(limits.Open(Stream::kWatch, "alice", 2).ok());  // still 2 open
  limits.Close(Stream::kWatch, "alice");
  EXPECT_THAT(limits.Open(Stream::kWatch, "alice", 2), IsOk());
}

TEST(CallerLimitsTest, SubmitRateIsATokenBucketPerPrincipalWithARetryHint) {
  CallerLimits limits;
  const config::RateLimit rate{.per_second = 10, .burst = 5};
  absl::Duration retry = absl::ZeroDuration();
  EXPECT_THAT(limits.TakeSubmits("alice", 3, rate, kStart, &retry), IsOk());
  EXPECT_THAT(limits.TakeSubmits("alice", 2, rate, kStart, &retry), IsOk());
  // Empty: one job needs a tenth of a second, three need three tenths; all or none.
  EXPECT_THAT(limits.TakeSubmits("alice", 1, rate, kStart, &retry),
              StatusIs(absl::StatusCode::kResourceExhausted, "limits.submit_rate"));
  EXPECT_EQ(retry, absl::Milliseconds(100));
  EXPECT_FALSE(limits.TakeSubmits("alice", 3, rate, kStart + absl::Milliseconds(200), &retry).ok());
  EXPECT_EQ(retry, absl::Milliseconds(100));
  EXPECT_THAT(limits.TakeSubmits("alice", 3, rate, kStart + absl::Milliseconds(300), &retry),
              IsOk());
  // Bob's bucket is his own.
  EXPECT_THAT(limits.TakeSubmits("bob", 5, rate, kStart, &retry), IsOk());
}

TEST(CallerLimitsTest, ABatchLargerThanTheBurstIsInvalidNotRetried) {
  CallerLimits limits;
  absl::Duration retry = absl::ZeroDuration();
  EXPECT_THAT(limits.TakeSubmits("alice", 6, {.per_second = 10, .burst = 5}, kStart, &retry),
              StatusIs(absl::StatusCode::kInvalidArgument, "limits.submit_burst"));
  EXPECT_EQ(retry, absl::ZeroDuration());
  // And it took nothing.
  EXPECT_THAT(limits.TakeSubmits("alice", 5, {.per_second = 10, .burst = 5}, kStart, &retry),
              IsOk());
}

TEST(CallerLimitsTest, NoRateMeansNoLimitAndANewRateAppliesAtOnce) {
  CallerLimits limits;
  absl::Duration retry = absl::ZeroDuration();
  EXPECT_THAT(limits.TakeSubmits("alice", 1'000'000, {}, kStart, &retry), IsOk());
  ASSERT_THAT(limits.TakeSubmits("alice", 2, {.per_second = 1, .burst = 2}, kStart, &retry),
              IsOk());
  EXPECT_FALSE(limits.TakeSubmits("alice", 1, {.per_second = 1, .burst = 2}, kStart, &retry).ok());
  // A reload to a faster rate keeps the empty bucket but refills it faster.
  const config::RateLimit faster{.per_second = 100, .burst = 2};
  EXPECT_FALSE(limits.TakeSubmits("alice", 1, faster, kStart, &retry).ok());
  EXPECT_THAT(limits.TakeSubmits("alice", 1, faster, kStart + absl::Milliseconds(10), &retry),
              IsOk());
}

}  // namespace
}  // namespace dispatchd::sched
