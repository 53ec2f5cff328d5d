// Several daemons on one database: one leads, the others serve clients and send workers to the
// leader; a dead or frozen leader is replaced without an operator, and a deposed leader's writes
// change nothing.

#include <cstdio>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <signal.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

constexpr absl::Duration kLease = absl::Seconds(2);

constexpr char kTerms[] = "dispatchd_leader_terms_total";
constexpr char kStepDowns[] = "dispatchd_leader_step_downs_total";
constexpr char kLeaseLapses[] = "dispatchd_leader_lease_lapses_total";

class HaTest : public E2eTest {
 protected:
  // A daemon of its own directory, electing with `lease`.
  std::unique_ptr<Daemon> StartHaDaemon(const TempDir& dir, const std::string& lease = "2s") {
    return StartDaemon({.types = {{.name = "echo", .max_attempts = 5}},
                        .extra_yaml = absl::StrCat("ha:\n  lease: ", lease, "\n")},
                       &dir);
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

  // Jobs the leader `d` has placed on a worker (dispatched or running); -1 if Stats fails.
  static int64_t Placed(Daemon& d) {
    absl::StatusOr<v1::StatsResponse> stats = d.Stats();
    if (!stats.ok()) return -1;
    int64_t placed = 0;
    for (const v1::TierStats& t : stats->tiers()) placed += t.running();
    return placed;
  }

  // Jobs the leader `d` holds queued (in memory or paged out); -1 if Stats fails or `d` does
  // not lead.
  static int64_t Queued(Daemon& d) {
    absl::StatusOr<v1::StatsResponse> stats = d.Stats();
    if (!stats.ok() || !stats->leader().is_leader()) return -1;
    int64_t queued = 0;
    for (const v1::TierStats& t : stats->tiers()) queued += t.queued();
    return queued;
  }

  TempDir dir_a_, dir_b_, dir_c_;
};

TEST_F(HaTest, OneLeadsTheStandbyServesClientsAndSendsWorkersToTheLeader) {
  auto a = StartHaDaemon(dir_a_);
  ASSERT_NE(a, nullptr);
  auto b = StartHaDaemon(dir_b_);
  ASSERT_NE(b, nullptr);
  absl::StatusOr<v1::LeaderInfo> la = Leader(*a), lb = Leader(*b);
  ASSERT_TRUE(la.ok() && lb.ok());
  EXPECT_TRUE(la->is_leader());
  EXPECT_FALSE(lb->is_leader());
  EXPECT_EQ(lb->address(), a->address());
  EXPECT_EQ(lb->epoch(), la->epoch());

  // The worker is pointed at the standby first: it is redirected to the leader.
  std::unique_ptr<Worker> w =
      StartWorkerAt(absl::StrCat(b->address(), ",", a->address()), {.id = "w1", .slots = 4});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(a->WaitForWorkers(1));
  EXPECT_GE(b->Metric("dispatchd_worker_redirects_total"), 1) << "the standby sent it on";
  EXPECT_EQ(a->Metric("dispatchd_worker_redirects_total"), 0) << "the leader kept it";

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
}

TEST_F(HaTest, StandbyTakesOverWithinTwoLeasesOfTheLeadersDeathAndNoJobIsLost) {
  auto a = StartHaDaemon(dir_a_);
  ASSERT_NE(a, nullptr);
  auto b = StartHaDaemon(dir_b_);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(IsLeader(*a));
  std::unique_ptr<Worker> w =
      StartWorkerAt(absl::StrCat(a->address(), ",", b->address()),
                    {.id = "w1", .slots = 8, .mode = {"--simulate", "100%:200ms-600ms"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(a->WaitForWorkers(1));
  std::vector<std::string> ids = SubmitMany(*b, 40, "before-");

  // The leader dies with some jobs on the worker and the rest waiting.
  ASSERT_TRUE(WaitFor([&] { return Placed(*a) > 0 && Queued(*a) > 0; }, absl::Seconds(10)));
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
  for (const JournalEvent& e : ReadJournal(w->journal_path(), "w1")) {
    if (!e.start) continue;
    EXPECT_TRUE(starts.insert({e.job_id, e.attempt}).second) << e.job_id;
  }
}

TEST_F(HaTest, FrozenLeaderIsReplacedAndCannotWriteWhenItWakes) {
  auto a = StartHaDaemon(dir_a_);
  ASSERT_NE(a, nullptr);
  auto b = StartHaDaemon(dir_b_);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(IsLeader(*a));
  std::unique_ptr<Worker> w =
      StartWorkerAt(absl::StrCat(a->address(), ",", b->address()),
                    {.id = "w1", .slots = 4, .mode = {"--simulate", "100%:100ms-300ms"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(a->WaitForWorkers(1));
  std::vector<std::string> ids = SubmitMany(*b, 20, "before-");

  a->process().Signal(SIGSTOP);
  const absl::Time frozen = absl::Now();
  ASSERT_TRUE(WaitFor([&] { return IsLeader(*b); }, absl::Seconds(30)));
  const absl::Duration takeover = absl::Now() - frozen;
  std::printf("ha: standby took over %.2fs after the leader froze (lease %s)\n",
              absl::ToDoubleSeconds(takeover), absl::FormatDuration(kLease).c_str());
  EXPECT_LE(takeover, 2 * kLease + absl::Seconds(1));
  // The frozen leader still held its database session: the standby had to find its lease
  // lapsed and end it.
  EXPECT_GE(b->Metric(kLeaseLapses), 1);
  EXPECT_EQ(b->Metric(kTerms), 1);
  a->process().Signal(SIGCONT);
  // The old leader finds its term over and steps down; it stays up as a standby.
  ASSERT_TRUE(WaitFor([&] { return a->Metric(kStepDowns) >= 1; }, absl::Seconds(20)))
      << a->process().Log();
  EXPECT_EQ(a->Metric(kTerms), 1);
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
  auto a = StartHaDaemon(dir_a_, "500ms");
  ASSERT_NE(a, nullptr);
  auto b = StartHaDaemon(dir_b_, "500ms");
  ASSERT_NE(b, nullptr);
  auto c = StartHaDaemon(dir_c_, "500ms");
  ASSERT_NE(c, nullptr);
  absl::StatusOr<v1::LeaderInfo> old = Leader(*a);
  ASSERT_TRUE(old.ok() && old->is_leader());
  Exec(
      "INSERT INTO jobs_active (id, type, payload, state, max_attempts, timeout_ms, created_at, "
      "updated_at) SELECT 'j_backlog_' || i, 'echo', 'x'::bytea, 'QUEUED', 3, 60000, now(), "
      "now() FROM generate_series(1, 300000) AS i");
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
  EXPECT_EQ(first->epoch(), old->epoch() + 1) << "a term began and ended in between";
  Daemon* other = leader == b.get() ? c.get() : b.get();
  // It leads with the whole backlog loaded, and the other standby follows the same term.
  ASSERT_TRUE(WaitFor(
      [&] {
        absl::StatusOr<v1::LeaderInfo> seen = Leader(*other);
        return Queued(*leader) == 300000 && seen.ok() && seen->epoch() == first->epoch();
      },
      absl::Seconds(30)))
      << "queued " << Queued(*leader);
  // The term it began is the only one: loading did not cost it the lease, so neither standby
  // found a lease lapsed, and nobody stepped down or took over in between.
  absl::StatusOr<v1::LeaderInfo> later = Leader(*leader);
  ASSERT_TRUE(later.ok());
  EXPECT_TRUE(later->is_leader());
  EXPECT_EQ(later->epoch(), first->epoch());
  for (Daemon* standby : {b.get(), c.get()}) {
    const bool leads = standby == leader;
    EXPECT_EQ(standby->Metric(kTerms), leads ? 1 : 0) << standby->address();
    EXPECT_EQ(standby->Metric(kStepDowns), 0) << standby->address();
    EXPECT_EQ(standby->Metric(kLeaseLapses), 0) << standby->address();
  }
}

}  // namespace
}  // namespace dispatchd::e2e
