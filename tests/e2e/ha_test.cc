// Several daemons on one database: one leads, the others serve clients and send workers to the
// leader; a dead or frozen leader is replaced without an operator, and a deposed leader's writes
// change nothing.

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include <signal.h>

#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kLease = absl::Seconds(2);

class HaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("ha");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::make_unique<testing::TestDatabase>(*std::move(db));
  }

  std::unique_ptr<Daemon> StartDaemon(const TempDir& dir, const std::string& lease = "2s") {
    DaemonOptions options{.postgres_url = db_->url(),
                          .types = {{.name = "echo", .max_attempts = 5}},
                          .extra_yaml = absl::StrCat("ha:\n  lease: ", lease, "\n")};
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(options, dir);
    EXPECT_TRUE(d.ok()) << d.status();
    return d.ok() ? *std::move(d) : nullptr;
  }

  static absl::StatusOr<v1::LeaderInfo> Leader(Daemon& d) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
    v1::StatsResponse resp;
    grpc::Status s = d.admin().Stats(&ctx, v1::StatsRequest(), &resp);
    if (!s.ok()) return absl::UnavailableError(s.error_message());
    return resp.leader();
  }

  static bool IsLeader(Daemon& d) {
    absl::StatusOr<v1::LeaderInfo> l = Leader(d);
    return l.ok() && l->is_leader();
  }

  // Submits `n` echo jobs through `d`; their ids.
  static std::vector<std::string> SubmitMany(Daemon& d, int n, const std::string& prefix) {
    std::vector<std::string> ids;
    for (int i = 0; i < n; ++i) {
      absl::StatusOr<std::string> id = d.Submit(Spec("echo", absl::StrCat(prefix, i)));
      EXPECT_TRUE(id.ok()) << id.status();
      if (id.ok()) ids.push_back(*id);
    }
    return ids;
  }

  static void ExpectAllSucceeded(Daemon& d, const std::vector<std::string>& ids) {
    std::vector<v1::Job> done;
    ASSERT_TRUE(d.WaitForTerminal(ids, &done, absl::Seconds(60)));
    for (const v1::Job& j : done) {
      EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED) << j.id() << " " << j.error();
    }
  }

  TempDir dir_a_, dir_b_, dir_c_, dir_w_;
  std::unique_ptr<testing::TestDatabase> db_;
};

TEST_F(HaTest, OneLeadsTheStandbyServesClientsAndSendsWorkersToTheLeader) {
  auto a = StartDaemon(dir_a_);
  ASSERT_NE(a, nullptr);
  auto b = StartDaemon(dir_b_);
  ASSERT_NE(b, nullptr);
  absl::StatusOr<v1::LeaderInfo> la = Leader(*a), lb = Leader(*b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(la->is_leader());
  EXPECT_FALSE(lb->is_leader());
  EXPECT_EQ(lb->address(), a->address());
  EXPECT_EQ(lb->epoch(), la->epoch());

  // The worker is pointed at the standby first: it is redirected to the leader.
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(
      absl::StrCat(b->address(), ",", a->address()), {.id = "w1", .slots = 4}, dir_w_);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(a->WaitForWorkers(1));

  // Submit and Status through the standby; the leader runs the jobs.
  std::vector<std::string> ids = SubmitMany(*b, 20, "via-standby-");
  ExpectAllSucceeded(*b, ids);
  // RunSync and Watch through the standby.
  CommandResult run = b->Ctl({"run", "--type", "echo", "--payload", "sync-through-standby"});
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("sync-through-standby"));
  absl::StatusOr<std::string> watched = b->Submit(Spec("echo", "watched"));
  ASSERT_TRUE(watched.ok());
  CommandResult watch = b->Ctl({"watch", *watched});
  EXPECT_EQ(watch.exit_code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("SUCCEEDED"));
  CommandResult stats = b->Ctl({"stats"});
  EXPECT_EQ(stats.exit_code, 0) << stats.err;
  EXPECT_THAT(stats.out, HasSubstr(absl::StrCat(a->address(), " (epoch ", la->epoch(), ")")));
  EXPECT_THAT(stats.out, HasSubstr("standby"));
  // What only the leader knows, the standby refuses, naming the leader.
  CommandResult workers = b->Ctl({"workers"});
  EXPECT_NE(workers.exit_code, 0);
  EXPECT_THAT(workers.err, HasSubstr(a->address()));
  EXPECT_THAT(w.value()->process().Log(), HasSubstr("redirected"));
}

