// The dispatcher against an in-memory store (tests/testing/fake_job_store.h) and a fake clock:
// what a worker, a client and the database can do to a job around one stream, without
// PostgreSQL. Each test waits on what a user would see (a message on the worker's stream, a row
// in the store) with a deadline, never on a sleep.

#include "server/dispatch/dispatcher.h"

#include <algorithm>
#include <future>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

#include "lib/sched/admission.h"
#include "lib/sched/admission_gate.h"
#include "server/config/yaml_config.h"
#include "server/metrics/daemon_metrics.h"
#include "server/store/group_inserter.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_job_store.h"

namespace dispatchd::dispatch {
namespace {

using job::JobState;

constexpr char kConfig[] = R"(
state_dir: /tmp
heartbeat_interval: 5s
worker_stale_after: 15s
orphan_grace: 30s
types:
  - name: echo
    max_attempts: 3
    timeout: 60s
    retry_backoff: 1s
    max_backoff: 1s
)";

config::Config TestConfig() {
  absl::StatusOr<config::Config> c = server::ParseConfig(kConfig, "dispatcher_test");
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Polls `done` until it holds or five seconds pass (real time: the dispatcher's loop and writer
// run on threads of their own).
template <typename F>
bool Eventually(F done) {
  const absl::Time deadline = absl::Now() + absl::Seconds(5);
  while (!done()) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

// The daemon's end of a worker stream: records what the dispatcher sends.
class Link final : public WorkerLink {
 public:
  void Send(v1::DaemonMessage msg) override {
    absl::MutexLock l(&mu_);
    sent_.push_back(std::move(msg));
  }
  void Close(const absl::Status& status) override {
    absl::MutexLock l(&mu_);
    closed_ = true;
    status_ = status;
  }
  std::string peer() const override { return "ipv4:127.0.0.1:40000"; }

  // The assignments sent so far, in order.
  std::vector<v1::Assignment> Assignments() const {
    absl::MutexLock l(&mu_);
    std::vector<v1::Assignment> out;
    for (const v1::DaemonMessage& m : sent_) {
      for (const v1::Assignment& a : m.assign().assignments()) out.push_back(a);
    }
    return out;
  }
  // The results acknowledged so far, as (job, attempt).
  std::vector<std::pair<std::string, int32_t>> Acks() const {
    absl::MutexLock l(&mu_);
    std::vector<std::pair<std::string, int32_t>> out;
    for (const v1::DaemonMessage& m : sent_) {
      for (const v1::ResultAck& a : m.result_acks().acks())
        out.emplace_back(a.job_id(), a.attempt());
      if (m.has_result_ack()) out.emplace_back(m.result_ack().job_id(), m.result_ack().attempt());
    }
    return out;
  }
  bool Acked(const std::string& job_id, int32_t attempt) const {
    for (const auto& a : Acks()) {
      if (a == std::pair{job_id, attempt}) return true;
    }
    return false;
  }
  // The Stopping messages sent so far.
  int Stoppings() const {
    absl::MutexLock l(&mu_);
    return static_cast<int>(std::count_if(
        sent_.begin(), sent_.end(), [](const v1::DaemonMessage& m) { return m.has_stopping(); }));
  }
  // The cancels sent so far, as (job, attempt).
  std::vector<std::pair<std::string, int32_t>> Cancels() const {
    absl::MutexLock l(&mu_);
    std::vector<std::pair<std::string, int32_t>> out;
    for (const v1::DaemonMessage& m : sent_) {
      if (m.has_cancel()) out.emplace_back(m.cancel().job_id(), m.cancel().attempt());
    }
    return out;
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<v1::DaemonMessage> sent_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

class DispatcherTest : public ::testing::Test {
 protected:
  DispatcherTest() : config_(TestConfig()), gate_(config_) {}
  ~DispatcherTest() override {
    store_.Release();  // a write a failed test left stalled must not hold up the stop
    inserter_.reset();
    if (dispatcher_ != nullptr) dispatcher_->Stop();
  }

  // An echo job as a Submit admits it.
  job::Job EchoJob(const std::string& id, const std::string& idempotency_key = "") {
    job::JobSpec spec;
    spec.type = "echo";
    spec.payload = "payload of " + id;
    spec.idempotency_key = idempotency_key;
    absl::StatusOr<job::JobSpec> resolved = sched::ResolveSpec(config_, std::move(spec));
    EXPECT_TRUE(resolved.ok()) << resolved.status();
    job::Job job;
    job.id = id;
    job.spec = *std::move(resolved);
    job.created_at = clock_.TimeNow();
    return job;
  }

  // Stores a QUEUED echo job.
  void Submit(const std::string& id) { ASSERT_TRUE(store_.Insert(EchoJob(id)).ok()); }

  // Submits `jobs` as the leader's Submit does: through a GroupInserter that the dispatcher
  // places them with, and once they are committed to the dispatcher (JobQueued). The future
  // holds the insert's outcomes.
  std::future<absl::StatusOr<std::vector<store::InsertOutcome>>> SubmitLive(
      std::vector<job::Job> jobs) {
    if (inserter_ == nullptr)
      inserter_ = std::make_unique<store::GroupInserter>(store_, store::GroupInserter::Options{});
    auto promise =
        std::make_shared<std::promise<absl::StatusOr<std::vector<store::InsertOutcome>>>>();
    std::future<absl::StatusOr<std::vector<store::InsertOutcome>>> future = promise->get_future();
    inserter_->Insert(
        std::move(jobs), /*notify_leader=*/false,
        [this, promise](std::vector<job::Job> written,
                        absl::StatusOr<std::vector<store::InsertOutcome>> outcomes) {
          for (size_t i = 0; outcomes.ok() && i < written.size(); ++i) {
            const store::InsertOutcome& o = (*outcomes)[i];
            if (o.deduplicated) continue;
            written[i].seq = o.seq;
            if (o.dispatched) written[i].state = JobState::kDispatched;
            sched::Reservation none;
            dispatcher_->JobQueued(written[i], none);
          }
          promise->set_value(std::move(outcomes));
        },
        std::shared_ptr<store::Placer>(dispatcher_.get(), [](store::Placer*) {}));
    return future;
  }

  void Start() {
    dispatcher_ = std::make_unique<Dispatcher>(config_, store_, clock_, events_, gate_);
    ASSERT_TRUE(dispatcher_->Start().ok());
  }

  // A worker of echo with `slots` slots says Hello on a new stream.
  std::shared_ptr<Link> Connect(const std::string& worker_id, int slots = 4) {
    auto link = std::make_shared<Link>();
    v1::Hello hello;
    hello.set_worker_id(worker_id);
    hello.add_types("echo");
    hello.set_slots(slots);
    hello.set_batching(true);
    dispatcher_->WorkerConnected(link, hello);
    return link;
  }

  void Send(const std::shared_ptr<Link>& link, v1::WorkerMessage msg) {
    dispatcher_->WorkerMessage(link, std::move(msg));
  }
  void Accept(const std::shared_ptr<Link>& link, const std::string& job_id, int32_t attempt) {
    v1::WorkerMessage m;
    m.mutable_accept()->set_job_id(job_id);
    m.mutable_accept()->set_attempt(attempt);
    Send(link, std::move(m));
  }
  void Succeed(const std::shared_ptr<Link>& link, const std::string& job_id, int32_t attempt) {
    v1::WorkerMessage m;
    m.mutable_result()->set_job_id(job_id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->set_output("out of " + job_id);
    m.mutable_result()->mutable_run_time()->set_seconds(2);
    Send(link, std::move(m));
  }
  void Fail(const std::shared_ptr<Link>& link, const std::string& job_id, int32_t attempt) {
    v1::WorkerMessage m;
    m.mutable_result()->set_job_id(job_id);
    m.mutable_result()->set_attempt(attempt);
    m.mutable_result()->mutable_failure()->set_message("out of memory");
    m.mutable_result()->mutable_failure()->set_retryable(true);
    Send(link, std::move(m));
  }
  void Heartbeat(const std::shared_ptr<Link>& link,
                 const std::vector<std::pair<std::string, int32_t>>& held = {}) {
    v1::WorkerMessage m;
    for (const auto& [id, attempt] : held) {
      v1::HeldJob* h = m.mutable_heartbeat()->add_running_jobs();
      h->set_job_id(id);
      h->set_attempt(attempt);
    }
    m.mutable_heartbeat();
    Send(link, std::move(m));
  }

  // The job's row as the store has it.
  job::Job Row(const std::string& id) {
    absl::StatusOr<job::Job> row = store_.Get(id);
    EXPECT_TRUE(row.ok()) << row.status();
    return row.ok() ? *row : job::Job{};
  }
  bool RowIs(const std::string& id, JobState state, int32_t attempt) {
    absl::StatusOr<job::Job> row = store_.Get(id);
    return row.ok() && row->state == state && row->attempt == attempt;
  }
  bool Assigned(const std::shared_ptr<Link>& link, const std::string& id, int32_t attempt) {
    for (const v1::Assignment& a : link->Assignments()) {
      if (a.job_id() == id && a.attempt() == attempt) return true;
    }
    return false;
  }
  // Waits until the store has answered `n` more turns than `before` and the loop has applied
  // them and sent what they release (acks, assignments).
  bool TurnsAnswered(int64_t before, int64_t n = 1) {
    if (!Eventually([&] { return dispatcher_->turns_answered() >= before + n; })) return false;
    dispatcher_->Workers();  // the loop turn that applied them has flushed its messages
    return true;
  }
  // Moves the clock on by `d`, a second at a time, with a heartbeat from `link` each second so
  // that its worker stays connected, and lets the loop sweep after each step.
  void Pass(absl::Duration d, const std::shared_ptr<Link>& link,
            const std::vector<std::pair<std::string, int32_t>>& held = {}) {
    for (absl::Duration gone; gone < d; gone += absl::Seconds(1)) {
      clock_.Advance(absl::Seconds(1));
      if (link != nullptr) Heartbeat(link, held);
      dispatcher_->Workers();  // a loop turn ...
      dispatcher_->Workers();  // ... and the sweep after it
    }
  }

  config::Config config_;
  testing::FakeClock clock_;
  testing::FakeJobStore store_{&clock_};
  JobEvents events_;
  sched::AdmissionGate gate_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<store::GroupInserter> inserter_;  // SubmitLive's
};

TEST_F(DispatcherTest, AJobRunsAndItsResultIsAcknowledgedOnceDurable) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  EXPECT_EQ(w1->Assignments()[0].payload(), "payload of j1");
  EXPECT_TRUE(RowIs("j1", JobState::kDispatched, 0));
  Accept(w1, "j1", 1);
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(Eventually([&] { return w1->Acked("j1", 1); }));
  const job::Job row = Row("j1");
  EXPECT_EQ(row.state, JobState::kSucceeded);
  EXPECT_EQ(row.attempt, 1);
  EXPECT_EQ(row.result, "out of j1");
  // Its RUNNING mark was never written (the result came first): it started when it ran from.
  EXPECT_EQ(row.finished_at - row.started_at, absl::Seconds(2));
  EXPECT_EQ(store_.misuses(), 0);
}

TEST_F(DispatcherTest, AWriteTheDatabaseRefusesGoesAgainAfterThePause) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  store_.FailNext("WriteTurn", absl::UnavailableError("database restarting"));
  const int64_t before = dispatcher_->turns_answered();
  Accept(w1, "j1", 1);
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(TurnsAnswered(before));
  // Not durable, so not acknowledged: the worker keeps the result.
  EXPECT_FALSE(w1->Acked("j1", 1));
  EXPECT_TRUE(RowIs("j1", JobState::kDispatched, 0));
  // After the pause the same write goes again, and lands.
  Pass(absl::Seconds(1), w1, {{"j1", 1}});
  ASSERT_TRUE(Eventually([&] { return w1->Acked("j1", 1); }));
  EXPECT_TRUE(RowIs("j1", JobState::kSucceeded, 1));
  EXPECT_EQ(Row("j1").result, "out of j1");
}

TEST_F(DispatcherTest, AStreamThatBreaksBeforeAcceptGivesTheJobBackWithNoAttemptUsed) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  dispatcher_->WorkerDisconnected(w1);
  dispatcher_->Workers();  // the loop has seen the stream end, at this time
  // The worker may come back for its jobs; once it is stale they go back to the queue.
  auto w2 = Connect("w2");
  Pass(absl::Seconds(16), w2);
  ASSERT_TRUE(Eventually([&] { return Assigned(w2, "j1", 1); }));
  EXPECT_EQ(Row("j1").worker_id, "w2");
  EXPECT_EQ(Row("j1").attempt, 0);
}

TEST_F(DispatcherTest, AResultForAnOldAttemptIsAcknowledgedAndChangesNothing) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  Accept(w1, "j1", 1);
  Fail(w1, "j1", 1);  // retryable: attempt 2 after the backoff
  ASSERT_TRUE(Eventually([&] { return RowIs("j1", JobState::kQueued, 1); }));
  EXPECT_EQ(Row("j1").error, "out of memory");
  Pass(absl::Seconds(2), w1);
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 2); }));
  Accept(w1, "j1", 2);
  // A late success of attempt 1: the worker may forget it; the row stays with attempt 2.
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(Eventually([&] {
    const auto acks = w1->Acks();
    return std::count(acks.begin(), acks.end(), std::pair<std::string, int32_t>{"j1", 1}) == 2;
  }));
  EXPECT_EQ(Row("j1").attempt, 1);  // DISPATCHED at 1 (or RUNNING at 2 once marked): not ended
  EXPECT_FALSE(job::IsTerminal(Row("j1").state));
  Succeed(w1, "j1", 2);
  ASSERT_TRUE(Eventually([&] { return RowIs("j1", JobState::kSucceeded, 2); }));
}

