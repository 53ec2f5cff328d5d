// Recovery rules against a real daemon: a worker that stops reporting a job it was given (a
// leaked slot), a late result from an attempt that was retried elsewhere, and `on_orphan: fail`.
// The misbehaving worker speaks the raw protocol (fake_worker.h); the others are dispatch-worker.

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <signal.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/fake_worker.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

v1::Hello FakeHello(const std::string& id) {
  v1::Hello hello;
  hello.set_worker_id(id);
  hello.add_types("echo");
  hello.set_slots(1);
  return hello;
}

// The /metrics series of the repairs of one kind.
std::string Repairs(const std::string& kind) {
  return absl::StrCat(R"(dispatchd_accounting_repairs_total{kind=")", kind, R"("})");
}

constexpr char kDiscarded[] = "dispatchd_results_discarded_total";
constexpr char kRefusedBusy[] = R"(dispatchd_worker_refusals_total{reason="resource_exhausted"})";

using RecoveryTest = E2eTest;

// A worker accepts a job and then forgets it (an SDK bug): it keeps heartbeating without it. The
// daemon would otherwise count its only slot busy for ever; it must notice from the heartbeats,
// retry the job, and give the slot back.
TEST_F(RecoveryTest, SlotLeakedByAWorkerThatForgetsAJobIsFoundAndFreed) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  FakeWorker w(d->address(), FakeHello("forgetful"));
  ASSERT_TRUE(
      w.Next([](const v1::DaemonMessage& m) { return m.has_welcome(); }, absl::Seconds(10)));

  absl::StatusOr<std::string> first = d->Submit(Spec("echo", "first"));
  ASSERT_TRUE(first.ok()) << first.status();
  std::optional<v1::Assignment> a1 = w.NextAssignment(absl::Seconds(10));
  ASSERT_TRUE(a1.has_value());
  ASSERT_EQ(a1->job_id(), *first);
  w.SendAccept(a1->job_id(), a1->attempt());
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> j = d->Status(*first);
        return j.ok() && j->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(10)));

  absl::StatusOr<std::string> second = d->Submit(Spec("echo", "second"));
  ASSERT_TRUE(second.ok()) << second.status();
  // Heartbeats without the job: the leak. Without repair no further assignment ever comes.
  std::optional<v1::Assignment> a2;
  for (int i = 0; i < 40 && !a2.has_value(); ++i) {
    w.SendHeartbeat({});
    a2 = w.NextAssignment(absl::Milliseconds(250));
  }
  ASSERT_TRUE(a2.has_value()) << "the leaked slot was never freed";
  // The forgotten job was retried (attempt 2) or the second job got the freed slot; either way
  // the worker now runs it properly.
  w.SendAccept(a2->job_id(), a2->attempt());
  w.SendResult(a2->job_id(), a2->attempt(), "done");
  std::optional<v1::Assignment> a3 = w.NextAssignment(absl::Seconds(10));
  ASSERT_TRUE(a3.has_value());
  w.SendAccept(a3->job_id(), a3->attempt());
  w.SendResult(a3->job_id(), a3->attempt(), "done");

  std::vector<v1::Job> done;
  ASSERT_TRUE(d->WaitForTerminal({*first, *second}, &done, absl::Seconds(30)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done[0].attempt(), 2) << "the forgotten attempt counts as interrupted";
  EXPECT_EQ(done[1].state(), v1::JOB_STATE_SUCCEEDED);
  absl::StatusOr<v1::StatsResponse> stats = d->Stats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_GE(stats->accounting_repairs(), 1);
  // Found from the heartbeats that stopped listing it, not by any other repair.
  EXPECT_GE(d->Metric(Repairs("lost_on_worker")), 1);
  EXPECT_EQ(d->Metric(Repairs("count_drift")), 0);
}

