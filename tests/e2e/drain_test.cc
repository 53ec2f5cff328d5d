// `dispatchctl drain WORKER` (AdminService.DrainWorker): the worker takes no new job, finishes
// the ones it runs with their results recorded, and dispatch-worker exits 0; the work left goes
// to the other workers.

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

using DrainTest = E2eTest;

// The scheduler's reason for the first queued echo job to wait, or "" if Stats fails.
std::string EchoWaitReason(Daemon& daemon) {
  absl::StatusOr<v1::TypeStats> echo = daemon.TypeStats("echo");
  return echo.ok() ? echo->head_wait_reason() : "";
}

TEST_F(DrainTest, DrainedWorkerFinishesItsJobsTakesNoMoreAndExits) {
  std::unique_ptr<Daemon> d = StartDaemon();
  ASSERT_NE(d, nullptr);
  Daemon& daemon = *d;
  std::unique_ptr<Worker> a =
      StartWorker(daemon, {.id = "a", .slots = 2, .mode = {"--simulate", "100%:2s"}});
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(daemon.WaitForWorkers(1));

  std::vector<std::string> first;
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<std::string> id = daemon.Submit(Spec("echo", "long"));
    ASSERT_TRUE(id.ok()) << id.status();
    first.push_back(*id);
  }
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string& id : first) {
          absl::StatusOr<v1::Job> j = daemon.Status(id);
          if (!j.ok() || j->worker_id() != "a") return false;
        }
        return true;
      },
      absl::Seconds(10)));

  CommandResult r = daemon.Ctl({"drain", "a"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "a: draining; 2 jobs finish first, and no new job goes to it\n");
  absl::StatusOr<std::vector<v1::WorkerInfo>> workers = daemon.Workers();
  ASSERT_TRUE(workers.ok());
  ASSERT_EQ(workers->size(), 1u);
  EXPECT_TRUE((*workers)[0].draining());

  // A job queued now waits, and the scheduler has seen it: its only worker is busy with the two
  // jobs it finishes before it leaves. That the draining worker takes nothing more is shown
  // below, when this job runs on the next worker.
  absl::StatusOr<std::string> later = daemon.Submit(Spec("echo", "later"));
  ASSERT_TRUE(later.ok()) << later.status();
  ASSERT_TRUE(WaitFor([&] { return EchoWaitReason(daemon) == "workers_busy"; }, absl::Seconds(10)))
      << EchoWaitReason(daemon);
  absl::StatusOr<v1::Job> waiting = daemon.Status(*later);
  ASSERT_TRUE(waiting.ok());
  EXPECT_EQ(waiting->state(), v1::JOB_STATE_QUEUED);

  // The drained worker finishes its two jobs and exits cleanly.
  absl::StatusOr<int> exited = a->process().Wait(absl::Seconds(30));
  ASSERT_TRUE(exited.ok()) << "the drained worker did not exit";
  EXPECT_EQ(*exited, 0) << a->process().Log();
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon.WaitForTerminal(first, &jobs, absl::Seconds(30)));
  for (const v1::Job& j : jobs) {
    EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(j.worker_id(), "a");
    EXPECT_EQ(j.attempt(), 1) << "ran once, not retried";
  }

  // Another worker takes what was left.
  std::unique_ptr<Worker> b = StartWorker(daemon, {.id = "b"});
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(daemon.WaitForTerminal({*later}, &jobs, absl::Seconds(30)));
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(jobs[0].worker_id(), "b");

  r = daemon.Ctl({"drain", "nosuch"});
  EXPECT_EQ(r.exit_code, 5) << r.err;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND: worker_id: no connected worker \"nosuch\""));
  r = daemon.Ctl({"drain", ""});
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_THAT(r.err, HasSubstr("worker_id: required"));
}

}  // namespace
}  // namespace dispatchd::e2e