TEST_F(DispatcherTest, AReconcileHoldsAStrayRowAndGivesItBackAfterTheGrace) {
  Start();
  auto w1 = Connect("w1");
  // A row placed behind the dispatcher's back, on a worker that never connects.
  Submit("stray");
  ASSERT_TRUE(store_.Claim({{.job_id = "stray", .attempt = 0, .worker_id = "ghost"}}).ok());
  Pass(absl::Seconds(16), w1);  // past the reconcile interval and the settle time
  ASSERT_TRUE(Eventually([&] { return dispatcher_->repairs() == 1; }));
  EXPECT_TRUE(RowIs("stray", JobState::kDispatched, 0));  // its worker may still come back
  Pass(absl::Seconds(31), w1);                            // it does not
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "stray", 1); }));
  EXPECT_EQ(Row("stray").worker_id, "w1");
}

TEST_F(DispatcherTest, AFailoverMidTurnWritesNothingAndAcknowledgesNothing) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  store_.StallNext("WriteTurn");
  const int64_t before = dispatcher_->turns_answered();
  Accept(w1, "j1", 1);
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(store_.AwaitStalled(absl::Seconds(5)));
  store_.SetLeaderEpoch(1);  // another daemon wins the lease while the turn is in the database
  store_.Release();
  ASSERT_TRUE(TurnsAnswered(before));
  EXPECT_FALSE(w1->Acked("j1", 1));  // the worker keeps its result for the next leader
  EXPECT_TRUE(RowIs("j1", JobState::kDispatched, 0));
  // Nothing this term writes lands from now on.
  Pass(absl::Seconds(3), w1, {{"j1", 1}});
  EXPECT_FALSE(w1->Acked("j1", 1));
  EXPECT_TRUE(RowIs("j1", JobState::kDispatched, 0));
  EXPECT_EQ(store_.misuses(), 0);
}

