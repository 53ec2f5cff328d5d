// PgJobStore against PostgreSQL: claims, accepts, retries, finishes, turns, cancels and expiry.

#include <algorithm>
#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/transaction"

#include "lib/job/job.h"
#include "server/store/job_store.h"
#include "server/store/pg_job_store.h"
#include "tests/store/pg_job_store_fixture.h"
#include "tests/testing/pg_test_db.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using job::Job;
using job::JobState;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

TEST_F(PgJobStoreTest, ClaimDispatchesQueuedJobToWorker) {
  Insert(MakeJob("j_1"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w7"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kDispatched);
  EXPECT_EQ(got.worker_id, "w7");
  EXPECT_EQ(got.attempt, 0);  // an attempt starts when the worker accepts
  EXPECT_NE(got.dispatched_at, absl::InfinitePast());
  EXPECT_GE(got.updated_at, got.created_at);
}

TEST_F(PgJobStoreTest, ClaimTakesManyJobsForSeveralWorkersInOneCall) {
  Insert(MakeJob("j_1"));
  Insert(MakeJob("j_2"));
  Insert(MakeJob("j_3"));
  EXPECT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_2", .attempt = 0, .worker_id = "w2"},
                             {.job_id = "j_missing", .attempt = 0, .worker_id = "w2"}}),
              IsOkAndHolds(UnorderedElementsAre("j_1", "j_2")));
  EXPECT_EQ(Get("j_1").worker_id, "w1");
  EXPECT_EQ(Get("j_2").worker_id, "w2");
  EXPECT_EQ(Get("j_3").state, JobState::kQueued);
  EXPECT_THAT(store_->Claim({}), IsOkAndHolds(IsEmpty()));
}

TEST_F(PgJobStoreTest, ClaimSkipsRowLockedByAnotherTransactionInsteadOfWaiting) {
  Insert(MakeJob("j_locked"));
  Insert(MakeJob("j_free"));
  pqxx::connection other(db_->url());
  auto locker = std::make_unique<pqxx::work>(other);
  locker->exec_params("SELECT id FROM jobs_active WHERE id = $1 FOR UPDATE", "j_locked");

  std::future<absl::StatusOr<std::vector<std::string>>> claimed =
      std::async(std::launch::async, [this] {
        return store_->Claim({{.job_id = "j_locked", .attempt = 0, .worker_id = "w1"},
                              {.job_id = "j_free", .attempt = 0, .worker_id = "w1"}});
      });
  const bool finished = claimed.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  locker->abort();  // releases the lock, so that a claim that waited does not hang the test
  ASSERT_TRUE(finished) << "Claim waited on a locked row";
  EXPECT_THAT(claimed.get(), IsOkAndHolds(ElementsAre("j_free")));
  EXPECT_EQ(Get("j_locked").state, JobState::kQueued);

  EXPECT_THAT(store_->Claim({{.job_id = "j_locked", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_locked")));
}

TEST_F(PgJobStoreTest, ClaimRefusesStaleAttempt) {
  Insert(MakeJob("j_1"));
  EXPECT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 1, .worker_id = "w1"}}),
              IsOkAndHolds(IsEmpty()));
  EXPECT_EQ(Get("j_1").state, JobState::kQueued);
}

