// Paging the backlog end to end: a queue (a job type and a fairness key) holds at most
// `scheduler.queue_window` queued jobs in the daemon's memory; the rest wait in the database and
// are read in as the queue drains. Nothing may be lost, run twice or held back by it: jobs
// beyond the window still run exactly once, another key's jobs do not wait behind them, and
// counts and Status still see them. Real dispatchd and dispatch-worker processes.

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

constexpr char kWindow16[] = "scheduler:\n  queue_window: 16\n";

constexpr char kEchoQueued[] = R"(dispatchd_jobs_queued{type="echo",tier="",model=""})";
constexpr char kEchoPaged[] = R"(dispatchd_jobs_queued_paged{type="echo"})";
constexpr char kUnknownQueued[] = R"(dispatchd_accounting_repairs_total{kind="unknown_queued"})";

class PagingTest : public E2eTest {
 protected:
  std::unique_ptr<Daemon> StartPagingDaemon() { return StartDaemon({.extra_yaml = kWindow16}); }

  // Queues `n` echo jobs of `key` in one SubmitBatch; their ids in order. Payload: "<key> <i>".
  std::vector<std::string> QueueJobs(Daemon& d, const std::string& key, int n) {
    v1::SubmitBatchRequest req;
    for (int i = 0; i < n; ++i) {
      v1::JobSpec spec = Spec("echo", absl::StrCat(key, " ", i));
      spec.set_fairness_key(key);
      *req.add_specs() = spec;
    }
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    v1::SubmitBatchResponse resp;
    grpc::Status s = d.jobs().SubmitBatch(&ctx, req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    std::vector<std::string> ids;
    for (const v1::SubmitResponse& r : resp.results()) ids.push_back(r.job_id());
    return ids;
  }

  // Every job in `ids` ends SUCCEEDED with its own payload as result, and worker `w1` started
  // each once (its journal is read once they have ended).
  void ExpectEachRanOnce(Daemon& d, const std::vector<std::string>& ids,
                         const std::vector<std::string>& payloads, Worker& w) {
    std::vector<v1::Job> done;
    ASSERT_TRUE(d.WaitForTerminal(ids, &done, absl::Seconds(120)));
    const std::vector<JournalEvent> journal = ReadJournal(w.journal_path(), "w1");
    for (size_t i = 0; i < done.size(); ++i) {
      EXPECT_EQ(done[i].state(), v1::JOB_STATE_SUCCEEDED) << done[i].id();
      EXPECT_EQ(done[i].result(), payloads[i]) << done[i].id();
    }
    EXPECT_TRUE(EachStartedOnce(journal, ids));
  }
};

std::vector<std::string> Payloads(const std::string& key, int n) {
  std::vector<std::string> out;
  for (int i = 0; i < n; ++i) out.push_back(absl::StrCat(key, " ", i));
  return out;
}

TEST_F(PagingTest, QueueBeyondItsWindowRunsEveryJobOnceAndDoesNotHoldBackAnotherKey) {
  auto d = StartPagingDaemon();
  ASSERT_NE(d, nullptr);
  std::vector<std::string> alice = QueueJobs(*d, "alice", 300);
  std::vector<std::string> bob = QueueJobs(*d, "bob", 5);
  ASSERT_EQ(alice.size(), 300u);
  ASSERT_EQ(bob.size(), 5u);

  // The jobs beyond the window still count: in Stats, and in Status with their place in line.
  absl::StatusOr<v1::StatsResponse> stats = d->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->tiers_size(), 1);
  EXPECT_EQ(stats->tiers(0).queued(), 305);
  int64_t alice_queued = -1;
  for (const v1::KeyStats& k : stats->keys()) {
    if (k.fairness_key() == "alice") alice_queued = k.queued();
  }
  EXPECT_EQ(alice_queued, 300);
  absl::StatusOr<v1::Job> deep = d->Status(alice[199]);
  ASSERT_TRUE(deep.ok()) << deep.status();
  EXPECT_EQ(deep->state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(deep->wait_reason(), "in_line");
  EXPECT_EQ(deep->queue_position(), 200);

  // One slot: the worker starts jobs in the order they are dispatched.
  auto w = StartWorker(*d, {.id = "w1", .slots = 1});
  ASSERT_NE(w, nullptr);
  std::vector<std::string> ids = alice, payloads = Payloads("alice", 300);
  ids.insert(ids.end(), bob.begin(), bob.end());
  for (const std::string& p : Payloads("bob", 5)) payloads.push_back(p);
  ExpectEachRanOnce(*d, ids, payloads, *w);
  std::vector<JournalEvent> journal = ReadJournal(w->journal_path(), "w1");

  // Fair queuing still sees bob, whose queue is small, beside alice's long one: all of bob's
  // jobs start before the 100th of alice's.
  std::map<std::string, size_t> order;
  for (const JournalEvent& e : journal) {
    if (e.start) order.emplace(e.job_id, order.size());
  }
  size_t bob_last = 0;
  for (const std::string& id : bob) bob_last = std::max(bob_last, order[id]);
  EXPECT_LT(bob_last, order[alice[99]]);
  // And alice's jobs ran in their order (one worker, one key: FIFO).
  for (size_t i = 1; i < alice.size(); ++i) {
    EXPECT_LT(order[alice[i - 1]], order[alice[i]]) << "job " << i;
  }
}

TEST_F(PagingTest, RestartWithABacklogHoldsOnlyTheWindowAndRunsEveryJobOnce) {
  auto d = StartPagingDaemon();
  ASSERT_NE(d, nullptr);
  std::vector<std::string> ids = QueueJobs(*d, "alice", 500);
  ASSERT_EQ(ids.size(), 500u);
  d->Kill9();
  ASSERT_TRUE(d->Restart().ok());
  // All 500 are queued once it leads again, and all but the window's 16 wait in the database.
  ASSERT_TRUE(WaitFor([&] { return d->Metric(kEchoQueued) == 500; }, absl::Seconds(10)))
      << d->Metric(kEchoQueued);
  EXPECT_EQ(d->Metric(kEchoPaged), 500 - 16);
  auto w = StartWorker(*d, {.id = "w1", .slots = 8});
  ASSERT_NE(w, nullptr);
  ExpectEachRanOnce(*d, ids, Payloads("alice", 500), *w);
}

TEST_F(PagingTest, RowsWrittenBehindTheDaemonsBackBeyondAWindowAreFoundAndRun) {
  auto d = StartPagingDaemon();
  ASSERT_NE(d, nullptr);
  auto w = StartWorker(*d, {.id = "w1", .slots = 4});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(d->WaitForWorkers(1));
  // Old enough to count as drift rather than a race with a Submit in flight.
  Exec(
      "INSERT INTO jobs_active (id, type, payload, state, max_attempts, timeout_ms, created_at, "
      "updated_at) SELECT 'j_hidden_' || i, 'echo', ('hidden ' || i)::bytea, 'QUEUED', 3, "
      "60000, now() - interval '1 minute', now() - interval '1 minute' "
      "FROM generate_series(0, 99) AS i");
  std::vector<std::string> ids, payloads;
  for (int i = 0; i < 100; ++i) {
    ids.push_back(absl::StrCat("j_hidden_", i));
    payloads.push_back(absl::StrCat("hidden ", i));
  }
  ExpectEachRanOnce(*d, ids, payloads, *w);
  // The recount found them (those beyond a window were paged in, not counted as repairs).
  EXPECT_GE(d->Metric(kUnknownQueued), 1);
}

}  // namespace
}  // namespace dispatchd::e2e
