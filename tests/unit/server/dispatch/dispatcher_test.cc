// The dispatcher against an in-memory store and a fake clock (dispatcher_fixture.h): what a
// worker and a client can do to a job around one stream, without PostgreSQL. What the database
// can do to the writes (refuse them, stall them, lose the lease under them) is in
// dispatcher_writes_test.cc.

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/unit/server/dispatch/dispatcher_fixture.h"

namespace dispatchd::dispatch::dispatcher_testing {
namespace {

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

// A worker process that restarts under the same id and reports none of its jobs lost them: they
// go back to the queue at once and run again, on it; another worker's job stays where it is.
TEST_F(DispatcherTest, AWorkerBackWithoutItsJobsGivesThemBackAndNoOneElses) {
  Submit("j1");
  Submit("j2");
  Submit("j3");
  Start();
  auto w1 = Connect("w1", /*slots=*/2);
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1) && Assigned(w1, "j2", 1); }));
  Accept(w1, "j1", 1);
  auto w2 = Connect("w2", /*slots=*/1);
  ASSERT_TRUE(Eventually([&] { return Assigned(w2, "j3", 1); }));
  auto again = Connect("w1", /*slots=*/2);  // a new process: its Hello holds no job
  ASSERT_TRUE(Eventually([&] { return Assigned(again, "j2", 1); }))
      << "not accepted: no attempt used";
  Pass(absl::Seconds(2), again);  // j1's accepted attempt was lost: a retry, after its backoff
  ASSERT_TRUE(Eventually([&] { return Assigned(again, "j1", 2); }));
  EXPECT_EQ(Row("j3").worker_id, "w2");
  EXPECT_EQ(w2->Assignments().size(), 1u);
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

TEST_F(DispatcherTest, GaugesCountTheConnectedWorkersAndTheTypesEachServes) {
  Start();
  auto w1 = Connect("w1", /*slots=*/4);
  // w2 names its one type twice: it serves it once.
  auto w2 = std::make_shared<Link>();
  v1::Hello hello;
  hello.set_worker_id("w2");
  hello.add_types("echo");
  hello.add_types("echo");
  hello.set_slots(2);
  dispatcher_->WorkerConnected(w2, hello);
  // A draining worker is connected and has slots, but serves nothing.
  auto w3 = Connect("w3", /*slots=*/1);
  ASSERT_TRUE(dispatcher_->DrainWorker("w3").ok());

  const Dispatcher::Gauges gauges = dispatcher_->ReadGauges();
  EXPECT_EQ(gauges.workers, 3);
  EXPECT_EQ(gauges.slots, 7);
  EXPECT_EQ(gauges.busy, 0);
  std::vector<std::string> ids;
  for (const auto& [id, loads] : gauges.model_loads) ids.push_back(id);
  EXPECT_THAT(ids, ::testing::UnorderedElementsAre("w1", "w2", "w3"));
  const sched::SchedulerStats::Type* echo = nullptr;
  for (const sched::SchedulerStats::Type& t : gauges.scheduler.types) {
    if (t.name == "echo") echo = &t;
  }
  ASSERT_NE(echo, nullptr);
  EXPECT_EQ(echo->workers, 2);
}

TEST_F(DispatcherTest, AWorkerWhoseStreamIsLostLeavesTheGaugesWhileItHoldsItsJob) {
  Submit("j1");
  Start();
  auto w1 = Connect("w1", /*slots=*/2);
  auto w2 = Connect("w2", /*slots=*/3);
  ASSERT_TRUE(Eventually([&] { return Assigned(w1, "j1", 1) || Assigned(w2, "j1", 1); }));
  const auto holder = Assigned(w1, "j1", 1) ? w1 : w2;
  const int64_t other_slots = holder == w1 ? 3 : 2;
  dispatcher_->WorkerDisconnected(holder);

  // Its job stays with it until it comes back or goes stale, but it is not connected: it is
  // neither a worker nor a server of its type in the gauges, and its busy slot is not counted.
  const Dispatcher::Gauges gauges = dispatcher_->ReadGauges();
  EXPECT_EQ(gauges.workers, 1);
  EXPECT_EQ(gauges.slots, other_slots);
  EXPECT_EQ(gauges.busy, 0);
  const sched::SchedulerStats::Type* echo = nullptr;
  for (const sched::SchedulerStats::Type& t : gauges.scheduler.types) {
    if (t.name == "echo") echo = &t;
  }
  ASSERT_NE(echo, nullptr);
  EXPECT_EQ(echo->workers, 1);
  EXPECT_EQ(echo->running, 1);
}

TEST_F(DispatcherTest, DrainWorkerNamesAWorkerThatIsNotConnected) {
  Start();
  const absl::StatusOr<v1::WorkerInfo> drained = dispatcher_->DrainWorker("nobody");
  EXPECT_EQ(drained.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(drained.status().message(), ::testing::HasSubstr("\"nobody\""));
}

}  // namespace
}  // namespace dispatchd::dispatch::dispatcher_testing