// A worker goes silent past the stale threshold while running attempt 1; the job is retried on
// another worker and succeeds. When the first worker comes back with its result for attempt 1,
// the result is acknowledged and discarded: the job keeps the second attempt's result.
TEST_F(RecoveryTest, LateResultOfARequeuedAttemptIsIgnored) {
  auto d = StartDaemon({.types = {{.name = "echo", .max_attempts = 3, .on_orphan = "requeue"}}});
  ASSERT_NE(d, nullptr);
  auto slow = std::make_unique<FakeWorker>(d->address(), FakeHello("slow"));
  ASSERT_TRUE(
      slow->Next([](const v1::DaemonMessage& m) { return m.has_welcome(); }, absl::Seconds(10)));
  absl::StatusOr<std::string> id = d->Submit(Spec("echo", "payload"));
  ASSERT_TRUE(id.ok()) << id.status();
  std::optional<v1::Assignment> a1 = slow->NextAssignment(absl::Seconds(10));
  ASSERT_TRUE(a1.has_value());
  slow->SendAccept(a1->job_id(), 1);
  // Silence: no heartbeat. The daemon declares the worker lost and ends its stream.
  ASSERT_TRUE(slow->Ended(absl::Seconds(20)));

  std::unique_ptr<Worker> good = StartWorker(*d, {.id = "good", .mode = {"--exec", "cat"}});
  ASSERT_NE(good, nullptr);
  std::vector<v1::Job> done;
  ASSERT_TRUE(d->WaitForTerminal({*id}, &done, absl::Seconds(30)));
  ASSERT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED);
  ASSERT_EQ(done[0].attempt(), 2);
  ASSERT_EQ(done[0].result(), "payload");

  // The first worker comes back and reports attempt 1 finished.
  v1::Hello hello = FakeHello("slow");
  v1::HeldJob* held = hello.add_running_jobs();
  held->set_job_id(*id);
  held->set_attempt(1);
  FakeWorker back(d->address(), hello);
  std::optional<v1::DaemonMessage> welcome =
      back.Next([](const v1::DaemonMessage& m) { return m.has_welcome(); }, absl::Seconds(10));
  ASSERT_TRUE(welcome.has_value());
  EXPECT_EQ(welcome->welcome().adopted_jobs_size(), 0) << "attempt 1 is not current any more";
  EXPECT_EQ(d->Metric(kDiscarded), 0);
  back.SendResult(*id, 1, "late and stale");
  std::optional<v1::DaemonMessage> ack =
      back.Next([](const v1::DaemonMessage& m) { return m.has_result_ack(); }, absl::Seconds(10));
  ASSERT_TRUE(ack.has_value()) << "a stale result is still acknowledged, so it is not resent";
  EXPECT_EQ(ack->result_ack().attempt(), 1);

  absl::StatusOr<v1::Job> after = d->Status(*id);
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(after->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(after->attempt(), 2);
  EXPECT_EQ(after->result(), "payload");
  EXPECT_EQ(d->Metric(kDiscarded), 1) << "the late result, and only it, was discarded";
}

