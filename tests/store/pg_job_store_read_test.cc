// PgJobStore against PostgreSQL: loads and counts, connecting and migrating, partitions of
// ended jobs, broken connections.

#include <cstdint>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include "pqxx/transaction"

#include "lib/job/job.h"
#include "server/store/job_store.h"
#include "server/store/migrations.h"
#include "server/store/pg_job_store.h"
#include "tests/store/pg_job_store_fixture.h"
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
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::UnorderedElementsAre;

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

TEST_F(PgJobStoreTest, SearchFindsActiveAndEndedJobsNewestFirstWithoutPayloads) {
  job::Job a = MakeJob("j_1", "embed");
  a.owner = "alice";
  a.spec.fairness_key = "alice";
  job::Job b = MakeJob("j_2", "chat");
  b.owner = "bob";
  b.spec.fairness_key = "bob";
  job::Job c = MakeJob("j_3", "embed");
  c.owner = "bob";
  c.spec.fairness_key = "carol";
  Insert(a);
  Insert(b);
  Insert(c);
  ASSERT_THAT(store_->Cancel("j_2", "x"), IsOk());  // ended: now in jobs_done
  auto ids = [&](const JobSearch& search) {
    std::vector<std::string> out;
    absl::StatusOr<std::vector<job::Job>> jobs = store_->SearchJobs(search);
    EXPECT_THAT(jobs, IsOk());
    if (!jobs.ok()) return out;
    for (const job::Job& j : *jobs) {
      EXPECT_TRUE(j.spec.payload.empty() && j.result.empty()) << j.id;
      out.push_back(j.id);
    }
    return out;
  };
  EXPECT_THAT(ids({}), ElementsAre("j_3", "j_2", "j_1"));
  EXPECT_THAT(ids({.limit = 2}), ElementsAre("j_3", "j_2"));
  EXPECT_THAT(ids({.state = job::JobState::kCancelled}), ElementsAre("j_2"));
  EXPECT_THAT(ids({.type = "embed"}), ElementsAre("j_3", "j_1"));
  EXPECT_THAT(ids({.fairness_key = "carol"}), ElementsAre("j_3"));
  EXPECT_THAT(ids({.owner = std::string("bob")}), ElementsAre("j_3", "j_2"));
  EXPECT_THAT(ids({.owner = std::string("")}), ::testing::IsEmpty());
  const absl::Time created = Get("j_2").created_at;
  EXPECT_THAT(ids({.created_after = created}), ElementsAre("j_3", "j_2"));
  EXPECT_THAT(ids({.created_before = created}), ElementsAre("j_1"));
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

// Under a database locale such as en_US.UTF-8, an index on a text column compares its keys with
// strcoll(), which made PostgreSQL spend about 1.5 times the CPU per drained job. The daemon's
// key columns sort by bytes whatever the locale (migration 11), so that every index of its
// tables compares with memcmp(). C.UTF-8 is a locale other than "C" that every glibc since 2.35
// carries.
TEST_F(PgJobStoreTest, NoIndexOfTheDaemonsTablesSortsTextByTheDatabasesLocale) {
  absl::StatusOr<TestDatabase> db = TestDatabase::Create("store_locale", "C.UTF-8");
  ASSERT_THAT(db, IsOk());
  ASSERT_THAT(PgJobStore::Connect({.url = db->url(), .pool_size = 1}), IsOk());
  pqxx::connection conn(db->url());
  pqxx::nontransaction txn(conn);
  ASSERT_EQ(txn.exec("SELECT datcollate FROM pg_database WHERE datname = current_database()")[0][0]
                .as<std::string>(),
            "C.UTF-8");
  // Each text key column of each index of the daemon's tables (partitions of jobs_done
  // included), with the collation it sorts by.
  std::map<std::string, std::string> collation_of;
  for (const pqxx::row& row : txn.exec(R"sql(
      SELECT ix.relname || '.' || a.attname, coll.collname
      FROM pg_index i
      JOIN pg_class ix ON ix.oid = i.indexrelid
      JOIN pg_namespace n ON n.oid = ix.relnamespace AND n.nspname = current_schema()
      CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) AS k(attnum, coll)
      JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
      JOIN pg_collation coll ON coll.oid = k.coll)sql")) {
    collation_of[row[0].as<std::string>()] = row[1].as<std::string>();
  }
  // The indexes the hot path walks are among them (jobs_active was first named jobs).
  for (const char* key :
       {"jobs_pkey.id", "jobs_queued_by_queue.type", "jobs_queued_by_queue.fairness_key",
        "jobs_idempotency.owner", "jobs_idempotency.idempotency_key", "jobs_done_by_id.id",
        "jobs_done_by_idempotency_key.idempotency_key", "fair_accounts_pkey.a"}) {
    EXPECT_TRUE(collation_of.contains(key))
        << key << " is not among " << absl::StrJoin(collation_of, ", ", absl::PairFormatter("="));
  }
  for (const auto& [column, collation] : collation_of) {
    EXPECT_EQ(collation, "C") << column;
  }
}

TEST_F(PgJobStoreTest, UpgradeFromVersionOneKeepsExistingJobsAndTheirKeys) {
  absl::StatusOr<TestDatabase> old = TestDatabase::Create("store_upgrade");
  ASSERT_THAT(old, IsOk());
  {
    // A database as the version 1 daemon left it, with a finished job holding a key.
    pqxx::connection conn(old->url());
    pqxx::work txn(conn);
    txn.exec(
        "CREATE TABLE schema_migrations (version int PRIMARY KEY, "
        "applied_at timestamptz NOT NULL DEFAULT now())");
    ASSERT_EQ(AllMigrations()[0].version, 1);
    txn.exec(AllMigrations()[0].sql);
    txn.exec("INSERT INTO schema_migrations (version) VALUES (1)");
    txn.exec(
        "INSERT INTO jobs (id, type, payload, fairness_key, idempotency_key, state, "
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
