// Retention end to end: an ended job stays readable for `retention`, then goes with its whole
// partition; active jobs are never touched. Real dispatchd and dispatch-worker processes.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"

#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

TEST(RetentionTest, EndedJobIsReadableForItsRetentionThenGoneWhileActiveJobsStay) {
  absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("e2e_retention");
  ASSERT_TRUE(db.ok()) << db.status();
  TempDir dir;
  // Retention 4s: partitions of one second, dropped once wholly older than four.
  DaemonOptions options{.postgres_url = db->url(),
                        .types = {{.name = "echo"}, {.name = "idle"}},
                        .extra_yaml = "retention: 4s\n"};
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(options, dir);
  ASSERT_TRUE(d.ok()) << d.status();
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start((*d)->address(), {.id = "w1"}, dir);
  ASSERT_TRUE(w.ok()) << w.status();

  absl::StatusOr<std::string> done = (*d)->Submit(Spec("echo", "kept for a while"));
  ASSERT_TRUE(done.ok()) << done.status();
  absl::StatusOr<std::string> waiting = (*d)->Submit(Spec("idle", "no worker serves this"));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  std::vector<v1::Job> ended;
  ASSERT_TRUE((*d)->WaitForTerminal({*done}, &ended, absl::Seconds(30)));
  EXPECT_EQ(ended[0].result(), "kept for a while");

  // Readable at first, then gone: retention plus at most one partition's span, plus the
  // keeper's period and some slack for a loaded machine.
  absl::StatusOr<v1::Job> now = (*d)->Status(*done);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(
      WaitFor([&] { return (*d)->Status(*done).status().code() == absl::StatusCode::kNotFound; },
              absl::Seconds(30)));
  CommandResult ctl = (*d)->Ctl({"status", *done});
  EXPECT_NE(ctl.exit_code, 0);
  EXPECT_THAT(ctl.err, HasSubstr("not found"));

  // The queued job outlived the retention untouched.
  absl::StatusOr<v1::Job> still = (*d)->Status(*waiting);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::JOB_STATE_QUEUED);
  EXPECT_THAT((*d)->process().Log(), HasSubstr("partitions of jobs that ended more than 4s ago"));
}

}  // namespace
}  // namespace dispatchd::e2e
