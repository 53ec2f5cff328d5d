// Chaos tests: under a continuous load of simulated jobs from several clients, each test injects
// one fault (a worker killed or frozen, the daemon killed, PostgreSQL restarted, the leader killed
// with a standby waiting, a submit flood past max_active), keeps the load on for a while, lets
// every job end, and then checks from the database and the workers' journals that no accepted job
// was lost, completed twice, or started twice at one attempt. Each test prints one report row.
//
// Every test has a PostgreSQL server of its own (one fault restarts it), real dispatchd and
// dispatch-worker processes on 127.0.0.1, and bounded waits. No timing is asserted except the
// takeover bound of the HA test, which is part of what HA promises.

#include <csignal>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

#include "tests/chaos/chaos_harness.h"
#include "tests/e2e/harness.h"

namespace dispatchd::chaos {
namespace {

using e2e::Daemon;
using e2e::DaemonOptions;
using e2e::TempDir;
using e2e::WaitFor;
using e2e::Worker;

constexpr int kWorkers = 3;
constexpr int kSlotsPerWorker = 8;
// The load runs this long before the fault, and at least this long after it.
constexpr absl::Duration kWarmUp = absl::Seconds(3);
constexpr absl::Duration kLoadAfterFault = absl::Seconds(10);
// After the fault, the load also runs until the jobs active at the fault have ended, but no longer
// than this.
constexpr absl::Duration kMaxRecoveryWait = absl::Seconds(60);
// Once the load stops, every job must end within this.
constexpr absl::Duration kDrainTimeout = absl::Seconds(90);

std::string Seconds(absl::Duration d) { return absl::StrFormat("%.1f", absl::ToDoubleSeconds(d)); }

// Whether the fault takes a worker away. Only a lost worker excuses running a job again after
// one of its attempts succeeded; otherwise the worker holds the result until the daemon records
// it (docs/architecture.md, "Failure handling as implemented").
enum class WorkerLoss { kNone, kSomeWorker };

class ChaosTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::cout << ReportHeader() << std::endl;
    absl::StatusOr<std::unique_ptr<PrivatePostgres>> pg = PrivatePostgres::Start(dir_.File("pg"));
    ASSERT_TRUE(pg.ok()) << pg.status();
    pg_ = *std::move(pg);
  }

  // The chaos job type and the timings every test shares, plus `extra_yaml` (top-level keys).
  DaemonOptions Options(const std::string& extra_yaml) const {
    return {.postgres_url = pg_->url(),
            .types = {{.name = kChaosType,
                       .max_attempts = 10,
                       .timeout = "30s",
                       .retry_backoff = "100ms",
                       .on_orphan = "requeue"}},
            .heartbeat_interval = "500ms",
            .worker_stale_after = "2s",
            .orphan_grace = "5s",
            .extra_yaml = extra_yaml};
  }

  // A daemon whose config and logs live in `dir` (one directory per daemon).
  Daemon* StartDaemon(const TempDir& dir, const std::string& extra_yaml = "") {
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(Options(extra_yaml), dir);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return nullptr;
    daemon_dirs_.push_back(dir.path());
    daemons_.push_back(*std::move(d));
    return daemons_.back().get();
  }

  // A simulated worker; `servers` is one address or a comma-separated list.
  Worker* StartWorker(const std::string& id, const std::string& servers) {
    absl::StatusOr<std::unique_ptr<Worker>> w =
        Worker::Start(servers,
                      {.id = id,
                       .types = {kChaosType},
                       .slots = kSlotsPerWorker,
                       .mode = {"--simulate", "100%:20ms-200ms"}},
                      dir_);
    EXPECT_TRUE(w.ok()) << w.status();
    if (!w.ok()) return nullptr;
    return (workers_[id] = *std::move(w)).get();
  }

