#include "server/convert/job_proto.h"

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

#include "dispatchd/v1/job.pb.h"
#include "lib/job/job.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::convert {
namespace {

using ::dispatchd::testing::IsOk;

TEST(JobProtoTest, DurationKeepsSecondsAndNanos) {
  google::protobuf::Duration d;
  ToProto(absl::Seconds(90) + absl::Nanoseconds(5), &d);
  EXPECT_EQ(d.seconds(), 90);
  EXPECT_EQ(d.nanos(), 5);
  EXPECT_EQ(FromProto(d), absl::Seconds(90) + absl::Nanoseconds(5));
}

// The wire allows durations up to 10000 years; a count of nanoseconds in an int64 ends at about
// 292 years, and used to saturate there (found by tests/fuzz/fuzz_submit_spec).
TEST(JobProtoTest, DurationPastAnInt64OfNanosecondsIsExact) {
  const absl::Duration longest = absl::Seconds(315'576'000'000) + absl::Nanoseconds(999'999'999);
  google::protobuf::Duration d;
  ToProto(longest, &d);
  EXPECT_EQ(d.seconds(), 315'576'000'000);
  EXPECT_EQ(d.nanos(), 999'999'999);
  EXPECT_EQ(FromProto(d), longest);
}

TEST(JobProtoTest, NegativeDurationHasSecondsAndNanosOfOneSign) {
  google::protobuf::Duration d;
  ToProto(-(absl::Seconds(2) + absl::Milliseconds(500)), &d);
  EXPECT_EQ(d.seconds(), -2);
  EXPECT_EQ(d.nanos(), -500'000'000);
}

TEST(JobProtoTest, SpecWithAThousandYearDeadlineReadsBackTheSame) {
  v1::JobSpec in;
  in.set_type("echo");
  in.set_payload("x");
  in.mutable_dispatch_deadline()->set_seconds(int64_t{1000} * 365 * 86400);
  absl::StatusOr<job::JobSpec> spec = FromProto(in);
  ASSERT_THAT(spec, IsOk());
  v1::JobSpec out;
  ToProto(*spec, &out);
  EXPECT_EQ(out.dispatch_deadline().seconds(), in.dispatch_deadline().seconds());
  EXPECT_EQ(out.dispatch_deadline().nanos(), 0);
}

}  // namespace
}  // namespace dispatchd::convert
