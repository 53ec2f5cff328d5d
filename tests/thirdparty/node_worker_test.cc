// The Node.js worker of client/node/worker.js, written from worker_service.proto and docs/api.md
// alone, against a real daemon: it runs jobs and their results are what it computed, it refuses an
// assignment beyond its capacity with REASON_RESOURCE_EXHAUSTED and the refused job runs later,
// it comes back after the daemon restarts, it stops a cancelled job, and a drain ends it cleanly.
//
// Needs node and the worker's npm packages; without them the test fails saying how to install
// them, so that a machine lacking them cannot pass the suite without running it.

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <signal.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

constexpr char kInstallHint[] =
    "install them with `bash deploy/install-deps.sh` (node, npm) and "
    "`npm ci --prefix client/node` (the pinned grpc-js); tests/run-all.sh does both";

// The absolute path of `name` on PATH (Process::Start does not search it), or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(candidate, ec);
    if (std::filesystem::is_regular_file(st) &&
        (st.permissions() & std::filesystem::perms::others_exec) != std::filesystem::perms::none) {
      return candidate;
    }
  }
  return "";
}

class NodeWorkerTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    node_ = FindOnPath("node");
    ASSERT_FALSE(node_.empty()) << "node is not on PATH: " << kInstallHint;
    for (const char* package : {"@grpc/grpc-js", "@grpc/proto-loader"}) {
      ASSERT_TRUE(std::filesystem::exists(
          absl::StrCat(NODE_WORKER_DIR, "/node_modules/", package, "/package.json")))
          << NODE_WORKER_DIR << "/node_modules has no " << package << ": " << kInstallHint;
    }
    daemon_ = StartDaemon({.types = {{.name = "reverse"}}});
    ASSERT_NE(daemon_, nullptr);
  }

  // Starts worker.js against the daemon with `flags` after --server and --types.
  std::unique_ptr<Process> StartNodeWorker(const std::string& id,
                                           const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {node_,         absl::StrCat(NODE_WORKER_DIR, "/worker.js"),
                                     "--server",    daemon_->address(),
                                     "--worker-id", id,
                                     "--types",     "reverse"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<std::unique_ptr<Process>> p =
        Process::Start(argv, dir_.File(absl::StrCat("node-", id, ".log")));
    EXPECT_TRUE(p.ok()) << p.status();
    return p.ok() ? *std::move(p) : nullptr;
  }

  std::vector<std::string> SubmitAll(const std::vector<std::string>& payloads) {
    std::vector<std::string> ids;
    for (const std::string& payload : payloads) {
      absl::StatusOr<std::string> id = daemon_->Submit(Spec("reverse", payload));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    return ids;
  }

  std::string node_;
  std::unique_ptr<Daemon> daemon_;
};

// The job ids the worker's log says it refused with `reason`.
std::set<std::string> Refused(const std::string& log, absl::string_view reason) {
  std::set<std::string> ids;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (!absl::ConsumePrefix(&line, "reject job=")) continue;
    const std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
    if (fields.size() == 3 && fields[2] == absl::StrCat("reason=", reason)) {
      ids.emplace(fields[0]);
    }
  }
  return ids;
}

std::string Reversed(std::string s) {
  std::reverse(s.begin(), s.end());
  return s;
}

