#include "tests/testing/fake_job_store.h"

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/job/job.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::testing {
namespace {

using job::JobState;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

// OK, with a value `matcher` matches.
MATCHER_P(IsOkAndHolds, matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

job::Job NewJob(const std::string& id, const std::string& idempotency_key = "") {
  job::Job job;
  job.id = id;
  job.spec.type = "echo";
  job.spec.payload = "payload of " + id;
  job.spec.fairness_key = "team-a";
  job.spec.idempotency_key = idempotency_key;
  job.spec.max_attempts = 3;
  job.spec.timeout = absl::Seconds(30);
  return job;
}

class FakeJobStoreTest : public ::testing::Test {
 protected:
  // Inserts `id`, claims it for worker w1 and marks attempt 1 running.
  void Run(const std::string& id) {
    ASSERT_THAT(store_.Insert(NewJob(id)), IsOk());
    ASSERT_THAT(store_.Claim({{.job_id = id, .attempt = 0, .worker_id = "w1"}}),
                IsOkAndHolds(ElementsAre(id)));
    ASSERT_THAT(store_.MarkRunning(id, 1, "w1"), IsOkAndHolds(true));
  }

  FakeClock clock_;
  FakeJobStore store_{&clock_};
};

TEST_F(FakeJobStoreTest, InsertThenGet) {
  absl::StatusOr<store::InsertOutcome> a = store_.Insert(NewJob("a"));
  ASSERT_THAT(a, IsOk());
  EXPECT_EQ(a->job_id, "a");
  EXPECT_FALSE(a->deduplicated);
  absl::StatusOr<store::InsertOutcome> b = store_.Insert(NewJob("b"));
  ASSERT_THAT(b, IsOk());
  EXPECT_GT(b->seq, a->seq);

  absl::StatusOr<job::Job> got = store_.Get("a");
  ASSERT_THAT(got, IsOk());
  EXPECT_EQ(got->state, JobState::kQueued);
  EXPECT_EQ(got->attempt, 0);
  EXPECT_EQ(got->spec.payload, "payload of a");
  EXPECT_EQ(got->created_at, clock_.TimeNow());
  EXPECT_THAT(store_.Get("nope"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_.Insert(NewJob("a")), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(store_.Insert(NewJob("")), StatusIs(absl::StatusCode::kInvalidArgument));

  // The dispatcher's loads come without payloads.
  absl::StatusOr<store::QueuedHeads> heads = store_.LoadQueuedHeads(1);
  ASSERT_THAT(heads, IsOk());
  ASSERT_EQ(heads->queues.size(), 1u);
  EXPECT_EQ(heads->queues[0].queued, 2);
  ASSERT_EQ(heads->jobs.size(), 1u);
  EXPECT_EQ(heads->jobs[0].id, "a");
  EXPECT_THAT(heads->jobs[0].spec.payload, IsEmpty());
}

TEST_F(FakeJobStoreTest, IdempotencyKeyReturnsTheHolder) {
  ASSERT_THAT(store_.Insert(NewJob("a", "k")), IsOk());
  absl::StatusOr<store::InsertOutcome> again = store_.Insert(NewJob("b", "k"));
  ASSERT_THAT(again, IsOk());
  EXPECT_TRUE(again->deduplicated);
  EXPECT_EQ(again->job_id, "a");
  EXPECT_THAT(store_.Get("b"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(FakeJobStoreTest, ClaimAndFinishCompareTheAttempt) {
  Run("a");
  // A claim of a row that is no longer QUEUED at that attempt changes nothing.
  EXPECT_THAT(store_.Claim({{.job_id = "a", .attempt = 0, .worker_id = "w2"}}),
              IsOkAndHolds(IsEmpty()));

  // The wrong attempt is stale.
  EXPECT_THAT(store_.Finish({.job_id = "a", .attempt = 2, .state = JobState::kSucceeded}),
              IsOkAndHolds(false));
  EXPECT_THAT(store_.FinishMany({{.job_id = "a", .attempt = 0, .state = JobState::kFailed}}),
              IsOkAndHolds(IsEmpty()));
  ASSERT_THAT(store_.Get("a"), IsOk());
  EXPECT_EQ(store_.Get("a")->state, JobState::kRunning);

  EXPECT_THAT(
      store_.Finish({.job_id = "a", .attempt = 1, .state = JobState::kSucceeded, .result = "out"}),
      IsOkAndHolds(true));
  absl::StatusOr<job::Job> done = store_.Get("a");
  ASSERT_THAT(done, IsOk());
  EXPECT_EQ(done->state, JobState::kSucceeded);
  EXPECT_EQ(done->attempt, 1);
  EXPECT_EQ(done->result, "out");
  EXPECT_EQ(done->worker_id, "w1");
  // Once ended, every write is stale.
  EXPECT_THAT(store_.Finish({.job_id = "a", .attempt = 1, .state = JobState::kFailed}),
              IsOkAndHolds(false));
  EXPECT_THAT(store_.Finish({.job_id = "a", .attempt = 1, .state = JobState::kExpired}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(FakeJobStoreTest, ResultThatOvertookItsAcceptFinishes) {
  ASSERT_THAT(store_.Insert(NewJob("a")), IsOk());
  ASSERT_THAT(store_.Claim({{.job_id = "a", .attempt = 0, .worker_id = "w1"}}), IsOk());
  absl::StatusOr<store::TurnOutcome> turn =
      store_.WriteTurn({.finishes = {{.job_id = "a", .attempt = 1, .state = JobState::kFailed}}});
  ASSERT_THAT(turn, IsOk());
  EXPECT_THAT(turn->finished, ElementsAre("a"));
  EXPECT_EQ(store_.Get("a")->state, JobState::kFailed);
}

TEST_F(FakeJobStoreTest, Cancel) {
  Run("a");
  absl::StatusOr<store::CancelOutcome> cancelled = store_.Cancel("a", "by client");
  ASSERT_THAT(cancelled, IsOk());
  EXPECT_EQ(cancelled->previous, JobState::kRunning);
  EXPECT_EQ(cancelled->job.state, JobState::kCancelled);
  EXPECT_EQ(cancelled->job.error, "by client");
  EXPECT_THAT(store_.Cancel("a", "again"), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store_.Cancel("nope", "x"), StatusIs(absl::StatusCode::kNotFound));
  // The worker's late result is stale.
  EXPECT_THAT(store_.Finish({.job_id = "a", .attempt = 1, .state = JobState::kSucceeded}),
              IsOkAndHolds(false));
}

TEST_F(FakeJobStoreTest, FailCallFailsThatCallOnly) {
  ASSERT_THAT(store_.Insert(NewJob("a")), IsOk());
  store_.FailCall(2, absl::UnavailableError("database down"));
  EXPECT_THAT(store_.Get("a"), IsOk());
  EXPECT_THAT(store_.Claim({{.job_id = "a", .attempt = 0, .worker_id = "w1"}}),
              StatusIs(absl::StatusCode::kUnavailable));
  // The failed claim changed nothing; the next call goes through.
  EXPECT_EQ(store_.Get("a")->state, JobState::kQueued);
  EXPECT_THAT(store_.Claim({{.job_id = "a", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("a")));
}

TEST_F(FakeJobStoreTest, FencedWritesFailOnceAnotherLeads) {
  ASSERT_THAT(store_.Insert(NewJob("a")), IsOk());
  store_.SetLeaderEpoch(2);
  store_.SetFence(1);
  EXPECT_THAT(store_.Claim({{.job_id = "a", .attempt = 0, .worker_id = "w1"}}),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(store_.Get("a")->state, JobState::kQueued);
  // Cancels are open to every daemon.
  EXPECT_THAT(store_.Cancel("a", "x"), IsOk());
}

TEST_F(FakeJobStoreTest, ExpireOverdueTakesQueuedRowsPastTheirDeadline) {
  job::Job soon = NewJob("soon");
  soon.spec.dispatch_deadline = absl::Seconds(10);
  ASSERT_THAT(store_.Insert(soon), IsOk());
  ASSERT_THAT(store_.Insert(NewJob("never")), IsOk());
  EXPECT_THAT(store_.ExpireOverdue(clock_.TimeNow() + absl::Seconds(5), "late"),
              IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_.ExpireOverdue(clock_.TimeNow() + absl::Seconds(11), "late"),
              IsOkAndHolds(ElementsAre("soon")));
  EXPECT_EQ(store_.Get("soon")->state, JobState::kExpired);
  EXPECT_EQ(store_.Get("never")->state, JobState::kQueued);
}

}  // namespace
}  // namespace dispatchd::testing