TEST_F(DispatcherTest, AWorkerLostWhileItsClaimIsWrittenDoesNotKeepTheJob) {
  Submit("j1");
  Start();
  store_.StallNext("WriteTurn");
  auto w1 = Connect("w1");
  ASSERT_TRUE(store_.AwaitStalled(absl::Seconds(5)));  // the claim of j1 for w1
  dispatcher_->WorkerDisconnected(w1);
  dispatcher_->Workers();  // the loop has seen the stream end, at this time
  auto w2 = Connect("w2");
  Pass(absl::Seconds(16), w2);  // w1 is lost meanwhile
  store_.Release();
  ASSERT_TRUE(Eventually([&] { return Assigned(w2, "j1", 1); }));
  EXPECT_TRUE(w1->Assignments().empty());
  EXPECT_EQ(Row("j1").worker_id, "w2");
}

TEST_F(DispatcherTest, ACancelWhileTheResultIsWrittenLetsTheWorkerForgetIt) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  Accept(w1, "j1", 1);
  store_.StallNext("WriteTurn");
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(store_.AwaitStalled(absl::Seconds(5)));
  absl::StatusOr<store::CancelOutcome> c = store_.Cancel("j1", "client cancelled");
  ASSERT_TRUE(c.ok());
  dispatcher_->JobCancelled("j1", c->previous);
  // The worker may forget its result: it is moot.
  ASSERT_TRUE(Eventually([&] { return w1->Acked("j1", 1); }));
  store_.Release();
  EXPECT_TRUE(Eventually([&] { return RowIs("j1", JobState::kCancelled, 0); }));
  EXPECT_EQ(store_.misuses(), 0);
}