TEST_F(HaTest, StandbyTakesOverWithinTwoLeasesOfTheLeadersDeathAndNoJobIsLost) {
  auto a = StartDaemon(dir_a_);
  ASSERT_NE(a, nullptr);
  auto b = StartDaemon(dir_b_);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(IsLeader(*a));
  absl::StatusOr<std::unique_ptr<Worker>> w =
      Worker::Start(absl::StrCat(a->address(), ",", b->address()),
                    {.id = "w1", .slots = 8, .mode = {"--simulate", "100%:200ms-600ms"}}, dir_w_);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(a->WaitForWorkers(1));
  std::vector<std::string> ids = SubmitMany(*b, 40, "before-");

  absl::SleepFor(absl::Milliseconds(500));  // some run, some wait
  a->Kill9();
  const absl::Time killed = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return IsLeader(*b); }, absl::Seconds(30)));
  const absl::Duration takeover = absl::Now() - killed;
  std::printf("ha: standby took over %.2fs after the leader's kill -9 (lease %s)\n",
              absl::ToDoubleSeconds(takeover), absl::FormatDuration(kLease).c_str());
  EXPECT_LE(takeover, 2 * kLease);

  std::vector<std::string> after = SubmitMany(*b, 20, "after-");
  ids.insert(ids.end(), after.begin(), after.end());
  ExpectAllSucceeded(*b, ids);
  // Each attempt ran once: the journal has no (job, attempt) started twice.
  std::set<std::pair<std::string, int>> starts;
  for (const JournalEvent& e : ReadJournal(w.value()->journal_path(), "w1")) {
    if (!e.start) continue;
    EXPECT_TRUE(starts.insert({e.job_id, e.attempt}).second) << e.job_id;
  }
}

TEST_F(HaTest, FrozenLeaderIsReplacedAndCannotWriteWhenItWakes) {
  auto a = StartDaemon(dir_a_);
  ASSERT_NE(a, nullptr);
  auto b = StartDaemon(dir_b_);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(IsLeader(*a));
  absl::StatusOr<std::unique_ptr<Worker>> w =
      Worker::Start(absl::StrCat(a->address(), ",", b->address()),
                    {.id = "w1", .slots = 4, .mode = {"--simulate", "100%:100ms-300ms"}}, dir_w_);
  ASSERT_TRUE(w.ok()) << w.status();
  ASSERT_TRUE(a->WaitForWorkers(1));
  std::vector<std::string> ids = SubmitMany(*b, 20, "before-");

  a->process().Signal(SIGSTOP);
  const absl::Time frozen = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return IsLeader(*b); }, absl::Seconds(30)));
  const absl::Duration takeover = absl::Now() - frozen;
  std::printf("ha: standby took over %.2fs after the leader froze (lease %s)\n",
              absl::ToDoubleSeconds(takeover), absl::FormatDuration(kLease).c_str());
  EXPECT_LE(takeover, 2 * kLease + absl::Seconds(1));
  a->process().Signal(SIGCONT);
  // The old leader finds its term over and steps down; it stays up as a standby.
  ASSERT_TRUE(WaitFor([&] { return absl::StrContains(a->process().Log(), "stepped down"); },
                      absl::Seconds(20)));
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::LeaderInfo> l = Leader(*a);
        return l.ok() && !l->is_leader() && l->address() == b->address();
      },
      absl::Seconds(20)));

  std::vector<std::string> after = SubmitMany(*a, 20, "after-");
  ids.insert(ids.end(), after.begin(), after.end());
  ExpectAllSucceeded(*b, ids);
}

// A new leader loads every active job before it schedules. With a backlog that takes longer to
// load than a lease, it must keep renewing meanwhile: otherwise the other standby takes it for
// frozen, ends its sessions, and the two evict each other in turn.
TEST_F(HaTest, LeaderLoadingABacklogLongerThanItsLeaseKeepsTheLease) {
  auto a = StartDaemon(dir_a_, "500ms");
  ASSERT_NE(a, nullptr);
  auto b = StartDaemon(dir_b_, "500ms");
  ASSERT_NE(b, nullptr);
  auto c = StartDaemon(dir_c_, "500ms");
  ASSERT_NE(c, nullptr);
  ASSERT_TRUE(IsLeader(*a));
  {
    pqxx::connection conn(db_->url());
    pqxx::nontransaction txn(conn);
    txn.exec(
        "INSERT INTO jobs_active (id, type, payload, state, max_attempts, timeout_ms, created_at, "
        "updated_at) SELECT 'j_backlog_' || i, 'echo', 'x'::bytea, 'QUEUED', 3, 60000, now(), "
        "now() FROM generate_series(1, 300000) AS i");
  }
  a->Kill9();
  Daemon* leader = nullptr;
  ASSERT_TRUE(WaitFor(
      [&] {
        leader = IsLeader(*b) ? b.get() : IsLeader(*c) ? c.get() : nullptr;
        return leader != nullptr;
      },
      absl::Seconds(60)));
  absl::StatusOr<v1::LeaderInfo> first = Leader(*leader);
  ASSERT_TRUE(first.ok());
  // Twenty leases later the same daemon leads the same term.
  absl::SleepFor(absl::Seconds(10));
  absl::StatusOr<v1::LeaderInfo> later = Leader(*leader);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->is_leader());
  EXPECT_EQ(later->epoch(), first->epoch());
  const std::string loader_log = leader->process().Log();
  EXPECT_THAT(loader_log, HasSubstr("recovered queued=300000"));
  EXPECT_THAT(loader_log, Not(HasSubstr("stepped down")));
  Daemon* other = leader == b.get() ? c.get() : b.get();
  EXPECT_THAT(other->process().Log(), Not(HasSubstr("has not renewed its lease")));
}

}  // namespace
}  // namespace dispatchd::e2e