TEST_F(PgJobStoreTest, ClaimRefusesJobNoLongerQueued) {
  Insert(MakeJob("j_1"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  EXPECT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w2"}}),
              IsOkAndHolds(IsEmpty()));
  EXPECT_EQ(Get("j_1").worker_id, "w1");
}

TEST_F(PgJobStoreTest, MarkRunningStartsTheNextAttempt) {
  Insert(MakeJob("j_1"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  EXPECT_THAT(store_->MarkRunning("j_1", 2, "w1"), IsOkAndHolds(false));
  EXPECT_THAT(store_->MarkRunning("j_1", 0, "w1"), IsOkAndHolds(false));
  EXPECT_EQ(Get("j_1").state, JobState::kDispatched);

  EXPECT_THAT(store_->MarkRunning("j_1", 1, "w1"), IsOkAndHolds(true));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kRunning);
  EXPECT_EQ(got.attempt, 1);
  EXPECT_EQ(got.worker_id, "w1");
  EXPECT_NE(got.started_at, absl::InfinitePast());
}

TEST_F(PgJobStoreTest, MarkRunningAdoptsRunningRowAtSameAttempt) {
  InsertRunning("j_1", "w1");
  const absl::Time started = Get("j_1").started_at;
  EXPECT_THAT(store_->MarkRunning("j_1", 1, "w2"), IsOkAndHolds(true));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kRunning);
  EXPECT_EQ(got.attempt, 1);
  EXPECT_EQ(got.worker_id, "w2");
  EXPECT_EQ(got.started_at, started);

  EXPECT_THAT(store_->MarkRunning("j_1", 2, "w3"), IsOkAndHolds(false));
  EXPECT_EQ(Get("j_1").worker_id, "w2");
}

TEST_F(PgJobStoreTest, MarkRunningRefusesQueuedAndFinishedJobs) {
  Insert(MakeJob("j_queued"));
  EXPECT_THAT(store_->MarkRunning("j_queued", 1, "w1"), IsOkAndHolds(false));
  InsertRunning("j_done");
  ASSERT_THAT(store_->Finish({.job_id = "j_done", .attempt = 1}), IsOkAndHolds(true));
  EXPECT_THAT(store_->MarkRunning("j_done", 1, "w1"), IsOkAndHolds(false));
  EXPECT_EQ(Get("j_done").state, JobState::kSucceeded);
}

TEST_F(PgJobStoreTest, ReturnToQueueDoesNotConsumeAnAttempt) {
  Insert(MakeJob("j_1"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  EXPECT_THAT(store_->ReturnToQueue("j_1", 1), IsOkAndHolds(false));
  EXPECT_THAT(store_->ReturnToQueue("j_1", 0), IsOkAndHolds(true));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kQueued);
  EXPECT_EQ(got.attempt, 0);
  EXPECT_EQ(got.worker_id, "");
  EXPECT_THAT(store_->ReturnToQueue("j_1", 0), IsOkAndHolds(false));
  // Claimable again at the same attempt.
  EXPECT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w2"}}),
              IsOkAndHolds(ElementsAre("j_1")));
}

TEST_F(PgJobStoreTest, RetryRequeuesKeepingTheAttemptCount) {
  InsertRunning("j_1");
  const absl::Time not_before = absl::FromUnixMicros(1'900'000'000'000'001);
  EXPECT_THAT(store_->Retry("j_1", 2, not_before, "stale"), IsOkAndHolds(false));
  EXPECT_THAT(store_->Retry("j_1", 1, not_before, "boom"), IsOkAndHolds(true));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kQueued);
  EXPECT_EQ(got.attempt, 1);
  EXPECT_EQ(got.worker_id, "");
  EXPECT_EQ(got.error, "boom");
  EXPECT_EQ(got.spec.not_before, not_before);
  EXPECT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 1, .worker_id = "w2"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  EXPECT_THAT(store_->MarkRunning("j_1", 2, "w2"), IsOkAndHolds(true));
}

TEST_F(PgJobStoreTest, RetryAcceptsAFailureThatOvertookItsAccept) {
  Insert(MakeJob("j_1"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  // The worker accepted attempt 1 and failed it, but the accept was never written.
  EXPECT_THAT(store_->Retry("j_1", 2, absl::InfinitePast(), "stale"), IsOkAndHolds(false));
  EXPECT_THAT(store_->Retry("j_1", 1, absl::InfinitePast(), "boom"), IsOkAndHolds(true));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kQueued);
  EXPECT_EQ(got.attempt, 1);  // the attempt is consumed
  EXPECT_EQ(got.worker_id, "");
  EXPECT_EQ(got.error, "boom");
  // It is kept, with no start: neither the accept nor the run time reached the store.
  ASSERT_EQ(got.earlier_attempts.size(), 1u);
  EXPECT_EQ(got.earlier_attempts[0].worker_id, "w1");
  EXPECT_EQ(got.earlier_attempts[0].started_at, absl::InfinitePast());
  EXPECT_EQ(got.earlier_attempts[0].error, "boom");
}

TEST_F(PgJobStoreTest, LateFinishForAnAttemptThatWasRetriedChangesNothing) {
  InsertRunning("j_1");
  ASSERT_THAT(store_->Retry("j_1", 1, absl::InfinitePast(), "lost"), IsOkAndHolds(true));
  const Job before = Get("j_1");
  EXPECT_THAT(store_->Finish(
                  {.job_id = "j_1", .attempt = 1, .state = JobState::kSucceeded, .result = "late"}),
              IsOkAndHolds(false));
  const Job after = Get("j_1");
  EXPECT_EQ(after.state, JobState::kQueued);
  EXPECT_EQ(after.result, "");
  EXPECT_EQ(after.updated_at, before.updated_at);
  EXPECT_EQ(after.spec.not_before, absl::InfinitePast());
}

TEST_F(PgJobStoreTest, EachRetryKeepsTheAttemptItEndedThroughToTheJobsEnd) {
  InsertRunning("j_1", "w1");
  const Job running = Get("j_1");
  ASSERT_THAT(store_->Retry("j_1", 1, absl::InfinitePast(), "out of memory"), IsOkAndHolds(true));
  // Attempt 2 fails on w2 after 2 s, before its accept is written; a turn retries it.
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 1, .worker_id = "w2"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  const Job dispatched = Get("j_1");
  EXPECT_EQ(dispatched.started_at, absl::InfinitePast());  // attempt 1's start is history now
  absl::StatusOr<TurnOutcome> turn = store_->WriteTurn(
      {.retries = {
           {.job_id = "j_1", .attempt = 2, .error = "CUDA error", .ran = absl::Seconds(2)}}});
  ASSERT_THAT(turn, IsOk());
  ASSERT_THAT(turn->retried, ElementsAre("j_1"));
  const Job queued = Get("j_1");
  ASSERT_EQ(queued.earlier_attempts.size(), 2u);
  const job::EndedAttempt& first = queued.earlier_attempts[0];
  EXPECT_EQ(first.attempt, 1);
  EXPECT_EQ(first.worker_id, "w1");
  EXPECT_EQ(first.dispatched_at, running.dispatched_at);
  EXPECT_EQ(first.started_at, running.started_at);
  EXPECT_GE(first.ended_at, running.started_at);
  EXPECT_EQ(first.error, "out of memory");
  const job::EndedAttempt& second = queued.earlier_attempts[1];
  EXPECT_EQ(second.attempt, 2);
  EXPECT_EQ(second.worker_id, "w2");
  EXPECT_EQ(second.dispatched_at, dispatched.dispatched_at);
  EXPECT_EQ(second.started_at, second.ended_at - absl::Seconds(2));
  EXPECT_GE(second.ended_at, first.ended_at);
  EXPECT_EQ(second.error, "CUDA error");

  // The third attempt succeeds in a turn: the ended row keeps both.
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 2, .worker_id = "w3"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  ASSERT_THAT(store_->MarkRunning("j_1", 3, "w3"), IsOkAndHolds(true));
  ASSERT_THAT(store_->WriteTurn({.finishes = {{.job_id = "j_1", .attempt = 3, .result = "ok"}}}),
              IsOk());
  const Job done = Get("j_1");
  EXPECT_EQ(done.state, JobState::kSucceeded);
  EXPECT_EQ(done.worker_id, "w3");
  ASSERT_EQ(done.earlier_attempts.size(), 2u);
  EXPECT_EQ(done.earlier_attempts[0].error, "out of memory");
  EXPECT_EQ(done.earlier_attempts[1].error, "CUDA error");
  EXPECT_EQ(done.earlier_attempts[1].ended_at, second.ended_at);
  absl::StatusOr<std::vector<Job>> both = store_->GetMany({"j_1"});
  ASSERT_THAT(both, IsOk());
  ASSERT_EQ(both->size(), 1u);
  EXPECT_EQ((*both)[0].earlier_attempts.size(), 2u);
}

TEST_F(PgJobStoreTest, ACancelledJobKeepsItsEarlierAttempts) {
  InsertRunning("j_cancel");
  ASSERT_THAT(store_->Retry("j_cancel", 1, absl::InfinitePast(), "lost"), IsOkAndHolds(true));
  absl::StatusOr<CancelOutcome> cancelled = store_->Cancel("j_cancel", "user asked");
  ASSERT_THAT(cancelled, IsOk());
  ASSERT_EQ(cancelled->job.earlier_attempts.size(), 1u);
  EXPECT_EQ(cancelled->job.earlier_attempts[0].error, "lost");
  EXPECT_EQ(Get("j_cancel").earlier_attempts.size(), 1u);
  // A job never retried has none, ended or not.
  Insert(MakeJob("j_plain"));
  EXPECT_TRUE(Get("j_plain").earlier_attempts.empty());
}

TEST_F(PgJobStoreTest, JobCompletesAtMostOnce) {
  InsertRunning("j_1");
  EXPECT_THAT(store_->Finish({.job_id = "j_1",
                              .attempt = 1,
                              .state = JobState::kSucceeded,
                              .result = std::string("ok\0bytes", 8)}),
              IsOkAndHolds(true));
  EXPECT_THAT(
      store_->Finish({.job_id = "j_1", .attempt = 1, .state = JobState::kFailed, .error = "x"}),
      IsOkAndHolds(false));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kSucceeded);
  EXPECT_EQ(got.result, std::string("ok\0bytes", 8));
  EXPECT_EQ(got.error, "");
  EXPECT_NE(got.finished_at, absl::InfinitePast());
}

TEST_F(PgJobStoreTest, FinishAcceptsResultThatOvertookItsAccept) {
  Insert(MakeJob("j_1"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  EXPECT_THAT(
      store_->Finish(
          {.job_id = "j_1", .attempt = 1, .state = JobState::kFailed, .error = "bad input"}),
      IsOkAndHolds(true));
  Job got = Get("j_1");
  EXPECT_EQ(got.state, JobState::kFailed);
  EXPECT_EQ(got.attempt, 1);
  EXPECT_EQ(got.error, "bad input");
  // The accept arriving afterwards changes nothing.
  EXPECT_THAT(store_->MarkRunning("j_1", 1, "w1"), IsOkAndHolds(false));
}

TEST_F(PgJobStoreTest, FinishRefusesNonTerminalState) {
  InsertRunning("j_1");
  EXPECT_THAT(store_->Finish({.job_id = "j_1", .attempt = 1, .state = JobState::kQueued}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(PgJobStoreTest, MarkRunningManyMarksCurrentAcceptsAndSkipsStaleOnes) {
  for (const char* id : {"j_1", "j_2", "j_3"}) Insert(MakeJob(id));
  ASSERT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_2", .attempt = 0, .worker_id = "w2"}}),
              IsOkAndHolds(UnorderedElementsAre("j_1", "j_2")));
  // j_2 at a stale attempt, j_3 still queued, j_missing unknown: only j_1 moves.
  EXPECT_THAT(store_->MarkRunningMany({{.job_id = "j_1", .attempt = 1, .worker_id = "w1"},
                                       {.job_id = "j_2", .attempt = 2, .worker_id = "w2"},
                                       {.job_id = "j_3", .attempt = 1, .worker_id = "w1"},
                                       {.job_id = "j_missing", .attempt = 1, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  Job j1 = Get("j_1");
  EXPECT_EQ(j1.state, JobState::kRunning);
  EXPECT_EQ(j1.attempt, 1);
  EXPECT_EQ(j1.worker_id, "w1");
  EXPECT_NE(j1.started_at, absl::InfinitePast());
  EXPECT_EQ(Get("j_2").state, JobState::kDispatched);
  EXPECT_EQ(Get("j_3").state, JobState::kQueued);
  // Re-attaching a running row at its attempt keeps it running.
  EXPECT_THAT(store_->MarkRunningMany({{.job_id = "j_1", .attempt = 1, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_1")));
  EXPECT_THAT(store_->MarkRunningMany({}), IsOkAndHolds(IsEmpty()));
}

TEST_F(PgJobStoreTest, FinishManyRecordsEachOutcomeOnceIncludingOnesThatOvertookTheirAccept) {
  InsertRunning("j_run");
  Insert(MakeJob("j_disp"));
  Insert(MakeJob("j_fail"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_disp", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_fail", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(UnorderedElementsAre("j_disp", "j_fail")));
  const std::string binary("\x00\x01\xff\\x'\"{},", 10);
  std::vector<FinishRequest> reqs = {
      {.job_id = "j_run", .attempt = 1, .state = JobState::kSucceeded, .result = binary},
      {.job_id = "j_disp", .attempt = 1, .state = JobState::kSucceeded, .result = ""},
      {.job_id = "j_fail", .attempt = 1, .state = JobState::kFailed, .error = "bad \"input\""},
      {.job_id = "j_run", .attempt = 2, .state = JobState::kSucceeded, .result = "stale"}};
  EXPECT_THAT(store_->FinishMany(reqs),
              IsOkAndHolds(UnorderedElementsAre("j_run", "j_disp", "j_fail")));
  Job run = Get("j_run");
  EXPECT_EQ(run.state, JobState::kSucceeded);
  EXPECT_EQ(run.result, binary);
  EXPECT_NE(run.finished_at, absl::InfinitePast());
  Job disp = Get("j_disp");
  EXPECT_EQ(disp.state, JobState::kSucceeded);
  EXPECT_EQ(disp.attempt, 1);
  Job failed = Get("j_fail");
  EXPECT_EQ(failed.state, JobState::kFailed);
  EXPECT_EQ(failed.error, "bad \"input\"");
  // Each job completes at most once.
  EXPECT_THAT(store_->FinishMany(reqs), IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->FinishMany({{.job_id = "j_x", .attempt = 1, .state = JobState::kExpired}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "state"));
}

TEST_F(PgJobStoreTest, WriteTurnFinishesMarksAndClaimsInOneTransaction) {
  InsertRunning("j_done");
  for (const char* id : {"j_acc", "j_new", "j_taken"}) Insert(MakeJob(id));
  ASSERT_THAT(store_->Claim({{.job_id = "j_acc", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_taken", .attempt = 0, .worker_id = "w9"}}),
              IsOkAndHolds(UnorderedElementsAre("j_acc", "j_taken")));
  absl::StatusOr<TurnOutcome> out =
      store_->WriteTurn({.finishes = {{.job_id = "j_done", .attempt = 1, .result = "ok"}},
                         .marks = {{.job_id = "j_acc", .attempt = 1, .worker_id = "w1"}},
                         .claims = {{.job_id = "j_new", .attempt = 0, .worker_id = "w2"},
                                    {.job_id = "j_taken", .attempt = 0, .worker_id = "w2"}}});
  ASSERT_THAT(out, IsOk());
  EXPECT_THAT(out->finished, ElementsAre("j_done"));
  EXPECT_THAT(out->marked, ElementsAre("j_acc"));
  EXPECT_THAT(out->claimed, ElementsAre("j_new"));  // j_taken is no longer queued
  EXPECT_EQ(Get("j_done").state, JobState::kSucceeded);
  EXPECT_EQ(Get("j_done").result, "ok");
  EXPECT_EQ(Get("j_acc").state, JobState::kRunning);
  EXPECT_EQ(Get("j_new").state, JobState::kDispatched);
  EXPECT_EQ(Get("j_new").worker_id, "w2");
  EXPECT_EQ(Get("j_taken").worker_id, "w9");
  // A bad request fails the whole turn before anything is written.
  EXPECT_THAT(store_->WriteTurn(
                  {.finishes = {{.job_id = "j_acc", .attempt = 1, .state = JobState::kQueued}},
                   .marks = {},
                   .claims = {}}),
              StatusIs(absl::StatusCode::kInvalidArgument, "state"));
  EXPECT_THAT(store_->WriteTurn({}), IsOk());
}

TEST_F(PgJobStoreTest, WriteTurnReturnsTheRowTimesOfTheFinishesThatAskForThem) {
  for (const char* id : {"j_want", "j_not"}) Insert(MakeJob(id));
  ASSERT_THAT(store_->Claim({{.job_id = "j_want", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_not", .attempt = 0, .worker_id = "w1"}}),
              IsOk());
  absl::StatusOr<TurnOutcome> out = store_->WriteTurn(
      {.finishes = {{.job_id = "j_want", .attempt = 1, .ran = absl::Seconds(2), .row_times = true},
                    {.job_id = "j_not", .attempt = 1, .ran = absl::Seconds(2)}}});
  ASSERT_THAT(out, IsOk());
  ASSERT_THAT(out->finished, UnorderedElementsAre("j_want", "j_not"));
  ASSERT_EQ(out->finished_times.size(), 2);
  for (size_t i = 0; i < 2; ++i) {
    const std::optional<TurnOutcome::Times>& t = out->finished_times[i];
    if (out->finished[i] == "j_not") {
      EXPECT_EQ(t, std::nullopt);
      continue;
    }
    // The times the row was committed with, as a read of it gives them.
    ASSERT_NE(t, std::nullopt);
    const Job want = Get("j_want");
    EXPECT_EQ(t->created_at, want.created_at);
    EXPECT_EQ(t->dispatched_at, want.dispatched_at);
    EXPECT_EQ(t->started_at, want.started_at);
    EXPECT_EQ(t->finished_at, want.finished_at);
    EXPECT_EQ(t->not_before, want.spec.not_before);
    EXPECT_EQ(t->finished_at - t->started_at, absl::Seconds(2));
  }
}

TEST_F(PgJobStoreTest, WriteTurnRetriesAndReturnsInTheSameTransaction) {
  for (const char* id : {"j_retry", "j_back", "j_gone"}) Insert(MakeJob(id));
  ASSERT_THAT(store_->Claim({{.job_id = "j_retry", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_back", .attempt = 0, .worker_id = "w1"}}),
              IsOk());
  const absl::Time later = absl::FromUnixSeconds(4'000'000'000);
  absl::StatusOr<TurnOutcome> out = store_->WriteTurn(
      {.claims = {{.job_id = "j_gone", .attempt = 0, .worker_id = "w2"}},
       .retries = {{.job_id = "j_retry", .attempt = 1, .not_before = later, .error = "oom"}},
       .returns = {{.job_id = "j_back", .attempt = 0},
                   {.job_id = "j_gone", .attempt = 5}}});  // stale: left alone
  ASSERT_THAT(out, IsOk());
  EXPECT_THAT(out->retried, ElementsAre("j_retry"));
  EXPECT_THAT(out->returned, ElementsAre("j_back"));
  EXPECT_THAT(out->claimed, ElementsAre("j_gone"));
  const Job retried = Get("j_retry");
  EXPECT_EQ(retried.state, JobState::kQueued);
  EXPECT_EQ(retried.attempt, 1);
  EXPECT_EQ(retried.error, "oom");
  EXPECT_EQ(retried.spec.not_before, later);
  EXPECT_EQ(Get("j_back").state, JobState::kQueued);
  EXPECT_EQ(Get("j_back").attempt, 0);
  EXPECT_EQ(Get("j_gone").state, JobState::kDispatched);
}

TEST_F(PgJobStoreTest, AnOutcomeThatOvertookItsMarkRecordsWhenItStarted) {
  Insert(MakeJob("j_fast"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_fast", .attempt = 0, .worker_id = "w1"}}), IsOk());
  ASSERT_THAT(store_->WriteTurn({.finishes = {{.job_id = "j_fast",
                                               .attempt = 1,
                                               .result = "ok",
                                               .ran = absl::Seconds(2)}}}),
              IsOkAndHolds(Field(&TurnOutcome::finished, ElementsAre("j_fast"))));
  const Job fast = Get("j_fast");
  ASSERT_NE(fast.started_at, absl::InfinitePast());
  EXPECT_EQ(fast.finished_at - fast.started_at, absl::Seconds(2));
}

TEST_F(PgJobStoreTest, CancelQueuedJob) {
  Insert(MakeJob("j_1"));
  absl::StatusOr<CancelOutcome> outcome = store_->Cancel("j_1", "user asked");
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(outcome->previous, JobState::kQueued);
  EXPECT_EQ(outcome->job.state, JobState::kCancelled);
  EXPECT_EQ(outcome->job.error, "user asked");
  EXPECT_NE(outcome->job.finished_at, absl::InfinitePast());
  EXPECT_EQ(Get("j_1").state, JobState::kCancelled);
  EXPECT_THAT(store_->Claim({{.job_id = "j_1", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(IsEmpty()));
}

TEST_F(PgJobStoreTest, CancelRunningJobKeepsItsWorker) {
  InsertRunning("j_1", "w9");
  absl::StatusOr<CancelOutcome> outcome = store_->Cancel("j_1", "stop");
  ASSERT_THAT(outcome, IsOk());
  EXPECT_EQ(outcome->previous, JobState::kRunning);
  EXPECT_EQ(outcome->job.state, JobState::kCancelled);
  EXPECT_EQ(outcome->job.worker_id, "w9");
  EXPECT_EQ(outcome->job.attempt, 1);
  // The worker's late result is refused.
  EXPECT_THAT(store_->Finish({.job_id = "j_1", .attempt = 1}), IsOkAndHolds(false));
}

TEST_F(PgJobStoreTest, CancelFinishedJobIsFailedPrecondition) {
  InsertRunning("j_123");
  ASSERT_THAT(store_->Finish({.job_id = "j_123", .attempt = 1}), IsOkAndHolds(true));
  EXPECT_THAT(store_->Cancel("j_123", "too late"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "job j_123 already SUCCEEDED"));
  EXPECT_EQ(Get("j_123").state, JobState::kSucceeded);
}

TEST_F(PgJobStoreTest, CancelUnknownJobIsNotFound) {
  EXPECT_THAT(store_->Cancel("j_nope", "x"), StatusIs(absl::StatusCode::kNotFound, "j_nope"));
}

TEST_F(PgJobStoreTest, ExpireOverdueExpiresOnlyQueuedJobsPastTheirDeadline) {
  Job overdue = MakeJob("j_overdue");
  overdue.spec.dispatch_deadline = absl::Seconds(1);
  Job later = MakeJob("j_later");
  later.spec.dispatch_deadline = absl::Hours(1);
  Job never = MakeJob("j_never");  // no deadline
  Job running = MakeJob("j_running");
  running.spec.dispatch_deadline = absl::Seconds(1);
  Insert(overdue);
  Insert(later);
  Insert(never);
  Insert(running);
  ASSERT_THAT(store_->Claim({{.job_id = "j_running", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_running")));

  const absl::Time now = Get("j_overdue").created_at + absl::Minutes(1);
  EXPECT_THAT(store_->ExpireOverdue(now, "capacity: no worker within 1s"),
              IsOkAndHolds(ElementsAre("j_overdue")));
  Job got = Get("j_overdue");
  EXPECT_EQ(got.state, JobState::kExpired);
  EXPECT_EQ(got.error, "capacity: no worker within 1s");
  EXPECT_NE(got.finished_at, absl::InfinitePast());
  EXPECT_EQ(Get("j_later").state, JobState::kQueued);
  EXPECT_EQ(Get("j_never").state, JobState::kQueued);
  EXPECT_EQ(Get("j_running").state, JobState::kDispatched);
  // Nothing is due any more.
  EXPECT_THAT(store_->ExpireOverdue(now, "capacity"), IsOkAndHolds(IsEmpty()));
}

TEST_F(PgJobStoreTest, ClaimReturnsThePayloadsOfTheJobsItClaimed) {
  Insert(MakeJob("j_1"));
  Insert(MakeJob("j_2"));
  Insert(MakeJob("j_3"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_3", .attempt = 0, .worker_id = "w1"}}), IsOk());
  std::vector<std::string> payloads;
  absl::StatusOr<std::vector<std::string>> claimed =
      store_->Claim({{.job_id = "j_2", .attempt = 0, .worker_id = "w1"},
                     {.job_id = "j_3", .attempt = 0, .worker_id = "w1"},
                     {.job_id = "j_1", .attempt = 0, .worker_id = "w1"}},
                    &payloads);
  ASSERT_THAT(claimed, IsOk());
  ASSERT_EQ(claimed->size(), 2u);
  ASSERT_EQ(payloads.size(), 2u);
  for (size_t i = 0; i < claimed->size(); ++i) {
    EXPECT_EQ(payloads[i], "payload of " + (*claimed)[i]);
  }
  absl::StatusOr<TurnOutcome> turn = store_->WriteTurn({.claims = {}});
  ASSERT_THAT(turn, IsOk());
  Insert(MakeJob("j_4"));
  turn = store_->WriteTurn({.claims = {{.job_id = "j_4", .attempt = 0, .worker_id = "w2"}}});
  ASSERT_THAT(turn, IsOk());
  EXPECT_THAT(turn->claimed, ElementsAre("j_4"));
  EXPECT_THAT(turn->claimed_payloads, ElementsAre("payload of j_4"));
}

TEST_F(PgJobStoreTest, ConcurrentClaimsOfTheSameRowsClaimEachRowOnce) {
  constexpr int kJobs = 50;
  constexpr int kThreads = 4;
  constexpr int kClaimsPerThread = 25;  // 100 Claim calls in all
  std::vector<ClaimRequest> all;
  for (int i = 0; i < kJobs; ++i) {
    const std::string id = absl::StrCat("j_", i);
    Insert(MakeJob(id));
    all.push_back({.job_id = id, .attempt = 0});
  }
  absl::Mutex mu;
  std::vector<std::string> claimed;  // guarded by mu
  std::vector<absl::Status> errors;  // guarded by mu
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < kClaimsPerThread; ++c) {
        std::vector<ClaimRequest> requests = all;
        // Each call asks for every row, in a different order.
        std::rotate(requests.begin(), requests.begin() + (t * 13 + c * 7) % kJobs, requests.end());
        for (ClaimRequest& r : requests) r.worker_id = absl::StrCat("w", t);
        absl::StatusOr<std::vector<std::string>> got = store_->Claim(requests);
        absl::MutexLock l(&mu);
        if (got.ok()) {
          claimed.insert(claimed.end(), got->begin(), got->end());
        } else {
          errors.push_back(got.status());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_THAT(errors, IsEmpty());
  std::sort(claimed.begin(), claimed.end());
  EXPECT_EQ(claimed.size(), static_cast<size_t>(kJobs));
  EXPECT_EQ(std::adjacent_find(claimed.begin(), claimed.end()), claimed.end())
      << "a row was claimed twice";
  absl::StatusOr<std::vector<TypeStateCount>> counts = store_->CountByTypeAndState();
  ASSERT_THAT(counts, IsOk());
  ASSERT_EQ(counts->size(), 1u);
  EXPECT_EQ((*counts)[0].state, JobState::kDispatched);
  EXPECT_EQ((*counts)[0].count, kJobs);
}

}  // namespace
}  // namespace dispatchd::store