TEST_F(NodeWorkerTest, RunsJobsRefusesBeyondItsCapacityAndRunsTheRefusedJobsLater) {
  // Queued before the worker comes, so that its first Assign fills both advertised slots while
  // it runs one job at a time: the second assignment is refused, and offered again later.
  const std::vector<std::string> payloads = {"alpha", "bravo", "charlie", "delta", "echo", "fail"};
  const std::vector<std::string> ids = SubmitAll(payloads);
  ASSERT_EQ(ids.size(), payloads.size());
  std::unique_ptr<Process> worker =
      StartNodeWorker("node-0", {"--slots", "2", "--max-concurrent", "1", "--work-ms", "200"});
  ASSERT_NE(worker, nullptr);

  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon_->WaitForTerminal(ids, &jobs, absl::Seconds(60))) << worker->Log();
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(jobs[i].worker_id(), "node-0");
    if (payloads[i] == "fail") {
      EXPECT_EQ(jobs[i].state(), v1::JOB_STATE_FAILED);
      EXPECT_THAT(jobs[i].error(), HasSubstr("asked to fail"));
    } else {
      EXPECT_EQ(jobs[i].state(), v1::JOB_STATE_SUCCEEDED) << jobs[i].error();
      EXPECT_EQ(jobs[i].result(), Reversed(payloads[i]));
    }
  }
  // At least one job was refused while the worker was full, and every refused job ran after.
  const std::set<std::string> refused = Refused(worker->Log(), "REASON_RESOURCE_EXHAUSTED");
  ASSERT_FALSE(refused.empty()) << worker->Log();
  for (const std::string& id : refused) {
    const auto at = std::find(ids.begin(), ids.end(), id);
    ASSERT_NE(at, ids.end()) << id;
    const v1::Job& job = jobs[at - ids.begin()];
    EXPECT_NE(job.state(), v1::JOB_STATE_QUEUED) << id;
    EXPECT_EQ(job.attempt(), 1) << id << ": a refusal uses no attempt";
  }
  EXPECT_GE(daemon_->Metric("dispatchd_worker_refusals_total{reason=\"resource_exhausted\"}"),
            static_cast<double>(refused.size()));

  // The daemon restarts; the worker reconnects by itself and takes new work.
  ASSERT_TRUE(daemon_->Restart().ok());
  ASSERT_TRUE(daemon_->WaitForWorkers(1, absl::Seconds(30))) << worker->Log();
  const std::vector<std::string> later = SubmitAll({"foxtrot"});
  ASSERT_EQ(later.size(), 1u);
  ASSERT_TRUE(daemon_->WaitForTerminal(later, &jobs, absl::Seconds(30))) << worker->Log();
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_SUCCEEDED) << jobs[0].error();
  EXPECT_EQ(jobs[0].result(), "tortxof");

  // SIGTERM drains: nothing runs, so it closes its stream and exits 0.
  worker->Signal(SIGTERM);
  absl::StatusOr<int> code = worker->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << worker->Log();
  EXPECT_EQ(*code, 0) << worker->Log();
}

TEST_F(NodeWorkerTest, StopsACancelledJobAndLeavesWhenTheDaemonDrainsIt) {
  std::unique_ptr<Process> worker = StartNodeWorker("node-1", {"--work-ms", "600000"});
  ASSERT_NE(worker, nullptr);
  ASSERT_TRUE(daemon_->WaitForWorkers(1)) << worker->Log();
  const std::vector<std::string> ids = SubmitAll({"long"});
  ASSERT_EQ(ids.size(), 1u);
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> job = daemon_->Status(ids[0]);
        return job.ok() && job->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(20)))
      << worker->Log();

  CommandResult r = daemon_->Ctl({"cancel", ids[0]});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  // The handler stops at the CancelJob, long before its ten minutes, and reports it.
  EXPECT_TRUE(WaitFor(
      [&] {
        return worker->Log().find(absl::StrCat("result job=", ids[0], " attempt=1 failure=")) !=
               std::string::npos;
      },
      absl::Seconds(20)))
      << worker->Log();
  absl::StatusOr<v1::Job> job = daemon_->Status(ids[0]);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_CANCELLED);

  // The daemon's Drain: the worker holds nothing, so it closes its stream and exits 0.
  r = daemon_->Ctl({"drain", "node-1"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  absl::StatusOr<int> code = worker->Wait(absl::Seconds(20));
  ASSERT_TRUE(code.ok()) << worker->Log();
  EXPECT_EQ(*code, 0) << worker->Log();
  EXPECT_THAT(worker->Log(), HasSubstr("draining (the daemon asked)"));
}

}  // namespace
}  // namespace dispatchd::e2e