TEST_F(DispatcherTest, AJobSubmittedWhileAWorkerIsFreeReachesItWithItsInsertsCommit) {
  Start();
  auto w1 = Connect("w1");
  dispatcher_->Workers();  // the Hello is applied
  // A turn would stall: the job must reach its worker without one (no claim).
  store_.StallNext("WriteTurn");
  absl::StatusOr<std::vector<store::InsertOutcome>> out = SubmitLive({EchoJob("j1")}).get();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_TRUE((*out)[0].dispatched);
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  EXPECT_EQ(w1->Assignments()[0].payload(), "payload of j1");
  EXPECT_TRUE(RowIs("j1", JobState::kDispatched, 0));
  EXPECT_EQ(Row("j1").worker_id, "w1");
  store_.Release();
  Accept(w1, "j1", 1);
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(Eventually([&] { return w1->Acked("j1", 1); }));
  EXPECT_TRUE(RowIs("j1", JobState::kSucceeded, 1));
  EXPECT_EQ(store_.misuses(), 0);
}

TEST_F(DispatcherTest, ADeposedLeaderPlacesNothingItsInsertQueuesTheJobForTheNextLeader) {
  Start();
  auto w1 = Connect("w1");
  dispatcher_->Workers();
  store_.SetLeaderEpoch(2);  // another daemon leads now
  absl::StatusOr<std::vector<store::InsertOutcome>> out = SubmitLive({EchoJob("j1")}).get();
  ASSERT_TRUE(out.ok()) << out.status();
  EXPECT_FALSE((*out)[0].dispatched);
  EXPECT_TRUE(RowIs("j1", JobState::kQueued, 0));
  EXPECT_EQ(Row("j1").worker_id, "");
  EXPECT_EQ(store_.notified(), std::vector<std::string>{"j1"});
}

