// The plans the store's statements get. A statement that finds jobs by id must reach them by
// their keys whatever PostgreSQL believes about the table: the store's sessions keep the plan a
// statement got early on, and a plan made while jobs_active was small (a sequential scan, a hash
// join) costs the whole queue on every turn once it has grown. These tests make the store's own
// session (PrepareSession), let it keep its plans on a small table, grow the table without new
// statistics, and check what a turn then reads.

#include <cstdint>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"

#include "server/store/pg_job_store.h"
#include "server/store/pg_session.h"
#include "tests/testing/pg_test_db.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::TestDatabase;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Every node of an EXPLAIN (FORMAT JSON) that reads or writes a job table (jobs_active, or a
// partition of jobs_done) without a key: anything but an index scan with an index condition, a
// TID scan with a TID condition, or the write itself. Each as "node type on relation".
constexpr char kKeylessAccess[] = R"sql(
SELECT n->>'Node Type', n->>'Relation Name'
FROM jsonb_path_query($1::jsonb, 'lax $.**') AS n
WHERE jsonb_typeof(n) = 'object' AND n ? 'Relation Name'
  AND (n->>'Relation Name' = 'jobs_active' OR n->>'Relation Name' LIKE 'jobs\_done%')
  AND NOT (n->>'Node Type' IN ('Index Scan', 'Index Only Scan') AND n ? 'Index Cond')
  AND NOT (n->>'Node Type' = 'Tid Scan' AND n ? 'TID Cond')
  AND n->>'Node Type' <> 'ModifyTable')sql";

std::vector<std::string> KeylessAccess(pqxx::connection& conn, const std::string& plan_json) {
  pqxx::nontransaction txn(conn);
  std::vector<std::string> out;
  for (const pqxx::row& row : txn.exec_params(kKeylessAccess, plan_json)) {
    out.push_back(absl::StrCat(row[0].c_str(), " on ", row[1].c_str()));
  }
  return out;
}

// A text[] literal of simple words.
std::string Texts(const std::vector<std::string>& items) {
  return absl::StrCat("'{", absl::StrJoin(items, ","), "}'::text[]");
}

std::string Ints(const std::vector<int>& items) {
  return absl::StrCat("'{", absl::StrJoin(items, ","), "}'::int4[]");
}

// EXECUTE write_turn for one turn: `finishes` SUCCEEDED at attempt 1, `marks` RUNNING at attempt
// 1 on worker w1, `claims` at attempt 0 to worker w1; epoch 0.
std::string WriteTurnCall(const std::vector<std::string>& finishes,
                          const std::vector<std::string>& marks,
                          const std::vector<std::string>& claims) {
  const std::vector<std::string> f_states(finishes.size(), "SUCCEEDED");
  const std::vector<std::string> empty_texts(finishes.size(), "\"\"");
  return absl::StrCat("EXECUTE write_turn(", Texts(finishes), ", ",
                      Ints(std::vector<int>(finishes.size(), 1)), ", ", Texts(f_states), ", ",
                      Texts(empty_texts), ", ", Texts(empty_texts), ", ",
                      Ints(std::vector<int>(finishes.size(), -1)), ", '{",
                      absl::StrJoin(std::vector<std::string>(finishes.size(), "f"), ","),
                      "}'::bool[], ", Texts(marks), ", ", Ints(std::vector<int>(marks.size(), 1)),
                      ", ", Texts(std::vector<std::string>(marks.size(), "w1")), ", ",
                      Texts(claims), ", ", Ints(std::vector<int>(claims.size(), 0)), ", ",
                      Texts(std::vector<std::string>(claims.size(), "w1")), ", 0)");
}

// The plan of prepared statement `name` (EXPLAIN (FORMAT JSON) EXECUTE, every parameter NULL).
std::string PlanOf(pqxx::nontransaction& txn, const std::string& name) {
  const int params = txn.exec_params(
                            "SELECT cardinality(parameter_types) FROM pg_prepared_statements "
                            "WHERE name = $1",
                            name)[0][0]
                         .as<int>();
  std::vector<std::string> nulls(params, "NULL");
  return txn
      .exec(
          absl::StrCat("EXPLAIN (FORMAT JSON) EXECUTE ", name,
                       params > 0 ? absl::StrCat("(", absl::StrJoin(nulls, ", "), ")") : ""))[0][0]
      .c_str();
}

class PgPlansTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestDatabase> db = TestDatabase::Create("plans");
    ASSERT_THAT(db, IsOk());
    db_.emplace(*std::move(db));
    // The daemon's store: it brings the schema up and adds the partitions of ended jobs.
    absl::StatusOr<std::unique_ptr<PgJobStore>> store =
        PgJobStore::Connect(PgStoreOptions{.url = db_->url(), .pool_size = 1});
    ASSERT_THAT(store, IsOk());
    store_ = *std::move(store);
    admin_ = std::make_unique<pqxx::connection>(db_->url());
    session_ = std::make_unique<pqxx::connection>(db_->url());
    PrepareSession(*session_);
  }

  void Admin(const std::string& sql) {
    pqxx::nontransaction txn(*admin_);
    txn.exec(sql);
  }

  // Adds n QUEUED jobs q<from>..q<from+n-1>, as clients' submits leave them.
  void Queue(int from, int n) {
    Admin(
        absl::StrCat("INSERT INTO jobs_active (id, type, payload, state, max_attempts, timeout_ms) "
                     "SELECT 'q' || i, 'noop', ''::bytea, 'QUEUED', 3, 60000 FROM generate_series(",
                     from, ", ", from + n - 1, ") AS i"));
  }

  std::optional<TestDatabase> db_;  // declared first: destroyed after everything that uses it
  std::unique_ptr<PgJobStore> store_;
  std::unique_ptr<pqxx::connection> admin_;    // fills the table, reads plans
  std::unique_ptr<pqxx::connection> session_;  // a session of the store's own kind
};

TEST_F(PgPlansTest, EveryStatementThatFindsJobsByKeyReadsThemByKeyOnAnEmptyTable) {
  // The statistics of a table that has just been drained: nothing in it. The session plans
  // every statement generically, once.
  Admin("ANALYZE jobs_active");
  Admin("ANALYZE jobs_done");
  pqxx::nontransaction txn(*session_);
  // NULL parameters would prune every partition of jobs_done from the plan before it is shown.
  txn.exec("SET enable_partition_pruning = off");
  int checked = 0;
  for (const PreparedStatementName& s : PreparedStatementNames()) {
    if (s.scans) continue;
    const std::string plan = PlanOf(txn, s.name);
    EXPECT_THAT(KeylessAccess(*admin_, plan), IsEmpty()) << s.name << "'s plan:\n" << plan;
    ++checked;
  }
  EXPECT_GE(checked, 20);  // the turn's writes, the inserts, the lookups and the single writes
}

// The penalty that pins a session to point plans (a cost of 1e10 on any other node) lifts a plan
// that has no other way, such as forget_accounts' scan of the few rows of fair_accounts, far
// above jit_above_cost. PostgreSQL would then compile it, inlined and optimized: about 200 ms of
// CPU, each time, for a statement that runs in microseconds. The store's sessions compile none.
TEST_F(PgPlansTest, NoStatementIsCompiledOnTheWay) {
  pqxx::nontransaction txn(*session_);
  for (const PreparedStatementName& s : PreparedStatementNames()) {
    const std::string plan = PlanOf(txn, s.name);
    EXPECT_THAT(plan, Not(HasSubstr("\"JIT\""))) << s.name << "'s plan:\n" << plan;
  }
}

// A statement is planned once per session, not on every run. Left to its default,
// PostgreSQL plans a prepared statement again each time a plan for the values at hand looks
// cheaper than the generic one, as it does for a turn of a single job: at light load each such
// turn spent about 1 ms planning for 0.2 ms of execution.
TEST_F(PgPlansTest, ASessionPlansATurnOnceNotOnEveryRun) {
  constexpr int kTurns = 12;
  Queue(0, kTurns);
  Admin("ANALYZE jobs_active");
  std::string claimed;
  for (int i = 0; i < kTurns; ++i) {
    // Claims one job and finishes the one claimed before it, as a turn at light load does.
    const std::vector<std::string> finishes =
        claimed.empty() ? std::vector<std::string>{} : std::vector<std::string>{claimed};
    claimed = absl::StrCat("q", i);
    pqxx::nontransaction txn(*session_);
    const pqxx::result r = txn.exec(WriteTurnCall(finishes, {}, {claimed}));
    EXPECT_EQ(r.size(), finishes.size() + 1) << "turn " << i << " wrote";
  }
  pqxx::nontransaction txn(*session_);
  const pqxx::row plans = txn.exec1(
      "SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE name = "
      "'write_turn'");
  EXPECT_EQ(plans[1].as<int64_t>(), 0) << "custom plans of write_turn in " << kTurns << " turns";
  EXPECT_EQ(plans[0].as<int64_t>(), kTurns) << "runs of its generic plan";
}

