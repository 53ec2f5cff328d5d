#include "proto/convert/time_proto.h"

#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace dispatchd::proto_convert {
namespace {

TEST(TimeProtoTest, DurationKeepsSecondsAndNanos) {
  const google::protobuf::Duration d = ToProto(absl::Seconds(90) + absl::Nanoseconds(5));
  EXPECT_EQ(d.seconds(), 90);
  EXPECT_EQ(d.nanos(), 5);
  EXPECT_EQ(FromProto(d), absl::Seconds(90) + absl::Nanoseconds(5));
}

// The wire allows durations up to 10000 years; a count of nanoseconds in an int64 ends at about
// 292 years.
TEST(TimeProtoTest, DurationPastAnInt64OfNanosecondsIsExact) {
  const absl::Duration longest = absl::Seconds(315'576'000'000) + absl::Nanoseconds(999'999'999);
  const google::protobuf::Duration d = ToProto(longest);
  EXPECT_EQ(d.seconds(), 315'576'000'000);
  EXPECT_EQ(d.nanos(), 999'999'999);
  EXPECT_EQ(FromProto(d), longest);
}

TEST(TimeProtoTest, NegativeDurationHasSecondsAndNanosOfOneSign) {
  const google::protobuf::Duration d = ToProto(-(absl::Seconds(2) + absl::Milliseconds(500)));
  EXPECT_EQ(d.seconds(), -2);
  EXPECT_EQ(d.nanos(), -500'000'000);
  EXPECT_EQ(FromProto(d), -(absl::Seconds(2) + absl::Milliseconds(500)));
}

TEST(TimeProtoTest, TimestampKeepsNanoseconds) {
  const absl::Time t = absl::FromUnixSeconds(1'700'000'000) + absl::Nanoseconds(123'456'789);
  const google::protobuf::Timestamp ts = ToProto(t);
  EXPECT_EQ(ts.seconds(), 1'700'000'000);
  EXPECT_EQ(ts.nanos(), 123'456'789);
  EXPECT_EQ(FromProto(ts), t);
}

// Before the epoch the seconds round down, so that the nanos stay positive.
TEST(TimeProtoTest, TimestampBeforeTheEpochHasPositiveNanos) {
  const absl::Time t = absl::UnixEpoch() - absl::Milliseconds(1500);
  const google::protobuf::Timestamp ts = ToProto(t);
  EXPECT_EQ(ts.seconds(), -2);
  EXPECT_EQ(ts.nanos(), 500'000'000);
  EXPECT_EQ(FromProto(ts), t);
}

TEST(TimeProtoTest, UnsetMessagesAreTheEpochAndZero) {
  EXPECT_EQ(FromProto(google::protobuf::Timestamp()), absl::UnixEpoch());
  EXPECT_EQ(FromProto(google::protobuf::Duration()), absl::ZeroDuration());
}

}  // namespace
}  // namespace dispatchd::proto_convert