  // Starts w1..w3 on `servers` and waits until `daemon` lists them.
  void StartWorkers(Daemon& daemon, const std::string& servers) {
    for (int i = 1; i <= kWorkers; ++i) {
      ASSERT_NE(StartWorker(absl::StrCat("w", i), servers), nullptr);
    }
    ASSERT_TRUE(daemon.WaitForWorkers(kWorkers)) << "workers did not connect";
  }

  void StartLoad(std::vector<std::string> addresses) {
    load_ = std::make_unique<Load>(LoadOptions{.addresses = std::move(addresses)});
    load_->Start();
  }

  // Lets the load run for kWarmUp, then waits (at most 30 s) for a worker with running jobs: the
  // busiest one and how many it runs, or ("", 0) if none ran any.
  std::pair<std::string, int> WarmUp() {
    absl::SleepFor(kWarmUp);
    std::pair<std::string, int> busiest;
    WaitFor(
        [&] {
          std::optional<std::pair<std::string, int>> w = BusiestWorker(pg_->url());
          if (w.has_value()) busiest = *w;
          return w.has_value();
        },
        absl::Seconds(30));
    return busiest;
  }

  // Call right before injecting the fault: notes the active jobs and starts the recovery clock.
  void MarkFault() {
    absl::StatusOr<std::set<std::string>> active = ActiveJobs(pg_->url());
    ASSERT_TRUE(active.ok()) << active.status();
    recovery_ = std::make_unique<RecoveryClock>(pg_->url(), *std::move(active), absl::Now());
  }

  // Call once a lasting fault is over (an outage ended, a frozen process resumed): the jobs active
  // now were held up by it, so the recovery also waits for them.
  void MarkFaultOver() {
    ASSERT_NE(recovery_, nullptr);
    std::set<std::string> active;
    ASSERT_TRUE(WaitFor(
        [&] {
          absl::StatusOr<std::set<std::string>> now = ActiveJobs(pg_->url());
          if (now.ok()) active = *std::move(now);
          return now.ok();
        },
        absl::Seconds(30)))
        << "the database is still unreachable";
    recovery_->AddActive(active);
  }

  // Keeps the load on for kLoadAfterFault and until the jobs active at the fault have ended
  // (bounded), stops it, waits for every job to end, checks the database, the daemons' logs and
  // the workers' journals, and prints the report row with `extra` fields.
  void FinishAndCheck(const std::string& fault, WorkerLoss loss,
                      std::vector<std::pair<std::string, std::string>> extra = {}) {
    ASSERT_NE(load_, nullptr);
    ASSERT_NE(recovery_, nullptr);
    const absl::Time fault_at = recovery_->fault_at();
    WaitFor(
        [&] {
          return absl::Now() - fault_at >= kLoadAfterFault && recovery_->seconds().has_value();
        },
        kMaxRecoveryWait);
    load_->Stop();
    const absl::Time stopped = absl::Now();
    const bool drained = WaitUntilNoActiveJobs(pg_->url(), kDrainTimeout);
    EXPECT_TRUE(drained) << "jobs still active " << kDrainTimeout << " after the load stopped";

    Evidence evidence{.db_url = pg_->url(), .accepted = load_->accepted()};
    evidence.accepted.insert(evidence.accepted.end(), more_accepted_.begin(), more_accepted_.end());
    for (const std::string& dir : daemon_dirs_) {
      for (std::string& log : DaemonLogFiles(dir)) evidence.daemon_logs.push_back(std::move(log));
    }
    for (const auto& [id, worker] : workers_) {
      evidence.journals.emplace_back(id, worker->journal_path());
    }
    absl::StatusOr<Verdict> verdict = Check(evidence);
    ASSERT_TRUE(verdict.ok()) << verdict.status();
    const Verdict& v = *verdict;

    extra.emplace_back("drain_s", Seconds(absl::Now() - stopped));
    const auto succeeded = v.by_state.find("SUCCEEDED");
    extra.emplace_back(
        "not_succeeded",
        absl::StrCat(v.accepted - (succeeded == v.by_state.end() ? 0 : succeeded->second)));
    extra.emplace_back("reruns", absl::StrCat(v.reruns));
    extra.emplace_back("reran_after_success", absl::StrCat(v.reran_after_success));
    extra.emplace_back("logged_completions", absl::StrCat(v.logged_completions));
    std::cout << ReportRow(fault, v, recovery_->seconds(), load_->errors(), extra) << std::endl;
    std::cout << "chaos: submit errors by code: " << load_->ErrorSummary() << std::endl;
    if (v.logged_completions == 0) {
      std::cout << "chaos: note: the daemons logged no `finished job=` line, so "
                   "duplicate_completions had nothing to count"
                << std::endl;
    }

    const std::string problems = absl::StrJoin(v.problems, "\n  ");
    EXPECT_GT(v.accepted, 0);
    EXPECT_EQ(v.lost, 0) << problems;
    EXPECT_EQ(v.left_active, 0) << problems;
    EXPECT_EQ(v.duplicate_completions, 0) << problems;
    EXPECT_EQ(v.log_disagrees_with_db, 0) << problems;
    EXPECT_EQ(v.ran_twice_same_attempt, 0) << problems;
    EXPECT_EQ(v.succeeded_not_run, 0) << problems;
    if (loss == WorkerLoss::kNone) {
      EXPECT_EQ(v.reran_after_success, 0) << problems;
    }
  }

