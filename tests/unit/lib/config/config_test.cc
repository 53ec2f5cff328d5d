#include "lib/config/config.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::config {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;

Config ValidConfig() {
  Config c;
  c.types.push_back(JobTypeConfig{.name = "echo"});
  c.types.push_back(JobTypeConfig{.name = "llm.cover_letter", .max_concurrency = 4});
  return c;
}

TEST(ConfigTest, DefaultsWithOneTypeAreValid) { EXPECT_THAT(ValidConfig().Validate(), IsOk()); }

TEST(ConfigTest, RequiresAType) {
  Config c;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types:"));
}

TEST(ConfigTest, NamesTheTypeIndexAndKey) {
  Config c = ValidConfig();
  c.types[1].max_concurrency = 0;
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument,
                                     "types[1].max_concurrency: must be >= 1, got 0"));
}

TEST(ConfigTest, RefusesDuplicateTypes) {
  Config c = ValidConfig();
  c.types[1].name = "echo";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types[1].name"));
}

TEST(ConfigTest, RefusesBadTypeName) {
  Config c = ValidConfig();
  c.types[0].name = "has space";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "types[0].name"));
}

TEST(ConfigTest, StaleThresholdMustExceedTwoHeartbeats) {
  Config c = ValidConfig();
  c.heartbeat_interval = absl::Seconds(5);
  c.worker_stale_after = absl::Seconds(10);
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "worker_stale_after"));
  c.worker_stale_after = absl::Seconds(11);
  EXPECT_THAT(c.Validate(), IsOk());
}

TEST(ConfigTest, RefusesBadListenAddress) {
  Config c = ValidConfig();
  c.listen = "localhost";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "listen"));
  c.listen = "127.0.0.1:99999";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "listen"));
}

TEST(ConfigTest, RefusesUnknownLogLevel) {
  Config c = ValidConfig();
  c.log_level = "verbose";
  EXPECT_THAT(c.Validate(), StatusIs(absl::StatusCode::kInvalidArgument, "log_level"));
}

TEST(ConfigTest, FindTypeByName) {
  Config c = ValidConfig();
  ASSERT_NE(c.FindType("llm.cover_letter"), nullptr);
  EXPECT_EQ(c.FindType("llm.cover_letter")->max_concurrency, 4);
  EXPECT_EQ(c.FindType("nope"), nullptr);
}

}  // namespace
}  // namespace dispatchd::config
