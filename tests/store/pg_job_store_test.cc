#include "server/store/pg_job_store.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/notification"
#include "pqxx/result"
#include "pqxx/transaction"

#include "lib/job/job.h"
#include "server/store/job_store.h"
#include "server/store/migrations.h"
#include "tests/testing/pg_test_db.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::dispatchd::testing::TestDatabase;
using job::Job;
using job::JobState;
using ::testing::ElementsAre;
using ::testing::Field;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

MATCHER_P(IsOkAndHolds, matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

Job MakeJob(const std::string& id, const std::string& type = "echo") {
  Job job;
  job.id = id;
  job.spec.type = type;
  job.spec.payload = "payload of " + id;
  job.spec.max_attempts = 3;
  job.spec.timeout = absl::Seconds(30);
  return job;
}

class PgJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestDatabase> db = TestDatabase::Create("store");
    ASSERT_THAT(db, IsOk());
    db_.emplace(*std::move(db));
    absl::StatusOr<std::unique_ptr<PgJobStore>> store = Connect();
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
  }

  absl::StatusOr<std::unique_ptr<PgJobStore>> Connect(
      int pool_size = 4, absl::Duration idempotency_window = absl::Hours(24)) {
    return PgJobStore::Connect(PgStoreOptions{
        .url = db_->url(), .pool_size = pool_size, .idempotency_window = idempotency_window});
  }

  void Insert(const Job& job) {
    absl::StatusOr<InsertOutcome> outcome = store_->Insert(job);
    ASSERT_THAT(outcome, IsOk());
    ASSERT_FALSE(outcome->deduplicated);
  }

  Job Get(const std::string& id) {
    absl::StatusOr<Job> job = store_->Get(id);
    EXPECT_THAT(job, IsOk());
    return job.ok() ? *job : Job{};
  }

  // Inserts `id` and takes it to RUNNING at attempt 1 on `worker`.
  void InsertRunning(const std::string& id, const std::string& worker = "w1") {
    Insert(MakeJob(id));
    ASSERT_THAT(store_->Claim({{.job_id = id, .attempt = 0, .worker_id = worker}}),
                IsOkAndHolds(ElementsAre(id)));
    ASSERT_THAT(store_->MarkRunning(id, 1, worker), IsOkAndHolds(true));
  }

  std::optional<TestDatabase> db_;  // declared first: destroyed after the store
  std::unique_ptr<PgJobStore> store_;
};

