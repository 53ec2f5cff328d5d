#include "client/cpp/latency_mix.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/status_matchers.h"

namespace dispatchd::client {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;

TEST(LatencyMixTest, ParsesRangesAndFixedValues) {
  absl::StatusOr<LatencyMix> mix = ParseLatencyMix("95%:1s-5s,5%:20s-40s");
  ASSERT_THAT(mix, IsOk());
  ASSERT_EQ(mix->buckets().size(), 2u);
  EXPECT_DOUBLE_EQ(mix->buckets()[0].percent, 95);
  EXPECT_EQ(mix->buckets()[0].min, absl::Seconds(1));
  EXPECT_EQ(mix->buckets()[0].max, absl::Seconds(5));
  EXPECT_EQ(mix->buckets()[1].min, absl::Seconds(20));
  EXPECT_EQ(mix->buckets()[1].max, absl::Seconds(40));

  absl::StatusOr<LatencyMix> fixed = ParseLatencyMix("100%:250ms");
  ASSERT_THAT(fixed, IsOk());
  EXPECT_EQ(fixed->buckets()[0].min, absl::Milliseconds(250));
  EXPECT_EQ(fixed->buckets()[0].max, absl::Milliseconds(250));
}

TEST(LatencyMixTest, AcceptsDecimalsSpacesAndABareDuration) {
  EXPECT_THAT(ParseLatencyMix("99.5%:10ms , 0.5%:1.5s-2m"), IsOk());
  absl::StatusOr<LatencyMix> bare = ParseLatencyMix("2s");
  ASSERT_THAT(bare, IsOk());
  EXPECT_DOUBLE_EQ(bare->buckets()[0].percent, 100);
}

TEST(LatencyMixTest, RejectsBadSpecsNamingThePart) {
  EXPECT_THAT(ParseLatencyMix(""), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseLatencyMix("95%:1s-5s,4%:20s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "add up to 99"));
  EXPECT_THAT(ParseLatencyMix("95%:1s-x,5%:2s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"95%:1s-x\": bad duration \"x\""));
  EXPECT_THAT(ParseLatencyMix("95:1s,5%:2s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "\"95:1s\""));
  EXPECT_THAT(ParseLatencyMix("100%:5s-1s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "before its start"));
  EXPECT_THAT(ParseLatencyMix("abc%:1s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "bad percentage"));
  EXPECT_THAT(ParseLatencyMix("100%:-1s"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseLatencyMix("50%:1s,,50%:2s"),
              StatusIs(absl::StatusCode::kInvalidArgument, "empty bucket"));
  EXPECT_THAT(ParseLatencyMix("100%:"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(LatencyMixTest, DrawsFollowTheMixWithAFixedSeed) {
  absl::StatusOr<LatencyMix> mix = ParseLatencyMix("95%:1s-5s,5%:20s-40s");
  ASSERT_THAT(mix, IsOk());
  std::mt19937_64 rng(42);
  constexpr int kDraws = 20000;
  int slow = 0;
  absl::Duration fast_sum;
  for (int i = 0; i < kDraws; ++i) {
    absl::Duration d = mix->Sample(rng);
    if (d >= absl::Seconds(20)) {
      ++slow;
      EXPECT_LE(d, absl::Seconds(40));
    } else {
      EXPECT_GE(d, absl::Seconds(1));
      EXPECT_LE(d, absl::Seconds(5));
      fast_sum += d;
    }
  }
  // 5% of 20000 = 1000 (sd ~31); the fast bucket's mean is 3s.
  EXPECT_NEAR(slow, 1000, 150);
  EXPECT_NEAR(absl::ToDoubleSeconds(fast_sum / (kDraws - slow)), 3.0, 0.1);

  // The same seed gives the same draws.
  std::mt19937_64 a(7), b(7);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(mix->Sample(a), mix->Sample(b));
}

TEST(LatencyMixTest, FixedValueAlwaysDrawsIt) {
  absl::StatusOr<LatencyMix> mix = ParseLatencyMix("100%:2s");
  ASSERT_THAT(mix, IsOk());
  std::mt19937_64 rng(1);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(mix->Sample(rng), absl::Seconds(2));
}

}  // namespace
}  // namespace dispatchd::client