TEST_F(DispatcherTest, AWorkerLostWhileItsJobsInsertIsWrittenDoesNotKeepTheJob) {
  Start();
  auto w1 = Connect("w1");
  dispatcher_->Workers();
  store_.StallNext("InsertMany");
  std::future<absl::StatusOr<std::vector<store::InsertOutcome>>> out = SubmitLive({EchoJob("j1")});
  ASSERT_TRUE(store_.AwaitStalled(absl::Seconds(5)));  // j1 placed on w1, being written
  dispatcher_->WorkerDisconnected(w1);
  dispatcher_->Workers();
  auto w2 = Connect("w2");
  Pass(absl::Seconds(16), w2);  // w1 is lost meanwhile
  store_.Release();
  absl::StatusOr<std::vector<store::InsertOutcome>> written = out.get();
  ASSERT_TRUE(written.ok()) << written.status();
  EXPECT_TRUE((*written)[0].dispatched);  // to w1, gone: the row goes back and on to w2
  ASSERT_TRUE(Eventually([&] { return Assigned(w2, "j1", 1); }));
  EXPECT_TRUE(w1->Assignments().empty());
  EXPECT_EQ(Row("j1").worker_id, "w2");
  EXPECT_EQ(store_.misuses(), 0);
}

TEST_F(DispatcherTest, APlacedDuplicateGivesItsSlotBack) {
  Start();
  auto w1 = Connect("w1", /*slots=*/2);
  dispatcher_->Workers();
  absl::StatusOr<std::vector<store::InsertOutcome>> first =
      SubmitLive({EchoJob("j1", "order-1")}).get();
  ASSERT_TRUE(first.ok() && (*first)[0].dispatched);
  // Placed on w1's second slot, but its key is held: nothing is written.
  absl::StatusOr<std::vector<store::InsertOutcome>> again =
      SubmitLive({EchoJob("j2", "order-1")}).get();
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_TRUE((*again)[0].deduplicated);
  EXPECT_FALSE((*again)[0].dispatched);
  EXPECT_EQ((*again)[0].job_id, "j1");
  // The slot it held is free again.
  absl::StatusOr<std::vector<store::InsertOutcome>> next = SubmitLive({EchoJob("j3")}).get();
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_TRUE((*next)[0].dispatched);
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j3", 1); }));
  EXPECT_FALSE(Assigned(w1, "j2", 1));
  EXPECT_EQ(store_.misuses(), 0);
}