TEST_F(PgJobStoreTest, InsertThenGetRoundTripsEveryField) {
  Job job = MakeJob("j_round_trip", "llm.cover_letter");
  job.spec.payload = std::string("\x00\x01\xff binary\0tail", 16);
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

// A job `id` of `fairness` with idempotency key `key`.
Job KeyedJob(const std::string& id, const std::string& key,
             const std::string& fairness = "alice") {
  Job job = MakeJob(id);
  job.spec.fairness_key = fairness;
  job.spec.idempotency_key = key;
  return job;
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
  EXPECT_THAT(Describe(*outcomes),
              ElementsAre("j_held (dup)", "j_b", "j_c", "j_b (dup)", "j_e"));
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
  ASSERT_THAT(store_->InsertMany({MakeJob("j_loud_1"), KeyedJob("j_dup", "k1"),
                                  MakeJob("j_loud_2")},
                                 true),
              IsOk());
  // NOTIFY is delivered at commit, so every payload is here once the call has returned.
  for (int i = 0; i < 50 && notes.payloads.size() < 2; ++i) conn.await_notification(0, 100'000);
  conn.get_notifs();
  EXPECT_THAT(notes.payloads, UnorderedElementsAre("j_loud_1", "j_loud_2"));
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
  ASSERT_THAT(store_->Finish({.job_id = "j_failed", .attempt = 1, .state = JobState::kFailed,
                              .error = "boom"}),
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
  EXPECT_EQ(txn.exec("SELECT count(*) FROM jobs WHERE idempotency_key = 'hot'")[0][0].as<int>(),
            1);
}

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

TEST_F(PgJobStoreTest, LoadActiveReturnsActiveJobsOldestFirst) {
  for (const char* id : {"j_c", "j_a", "j_d", "j_b", "j_e"}) Insert(MakeJob(id));
  // j_c queued, j_a dispatched, j_d running, j_b succeeded, j_e cancelled.
  ASSERT_THAT(store_->Claim({{.job_id = "j_a", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_d", .attempt = 0, .worker_id = "w1"},
                             {.job_id = "j_b", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(UnorderedElementsAre("j_a", "j_d", "j_b")));
  ASSERT_THAT(store_->MarkRunning("j_d", 1, "w1"), IsOkAndHolds(true));
  ASSERT_THAT(store_->Finish({.job_id = "j_b", .attempt = 1}), IsOkAndHolds(true));
  ASSERT_THAT(store_->Cancel("j_e", "x"), IsOk());

  absl::StatusOr<std::vector<Job>> active = store_->LoadActive();
  ASSERT_THAT(active, IsOk());
  std::vector<std::string> ids;
  for (const Job& j : *active) ids.push_back(j.id);
  EXPECT_THAT(ids, ElementsAre("j_c", "j_a", "j_d"));
  EXPECT_EQ((*active)[0].state, JobState::kQueued);
  EXPECT_EQ((*active)[1].state, JobState::kDispatched);
  EXPECT_EQ((*active)[2].state, JobState::kRunning);
  EXPECT_EQ((*active)[2].attempt, 1);
  EXPECT_EQ((*active)[2].worker_id, "w1");
  EXPECT_EQ((*active)[0].spec.payload, "payload of j_c");
  EXPECT_THAT(store_->CountActive(), IsOkAndHolds(3));
}

// `job` of `type` for fairness key `key`.
Job QueueJob(const std::string& id, const std::string& type, const std::string& key) {
  Job job = MakeJob(id, type);
  job.spec.fairness_key = key;
  return job;
}

std::vector<std::string> IdsOf(const std::vector<Job>& jobs) {
  std::vector<std::string> ids;
  for (const Job& j : jobs) ids.push_back(j.id);
  return ids;
}

TEST_F(PgJobStoreTest, QueuesArePagedInBySeqWithoutPayloads) {
  // Queue (echo, alice): a1..a5; (echo, bob): b1; (embed, alice): e1. One of alice's is claimed.
  for (int i = 1; i <= 5; ++i) Insert(QueueJob(absl::StrCat("j_a", i), "echo", "alice"));
  Insert(QueueJob("j_b1", "echo", "bob"));
  Insert(QueueJob("j_e1", "embed", "alice"));
  Insert(QueueJob("j_a6", "echo", "alice"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_a2", .attempt = 0, .worker_id = "w1"}}),
              IsOkAndHolds(ElementsAre("j_a2")));

  absl::StatusOr<QueuedHeads> heads = store_->LoadQueuedHeads(2);
  ASSERT_THAT(heads, IsOk());
  EXPECT_THAT(IdsOf(heads->jobs), ElementsAre("j_a1", "j_a3", "j_b1", "j_e1"));
  for (const Job& j : heads->jobs) {
    EXPECT_EQ(j.state, JobState::kQueued);
    EXPECT_TRUE(j.spec.payload.empty()) << j.id;
    EXPECT_GT(j.seq, 0) << j.id;
  }
  std::map<std::string, int64_t> counts;
  for (const QueueCount& q : heads->queues) counts[q.type + "/" + q.fairness_key] = q.queued;
  EXPECT_THAT(counts, ::testing::ElementsAre(::testing::Pair("echo/alice", 5),
                                             ::testing::Pair("echo/bob", 1),
                                             ::testing::Pair("embed/alice", 1)));

  // The rest of alice's echo queue, after the last row held.
  const int64_t after = heads->jobs[1].seq;
  absl::StatusOr<std::vector<Job>> page = store_->LoadQueuedPage("echo", "alice", after, 2);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(IdsOf(*page), ElementsAre("j_a4", "j_a5"));
  page = store_->LoadQueuedPage("echo", "alice", (*page)[1].seq, 10);
  ASSERT_THAT(page, IsOk());
  EXPECT_THAT(IdsOf(*page), ElementsAre("j_a6"));

  // Placed jobs load apart, also without payloads.
  absl::StatusOr<std::vector<Job>> placed = store_->LoadPlaced();
  ASSERT_THAT(placed, IsOk());
  EXPECT_THAT(IdsOf(*placed), ElementsAre("j_a2"));
  EXPECT_TRUE((*placed)[0].spec.payload.empty());

  // Counts per queue, and how many rows are at or below a bound given per queue.
  absl::StatusOr<std::vector<QueueCount>> counted =
      store_->CountQueued({{.type = "echo", .fairness_key = "alice", .bound = after},
                           {.type = "embed", .fairness_key = "alice", .bound = 0}});
  ASSERT_THAT(counted, IsOk());
  std::map<std::string, std::pair<int64_t, int64_t>> got;
  for (const QueueCount& q : *counted) {
    got[q.type + "/" + q.fairness_key] = {q.queued, q.up_to_bound};
  }
  EXPECT_EQ(got["echo/alice"], std::make_pair(int64_t{5}, int64_t{2}));
  EXPECT_EQ(got["echo/bob"], std::make_pair(int64_t{1}, int64_t{1}));  // no bound: all
  EXPECT_EQ(got["embed/alice"], std::make_pair(int64_t{1}, int64_t{0}));
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

TEST_F(PgJobStoreTest, CountsByTypeAndState) {
  Insert(MakeJob("j_1", "embed"));
  Insert(MakeJob("j_2", "embed"));
  Insert(MakeJob("j_3", "chat"));
  ASSERT_THAT(store_->Cancel("j_2", "x"), IsOk());
  absl::StatusOr<std::vector<TypeStateCount>> counts = store_->CountByTypeAndState();
  ASSERT_THAT(counts, IsOk());
  std::vector<std::string> rendered;
  for (const TypeStateCount& c : *counts) {
    rendered.push_back(absl::StrCat(c.type, "/", job::ToString(c.state), "=", c.count));
  }
  EXPECT_THAT(rendered,
              UnorderedElementsAre("embed/QUEUED=1", "embed/CANCELLED=1", "chat/QUEUED=1"));
  EXPECT_THAT(store_->CountActive(), IsOkAndHolds(2));
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

TEST_F(PgJobStoreTest, ConnectAgainOnAMigratedDatabaseSucceeds) {
  Insert(MakeJob("j_kept"));
  absl::StatusOr<std::unique_ptr<PgJobStore>> second = Connect();
  ASSERT_THAT(second, IsOk());
  EXPECT_THAT((*second)->Get("j_kept"), IsOk());
}

TEST_F(PgJobStoreTest, ConcurrentConnectsMigrateOnce) {
  // A fresh database, so that the migrations race from scratch.
  absl::StatusOr<TestDatabase> fresh = TestDatabase::Create("store_migrate");
  ASSERT_THAT(fresh, IsOk());
  constexpr int kDaemons = 6;
  std::vector<std::future<absl::Status>> results;
  for (int i = 0; i < kDaemons; ++i) {
    results.push_back(std::async(std::launch::async, [&] {
      return PgJobStore::Connect({.url = fresh->url(), .pool_size = 1}).status();
    }));
  }
  for (auto& r : results) EXPECT_THAT(r.get(), IsOk());
  pqxx::connection conn(fresh->url());
  pqxx::nontransaction txn(conn);
  pqxx::result versions = txn.exec("SELECT version FROM schema_migrations ORDER BY version");
  ASSERT_EQ(versions.size(), AllMigrations().size());
  for (size_t i = 0; i < versions.size(); ++i) {
    EXPECT_EQ(versions[i][0].as<int>(), AllMigrations()[i].version);
  }
}

TEST_F(PgJobStoreTest, UpgradeFromVersionOneKeepsExistingJobsAndTheirKeys) {
  absl::StatusOr<TestDatabase> old = TestDatabase::Create("store_upgrade");
  ASSERT_THAT(old, IsOk());
  {
    // A database as the version 1 daemon left it, with a finished job holding a key.
    pqxx::connection conn(old->url());
    pqxx::work txn(conn);
    txn.exec("CREATE TABLE schema_migrations (version int PRIMARY KEY, "
             "applied_at timestamptz NOT NULL DEFAULT now())");
    ASSERT_EQ(AllMigrations()[0].version, 1);
    txn.exec(AllMigrations()[0].sql);
    txn.exec("INSERT INTO schema_migrations (version) VALUES (1)");
    txn.exec("INSERT INTO jobs (id, type, payload, fairness_key, idempotency_key, state, "
             "max_attempts, timeout_ms, finished_at) VALUES ('j_v1', 'echo', 'p', 'alice', "
             "'k1', 'SUCCEEDED', 3, 1000, now() - interval '1 hour')");
    txn.commit();
  }
  absl::StatusOr<std::unique_ptr<PgJobStore>> store = PgJobStore::Connect({.url = old->url()});
  ASSERT_THAT(store, IsOk());
  absl::StatusOr<InsertOutcome> repeat = (*store)->Insert(KeyedJob("j_repeat", "k1"));
  ASSERT_THAT(repeat, IsOk());
  EXPECT_TRUE(repeat->deduplicated);
  EXPECT_EQ(repeat->job_id, "j_v1");
  absl::StatusOr<Job> v1_job = (*store)->Get("j_v1");
  ASSERT_THAT(v1_job, IsOk());
  EXPECT_EQ(v1_job->spec.idempotency_key, "k1");
  EXPECT_EQ(v1_job->state, JobState::kSucceeded);
  // The ended job moved to jobs_done; the view shows it with the rest.
  pqxx::connection conn(old->url());
  pqxx::nontransaction txn(conn);
  EXPECT_EQ(txn.exec("SELECT count(*) FROM jobs_done WHERE id = 'j_v1'")[0][0].as<int>(), 1);
  EXPECT_EQ(txn.exec("SELECT count(*) FROM jobs_active")[0][0].as<int>(), 0);
  EXPECT_EQ(txn.exec("SELECT state FROM jobs WHERE id = 'j_v1'")[0][0].as<std::string>(),
            "SUCCEEDED");
  // Past an hour's window, its key is free.
  absl::StatusOr<std::unique_ptr<PgJobStore>> short_window =
      PgJobStore::Connect({.url = old->url(), .idempotency_window = absl::Minutes(30)});
  ASSERT_THAT(short_window, IsOk());
  absl::StatusOr<InsertOutcome> fresh = (*short_window)->Insert(KeyedJob("j_fresh", "k1"));
  ASSERT_THAT(fresh, IsOk());
  EXPECT_FALSE(fresh->deduplicated);
}

TEST_F(PgJobStoreTest, EndedJobsMoveToTheirOwnTableAndReadsSeeBoth) {
  Insert(MakeJob("j_queued"));
  Insert(MakeJob("j_done"));
  Insert(MakeJob("j_cancelled"));
  ASSERT_THAT(store_->Claim({{.job_id = "j_done", .attempt = 0, .worker_id = "w1"}}), IsOk());
  ASSERT_THAT(store_->Finish({.job_id = "j_done", .attempt = 1, .result = "r"}),
              IsOkAndHolds(true));
  absl::StatusOr<CancelOutcome> cancelled = store_->Cancel("j_cancelled", "by test");
  ASSERT_THAT(cancelled, IsOk());
  EXPECT_EQ(cancelled->previous, JobState::kQueued);
  EXPECT_EQ(cancelled->job.state, JobState::kCancelled);
  EXPECT_EQ(cancelled->job.error, "by test");
  EXPECT_EQ(cancelled->job.spec.payload, "payload of j_cancelled");

  pqxx::connection conn(db_->url());
  pqxx::nontransaction txn(conn);
  auto ids = [&](const std::string& table) {
    std::vector<std::string> out;
    for (const pqxx::row& r : txn.exec("SELECT id FROM " + table + " ORDER BY id")) {
      out.push_back(r[0].as<std::string>());
    }
    return out;
  };
  EXPECT_THAT(ids("jobs_active"), ElementsAre("j_queued"));
  EXPECT_THAT(ids("jobs_done"), ElementsAre("j_cancelled", "j_done"));
  EXPECT_THAT(ids("jobs"), ElementsAre("j_cancelled", "j_done", "j_queued"));

  Job done = Get("j_done");
  EXPECT_EQ(done.state, JobState::kSucceeded);
  EXPECT_EQ(done.result, "r");
  EXPECT_EQ(done.spec.payload, "payload of j_done");
  EXPECT_NE(done.finished_at, absl::InfinitePast());
  EXPECT_GT(done.seq, 0);
  absl::StatusOr<std::vector<Job>> many = store_->GetMany({"j_queued", "j_done", "j_nope"});
  ASSERT_THAT(many, IsOk());
  EXPECT_EQ(many->size(), 2u);
  absl::StatusOr<std::vector<JobRef>> refs = store_->GetRefs({"j_cancelled", "j_queued"});
  ASSERT_THAT(refs, IsOk());
  EXPECT_EQ(refs->size(), 2u);
  EXPECT_THAT(store_->Cancel("j_done", "again"),
              StatusIs(absl::StatusCode::kFailedPrecondition, "already SUCCEEDED"));
  EXPECT_THAT(store_->Cancel("j_nope", "again"), StatusIs(absl::StatusCode::kNotFound));
  // A finish of the job that moved on changes nothing.
  EXPECT_THAT(store_->Finish({.job_id = "j_done", .attempt = 1, .result = "again"}),
              IsOkAndHolds(false));
  EXPECT_EQ(Get("j_done").result, "r");
}

TEST(DonePartitionSpanTest, IsARoundSpanOfAtMostAQuarterOfTheRetention) {
  EXPECT_EQ(PgJobStore::DonePartitionSpan(absl::Hours(24 * 7)), absl::Hours(24));
  EXPECT_EQ(PgJobStore::DonePartitionSpan(absl::Hours(24)), absl::Hours(1));
  EXPECT_EQ(PgJobStore::DonePartitionSpan(absl::Hours(1)), absl::Minutes(1));
  EXPECT_EQ(PgJobStore::DonePartitionSpan(absl::Minutes(3)), absl::Seconds(1));
  EXPECT_EQ(PgJobStore::DonePartitionSpan(absl::Seconds(1)), absl::Seconds(1));
}

TEST_F(PgJobStoreTest, EndedJobsAreKeptForTheRetentionThenDroppedByPartition) {
  // A database of its own: the fixture's store made its partitions for a retention of days.
  absl::StatusOr<TestDatabase> db = TestDatabase::Create("store_retention");
  ASSERT_THAT(db, IsOk());
  absl::StatusOr<std::unique_ptr<PgJobStore>> store =
      PgJobStore::Connect({.url = db->url(), .retention = absl::Seconds(4)});
  ASSERT_THAT(store, IsOk());
  pqxx::connection conn(db->url());
  auto partitions = [&] {
    pqxx::nontransaction txn(conn);
    return txn
        .exec("SELECT count(*) FROM pg_inherits WHERE inhparent = 'jobs_done'::regclass")[0][0]
        .as<int>();
  };
  // Connect made partitions of one second through four seconds ahead.
  EXPECT_GE(partitions(), 4);
  EXPECT_THAT((*store)->AddDonePartitions((*store)->DonePartitionsAhead()),
              IsOkAndHolds(::testing::Le(2)));

  ASSERT_THAT((*store)->Insert(MakeJob("j_old")), IsOk());
  ASSERT_THAT((*store)->Cancel("j_old", "by test"), IsOk());
  ASSERT_THAT((*store)->Insert(MakeJob("j_waiting")), IsOk());
  EXPECT_THAT((*store)->DropDonePartitions(), IsOkAndHolds(0));  // nothing is old enough yet
  EXPECT_THAT((*store)->Get("j_old"), IsOk());

  // Past the retention and the job's partition: gone, as a whole partition. Active jobs stay.
  absl::SleepFor(absl::Seconds(6));
  ASSERT_THAT((*store)->AddDonePartitions((*store)->DonePartitionsAhead()), IsOk());
  absl::StatusOr<int> dropped = (*store)->DropDonePartitions();
  ASSERT_THAT(dropped, IsOk());
  EXPECT_GE(*dropped, 1);
  EXPECT_THAT((*store)->Get("j_old"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*store)->Get("j_waiting"), IsOk());
  // New ends still find a partition.
  ASSERT_THAT((*store)->Cancel("j_waiting", "by test"), IsOk());
  absl::StatusOr<Job> waiting = (*store)->Get("j_waiting");
  ASSERT_THAT(waiting, IsOk());
  EXPECT_EQ(waiting->state, JobState::kCancelled);
  pqxx::nontransaction txn(conn);
  EXPECT_EQ(txn.exec("SELECT count(*) FROM pg_class WHERE relname ~ '^jobs_done_[0-9]+_[0-9]+$' "
                     "AND relname NOT IN (SELECT inhrelid::regclass::text FROM pg_inherits)")[0][0]
                .as<int>(),
            0)
      << "a detached partition was left behind";
}

TEST_F(PgJobStoreTest, ConnectRefusesARetentionBelowASecond) {
  EXPECT_THAT(PgJobStore::Connect({.url = db_->url(), .retention = absl::Milliseconds(500)}),
              StatusIs(absl::StatusCode::kInvalidArgument, "retention"));
}

TEST_F(PgJobStoreTest, ConnectRejectsBadOptions) {
  EXPECT_THAT(PgJobStore::Connect({.url = db_->url(), .pool_size = 0}),
              StatusIs(absl::StatusCode::kInvalidArgument, "pool_size"));
  absl::StatusOr<std::unique_ptr<PgJobStore>> bad_url =
      PgJobStore::Connect({.url = "postgresql://x:hunter2@127.0.0.1/db?no_such_option=1"});
  EXPECT_THAT(bad_url, StatusIs(absl::StatusCode::kInvalidArgument, "no_such_option"));
  EXPECT_THAT(std::string(bad_url.status().message()), Not(HasSubstr("hunter2")));
}

TEST(PgJobStoreConnectTest, UnreachableServerIsUnavailableQuicklyWithoutThePassword) {
  const absl::Time start = absl::Now();
  absl::StatusOr<std::unique_ptr<PgJobStore>> store = PgJobStore::Connect(
      {.url = "postgresql://x:hunter2@127.0.0.1:1/db", .connect_timeout = absl::Seconds(2)});
  EXPECT_THAT(store, StatusIs(absl::StatusCode::kUnavailable,
                              "postgres: cannot connect to 127.0.0.1:1/db: "));
  EXPECT_THAT(std::string(store.status().message()), Not(HasSubstr("hunter2")));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(PgJobStoreTest, BrokenConnectionFailsOneCallThenIsReplaced) {
  absl::StatusOr<std::unique_ptr<PgJobStore>> store = Connect(/*pool_size=*/1);
  ASSERT_THAT(store, IsOk());
  Insert(MakeJob("j_1"));
  {
    pqxx::connection admin(db_->server_url());
    pqxx::nontransaction txn(admin);
    txn.exec_params(
        "SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity "
        "WHERE datname = $1 AND pid <> pg_backend_pid()",
        db_->name());
  }
  // Every connection of both stores is gone: the next call fails Unavailable, and the call after
  // it runs on a fresh connection.
  EXPECT_THAT((*store)->Get("j_1"), StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT((*store)->Get("j_1"), IsOk());
  EXPECT_THAT((*store)->CountActive(), IsOkAndHolds(1));
}

}  // namespace
}  // namespace dispatchd::store
