// Memory throttling: a worker whose reported RAM or GPU memory passes the throttle threshold gets
// no new jobs until its use drops below the lower resume threshold.
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

constexpr int64_t kGiB = int64_t{1} << 30;

// Writes what the worker reports at its next heartbeat: RAM used of 100 GiB.
void ReportRamPercent(const std::string& path, int percent) {
  std::ofstream(path) << percent * kGiB << " " << 100 * kGiB << "\n";
}

using MemoryThrottleTest = E2eTest;

TEST_F(MemoryThrottleTest, WorkerOverThresholdGetsNoJobsUntilBelowResume) {
  DaemonOptions options;
  options.extra_yaml = "memory_throttle:\n  ram_percent: 90\n  ram_resume_percent: 80\n";
  std::unique_ptr<Daemon> daemon = StartDaemon(options);
  ASSERT_NE(daemon, nullptr);
  Daemon& d = *daemon;

  const std::string memory = dir_.File("memory");
  ReportRamPercent(memory, 95);
  std::unique_ptr<Worker> worker =
      StartWorker(d, {.id = "w", .mode = {"--echo", "--memory-file", memory}});
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(d.WaitForWorkers(1));

  // What the daemon made of the worker's last heartbeat (every 500 ms here).
  auto seen = [&](int percent, bool throttled) {
    absl::StatusOr<std::vector<v1::WorkerInfo>> workers = d.Workers();
    return workers.ok() && workers->size() == 1 &&
           (*workers)[0].ram_used_bytes() == percent * kGiB &&
           (*workers)[0].memory_throttled() == throttled;
  };

  // The first heartbeat reports 95%: the worker is throttled.
  ASSERT_TRUE(WaitFor([&] { return seen(95, true); }, absl::Seconds(10)));
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
  ASSERT_TRUE(WaitFor([&] { return seen(85, true); }, absl::Seconds(10)));
  absl::StatusOr<v1::Job> held = d.Status(*id);
  ASSERT_TRUE(held.ok()) << held.status();
  EXPECT_EQ(held->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(held->wait_reason(), "memory");

  // 70%: released, and the job runs.
  ReportRamPercent(memory, 70);
  std::vector<v1::Job> done;
  ASSERT_TRUE(d.WaitForTerminal({*id}, &done, absl::Seconds(15)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_TRUE(seen(70, false));
}

}  // namespace
}  // namespace dispatchd::e2e
