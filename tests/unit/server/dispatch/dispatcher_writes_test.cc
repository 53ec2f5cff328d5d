// The dispatcher's writes against an in-memory store that can refuse or stall them
// (dispatcher_fixture.h): a write the database refuses, a failover or a lost worker while a turn
// or an insert is in the database, inserts that place jobs on free workers, and turns that
// overlap up to postgres.turns_in_flight. No PostgreSQL.

#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "server/metrics/daemon_metrics.h"
#include "tests/unit/server/dispatch/dispatcher_fixture.h"

namespace dispatchd::dispatch::dispatcher_testing {
namespace {

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

}  // namespace
}  // namespace dispatchd::dispatch::dispatcher_testing
