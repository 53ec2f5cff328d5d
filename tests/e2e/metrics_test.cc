// GET /metrics during a run: the series an operator needs exist in the Prometheus text format,
// and they move as jobs are admitted, refused, queued, dispatched and run.

#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <httplib.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// A rate-limited model beside the harness's echo type.
constexpr char kTypes[] = R"(  - name: echo
    retry_backoff: 100ms
  - name: llm
    model: m1
    rpm: 6000
    burst: 5
)";

// The page at http://ADDRESS/metrics; empty if the request fails.
std::string Scrape(const std::string& address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port)) return "";
  httplib::Client client(address.substr(0, colon), port);
  httplib::Result r = client.Get("/metrics");
  if (!r || r->status != 200) return "";
  EXPECT_THAT(r->get_header_value("Content-Type"), HasSubstr("text/plain; version=0.0.4"));
  return r->body;
}

// The value of the sample named exactly `series` (name and labels as rendered), or -1.
double Sample(const std::string& page, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(page, '\n')) {
    if (absl::ConsumePrefix(&line, series) && absl::ConsumePrefix(&line, " ")) {
      double v = 0;
      return absl::SimpleAtod(line, &v) ? v : -1;
    }
  }
  return -1;
}

using MetricsTest = E2eTest;

TEST_F(MetricsTest, SeriesExistAndMoveAsJobsFlow) {
  DaemonOptions options;
  options.types = {};
  options.extra_yaml = kTypes;
  std::unique_ptr<Daemon> d = StartDaemon(options);
  ASSERT_NE(d, nullptr);
  Daemon& daemon = *d;
  const std::string address = daemon.MetricsAddress();
  ASSERT_FALSE(address.empty()) << daemon.process().Log();

  std::string page = Scrape(address);
  ASSERT_FALSE(page.empty());
  for (const char* family :
       {"dispatchd_jobs_admitted_total counter", "dispatchd_jobs_refused_total counter",
        "dispatchd_job_queue_wait_seconds histogram", "dispatchd_job_run_seconds histogram",
        "dispatchd_store_batch_rows histogram", "dispatchd_store_commit_seconds histogram",
        "dispatchd_store_insert_wait_seconds histogram",
        "dispatchd_dispatch_decision_seconds histogram", "dispatchd_jobs_queued gauge",
        "dispatchd_jobs_running gauge", "dispatchd_rate_limit_tokens gauge",
        "dispatchd_rate_limit_waiting gauge", "dispatchd_workers gauge",
        "dispatchd_worker_slots gauge", "dispatchd_worker_model_loads_total counter",
        "dispatchd_worker_stream_messages_total counter", "dispatchd_leader gauge"}) {
    EXPECT_THAT(page, HasSubstr(absl::StrCat("# TYPE ", family, "\n"))) << family;
  }
  EXPECT_EQ(Sample(page, "dispatchd_leader"), 1);
  EXPECT_EQ(Sample(page, "dispatchd_workers"), 0);
  EXPECT_EQ(Sample(page, R"(dispatchd_worker_stream_messages_total{direction="received"})"), 0);
  EXPECT_EQ(Sample(page, R"(dispatchd_worker_stream_messages_total{direction="sent"})"), 0);
  EXPECT_EQ(Sample(page, R"(dispatchd_rate_limit_tokens{model="m1"})"), 5);

  // Jobs queued with no worker to run them; one refused for an unknown type.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    absl::StatusOr<std::string> id = daemon.Submit(Spec("echo", "queued first"));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  EXPECT_FALSE(daemon.Submit(Spec("nope", "x")).ok());
  page = Scrape(address);
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_queued{type="echo",tier="",model=""})"), 3) << page;
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_admitted_total{type="echo"})"), 3);
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_refused_total{type="nope",reason="invalid"})"), 1);
  EXPECT_GE(Sample(page, R"(dispatchd_store_batch_rows_count{op="insert"})"), 1);
  EXPECT_GE(Sample(page, R"(dispatchd_store_commit_seconds_count{op="insert"})"), 1);
  // Each Submit's wait for its statement, once (the refused one was never handed over).
  EXPECT_EQ(Sample(page, "dispatchd_store_insert_wait_seconds_count"), 3);

  // A worker drains them, and runs jobs of the rate-limited model too.
  std::unique_ptr<Worker> w =
      StartWorker(daemon, {.id = "w", .types = {"echo", "llm"}, .slots = 4});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(daemon.WaitForWorkers(1));
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::string> id = daemon.Submit(Spec(i % 2 == 0 ? "echo" : "llm", "run"));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon.WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  page = Scrape(address);
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_queued{type="echo",tier="",model=""})"), 0) << page;
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_running{type="echo",tier="",model=""})"), 0);
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_admitted_total{type="echo"})"), 6);
  EXPECT_EQ(Sample(page, R"(dispatchd_jobs_admitted_total{type="llm"})"), 2);
  EXPECT_EQ(Sample(page, R"(dispatchd_job_queue_wait_seconds_count{type="echo"})"), 6);
  EXPECT_EQ(Sample(page, R"(dispatchd_job_queue_wait_seconds_count{type="llm"})"), 2);
  // The 3 jobs that waited for a worker waited at least as long as it took to start one.
  EXPECT_GT(Sample(page, R"(dispatchd_job_queue_wait_seconds_sum{type="echo"})"), 0);
  EXPECT_EQ(Sample(page, R"(dispatchd_job_queue_wait_seconds_bucket{type="echo",le="+Inf"})"), 6);
  // Each attempt ran on the worker from its accept to its result.
  EXPECT_EQ(Sample(page, R"(dispatchd_job_run_seconds_count{type="echo"})"), 6) << page;
  EXPECT_EQ(Sample(page, R"(dispatchd_job_run_seconds_count{type="llm"})"), 2);
  EXPECT_GE(Sample(page, R"(dispatchd_store_batch_rows_count{op="turn"})"), 1);
  EXPECT_GE(Sample(page, R"(dispatchd_store_commit_seconds_count{op="turn"})"), 1);
  // Each job placed was decided in some turn.
  EXPECT_GE(Sample(page, "dispatchd_dispatch_decision_seconds_count"), 1);
  EXPECT_EQ(Sample(page, "dispatchd_workers"), 1);
  EXPECT_EQ(Sample(page, R"(dispatchd_type_workers{type="echo"})"), 1);
  EXPECT_EQ(Sample(page, R"(dispatchd_type_workers{type="llm"})"), 1);
  EXPECT_EQ(Sample(page, R"(dispatchd_worker_slots{state="free"})"), 4);
  EXPECT_EQ(Sample(page, R"(dispatchd_worker_slots{state="busy"})"), 0);
  EXPECT_EQ(Sample(page, R"(dispatchd_worker_model_loads_total{worker="w"})"), 1)
      << "m1 was loaded once";
  EXPECT_EQ(Sample(page, R"(dispatchd_rate_limit_waiting{model="m1"})"), 0);
  // The worker's stream carried its Hello, its accepts and its results; the daemon's, the
  // Welcome and the assignments.
  EXPECT_GE(Sample(page, R"(dispatchd_worker_stream_messages_total{direction="received"})"), 3);
  EXPECT_GE(Sample(page, R"(dispatchd_worker_stream_messages_total{direction="sent"})"), 2);
  EXPECT_EQ(httplib::Client(address.substr(0, address.rfind(':')),
                            std::stoi(address.substr(address.rfind(':') + 1)))
                .Get("/nothing-here")
                ->status,
            404);

  absl::StatusOr<int> rc = daemon.Terminate();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << daemon.process().Log();
}

}  // namespace
}  // namespace dispatchd::e2e
