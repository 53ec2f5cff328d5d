// With no postgres.url the daemon runs its own PostgreSQL under its state directory, and finds
// its jobs there again after a restart.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

TEST(EmbeddedPostgresTest, RunsJobsAndKeepsThemAcrossKillNine) {
  TempDir dir;
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start({.postgres_url = ""}, dir);
  ASSERT_TRUE(d.ok()) << d.status();
  Daemon& daemon = **d;

  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::string> id = daemon.Submit(Spec("echo", "embedded"));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  daemon.Kill9();
  ASSERT_TRUE(daemon.Restart().ok()) << daemon.process().Log();
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(daemon.address(), {.id = "w"}, dir);
  ASSERT_TRUE(w.ok());
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon.WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(j.result(), "embedded");
  }
  absl::StatusOr<int> rc = daemon.Terminate();
  ASSERT_TRUE(rc.ok());
  EXPECT_EQ(*rc, 0) << daemon.process().Log();
}

}  // namespace
}  // namespace dispatchd::e2e
