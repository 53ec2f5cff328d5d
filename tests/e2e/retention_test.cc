// Retention end to end: an ended job stays readable for `retention`, then goes with its whole
// partition; active jobs are never touched. Real dispatchd and dispatch-worker processes.

#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

using RetentionTest = E2eTest;

constexpr char kDropped[] = "dispatchd_retention_partitions_dropped_total";

TEST_F(RetentionTest, EndedJobIsReadableForItsRetentionThenGoneWhileActiveJobsStay) {
  // Retention 4s: partitions of one second, dropped once wholly older than four.
  std::unique_ptr<Daemon> d =
      StartDaemon({.types = {{.name = "echo"}, {.name = "idle"}}, .extra_yaml = "retention: 4s\n"});
  ASSERT_NE(d, nullptr);
  std::unique_ptr<Worker> w = StartWorker(*d, {.id = "w1"});
  ASSERT_NE(w, nullptr);

  absl::StatusOr<std::string> done = d->Submit(Spec("echo", "kept for a while"));
  ASSERT_TRUE(done.ok()) << done.status();
  absl::StatusOr<std::string> waiting = d->Submit(Spec("idle", "no worker serves this"));
  ASSERT_TRUE(waiting.ok()) << waiting.status();
  std::vector<v1::Job> ended;
  ASSERT_TRUE(d->WaitForTerminal({*done}, &ended, absl::Seconds(30)));
  EXPECT_EQ(ended[0].result(), "kept for a while");

  // Readable at first, then gone: retention plus at most one partition's span, plus the
  // keeper's period and some slack for a loaded machine.
  absl::StatusOr<v1::Job> now = d->Status(*done);
  ASSERT_TRUE(now.ok()) << now.status();
  EXPECT_EQ(now->state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_TRUE(
      WaitFor([&] { return d->Status(*done).status().code() == absl::StatusCode::kNotFound; },
              absl::Seconds(30)));
  CommandResult ctl = d->Ctl({"status", *done});
  EXPECT_NE(ctl.exit_code, 0);
  EXPECT_THAT(ctl.err, HasSubstr("not found"));
  // It went with its partition, dropped by the retention keeper (which counts the drop once it
  // has committed).
  EXPECT_TRUE(WaitFor([&] { return d->Metric(kDropped) >= 1; }, absl::Seconds(5)))
      << d->Metric(kDropped);

  // The queued job outlived the retention untouched.
  absl::StatusOr<v1::Job> still = d->Status(*waiting);
  ASSERT_TRUE(still.ok()) << still.status();
  EXPECT_EQ(still->state(), v1::JOB_STATE_QUEUED);
}

}  // namespace
}  // namespace dispatchd::e2e