TEST_F(DispatcherTest, AStoppingDaemonAssignsNothingMoreAndStillRecordsResults) {
  Submit("j1");
  Submit("j2");
  Start();
  auto w1 = Connect("w1", /*slots=*/1);
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  ASSERT_TRUE(dispatcher_->StopAssigning("the daemon is stopping"));
  EXPECT_EQ(w1->Stoppings(), 1);
  EXPECT_EQ(dispatcher_->JobsInFlight(), 1);
  // A worker that connects now is told too.
  auto w2 = Connect("w2");
  dispatcher_->Workers();
  EXPECT_EQ(w2->Stoppings(), 1);

  Accept(w1, "j1", 1);
  Succeed(w1, "j1", 1);
  ASSERT_TRUE(Eventually([&] { return w1->Acked("j1", 1); }));
  EXPECT_TRUE(RowIs("j1", JobState::kSucceeded, 1));
  EXPECT_EQ(dispatcher_->JobsInFlight(), 0);
  // The turn that freed w1's slot would have given it j2, and so would a later one; j2 stays
  // queued for the next leader.
  Pass(absl::Seconds(2), w1);
  EXPECT_EQ(w1->Assignments().size(), 1u);
  EXPECT_TRUE(w2->Assignments().empty());
  EXPECT_TRUE(RowIs("j2", JobState::kQueued, 0));
}

