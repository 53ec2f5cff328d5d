// Every edge of the job state diagram (DESIGN.md, "States") as the leading daemon decides it,
// with a fake clock: the decision, the write it owes the store, and the job after the store
// answers.

#include "lib/job/attempt.h"

#include "gtest/gtest.h"

#include "tests/testing/fake_clock.h"

namespace dispatchd::job {
namespace {

constexpr absl::Duration kTimeout = absl::Minutes(5);
constexpr absl::Duration kMarkDelay = absl::Milliseconds(50);
const RetryPolicy kThreeAttempts{.max_attempts = 3,
                                 .retry_at = absl::FromUnixSeconds(1'700'000'010)};

class AttemptTest : public ::testing::Test {
 protected:
  absl::Time Now() { return clock_.TimeNow(); }

  // A job claimed for `worker` (QUEUED -> DISPATCHED), attempts started so far: `attempt`.
  AttemptState Claimed(const std::string& worker = "w1", int32_t attempt = 0) {
    AttemptState s;
    s.attempt = attempt;
    Dispatched(s, worker);
    return s;
  }
  // A job whose worker accepted it and whose RUNNING mark committed.
  AttemptState Running(const std::string& worker = "w1", int32_t attempt = 1) {
    AttemptState s = Claimed(worker, attempt - 1);
    OnAccept(s, worker, attempt, Now(), kTimeout, absl::ZeroDuration());
    EXPECT_TRUE(StartWrite(s, Now()));
    EXPECT_EQ(Written(s, /*changed=*/true).next, AfterWrite::kRunning);
    return s;
  }
  // Commits the owed write; what the job is after it.
  WriteAnswer Commit(AttemptState& s, bool changed = true) {
    EXPECT_TRUE(StartWrite(s, Now()));
    return Written(s, changed);
  }

  testing::FakeClock clock_;
};

TEST_F(AttemptTest, ClaimDispatchesToTheWorkerAndTheWorkerHoldsTheNextAttempt) {
  AttemptState s = Claimed("w1", 2);
  EXPECT_EQ(s.state, JobState::kDispatched);
  EXPECT_EQ(s.worker_id, "w1");
  EXPECT_EQ(s.HeldAttempt(), 3);
  EXPECT_TRUE(s.IsCurrent("w1", 3));
  EXPECT_FALSE(s.IsCurrent("w1", 2));
  EXPECT_FALSE(s.IsCurrent("w2", 3));
  EXPECT_FALSE(s.Runs());
}

TEST_F(AttemptTest, AcceptRunsTheJobAndOwesADelayedMark) {
  AttemptState s = Claimed();
  Transition t = OnAccept(s, "w1", 1, Now(), kTimeout, kMarkDelay);
  EXPECT_EQ(t.write, WriteKind::kMark);
  EXPECT_TRUE(s.Runs());
  EXPECT_EQ(s.run_deadline, Now() + kTimeout);
  EXPECT_EQ(s.started_at, Now());
  // Not before its delay: a result in that time makes it unnecessary.
  EXPECT_FALSE(StartWrite(s, Now()));
  clock_.Advance(kMarkDelay);
  ASSERT_TRUE(StartWrite(s, Now()));
  EXPECT_EQ(s.writing.attempt, 1);
  WriteAnswer a = Written(s, true);
  EXPECT_EQ(a.next, AfterWrite::kRunning);
  EXPECT_EQ(s.state, JobState::kRunning);
  EXPECT_EQ(s.attempt, 1);
  EXPECT_FALSE(s.accepted);
  EXPECT_TRUE(s.Runs());
}

TEST_F(AttemptTest, RepeatedAcceptChangesNothing) {
  AttemptState s = Claimed();
  OnAccept(s, "w1", 1, Now(), kTimeout, kMarkDelay);
  clock_.Advance(absl::Seconds(1));
  EXPECT_TRUE(OnAccept(s, "w1", 1, Now(), kTimeout, kMarkDelay).Nothing());
  EXPECT_EQ(s.started_at, Now() - absl::Seconds(1));
  AttemptState r = Running();
  EXPECT_TRUE(OnAccept(r, "w1", 1, Now(), kTimeout, kMarkDelay).Nothing());
}

TEST_F(AttemptTest, AcceptOfAnAttemptThatIsNotCurrentStopsIt) {
  AttemptState s = Claimed("w1");
  for (auto [worker, attempt] : {std::pair{"w2", 1}, std::pair{"w1", 2}, std::pair{"w1", 0}}) {
    Transition t = OnAccept(s, worker, attempt, Now(), kTimeout, kMarkDelay);
    EXPECT_TRUE(t.stop_worker) << worker << " " << attempt;
    EXPECT_EQ(t.stop_attempt, attempt);
  }
  EXPECT_FALSE(s.accepted);
}

TEST_F(AttemptTest, SuccessEndsTheJobAndAcknowledgesOnceWritten) {
  AttemptState s = Running();
  Transition t = OnResult(s, "w1", 1, {.succeeded = true, .output = "out"}, kThreeAttempts);
  EXPECT_EQ(t.write, WriteKind::kSucceed);
  EXPECT_TRUE(t.frees_slot);
  EXPECT_FALSE(t.ack);  // only once it is durable
  EXPECT_FALSE(s.Runs());
  EXPECT_TRUE(s.ResultWaits("w1", 1));
  WriteAnswer a = Commit(s);
  EXPECT_EQ(a.next, AfterWrite::kEnded);
  EXPECT_EQ(a.write.result, "out");
  EXPECT_TRUE(a.write.from_result);
}

TEST_F(AttemptTest, ResultBeforeTheMarkReplacesIt) {
  AttemptState s = Claimed();
  OnAccept(s, "w1", 1, Now(), kTimeout, kMarkDelay);
  Transition t = OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_EQ(t.write, WriteKind::kSucceed);
  EXPECT_EQ(s.owed.kind, WriteKind::kSucceed);  // one write, not two
  EXPECT_EQ(Commit(s).next, AfterWrite::kEnded);
}

TEST_F(AttemptTest, ResultWhileTheMarkIsWrittenWaitsForIt) {
  AttemptState s = Claimed();
  OnAccept(s, "w1", 1, Now(), kTimeout, absl::ZeroDuration());
  ASSERT_TRUE(StartWrite(s, Now()));
  OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_FALSE(StartWrite(s, Now()));  // two writes of one row are never in flight
  EXPECT_EQ(Written(s, true).next, AfterWrite::kRunning);
  EXPECT_EQ(Commit(s).next, AfterWrite::kEnded);
}

TEST_F(AttemptTest, TheSameResultAgainWhileItsWriteWaitsChangesNothing) {
  AttemptState s = Running();
  OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_TRUE(OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts).Nothing());
  ASSERT_TRUE(StartWrite(s, Now()));
  EXPECT_TRUE(OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts).Nothing());
}

TEST_F(AttemptTest, ResultForAnOldAttemptIsAcknowledgedAndDropped) {
  AttemptState s = Running("w1", 2);
  Transition t = OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_TRUE(t.ack);
  EXPECT_EQ(t.ack_attempt, 1);
  EXPECT_EQ(t.write, WriteKind::kNone);
  EXPECT_TRUE(s.Runs());
  // Another worker's result for the current attempt number is not current either.
  EXPECT_TRUE(OnResult(s, "w2", 2, {.succeeded = true}, kThreeAttempts).ack);
}

TEST_F(AttemptTest, RetryableFailureWithAttemptsLeftQueuesAfterTheBackoff) {
  AttemptState s = Running("w1", 1);
  Transition t = OnResult(s, "w1", 1, {.error = "oom", .retryable = true}, kThreeAttempts);
  EXPECT_EQ(t.write, WriteKind::kRetry);
  EXPECT_EQ(s.owed.not_before, kThreeAttempts.retry_at);
  WriteAnswer a = Commit(s);
  EXPECT_EQ(a.next, AfterWrite::kQueued);
  EXPECT_EQ(a.write.error, "oom");
  EXPECT_EQ(s.state, JobState::kQueued);
  EXPECT_EQ(s.attempt, 1);  // one attempt consumed
  EXPECT_TRUE(s.worker_id.empty());
}

TEST_F(AttemptTest, FailureWithoutAttemptsLeftOrNotRetryableFails) {
  AttemptState last = Running("w1", 3);
  EXPECT_EQ(OnResult(last, "w1", 3, {.error = "x", .retryable = true}, kThreeAttempts).write,
            WriteKind::kFail);
  AttemptState fatal = Running("w1", 1);
  EXPECT_EQ(OnResult(fatal, "w1", 1, {.error = "x", .retryable = false}, kThreeAttempts).write,
            WriteKind::kFail);
  EXPECT_EQ(Commit(fatal).next, AfterWrite::kEnded);
}

TEST_F(AttemptTest, RefusalReturnsTheJobWithNoAttemptConsumed) {
  AttemptState s = Claimed("w1", 1);
  Transition t = OnReject(s, "w1", 2);
  EXPECT_EQ(t.write, WriteKind::kReturn);
  EXPECT_TRUE(t.frees_slot);
  EXPECT_EQ(Commit(s).next, AfterWrite::kQueued);
  EXPECT_EQ(s.attempt, 1);
  EXPECT_EQ(s.state, JobState::kQueued);
}

TEST_F(AttemptTest, RefusalThatIsNotCurrentChangesNothing) {
  AttemptState s = Claimed("w1", 1);
  EXPECT_TRUE(OnReject(s, "w2", 2).Nothing());
  EXPECT_TRUE(OnReject(s, "w1", 1).Nothing());
  OnAccept(s, "w1", 2, Now(), kTimeout, kMarkDelay);
  EXPECT_TRUE(OnReject(s, "w1", 2).Nothing());  // it runs: a late refusal is moot
}

TEST_F(AttemptTest, WorkerGoneBeforeAcceptingReturnsTheJob) {
  AttemptState s = Claimed();
  EXPECT_EQ(Orphan(s, /*requeue=*/false, kThreeAttempts, "lost").write, WriteKind::kReturn);
}

TEST_F(AttemptTest, WorkerLostFollowsOnOrphan) {
  AttemptState requeue = Running();
  Transition t = Orphan(requeue, /*requeue=*/true, kThreeAttempts, "worker w1 lost");
  EXPECT_EQ(t.write, WriteKind::kRetry);
  EXPECT_EQ(requeue.owed.error, "interrupted: worker w1 lost");
  EXPECT_FALSE(requeue.owed.from_result);
  AttemptState fail = Running();
  EXPECT_EQ(Orphan(fail, /*requeue=*/false, kThreeAttempts, "lost").write, WriteKind::kFail);
  // Accepted but not yet marked counts as running, at the attempt its worker held.
  AttemptState accepted = Claimed();
  OnAccept(accepted, "w1", 1, Now(), kTimeout, kMarkDelay);
  Orphan(accepted, true, kThreeAttempts, "lost");
  EXPECT_EQ(accepted.owed.kind, WriteKind::kRetry);
  EXPECT_EQ(accepted.owed.attempt, 1);
}

TEST_F(AttemptTest, OrphanOfASettledJobChangesNothing) {
  AttemptState s = Running();
  OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_TRUE(Orphan(s, true, kThreeAttempts, "lost").Nothing());
  EXPECT_EQ(s.owed.kind, WriteKind::kSucceed);
}

TEST_F(AttemptTest, TwoMissedHeartbeatsLoseTheJobOnItsWorker) {
  AttemptState s = Running("w1", 1);
  EXPECT_FALSE(MissedHeartbeat(s, 0, 2));
  EXPECT_FALSE(MissedHeartbeat(s, 1, 2));
  EXPECT_EQ(s.heartbeat_misses, 0);  // reported again: the count starts over
  EXPECT_FALSE(MissedHeartbeat(s, 0, 2));
  EXPECT_TRUE(MissedHeartbeat(s, 7, 2));  // another attempt is not this one
  // Lost there: its attempt ends as on_orphan says.
  EXPECT_EQ(Orphan(s, true, kThreeAttempts, "stopped reporting").write, WriteKind::kRetry);
  // A job that does not run is not missed.
  AttemptState claimed = Claimed();
  EXPECT_FALSE(MissedHeartbeat(claimed, 0, 1));
}

TEST_F(AttemptTest, TimeoutStopsTheAttemptAndRetriesIt) {
  AttemptState s = Running();
  clock_.Advance(kTimeout - absl::Seconds(1));
  EXPECT_TRUE(TimeOut(s, Now(), kTimeout, kThreeAttempts).Nothing());
  clock_.Advance(absl::Seconds(1));
  Transition t = TimeOut(s, Now(), kTimeout, kThreeAttempts);
  EXPECT_TRUE(t.stop_worker);
  EXPECT_EQ(t.write, WriteKind::kRetry);
  EXPECT_EQ(s.owed.error, "timeout: attempt 1 ran longer than 5m");
  EXPECT_TRUE(TimeOut(s, Now(), kTimeout, kThreeAttempts).Nothing());  // once
}

TEST_F(AttemptTest, EndedElsewhereStopsTheWorkerAndAcknowledgesAWaitingResult) {
  AttemptState running = Running("w1", 2);
  Transition t = Ended(running);
  EXPECT_TRUE(t.stop_worker);
  EXPECT_EQ(t.stop_attempt, 2);
  EXPECT_FALSE(t.ack);
  AttemptState settled = Running("w1", 2);
  OnResult(settled, "w1", 2, {.succeeded = true}, kThreeAttempts);
  t = Ended(settled);
  EXPECT_FALSE(t.stop_worker);
  EXPECT_TRUE(t.ack);
  EXPECT_EQ(t.ack_attempt, 2);
  AttemptState queued;
  EXPECT_TRUE(Ended(queued).Nothing());
}

TEST_F(AttemptTest, WriteTheRowRefusedMeansItMovedOn) {
  AttemptState s = Running();
  OnResult(s, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_EQ(Commit(s, /*changed=*/false).next, AfterWrite::kMovedOn);
  AttemptState claimed = Claimed();
  OnReject(claimed, "w1", 1);
  EXPECT_EQ(Commit(claimed, false).next, AfterWrite::kMovedOn);
  AttemptState marking = Claimed();
  OnAccept(marking, "w1", 1, Now(), kTimeout, absl::ZeroDuration());
  EXPECT_EQ(Commit(marking, false).next, AfterWrite::kStale);
}

TEST_F(AttemptTest, AFailedWriteIsOwedAgainAndASettleReplacesAFailedMark) {
  AttemptState s = Running();
  OnResult(s, "w1", 1, {.succeeded = true, .output = "o"}, kThreeAttempts);
  ASSERT_TRUE(StartWrite(s, Now()));
  WriteFailed(s);
  EXPECT_EQ(s.owed.kind, WriteKind::kSucceed);
  EXPECT_EQ(Commit(s).next, AfterWrite::kEnded);

  AttemptState m = Claimed();
  OnAccept(m, "w1", 1, Now(), kTimeout, absl::ZeroDuration());
  ASSERT_TRUE(StartWrite(m, Now()));
  OnResult(m, "w1", 1, {.error = "e"}, kThreeAttempts);
  WriteFailed(m);
  EXPECT_EQ(m.owed.kind, WriteKind::kFail);  // the mark is moot
}

TEST_F(AttemptTest, ReattachAdoptsOnlyTheAttemptItsWorkerRuns) {
  AttemptState running = Running("w1", 2);
  running.orphan_deadline = Now() + absl::Seconds(30);
  EXPECT_EQ(OnReattach(running, "w1", 2, Now(), kTimeout), Reattach::kRunning);
  EXPECT_EQ(running.orphan_deadline, absl::InfiniteFuture());
  EXPECT_EQ(OnReattach(running, "w1", 1, Now(), kTimeout), Reattach::kNo);
  EXPECT_EQ(OnReattach(running, "w2", 2, Now(), kTimeout), Reattach::kNo);

  AttemptState unrecorded = Claimed("w1", 1);
  EXPECT_EQ(OnReattach(unrecorded, "w1", 2, Now(), kTimeout), Reattach::kAccepted);
  EXPECT_EQ(unrecorded.owed.kind, WriteKind::kMark);
  EXPECT_TRUE(StartWrite(unrecorded, Now()));  // due at once

  AttemptState waits = Running("w1", 1);
  OnResult(waits, "w1", 1, {.succeeded = true}, kThreeAttempts);
  EXPECT_EQ(OnReattach(waits, "w1", 1, Now(), kTimeout), Reattach::kResultWaits);
}

TEST_F(AttemptTest, HeartbeatHoldsAsItsOwnOnlyTheCurrentAttemptOrAWaitingResult) {
  AttemptState s = Running("w1", 2);
  EXPECT_TRUE(HoldsAsItsOwn(s, "w1", 2));
  EXPECT_FALSE(HoldsAsItsOwn(s, "w1", 1));
  EXPECT_FALSE(HoldsAsItsOwn(s, "w2", 2));
  OnResult(s, "w1", 2, {.succeeded = true}, kThreeAttempts);
  EXPECT_TRUE(HoldsAsItsOwn(s, "w1", 2));
  AttemptState timed_out = Running("w1", 2);
  TimeOut(timed_out, Now() + kTimeout, kTimeout, kThreeAttempts);
  EXPECT_FALSE(HoldsAsItsOwn(timed_out, "w1", 2));  // no result waits: stop it
}

}  // namespace
}  // namespace dispatchd::job
