#pragma once

// The fixture of the dispatcher's unit tests (dispatcher_test.cc, dispatcher_writes_test.cc): a
// Dispatcher against an in-memory store (tests/testing/fake_job_store.h) and a fake clock, and
// the daemon's end of a worker stream that records what the dispatcher sends. Each test waits on
// what a user would see (a message on the worker's stream, a row in the store) with a deadline,
// never on a sleep.

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
#include "server/dispatch/dispatcher.h"
#include "server/store/group_inserter.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fake_job_store.h"

namespace dispatchd::dispatch::dispatcher_testing {

using job::JobState;

inline constexpr char kConfig[] = R"(
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

inline config::Config TestConfig() {
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

}  // namespace dispatchd::dispatch::dispatcher_testing