  // Destroyed in reverse: the clock and the load stop first, then the workers and daemons, then
  // PostgreSQL, then the directories.
  TempDir dir_;
  TempDir standby_dir_;  // the second daemon's, in the HA test
  std::unique_ptr<PrivatePostgres> pg_;
  std::vector<std::string> daemon_dirs_;
  std::vector<std::unique_ptr<Daemon>> daemons_;
  std::map<std::string, std::unique_ptr<Worker>> workers_;
  std::unique_ptr<Load> load_;
  std::vector<std::string> more_accepted_;  // accepted outside the load (the flood)
  std::unique_ptr<RecoveryClock> recovery_;
};

TEST_F(ChaosTest, WorkerKill9) {
  Daemon* daemon = StartDaemon(dir_);
  ASSERT_NE(daemon, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(*daemon, daemon->address()));
  StartLoad({daemon->address()});
  const auto [victim, running] = WarmUp();
  ASSERT_FALSE(victim.empty()) << "no worker ran a job";

  ASSERT_NO_FATAL_FAILURE(MarkFault());
  workers_.at(victim)->process().Signal(SIGKILL);
  // A replacement with a new id, as a supervisor would start one.
  ASSERT_NE(StartWorker("w4", daemon->address()), nullptr);

  FinishAndCheck("worker_kill9", WorkerLoss::kSomeWorker,
                 {{"victim", victim}, {"victim_running", absl::StrCat(running)}});
  EXPECT_TRUE(DaemonLogContains(dir_.path(), absl::StrCat("worker lost worker=", victim)));
}

TEST_F(ChaosTest, WorkerSigstopPastStaleThreshold) {
  Daemon* daemon = StartDaemon(dir_);
  ASSERT_NE(daemon, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(*daemon, daemon->address()));
  StartLoad({daemon->address()});
  const auto [victim, running] = WarmUp();
  ASSERT_FALSE(victim.empty()) << "no worker ran a job";
  e2e::Process& frozen = workers_.at(victim)->process();

  ASSERT_NO_FATAL_FAILURE(MarkFault());
  frozen.Signal(SIGSTOP);
  absl::SleepFor(absl::Seconds(2) + absl::Seconds(2));  // worker_stale_after + 2 s
  frozen.Signal(SIGCONT);
  ASSERT_NO_FATAL_FAILURE(MarkFaultOver());

  // The daemon gave it up, and it came back by itself: a second `connected` line in its log.
  EXPECT_TRUE(WaitFor(
      [&] { return DaemonLogContains(dir_.path(), absl::StrCat("worker lost worker=", victim)); },
      absl::Seconds(10)));
  auto connections = [&] {
    const std::string log = frozen.Log();
    int n = 0;
    for (size_t at = log.find("connected worker="); at != std::string::npos;
         at = log.find("connected worker=", at + 1)) {
      ++n;
    }
    return n;
  };
  EXPECT_TRUE(WaitFor([&] { return connections() >= 2; }, absl::Seconds(30)))
      << "the stopped worker did not reconnect; its log:\n"
      << frozen.Log();

  FinishAndCheck("worker_sigstop", WorkerLoss::kSomeWorker,
                 {{"victim", victim}, {"victim_running", absl::StrCat(running)}});
}

