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

TEST(JobProtoTest, EarlierAttemptsKeepTheirOrderAndLeaveUnknownTimesUnset) {
  job::Job job;
  job.id = "j1";
  job.attempt = 3;
  job.earlier_attempts = {{.attempt = 1,
                           .worker_id = "w1",
                           .dispatched_at = absl::FromUnixSeconds(100),
                           .started_at = absl::FromUnixSeconds(101),
                           .ended_at = absl::FromUnixSeconds(102),
                           .error = "out of memory"},
                          {.attempt = 2,
                           .worker_id = "w2",
                           .dispatched_at = absl::FromUnixSeconds(103),
                           .ended_at = absl::FromUnixSeconds(104),
                           .error = "lost"}};
  v1::Job out;
  ToProto(job, &out);
  ASSERT_EQ(out.earlier_attempts_size(), 2);
  const v1::JobAttempt& first = out.earlier_attempts(0);
  EXPECT_EQ(first.attempt(), 1);
  EXPECT_EQ(first.worker_id(), "w1");
  EXPECT_EQ(first.dispatched_at().seconds(), 100);
  EXPECT_EQ(first.started_at().seconds(), 101);
  EXPECT_EQ(first.ended_at().seconds(), 102);
  EXPECT_EQ(first.error(), "out of memory");
  const v1::JobAttempt& second = out.earlier_attempts(1);
  EXPECT_EQ(second.attempt(), 2);
  EXPECT_FALSE(second.has_started_at());  // it failed before its accept
  EXPECT_EQ(second.ended_at().seconds(), 104);
  // Converting again into the same message replaces them.
  ToProto(job, &out);
  EXPECT_EQ(out.earlier_attempts_size(), 2);
}

}  // namespace
}  // namespace dispatchd::convert