// One dispatcher turn after another over a queue that grows without the table ever being
// analyzed (autovacuum off: the worst case; with it on, it runs a minute apart): each turn
// claims `kBatch` queued jobs, marks the previous turn's claims RUNNING and finishes the marks of
// the turn before. The buffers a turn reads per job written stay the same from a queue of two
// thousand to one of fifty thousand.
TEST_F(PgPlansTest, ATurnReadsTheSameBuffersPerJobWhateverTheQueueHolds) {
  constexpr int kBatch = 32;
  Admin("ALTER TABLE jobs_active SET (autovacuum_enabled = off)");
  Admin("ANALYZE jobs_active");
  // The plan the session keeps is the one it makes on its first turn, on a short queue.
  int queued = 0, next_claim = 0;
  std::vector<std::string> claimed, marked;

  // Runs one turn; with `explain`, as EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON), returning the
  // plan.
  auto turn = [&](bool explain) -> std::string {
    std::vector<std::string> claims;
    for (int i = 0; i < kBatch; ++i) claims.push_back(absl::StrCat("q", next_claim++));
    const std::vector<std::string> finishes = marked, marks = claimed;
    const std::string call = WriteTurnCall(finishes, marks, claims);
    pqxx::nontransaction txn(*session_);
    pqxx::result r =
        txn.exec(explain ? absl::StrCat("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) ", call) : call);
    if (!explain) {
      EXPECT_EQ(r.size(), finishes.size() + marks.size() + claims.size()) << "turn wrote";
    }
    marked = marks;
    claimed = claims;
    return explain ? r[0][0].c_str() : "";
  };
  // Buffers the turn read or wrote per job.
  auto buffers_per_job = [&](const std::string& plan) {
    pqxx::nontransaction txn(*admin_);
    const int64_t buffers =
        txn.exec_params(
               "SELECT (p->>'Shared Hit Blocks')::int8 + (p->>'Shared Read Blocks')::int8 "
               "FROM (SELECT $1::jsonb->0->'Plan' AS p) x",
               plan)[0][0]
            .as<int64_t>();
    return static_cast<double>(buffers) / (3 * kBatch);
  };

  // Tops the queue up to `depth` jobs, then runs three measured turns; the mean of their
  // buffers per job.
  auto measure_at = [&](int depth) {
    double sum = 0;
    for (int i = 0; i < 3; ++i) {
      Queue(queued, depth - (queued - next_claim));
      queued = next_claim + depth;
      const std::string plan = turn(true);
      EXPECT_THAT(KeylessAccess(*admin_, plan), IsEmpty()) << "at " << depth << ":\n" << plan;
      sum += buffers_per_job(plan);
    }
    return sum / 3;
  };

  // A new daemon on a short queue: its session keeps the plans it makes now.
  Queue(queued, 100);
  queued += 100;
  for (int i = 0; i < 3; ++i) turn(false);

  const double at_small = measure_at(2000);
  const double at_large = measure_at(50000);
  RecordProperty("buffers_per_job_at_2k", absl::StrCat(at_small));
  RecordProperty("buffers_per_job_at_50k", absl::StrCat(at_large));
  std::cout << "buffers a turn read per job written: " << at_small << " with 2k queued, "
            << at_large << " with 50k queued\n";
  EXPECT_LE(at_large, 1.5 * at_small)
      << "buffers per job: " << at_small << " with 2k queued, " << at_large << " with 50k";
}

}  // namespace
}  // namespace dispatchd::store
