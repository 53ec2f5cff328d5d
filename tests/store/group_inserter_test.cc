#include "server/store/group_inserter.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/job/job.h"
#include "server/store/pg_job_store.h"
#include "tests/testing/pg_test_db.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::TestDatabase;

job::Job MakeJob(const std::string& id) {
  job::Job job;
  job.id = id;
  job.spec.type = "echo";
  job.spec.payload = "payload of " + id;
  job.spec.max_attempts = 3;
  job.spec.timeout = absl::Seconds(30);
  return job;
}

// What one Insert call got back.
struct Answer {
  std::vector<job::Job> jobs;
  absl::StatusOr<std::vector<InsertOutcome>> outcomes = absl::UnknownError("no answer");
};

// Collects the answers of many Insert calls and waits for them.
class Answers {
 public:
  GroupInserter::Done Slot(size_t i) {
    {
      absl::MutexLock l(&mu_);
      if (answers_.size() <= i) answers_.resize(i + 1);
    }
    return
        [this, i](std::vector<job::Job> jobs, absl::StatusOr<std::vector<InsertOutcome>> outcomes) {
          absl::MutexLock l(&mu_);
          answers_[i] = Answer{std::move(jobs), std::move(outcomes)};
          ++done_;
        };
  }

  // Waits up to 30 s for `n` answers; all answers so far.
  std::vector<std::optional<Answer>> Wait(size_t n) {
    absl::MutexLock l(&mu_);
    wanted_ = n;
    mu_.AwaitWithTimeout(absl::Condition(this, &Answers::Enough), absl::Seconds(30));
    return answers_;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::optional<Answer>> answers_ ABSL_GUARDED_BY(mu_);
  size_t done_ ABSL_GUARDED_BY(mu_) = 0;
  size_t wanted_ ABSL_GUARDED_BY(mu_) = 0;

  bool Enough() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return done_ >= wanted_; }
};

class GroupInserterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestDatabase> db = TestDatabase::Create("group_insert");
    ASSERT_THAT(db, IsOk());
    db_.emplace(*std::move(db));
    absl::StatusOr<std::unique_ptr<PgJobStore>> store =
        PgJobStore::Connect(PgStoreOptions{.url = db_->url(), .pool_size = 4});
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
  }

  std::optional<TestDatabase> db_;
  std::unique_ptr<PgJobStore> store_;
};

TEST_F(GroupInserterTest, CallsQueuedTogetherShareStatementsAndEachGetsItsOwnOutcomes) {
  GroupInserter inserter(*store_, {.max_rows = 1000, .flushers = 1});
  Answers answers;
  constexpr int kCalls = 300;
  for (int i = 0; i < kCalls; ++i) {
    std::vector<job::Job> jobs = {MakeJob(absl::StrCat("j_", i, "_a")),
                                  MakeJob(absl::StrCat("j_", i, "_b"))};
    inserter.Insert(std::move(jobs), false, answers.Slot(i));
  }
  std::vector<std::optional<Answer>> got = answers.Wait(kCalls);
  ASSERT_EQ(got.size(), size_t{kCalls});
  for (int i = 0; i < kCalls; ++i) {
    ASSERT_TRUE(got[i].has_value()) << i;
    ASSERT_THAT(got[i]->outcomes, IsOk());
    ASSERT_EQ(got[i]->outcomes->size(), 2u);
    EXPECT_EQ((*got[i]->outcomes)[0].job_id, absl::StrCat("j_", i, "_a"));
    EXPECT_EQ((*got[i]->outcomes)[1].job_id, absl::StrCat("j_", i, "_b"));
    // The jobs come back to their caller, moved out of the batch.
    ASSERT_EQ(got[i]->jobs.size(), 2u);
    EXPECT_EQ(got[i]->jobs[1].spec.payload, absl::StrCat("payload of j_", i, "_b"));
  }
  GroupInserter::Counts counts = inserter.counts();
  EXPECT_EQ(counts.rows, 2 * kCalls);
  // The first call went alone; the rest queued behind it and shared statements.
  EXPECT_LT(counts.statements, kCalls / 2);
  absl::StatusOr<int64_t> active = store_->CountActive();
  ASSERT_THAT(active, IsOk());
  EXPECT_EQ(*active, 2 * kCalls);
}

TEST_F(GroupInserterTest, ACallWhoseRowTheDatabaseRefusesFailsAloneAndWritesNothing) {
  ASSERT_THAT(store_->Insert(MakeJob("j_taken")), IsOk());
  // Stopping after queueing commits everything queued, in as few statements as it can.
  GroupInserter inserter(*store_, {.max_rows = 1000, .flushers = 1});
  Answers answers;
  inserter.Insert({MakeJob("j_before")}, false, answers.Slot(0));
  inserter.Insert({MakeJob("j_bad_1"), MakeJob("j_taken")}, false, answers.Slot(1));
  inserter.Insert({MakeJob("j_after_1"), MakeJob("j_after_2")}, false, answers.Slot(2));
  inserter.Stop();
  std::vector<std::optional<Answer>> got = answers.Wait(3);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_THAT(got[0]->outcomes, IsOk());
  EXPECT_EQ(got[1]->outcomes.status().code(), absl::StatusCode::kAlreadyExists)
      << got[1]->outcomes.status();
  EXPECT_THAT(got[2]->outcomes, IsOk());
  EXPECT_EQ(store_->Get("j_bad_1").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(store_->Get("j_after_2"), IsOk());

  // After Stop, a call is answered at once with UNAVAILABLE.
  Answers late;
  inserter.Insert({MakeJob("j_late")}, false, late.Slot(0));
  std::vector<std::optional<Answer>> refused = late.Wait(1);
  EXPECT_EQ(refused[0]->outcomes.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(refused[0]->jobs.size(), 1u);
}

}  // namespace
}  // namespace dispatchd::store