TEST_F(ChaosTest, DaemonKill9AndRestart) {
  Daemon* daemon = StartDaemon(dir_);
  ASSERT_NE(daemon, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(*daemon, daemon->address()));
  StartLoad({daemon->address()});
  ASSERT_FALSE(WarmUp().first.empty()) << "no worker ran a job";

  ASSERT_NO_FATAL_FAILURE(MarkFault());
  daemon->Kill9();
  // Same address: the workers and the clients find the new process by themselves.
  absl::Status restarted = daemon->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_TRUE(daemon->WaitForWorkers(kWorkers, absl::Seconds(30)))
      << "the workers did not reconnect";
  ASSERT_NO_FATAL_FAILURE(MarkFaultOver());

  FinishAndCheck("daemon_kill9", WorkerLoss::kNone);
}

TEST_F(ChaosTest, PostgresRestart) {
  Daemon* daemon = StartDaemon(dir_);
  ASSERT_NE(daemon, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(*daemon, daemon->address()));
  StartLoad({daemon->address()});
  ASSERT_FALSE(WarmUp().first.empty()) << "no worker ran a job";

  ASSERT_NO_FATAL_FAILURE(MarkFault());
  absl::Status restarted = pg_->Restart();
  ASSERT_TRUE(restarted.ok()) << restarted;
  ASSERT_NO_FATAL_FAILURE(MarkFaultOver());

  FinishAndCheck("postgres_restart", WorkerLoss::kNone);
  // The daemon carried on by itself: the first process, never restarted.
  EXPECT_TRUE(daemon->process().Running());
  EXPECT_EQ(DaemonLogFiles(dir_.path()).size(), 1u);
}

// The role a daemon's running process last logged: leader (`became leader`) or standby
// (`standby leader=`), whichever line came last.
enum class Role { kUnknown, kLeader, kStandby };
Role LatestRole(const TempDir& dir) {
  const std::string log = LatestDaemonLog(dir.path());
  const size_t leader = log.rfind("became leader");
  const size_t standby = log.rfind("standby leader=");
  if (leader == std::string::npos && standby == std::string::npos) return Role::kUnknown;
  if (standby == std::string::npos) return Role::kLeader;
  if (leader == std::string::npos) return Role::kStandby;
  return leader > standby ? Role::kLeader : Role::kStandby;
}

