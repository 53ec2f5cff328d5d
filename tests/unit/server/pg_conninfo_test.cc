#include "server/store/pg_conninfo.h"

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST(ParseTargetTest, AddsTimeoutsNameAndKeepalives) {
  absl::StatusOr<Target> t =
      ParseTarget("postgresql://app@db.example:6432/jobs", absl::Milliseconds(2500),
                  "dispatchd d-1", absl::Seconds(4));
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->endpoint, "db.example:6432/jobs");
  EXPECT_THAT(t->conninfo,
              AllOf(HasSubstr("connect_timeout=3"), HasSubstr("application_name='dispatchd d-1'"),
                    HasSubstr("keepalives=1"), HasSubstr("tcp_user_timeout=4000")));
}

TEST(ParseTargetTest, TheDaemonsApplicationNameReplacesTheUrls) {
  // A leader's sessions must carry its own name, or a standby could not end them.
  absl::StatusOr<Target> t =
      ParseTarget("host=db application_name=myapp", absl::Seconds(5), "dispatchd d-1");
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(t->conninfo, HasSubstr("application_name='dispatchd d-1'"));
  EXPECT_THAT(t->conninfo, Not(HasSubstr("myapp")));

  t = ParseTarget("host=db application_name=myapp", absl::Seconds(5), "");
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(t->conninfo, HasSubstr("application_name='myapp'"));
  t = ParseTarget("host=db", absl::Seconds(5), "");
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(t->conninfo, HasSubstr("application_name='dispatchd'"));
}

TEST(ParseTargetTest, SettingsInTheUrlWin) {
  absl::StatusOr<Target> t = ParseTarget(
      "host=db connect_timeout=9 keepalives_idle=60 tcp_user_timeout=100", absl::Seconds(5), "x");
  ASSERT_THAT(t, IsOk());
  EXPECT_THAT(t->conninfo,
              AllOf(HasSubstr("connect_timeout='9'"), HasSubstr("keepalives_idle='60'"),
                    HasSubstr("tcp_user_timeout='100'")));
  EXPECT_THAT(t->conninfo,
              AllOf(Not(HasSubstr("connect_timeout=5")), Not(HasSubstr("keepalives=1")),
                    Not(HasSubstr("tcp_user_timeout=30000"))));
}

TEST(ParseTargetTest, DescribesSocketsAndDefaults) {
  absl::StatusOr<Target> t = ParseTarget("host=/run/postgresql user=alice", absl::Seconds(5), "x");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->endpoint, "socket /run/postgresql port 5432/alice");
  t = ParseTarget("", absl::Seconds(5), "x");
  ASSERT_THAT(t, IsOk());
  EXPECT_EQ(t->endpoint, "local socket port 5432");
}

TEST(ParseTargetTest, BadUrlIsInvalidArgumentWithThePasswordMasked) {
  absl::StatusOr<Target> t =
      ParseTarget("postgresql://u:s3cret@db:notaport/x?bogus=1", absl::Seconds(5), "x");
  EXPECT_THAT(t, StatusIs(absl::StatusCode::kInvalidArgument, "invalid connection URL"));
  EXPECT_THAT(t.status().message(), Not(HasSubstr("s3cret")));
}

}  // namespace
}  // namespace dispatchd::store