TEST_F(DispatcherTest, TwoMissedHeartbeatsRequeueTheJob) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1");
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1); }));
  Accept(w1, "j1", 1);
  Heartbeat(w1);  // without j1
  Heartbeat(w1);
  ASSERT_TRUE(Eventually([&] { return RowIs("j1", JobState::kQueued, 1); }));
  EXPECT_EQ(Row("j1").error, "interrupted: worker w1 stopped reporting it");
  const auto cancels = w1->Cancels();
  EXPECT_NE(std::find(cancels.begin(), cancels.end(), std::pair<std::string, int32_t>{"j1", 1}),
            cancels.end());
  EXPECT_EQ(dispatcher_->repairs(), 1);
}

// Turns overlap up to postgres.turns_in_flight and no further: a result that comes while that
// many are in the database waits for one of them, then lands. The gauge operators read says so.
TEST_F(DispatcherTest, TurnsOverlapUpToTheConfiguredNumberAndTheRestWait) {
  config_.postgres.turns_in_flight = 3;
  const std::vector<std::string> ids = {"j1", "j2", "j3", "j4"};
  for (const std::string& id : ids) Submit(id);
  Start();
  auto w1 = Connect("w1", /*slots=*/8);
  for (const std::string& id : ids) {
    ASSERT_TRUE(Eventually([&] { return Assigned(w1, id, 1); })) << id;
    Accept(w1, id, 1);
  }
  const metrics::Gauge& gauge = metrics::Metrics().turns_in_flight.With({});
  dispatcher_->Workers();  // the claims' turn is applied
  EXPECT_EQ(gauge.value(), 0);
  store_.StallNext("WriteTurn", 4);  // a fourth turn, were it let in, would stall too
  // Each result goes in a turn of its own, started while the ones before it are in the database.
  for (int i = 0; i < 3; ++i) {
    Succeed(w1, ids[i], 1);
    ASSERT_TRUE(store_.AwaitStalled(absl::Seconds(5), i + 1)) << "turn " << i + 1 << " not begun";
    EXPECT_EQ(gauge.value(), i + 1);
  }
  // The fourth waits: the loop has taken the result and owes its write (a pass of the loop runs
  // its tasks, this Workers() among them, then starts a turn; the second Workers() runs in a
  // later pass), but three turns are in the database.
  Succeed(w1, ids[3], 1);
  dispatcher_->Workers();
  dispatcher_->Workers();
  EXPECT_EQ(gauge.value(), 3);
  EXPECT_TRUE(w1->Acks().empty());
  store_.Release();
  for (const std::string& id : ids) {
    EXPECT_TRUE(Eventually([&] { return w1->Acked(id, 1); })) << id;
    EXPECT_TRUE(RowIs(id, JobState::kSucceeded, 1)) << id;
  }
  ASSERT_TRUE(Eventually([&] { return gauge.value() == 0; }));
  EXPECT_EQ(store_.misuses(), 0);
}

// A heartbeat does not wake the loop (PostUnhurried), but it is never overtaken: whatever the
// worker sent after it, and any call that reads the loop's state, sees it applied.
TEST_F(DispatcherTest, AHeartbeatIsAppliedBeforeAnythingThatCameAfterIt) {
  Start();
  auto w1 = Connect("w1");
  for (int64_t used : {int64_t{1} << 30, int64_t{5} << 30, int64_t{3} << 30}) {
    v1::WorkerMessage m;
    m.mutable_heartbeat()->set_ram_used_bytes(used);
    m.mutable_heartbeat()->set_ram_total_bytes(int64_t{100} << 30);
    m.mutable_heartbeat()->add_models_resident(absl::StrCat("m", used >> 30));
    Send(w1, std::move(m));
    std::vector<v1::WorkerInfo> workers = dispatcher_->Workers();
    ASSERT_EQ(workers.size(), 1u);
    EXPECT_EQ(workers[0].ram_used_bytes(), used);
    ASSERT_EQ(workers[0].models_resident_size(), 1);
    EXPECT_EQ(workers[0].models_resident(0), absl::StrCat("m", used >> 30));
  }
}

}  // namespace
}  // namespace dispatchd::dispatch