// Two daemons on one database: one leads (schedules, holds the workers), the other stands by and
// serves clients. Killing the leader hands the lease to the standby within two lease periods.
TEST_F(ChaosTest, LeaderKill9WithStandby) {
  const std::string ha = "ha:\n  lease: 2s\n";
  Daemon* a = StartDaemon(dir_, ha);
  ASSERT_NE(a, nullptr);
  Daemon* b = StartDaemon(standby_dir_, ha);
  ASSERT_NE(b, nullptr);
  // One leads and the other stands by, according to their logs.
  auto settled = [&] {
    const Role ra = LatestRole(dir_), rb = LatestRole(standby_dir_);
    return (ra == Role::kLeader && rb == Role::kStandby) ||
           (ra == Role::kStandby && rb == Role::kLeader);
  };
  ASSERT_TRUE(WaitFor(settled, absl::Seconds(30))) << "no leader and standby in the daemons' logs";

  // Workers know both daemons and follow the redirects to the leader.
  Daemon* first_leader = LatestRole(dir_) == Role::kLeader ? a : b;
  ASSERT_NO_FATAL_FAILURE(
      StartWorkers(*first_leader, absl::StrCat(a->address(), ",", b->address())));
  StartLoad({a->address(), b->address()});
  ASSERT_FALSE(WarmUp().first.empty()) << "no worker ran a job";

  // Who leads now (the lease may have moved meanwhile).
  ASSERT_TRUE(WaitFor(settled, absl::Seconds(10)));
  const bool a_leads = LatestRole(dir_) == Role::kLeader;
  Daemon* leader = a_leads ? a : b;
  const TempDir& survivor_dir = a_leads ? standby_dir_ : dir_;
  const int64_t times_led = DaemonLogCount(survivor_dir.path(), "became leader");

  ASSERT_NO_FATAL_FAILURE(MarkFault());
  const absl::Time killed = absl::Now();
  leader->Kill9();
  const bool took_over =
      WaitFor([&] { return DaemonLogCount(survivor_dir.path(), "became leader") > times_led; },
              absl::Seconds(30));
  const absl::Duration takeover = absl::Now() - killed;
  EXPECT_TRUE(took_over) << "the standby never became leader";
  EXPECT_LE(takeover, absl::Seconds(4)) << "takeover took longer than 2 x lease";
  ASSERT_NO_FATAL_FAILURE(MarkFaultOver());
  // The old leader comes back, as a supervisor would restart it, and serves clients again.
  absl::Status restarted = leader->Restart();
  EXPECT_TRUE(restarted.ok()) << restarted;

  FinishAndCheck("leader_kill9", WorkerLoss::kNone,
                 {{"takeover_s", took_over ? Seconds(takeover) : "NA"}});
}

TEST_F(ChaosTest, SubmitFloodPastMaxActive) {
  constexpr int kMaxActive = 200;
  Daemon* daemon = StartDaemon(dir_, absl::StrCat("max_active: ", kMaxActive, "\n"));
  ASSERT_NE(daemon, nullptr);
  ASSERT_NO_FATAL_FAILURE(StartWorkers(*daemon, daemon->address()));
  StartLoad({daemon->address()});
  ASSERT_FALSE(WarmUp().first.empty()) << "no worker ran a job";

  ASSERT_NO_FATAL_FAILURE(MarkFault());
  // The active count, sampled from the database every ~50 ms from the flood's start until a few
  // seconds after its end.
  ActiveCountSampler active(pg_->url(), absl::Milliseconds(50));
  FloodResult flood = Flood(daemon->address(), /*threads=*/8, /*total=*/2000, absl::Seconds(30));
  more_accepted_ = flood.accepted;
  ASSERT_NO_FATAL_FAILURE(MarkFaultOver());
  absl::SleepFor(absl::Seconds(3));
  active.Stop();

  EXPECT_GT(flood.refused, 0) << "the flood never reached max_active";
  EXPECT_EQ(flood.refused_without_retry_after, 0);
  EXPECT_EQ(flood.other_errors, 0) << "first: " << flood.first_other_error;
  EXPECT_GT(active.samples(), 0);
  EXPECT_LE(active.most(), kMaxActive);

  FinishAndCheck("submit_flood", WorkerLoss::kNone,
                 {{"refused", absl::StrCat(flood.refused)},
                  {"flood_accepted", absl::StrCat(flood.accepted.size())},
                  {"max_active_seen", absl::StrCat(active.most())}});
  // The steady clients were refused the same way during the flood, never otherwise.
  EXPECT_EQ(load_->refused_without_retry_after(), 0);
  EXPECT_EQ(load_->errors(), load_->refused()) << load_->ErrorSummary();
}

}  // namespace
}  // namespace dispatchd::chaos
