// PgJobStore against PostgreSQL: inserts, reads by id, and idempotency keys.

#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/notification"
#include "pqxx/result"

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
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

TEST_F(PgJobStoreTest, InsertThenGetRoundTripsEveryField) {
  Job job = MakeJob("j_round_trip", "llm.cover_letter");
  job.spec.payload = std::string("\x00\x01\xff binary\0tail", 15);
  job.spec.resource_id = "doc-7";
  job.spec.fairness_key = "alice";
  job.spec.idempotency_key = "idem-1";
  job.spec.max_attempts = 5;
  job.spec.timeout = absl::Milliseconds(90'500);
  job.spec.dispatch_deadline = absl::Microseconds(12'345'678'901);
  job.spec.not_before = absl::FromUnixMicros(1'700'000'000'123'457);
  job.spec.labels = {{"gpu", "h100"},  {"quote\"s", "back\\slash"}, {"a,b", "{braces}"},
                     {"null", "NULL"}, {"unicode", "grüße ✓"},      {"empty", ""}};
  const absl::Time before = absl::Now() - absl::Seconds(5);
  Insert(job);

  Job got = Get(job.id);
  EXPECT_EQ(got.id, job.id);
  EXPECT_EQ(got.spec.type, job.spec.type);
  EXPECT_EQ(got.spec.payload, job.spec.payload);
  EXPECT_EQ(got.spec.resource_id, job.spec.resource_id);
  EXPECT_EQ(got.spec.fairness_key, job.spec.fairness_key);
  EXPECT_EQ(got.spec.idempotency_key, job.spec.idempotency_key);
  EXPECT_EQ(got.spec.max_attempts, job.spec.max_attempts);
  EXPECT_EQ(got.spec.timeout, job.spec.timeout);
  EXPECT_EQ(got.spec.dispatch_deadline, job.spec.dispatch_deadline);
  EXPECT_EQ(got.spec.not_before, job.spec.not_before);
  EXPECT_EQ(got.spec.labels, job.spec.labels);
  EXPECT_EQ(got.state, JobState::kQueued);
  EXPECT_EQ(got.attempt, 0);
  EXPECT_EQ(got.worker_id, "");
  EXPECT_EQ(got.result, "");
  EXPECT_EQ(got.error, "");
  EXPECT_GT(got.created_at, before);
  EXPECT_LT(got.created_at, absl::Now() + absl::Seconds(5));
  EXPECT_EQ(got.updated_at, got.created_at);
  EXPECT_EQ(got.dispatched_at, absl::InfinitePast());
  EXPECT_EQ(got.started_at, absl::InfinitePast());
  EXPECT_EQ(got.finished_at, absl::InfinitePast());
}

TEST_F(PgJobStoreTest, DefaultsRoundTripAsNone) {
  Job job = MakeJob("j_defaults");
  job.spec.payload = "";
  Insert(job);
  Job got = Get(job.id);
  EXPECT_EQ(got.spec.payload, "");
  EXPECT_EQ(got.spec.dispatch_deadline, absl::InfiniteDuration());
  EXPECT_EQ(got.spec.not_before, absl::InfinitePast());
  EXPECT_THAT(got.spec.labels, IsEmpty());
}

TEST_F(PgJobStoreTest, GetUnknownIdIsNotFound) {
  EXPECT_THAT(store_->Get("j_nope"), StatusIs(absl::StatusCode::kNotFound, "j_nope"));
}

TEST_F(PgJobStoreTest, GetManyReturnsTheJobsThatExistInOneCall) {
  Insert(MakeJob("j_m1"));
  Insert(MakeJob("j_m2"));
  absl::StatusOr<std::vector<Job>> got = store_->GetMany({"j_m2", "j_missing", "j_m1"});
  ASSERT_THAT(got, IsOk());
  std::vector<std::string> ids;
  for (const Job& j : *got) ids.push_back(j.id);
  EXPECT_THAT(ids, UnorderedElementsAre("j_m1", "j_m2"));
  for (const Job& j : *got) EXPECT_EQ(j.spec.payload, "payload of " + j.id);
  EXPECT_THAT(store_->GetMany({}), IsOkAndHolds(IsEmpty()));
}

TEST_F(PgJobStoreTest, InsertOfExistingIdIsAlreadyExists) {
  Insert(MakeJob("j_dup"));
  EXPECT_THAT(store_->Insert(MakeJob("j_dup")), StatusIs(absl::StatusCode::kAlreadyExists));
}

TEST_F(PgJobStoreTest, InsertRejectsInvalidSpec) {
  Job job = MakeJob("j_bad");
  job.spec.timeout = absl::Seconds(-1);
  EXPECT_THAT(store_->Insert(job), StatusIs(absl::StatusCode::kInvalidArgument, "timeout"));
  job = MakeJob(std::string("j_\0nul", 6));
  EXPECT_THAT(store_->Insert(job), StatusIs(absl::StatusCode::kInvalidArgument, "NUL"));
}

TEST_F(PgJobStoreTest, InsertDeduplicatesByFairnessAndIdempotencyKey) {
  Job first = MakeJob("j_first");
  first.spec.fairness_key = "alice";
  first.spec.idempotency_key = "k1";
  Insert(first);

  Job again = MakeJob("j_again");
  again.spec.fairness_key = "alice";
  again.spec.idempotency_key = "k1";
  absl::StatusOr<InsertOutcome> outcome = store_->Insert(again);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_TRUE(outcome->deduplicated);
  EXPECT_EQ(outcome->job_id, "j_first");
  EXPECT_THAT(store_->Get("j_again"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PgJobStoreTest, IdempotencyKeyIsScopedToTheFairnessKey) {
  Job alice = MakeJob("j_alice");
  alice.spec.fairness_key = "alice";
  alice.spec.idempotency_key = "k1";
  Insert(alice);
  Job bob = MakeJob("j_bob");
  bob.spec.fairness_key = "bob";
  bob.spec.idempotency_key = "k1";
  absl::StatusOr<InsertOutcome> outcome = store_->Insert(bob);
  ASSERT_THAT(outcome, IsOk());
  EXPECT_FALSE(outcome->deduplicated);
  EXPECT_EQ(outcome->job_id, "j_bob");
}

TEST_F(PgJobStoreTest, EmptyIdempotencyKeyNeverDeduplicates) {
  Job a = MakeJob("j_a");
  a.spec.fairness_key = "alice";
  Job b = MakeJob("j_b");
  b.spec.fairness_key = "alice";
  Insert(a);
  Insert(b);
  EXPECT_THAT(store_->CountActive(), IsOkAndHolds(2));
}

TEST_F(PgJobStoreTest, ConcurrentInsertsWithOneIdempotencyKeyCreateOneJob) {
  constexpr int kThreads = 4;
  std::vector<std::future<absl::StatusOr<InsertOutcome>>> results;
  for (int i = 0; i < kThreads; ++i) {
    results.push_back(std::async(std::launch::async, [this, i] {
      Job job = MakeJob(absl::StrCat("j_race_", i));
      job.spec.fairness_key = "alice";
      job.spec.idempotency_key = "same";
      return store_->Insert(job);
    }));
  }
  std::set<std::string> ids;
  int inserted = 0;
  for (auto& f : results) {
    absl::StatusOr<InsertOutcome> outcome = f.get();
    ASSERT_THAT(outcome, IsOk());
    ids.insert(outcome->job_id);
    if (!outcome->deduplicated) ++inserted;
  }
  EXPECT_EQ(inserted, 1);
  EXPECT_EQ(ids.size(), 1u);
}

// Outcomes of InsertMany as "id" or "id (dup)", in order.
std::vector<std::string> Describe(const std::vector<InsertOutcome>& outcomes) {
  std::vector<std::string> out;
  for (const InsertOutcome& o : outcomes) {
    out.push_back(o.deduplicated ? o.job_id + " (dup)" : o.job_id);
  }
  return out;
}

TEST_F(PgJobStoreTest, InsertManyWritesEveryJobInArrivalOrder) {
  std::vector<Job> jobs;
  for (int i = 0; i < 5; ++i) jobs.push_back(MakeJob(absl::StrCat("j_many_", 4 - i)));
  jobs[2].spec.labels = {{"gpu", "h100"}, {"quote\"s", "{braces},"}};
  jobs[3].spec.dispatch_deadline = absl::Seconds(90);
  jobs[4].spec.not_before = absl::FromUnixMicros(1'700'000'000'123'457);
  absl::StatusOr<std::vector<InsertOutcome>> outcomes = store_->InsertMany(jobs, false);
  ASSERT_THAT(outcomes, IsOk());
  EXPECT_THAT(Describe(*outcomes),
              ElementsAre("j_many_4", "j_many_3", "j_many_2", "j_many_1", "j_many_0"));
  absl::StatusOr<std::vector<Job>> active = store_->LoadActive();
  ASSERT_THAT(active, IsOk());
  std::vector<std::string> order;
  for (const Job& j : *active) order.push_back(j.id);
  EXPECT_THAT(order, ElementsAre("j_many_4", "j_many_3", "j_many_2", "j_many_1", "j_many_0"));
  for (const Job& want : jobs) {
    Job got = Get(want.id);
    EXPECT_EQ(got.state, JobState::kQueued);
    EXPECT_EQ(got.spec.payload, want.spec.payload);
    EXPECT_EQ(got.spec.labels, want.spec.labels);
    EXPECT_EQ(got.spec.timeout, want.spec.timeout);
    EXPECT_EQ(got.spec.dispatch_deadline, want.spec.dispatch_deadline);
    EXPECT_EQ(got.spec.not_before, want.spec.not_before);
  }
}

TEST_F(PgJobStoreTest, InsertManyDeduplicatesAgainstStoredJobsAndWithinTheCall) {
  Insert(KeyedJob("j_held", "k1"));
  std::vector<Job> jobs = {KeyedJob("j_a", "k1"), KeyedJob("j_b", "k2"), MakeJob("j_c"),
                           KeyedJob("j_d", "k2"), KeyedJob("j_e", "k1", "bob")};
  absl::StatusOr<std::vector<InsertOutcome>> outcomes = store_->InsertMany(jobs, false);
  ASSERT_THAT(outcomes, IsOk());
  EXPECT_THAT(Describe(*outcomes), ElementsAre("j_held (dup)", "j_b", "j_c", "j_b (dup)", "j_e"));
  EXPECT_THAT(store_->Get("j_a"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->Get("j_d"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(store_->CountActive(), IsOkAndHolds(4));
}

TEST_F(PgJobStoreTest, InsertManyOfOneKeyedJob) {
  absl::StatusOr<std::vector<InsertOutcome>> outcomes =
      store_->InsertMany({KeyedJob("j_1", "order-1", "order")}, false);
  ASSERT_THAT(outcomes, IsOk());
  EXPECT_THAT(Describe(*outcomes), ElementsAre("j_1"));
}

TEST_F(PgJobStoreTest, InsertManyIsAllOrNothing) {
  Insert(MakeJob("j_taken"));
  std::vector<Job> jobs = {MakeJob("j_new"), MakeJob("j_taken")};
  EXPECT_THAT(store_->InsertMany(jobs, false), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(store_->Get("j_new"), StatusIs(absl::StatusCode::kNotFound));

  jobs = {KeyedJob("j_keyed", "k9"), MakeJob("j_taken")};
  EXPECT_THAT(store_->InsertMany(jobs, false), StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(store_->Get("j_keyed"), StatusIs(absl::StatusCode::kNotFound));

  Job bad = MakeJob("j_bad");
  bad.spec.type = std::string("nul\0", 4);
  jobs = {MakeJob("j_fine"), bad};
  EXPECT_THAT(store_->InsertMany(jobs, false),
              StatusIs(absl::StatusCode::kInvalidArgument, "jobs[1]."));
  EXPECT_THAT(store_->Get("j_fine"), StatusIs(absl::StatusCode::kNotFound));
}

// Collects the payloads of NOTIFY dispatchd_jobs, the channel a standby tells the leader on.
class JobNotifications final : public pqxx::notification_receiver {
 public:
  explicit JobNotifications(pqxx::connection_base& conn)
      : pqxx::notification_receiver(conn, "dispatchd_jobs") {}
  void operator()(const std::string& payload, int /*backend_pid*/) override {
    payloads.push_back(payload);
  }
  std::vector<std::string> payloads;
};

TEST_F(PgJobStoreTest, InsertManyNotifiesTheLeaderOfEachNewRowOnlyWhenAsked) {
  pqxx::connection conn(db_->url());
  JobNotifications notes(conn);
  ASSERT_THAT(store_->InsertMany({MakeJob("j_quiet")}, false), IsOk());
  Insert(KeyedJob("j_held", "k1"));
  ASSERT_THAT(
      store_->InsertMany({MakeJob("j_loud_1"), KeyedJob("j_dup", "k1"), MakeJob("j_loud_2")}, true),
      IsOk());
  // NOTIFY is delivered at commit, so every payload is here once the call has returned.
  for (int i = 0; i < 50 && notes.payloads.size() < 2; ++i) conn.await_notification(0, 100'000);
  conn.get_notifs();
  EXPECT_THAT(notes.payloads, UnorderedElementsAre("j_loud_1", "j_loud_2"));
}

// A job the leader places as it inserts it (worker_id set).
Job PlacedJob(Job job, const std::string& worker_id) {
  job.worker_id = worker_id;
  return job;
}

TEST_F(PgJobStoreTest, APlacedJobIsWrittenDispatchedToItsWorkerByItsInsert) {
  absl::StatusOr<std::vector<InsertOutcome>> outcomes =
      store_->InsertMany({PlacedJob(MakeJob("j_placed"), "w1"), MakeJob("j_queued")}, false);
  ASSERT_THAT(outcomes, IsOk());
  EXPECT_TRUE((*outcomes)[0].dispatched);
  EXPECT_FALSE((*outcomes)[1].dispatched);
  const Job placed = Get("j_placed");
  EXPECT_EQ(placed.state, JobState::kDispatched);
  EXPECT_EQ(placed.worker_id, "w1");
  EXPECT_EQ(placed.attempt, 0);
  EXPECT_EQ(placed.dispatched_at, placed.created_at);  // one transaction, one commit
  const Job queued = Get("j_queued");
  EXPECT_EQ(queued.state, JobState::kQueued);
  EXPECT_EQ(queued.worker_id, "");
  // From here the placed row is what a claim leaves: its worker's attempt 1 runs and ends it.
  EXPECT_THAT(store_->Claim({{.job_id = "j_placed", .attempt = 0, .worker_id = "w2"}}),
              IsOkAndHolds(IsEmpty()));
  EXPECT_THAT(store_->MarkRunning("j_placed", 1, "w1"), IsOkAndHolds(true));
  EXPECT_THAT(
      store_->FinishMany(
          {{.job_id = "j_placed", .attempt = 1, .state = JobState::kSucceeded, .result = "done"}}),
      IsOkAndHolds(ElementsAre("j_placed")));
}

TEST_F(PgJobStoreTest, ADeposedLeadersPlacedJobIsQueuedAndAnnouncedToTheNextLeader) {
  pqxx::connection conn(db_->url());
  JobNotifications notes(conn);
  store_->SetFence(41);  // the leader's epoch is another
  absl::StatusOr<std::vector<InsertOutcome>> outcomes =
      store_->InsertMany({PlacedJob(MakeJob("j_placed"), "w1")}, false);
  ASSERT_THAT(outcomes, IsOk());
  EXPECT_FALSE((*outcomes)[0].dispatched);
  const Job row = Get("j_placed");
  EXPECT_EQ(row.state, JobState::kQueued);
  EXPECT_EQ(row.worker_id, "");
  for (int i = 0; i < 50 && notes.payloads.empty(); ++i) conn.await_notification(0, 100'000);
  conn.get_notifs();
  EXPECT_THAT(notes.payloads, ElementsAre("j_placed"));
}

TEST_F(PgJobStoreTest, APlacedDuplicateIsNotWrittenAndItsHolderStaysAsItWas) {
  Insert(KeyedJob("j_held", "k1"));
  absl::StatusOr<std::vector<InsertOutcome>> outcomes =
      store_->InsertMany({PlacedJob(KeyedJob("j_dup", "k1"), "w1")}, false);
  ASSERT_THAT(outcomes, IsOk());
  EXPECT_TRUE((*outcomes)[0].deduplicated);
  EXPECT_FALSE((*outcomes)[0].dispatched);
  EXPECT_EQ((*outcomes)[0].job_id, "j_held");
  EXPECT_EQ(Get("j_held").state, JobState::kQueued);
  EXPECT_THAT(store_->Get("j_dup"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PgJobStoreTest, IdempotencyKeyOfAnActiveJobIsHeldWhateverTheWindow) {
  absl::StatusOr<std::unique_ptr<PgJobStore>> store = Connect(4, absl::ZeroDuration());
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT((*store)->Insert(KeyedJob("j_first", "k1")), IsOk());
  absl::StatusOr<InsertOutcome> queued = (*store)->Insert(KeyedJob("j_again", "k1"));
  ASSERT_THAT(queued, IsOk());
  EXPECT_TRUE(queued->deduplicated);
  EXPECT_EQ(queued->job_id, "j_first");

  ASSERT_THAT((*store)->Claim({{.job_id = "j_first", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_first")));
  ASSERT_THAT((*store)->MarkRunning("j_first", 1, "w1"), IsOkAndHolds(true));
  absl::StatusOr<InsertOutcome> running = (*store)->Insert(KeyedJob("j_again", "k1"));
  ASSERT_THAT(running, IsOk());
  EXPECT_TRUE(running->deduplicated);
  EXPECT_EQ(running->job_id, "j_first");
  EXPECT_THAT((*store)->Get("j_again"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PgJobStoreTest, IdempotencyKeyOfAnEndedJobIsHeldForTheWindowThenCreatesANewJob) {
  absl::StatusOr<std::unique_ptr<PgJobStore>> store = Connect(4, absl::Seconds(2));
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT((*store)->Insert(KeyedJob("j_first", "k1")), IsOk());
  ASSERT_THAT((*store)->Claim({{.job_id = "j_first", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_first")));
  ASSERT_THAT((*store)->Finish({.job_id = "j_first", .attempt = 1, .result = "r"}),
              IsOkAndHolds(true));

  // Inside the window: still a repeat.
  absl::StatusOr<InsertOutcome> held = (*store)->Insert(KeyedJob("j_held", "k1"));
  ASSERT_THAT(held, IsOk());
  EXPECT_TRUE(held->deduplicated);
  EXPECT_EQ(held->job_id, "j_first");
  EXPECT_THAT((*store)->Get("j_held"), StatusIs(absl::StatusCode::kNotFound));

  // Past the window: the key is free and the same request creates a new job.
  absl::SleepFor(absl::Seconds(2.5));
  absl::StatusOr<InsertOutcome> fresh = (*store)->Insert(KeyedJob("j_second", "k1"));
  ASSERT_THAT(fresh, IsOk());
  EXPECT_FALSE(fresh->deduplicated);
  EXPECT_EQ(fresh->job_id, "j_second");
  // The old job is still there with its key; the new one now holds the key.
  absl::StatusOr<Job> old = (*store)->Get("j_first");
  ASSERT_THAT(old, IsOk());
  EXPECT_EQ(old->state, JobState::kSucceeded);
  EXPECT_EQ(old->spec.idempotency_key, "k1");
  absl::StatusOr<InsertOutcome> third = (*store)->Insert(KeyedJob("j_third", "k1"));
  ASSERT_THAT(third, IsOk());
  EXPECT_TRUE(third->deduplicated);
  EXPECT_EQ(third->job_id, "j_second");
}

TEST_F(PgJobStoreTest, EveryWayAJobEndsHoldsItsKeyForTheWindow) {
  Insert(KeyedJob("j_cancelled", "k1"));
  ASSERT_THAT(store_->Cancel("j_cancelled", "by test"), IsOk());
  Job expiring = KeyedJob("j_expired", "k2");
  expiring.spec.dispatch_deadline = absl::Milliseconds(1);
  Insert(expiring);
  ASSERT_THAT(store_->ExpireOverdue(absl::Now() + absl::Minutes(1), "capacity"),
              IsOkAndHolds(ElementsAre("j_expired")));
  Insert(KeyedJob("j_failed", "k3"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_failed", .attempt = 0, .worker_id = "w1"}}), IsOk());
  ASSERT_THAT(
      store_->Finish(
          {.job_id = "j_failed", .attempt = 1, .state = JobState::kFailed, .error = "boom"}),
      IsOkAndHolds(true));
  Insert(KeyedJob("j_bob", "k1", "bob"));  // queued: holds bob's k1, not alice's

  // The default window is a day: every ended job still holds its key.
  std::map<std::string, std::string> holder = {
      {"k1", "j_cancelled"}, {"k2", "j_expired"}, {"k3", "j_failed"}};
  for (const auto& [key, id] : holder) {
    absl::StatusOr<InsertOutcome> outcome = store_->Insert(KeyedJob("j_repeat_" + key, key));
    ASSERT_THAT(outcome, IsOk());
    EXPECT_TRUE(outcome->deduplicated) << key;
    EXPECT_EQ(outcome->job_id, id);
  }
  // With no window, only the active holder counts.
  absl::StatusOr<std::unique_ptr<PgJobStore>> no_window = Connect(4, absl::ZeroDuration());
  ASSERT_THAT(no_window, IsOk());
  for (const char* key : {"k1", "k2", "k3"}) {
    absl::StatusOr<InsertOutcome> outcome =
        (*no_window)->Insert(KeyedJob(absl::StrCat("j_new_", key), key));
    ASSERT_THAT(outcome, IsOk());
    EXPECT_FALSE(outcome->deduplicated) << key;
  }
  absl::StatusOr<InsertOutcome> bob = (*no_window)->Insert(KeyedJob("j_bob_again", "k1", "bob"));
  ASSERT_THAT(bob, IsOk());
  EXPECT_TRUE(bob->deduplicated);
  EXPECT_EQ(bob->job_id, "j_bob");
}

TEST_F(PgJobStoreTest, ConcurrentInsertsOfAKeyWhoseHolderEndedBeforeTheWindowCreateOneNewJob) {
  absl::StatusOr<std::unique_ptr<PgJobStore>> store = Connect(8, absl::ZeroDuration());
  ASSERT_THAT(store, IsOk());
  ASSERT_THAT((*store)->Insert(KeyedJob("j_old", "same")), IsOk());
  ASSERT_THAT((*store)->Cancel("j_old", "by test"), IsOk());
  constexpr int kThreads = 6;
  std::vector<std::future<absl::StatusOr<InsertOutcome>>> results;
  for (int i = 0; i < kThreads; ++i) {
    results.push_back(std::async(std::launch::async, [&store, i] {
      return (*store)->Insert(KeyedJob(absl::StrCat("j_race_", i), "same"));
    }));
  }
  std::set<std::string> ids;
  int inserted = 0;
  for (auto& f : results) {
    absl::StatusOr<InsertOutcome> outcome = f.get();
    ASSERT_THAT(outcome, IsOk());
    ids.insert(outcome->job_id);
    if (!outcome->deduplicated) ++inserted;
  }
  EXPECT_EQ(inserted, 1);
  ASSERT_EQ(ids.size(), 1u);
  EXPECT_NE(*ids.begin(), "j_old");
}

TEST_F(PgJobStoreTest, EndingRacingRepeatsNeverLetsTwoJobsHoldOneKey) {
  // One thread ends every active job of the key (moving it to jobs_done) while others keep
  // repeating the key. Within the window an ended job still holds it, so the first job is the
  // only one ever created, however the ends and the inserts interleave. An insert may only fail
  // with Aborted (the contract's "retry").
  std::atomic<bool> stop{false};
  std::thread ender([&] {
    while (!stop.load()) {
      absl::StatusOr<std::vector<Job>> active = store_->LoadActive();
      if (active.ok()) {
        for (const Job& j : *active) store_->Cancel(j.id, "by test").IgnoreError();
      }
    }
  });
  std::vector<std::future<int>> inserters;
  for (int t = 0; t < 3; ++t) {
    inserters.push_back(std::async(std::launch::async, [this, t] {
      int ok = 0;
      for (int i = 0; i < 100; ++i) {
        absl::StatusOr<InsertOutcome> outcome =
            store_->Insert(KeyedJob(absl::StrCat("j_", t, "_", i), "hot"));
        if (outcome.ok()) {
          ++ok;
        } else {
          EXPECT_THAT(outcome, StatusIs(absl::StatusCode::kAborted));
        }
      }
      return ok;
    }));
  }
  int ok = 0;
  for (auto& f : inserters) ok += f.get();
  EXPECT_GT(ok, 250);
  stop = true;
  ender.join();
  pqxx::connection conn(db_->url());
  pqxx::nontransaction txn(conn);
  EXPECT_EQ(txn.exec("SELECT count(*) FROM jobs WHERE idempotency_key = 'hot'")[0][0].as<int>(), 1);
}

TEST_F(PgJobStoreTest, InsertsReturnTheArrivalOrderOfEachNewRow) {
  absl::StatusOr<InsertOutcome> first = store_->Insert(MakeJob("j_1"));
  ASSERT_THAT(first, IsOk());
  absl::StatusOr<std::vector<InsertOutcome>> more =
      store_->InsertMany({MakeJob("j_2"), MakeJob("j_3")}, false);
  ASSERT_THAT(more, IsOk());
  EXPECT_GT(first->seq, 0);
  EXPECT_GT((*more)[0].seq, first->seq);
  EXPECT_GT((*more)[1].seq, (*more)[0].seq);
  EXPECT_EQ(Get("j_3").seq, (*more)[1].seq);
}

}  // namespace
}  // namespace dispatchd::store