// on_orphan: fail ends a running job FAILED ("interrupted") when its worker dies; nothing retries
// it even though attempts remain.
TEST_F(RecoveryTest, OrphanFailPolicyEndsTheJobWhenItsWorkerDies) {
  auto d = StartDaemon({.types = {{.name = "gpu", .max_attempts = 5, .on_orphan = "fail"}}});
  ASSERT_NE(d, nullptr);
  std::unique_ptr<Worker> w =
      StartWorker(*d, {.id = "w1", .types = {"gpu"}, .mode = {"--simulate", "100%:60s"}});
  ASSERT_NE(w, nullptr);
  absl::StatusOr<std::string> id = d->Submit(Spec("gpu", "x"));
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> j = d->Status(*id);
        return j.ok() && j->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(20)));
  w->process().Signal(SIGKILL);
  std::vector<v1::Job> done;
  ASSERT_TRUE(d->WaitForTerminal({*id}, &done, absl::Seconds(30)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(done[0].attempt(), 1);
  EXPECT_THAT(done[0].error(), HasSubstr("interrupted"));
}

// Retry to deadline: a job every worker refuses (RESOURCE_EXHAUSTED) goes back to the queue with no
// attempt used, is offered again and again, and ends EXPIRED with a "capacity:" error once its
// dispatch deadline passes.
TEST_F(RecoveryTest, JobRefusedEverywhereExpiresAtItsDispatchDeadline) {
  auto d = StartDaemon({.types = {{.name = "gpu"}}});
  ASSERT_NE(d, nullptr);
  // It advertises 4 slots but runs one job at a time: the rest are refused.
  std::unique_ptr<Worker> w = StartWorker(*d, {.id = "w1",
                                               .types = {"gpu"},
                                               .slots = 4,
                                               .max_concurrent = 1,
                                               .mode = {"--simulate", "100%:60s"}});
  ASSERT_NE(w, nullptr);
  absl::StatusOr<std::string> busy = d->Submit(Spec("gpu", "long"));
  ASSERT_TRUE(busy.ok()) << busy.status();
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> j = d->Status(*busy);
        return j.ok() && j->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(20)));
  EXPECT_EQ(d->Metric(kRefusedBusy), 0);
  v1::JobSpec spec = Spec("gpu", "waits");
  spec.mutable_dispatch_deadline()->set_seconds(3);
  absl::StatusOr<std::string> id = d->Submit(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  std::vector<v1::Job> done;
  ASSERT_TRUE(d->WaitForTerminal({*id}, &done, absl::Seconds(30)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_EXPIRED);
  EXPECT_EQ(done[0].attempt(), 0) << "a refusal uses no attempt";
  EXPECT_THAT(done[0].error(), ::testing::StartsWith("capacity:"));
  // The worker was offered it and said it was full (the only job that could be refused).
  EXPECT_GE(d->Metric(kRefusedBusy), 1);
}

// The database refuses the RUNNING mark of an accepted job (injected with a trigger), so the
// row stays DISPATCHED while the worker runs attempt 1. The worker's retryable failure must still
// consume that attempt and requeue the job, not be mistaken for a result of a job that moved on
// (which would leave the row DISPATCHED with nobody to run it).
TEST_F(RecoveryTest, FailureOfAnAcceptWhoseRunningMarkFailedStillRetries) {
  auto d = StartDaemon({.types = {{.name = "echo", .max_attempts = 3}}});
  ASSERT_NE(d, nullptr);
  FakeWorker w(d->address(), FakeHello("w1"));
  ASSERT_TRUE(
      w.Next([](const v1::DaemonMessage& m) { return m.has_welcome(); }, absl::Seconds(10)));
  Exec(R"sql(
CREATE FUNCTION refuse_running() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.state = 'RUNNING' THEN RAISE EXCEPTION 'injected fault: no RUNNING marks'; END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER refuse_running BEFORE UPDATE ON jobs_active FOR EACH ROW
  EXECUTE FUNCTION refuse_running();
)sql");
  absl::StatusOr<std::string> id = d->Submit(Spec("echo", "payload"));
  ASSERT_TRUE(id.ok()) << id.status();
  std::optional<v1::Assignment> a1 = w.NextAssignment(absl::Seconds(10));
  ASSERT_TRUE(a1.has_value());
  ASSERT_EQ(a1->attempt(), 1);
  w.SendAccept(*id, 1);
  ASSERT_TRUE(
      WaitFor([&] { return d->Metric(R"(dispatchd_store_write_errors_total{kind="mark"})") >= 1; },
              absl::Seconds(10)));
  absl::StatusOr<v1::Job> mid = d->Status(*id);
  ASSERT_TRUE(mid.ok());
  EXPECT_EQ(mid->state(), v1::JOB_STATE_DISPATCHED) << "the mark was refused";

  v1::WorkerMessage failure;
  failure.mutable_result()->set_job_id(*id);
  failure.mutable_result()->set_attempt(1);
  failure.mutable_result()->mutable_failure()->set_message("CUDA error: out of memory");
  failure.mutable_result()->mutable_failure()->set_retryable(true);
  ASSERT_TRUE(w.Send(failure));
  ASSERT_TRUE(
      w.Next([](const v1::DaemonMessage& m) { return m.has_result_ack(); }, absl::Seconds(10)));
  Exec("DROP TRIGGER refuse_running ON jobs_active");
  // Attempt 1 is spent; the retry runs as attempt 2 once its backoff has passed.
  std::optional<v1::Assignment> a2 = w.NextAssignment(absl::Seconds(30));
  ASSERT_TRUE(a2.has_value()) << "the job was never requeued";
  EXPECT_EQ(a2->job_id(), *id);
  EXPECT_EQ(a2->attempt(), 2);
  w.SendAccept(*id, 2);
  w.SendResult(*id, 2, "done");
  std::vector<v1::Job> done;
  ASSERT_TRUE(d->WaitForTerminal({*id}, &done, absl::Seconds(20)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done[0].attempt(), 2);
  EXPECT_EQ(done[0].result(), "done");
}

// A queued row the leader never heard of (a standby's notification lost, or a row restored by an
// operator) is found by the recount against the database, and runs.
TEST_F(RecoveryTest, QueuedRowTheDaemonNeverHeardOfIsFoundAndRun) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  std::unique_ptr<Worker> w = StartWorker(*d, {.id = "w1", .mode = {"--exec", "cat"}});
  ASSERT_NE(w, nullptr);
  // Written behind the daemon's back, and old enough to count as drift rather than a race.
  Exec(
      "INSERT INTO jobs_active (id, type, payload, state, max_attempts, timeout_ms, created_at, "
      "updated_at) VALUES ('j_behind_its_back', 'echo', 'hidden'::bytea, 'QUEUED', 3, 60000, "
      "now() - interval '1 minute', now() - interval '1 minute')");
  std::vector<v1::Job> done;
  ASSERT_TRUE(d->WaitForTerminal({"j_behind_its_back"}, &done, absl::Seconds(40)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(done[0].result(), "hidden");
  EXPECT_EQ(d->Metric(Repairs("unknown_queued")), 1) << "found by the recount";
  absl::StatusOr<v1::StatsResponse> stats = d->Stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_GE(stats->accounting_repairs(), 1);
}

// A worker that reads the batched protocol gets its answers and results applied from one Batch,
// and all the acknowledgements of a turn in one ResultAcks; a lost ack is made good by the
// resend after a reconnect, as with single messages.
TEST_F(RecoveryTest, BatchedAnswersAndResultsAreAppliedAndAcknowledgedTogether) {
  auto d = StartDaemon();
  ASSERT_NE(d, nullptr);
  v1::Hello hello = FakeHello("batcher");
  hello.set_slots(4);
  hello.set_batching(true);
  FakeWorker w(d->address(), hello);
  std::optional<v1::DaemonMessage> welcome =
      w.Next([](const v1::DaemonMessage& m) { return m.has_welcome(); }, absl::Seconds(10));
  ASSERT_TRUE(welcome.has_value());
  EXPECT_TRUE(welcome->welcome().batching());

  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    absl::StatusOr<std::string> id = d->Submit(Spec("echo", absl::StrCat("job ", i)));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Assignment> assigned;
  while (assigned.size() < 4) {
    std::optional<v1::Assignment> a = w.NextAssignment(absl::Seconds(10));
    ASSERT_TRUE(a.has_value()) << "only " << assigned.size() << " of 4 assigned";
    assigned.push_back(*a);
  }
  // Accept three and refuse one in one message; then two results in one message.
  v1::WorkerMessage answers;
  for (int i = 0; i < 3; ++i) {
    v1::Accept* a = answers.mutable_batch()->add_accepts();
    a->set_job_id(assigned[i].job_id());
    a->set_attempt(assigned[i].attempt());
  }
  v1::Reject* r = answers.mutable_batch()->add_rejects();
  r->set_job_id(assigned[3].job_id());
  r->set_attempt(assigned[3].attempt());
  r->set_reason(v1::Reject::REASON_RESOURCE_EXHAUSTED);
  ASSERT_TRUE(w.Send(answers));
  v1::WorkerMessage results;
  for (int i = 0; i < 2; ++i) {
    v1::Result* res = results.mutable_batch()->add_results();
    res->set_job_id(assigned[i].job_id());
    res->set_attempt(assigned[i].attempt());
    res->set_output(absl::StrCat("out ", i));
  }
  ASSERT_TRUE(w.Send(results));

  std::set<std::string> acked;
  while (acked.size() < 2) {
    std::optional<v1::DaemonMessage> m =
        w.Next([](const v1::DaemonMessage& m) { return m.has_result_acks() || m.has_result_ack(); },
               absl::Seconds(10));
    ASSERT_TRUE(m.has_value()) << "acknowledged " << acked.size() << " of 2";
    ASSERT_TRUE(m->has_result_acks()) << "a batching worker gets ResultAcks";
    for (const v1::ResultAck& ack : m->result_acks().acks()) acked.insert(ack.job_id());
  }
  EXPECT_THAT(acked, ::testing::UnorderedElementsAre(assigned[0].job_id(), assigned[1].job_id()));
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<v1::Job> j = d->Status(assigned[i].job_id());
    ASSERT_TRUE(j.ok()) << j.status();
    EXPECT_EQ(j->state(), v1::JOB_STATE_SUCCEEDED);
    EXPECT_EQ(j->result(), absl::StrCat("out ", i));
  }
  // The third runs (its accept counted), and the refused one is offered again at the same attempt.
  std::optional<v1::Assignment> again = w.NextAssignment(absl::Seconds(10));
  ASSERT_TRUE(again.has_value());
  EXPECT_EQ(again->job_id(), assigned[3].job_id());
  EXPECT_EQ(again->attempt(), assigned[3].attempt());
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::Job> j = d->Status(assigned[2].job_id());
        return j.ok() && j->state() == v1::JOB_STATE_RUNNING;
      },
      absl::Seconds(10)));
}

}  // namespace
}  // namespace dispatchd::e2e
