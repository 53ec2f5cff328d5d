// Memory throttling: a worker whose reported RAM or GPU memory passes the throttle threshold gets
// no new jobs until its use drops below the lower resume threshold.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Writes what the worker reports at its next heartbeat: RAM used of 100 GiB.
void ReportRamPercent(const std::string& path, int percent) {
  std::ofstream(path) << percent * kGiB << " " << 100 * kGiB << "\n";
}

TEST(MemoryThrottleTest, WorkerOverThresholdGetsNoJobsUntilBelowResume) {
  absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("e2e");
  ASSERT_TRUE(db.ok()) << db.status();
  TempDir dir;
  DaemonOptions options;
  options.postgres_url = db->url();
  options.extra_yaml = "memory_throttle:\n  ram_percent: 90\n  ram_resume_percent: 80\n";
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options, dir);
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  Daemon& d = **daemon;

  const std::string memory = dir.File("memory");
  ReportRamPercent(memory, 95);
  absl::StatusOr<std::unique_ptr<Worker>> worker =
      Worker::Start(d.address(), {.id = "w", .mode = {"--echo", "--memory-file", memory}}, dir);
  ASSERT_TRUE(worker.ok()) << worker.status();
  ASSERT_TRUE(d.WaitForWorkers(1));

  // The first heartbeat (every 500 ms here) reports 95%: the worker is throttled.
  absl::SleepFor(absl::Seconds(1.5));
  absl::StatusOr<std::string> id = d.Submit(Spec("echo", "held"));
  ASSERT_TRUE(id.ok()) << id.status();
  std::string reason;
  EXPECT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = d.Status(*id);
        reason = job.ok() ? job->wait_reason() : "";
        return reason == "memory";
      },
      absl::Seconds(10)))
      << "wait_reason " << reason;

  // 85% is below the throttle threshold but above the resume threshold: still held.
  ReportRamPercent(memory, 85);
  absl::SleepFor(absl::Seconds(1.5));
  absl::StatusOr<v1::Job> held = d.Status(*id);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(held->wait_reason(), "memory");

  // 70%: released, and the job runs.
  ReportRamPercent(memory, 70);
  std::vector<v1::Job> done;
  ASSERT_TRUE(d.WaitForTerminal({*id}, &done, absl::Seconds(15)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED);
  std::string log = d.process().Log();
  EXPECT_THAT(log, ::testing::HasSubstr("memory throttle on worker=w: RAM at 95.0%"));
  EXPECT_THAT(log, ::testing::HasSubstr("memory throttle off worker=w: RAM at 70.0%"));
}

}  // namespace
}  // namespace dispatchd::e2e
