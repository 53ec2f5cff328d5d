// Several daemons on one database: one leads, the others serve clients and send workers to the
// leader; a dead or frozen leader is replaced without an operator, and a deposed leader's writes
// change nothing.

#include <atomic>
#include <cstdio>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <signal.h>

#include "proto/convert/time_proto.h"
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
  std::unique_ptr<Daemon> StartHaDaemon(const TempDir& dir, const std::string& lease = "2s",
                                        const std::string& stop_grace = "30s") {
    return StartDaemon(
        {.types = {{.name = "echo", .max_attempts = 5}},
         .extra_yaml = absl::StrCat("ha:\n  lease: ", lease, "\nstop_grace: ", stop_grace, "\n")},
        &dir);
  }

  // Until `a` has exited and `b` leads (at most `timeout`), polls both every 20 ms: when `a`
  // was last seen leading, when it exited, and when `b` was first seen leading.
  struct Handover {
    absl::Time a_led_last = absl::InfinitePast();
    absl::Time a_exited = absl::InfiniteFuture();
    absl::Time b_led = absl::InfiniteFuture();
  };
  static Handover WatchHandover(Daemon& a, Daemon& b, absl::Duration timeout) {
    Handover h;
    const absl::Time end = absl::Now() + timeout;
    while (absl::Now() < end &&
           (h.a_exited == absl::InfiniteFuture() || h.b_led == absl::InfiniteFuture())) {
      const absl::Time now = absl::Now();
      if (h.a_exited == absl::InfiniteFuture()) {
        if (!a.process().Running()) {
          h.a_exited = now;
        } else if (IsLeader(a)) {
          h.a_led_last = now;
        }
      }
      if (h.b_led == absl::InfiniteFuture() && IsLeader(b)) h.b_led = absl::Now();
      absl::SleepFor(absl::Milliseconds(20));
    }
    return h;
  }

  // A leader (stop_grace `grace`) and a standby, leases of 10 s, and worker w1 pointed at both,
  // running one job of `run` that was submitted to the leader.
  struct LongJob {
    std::unique_ptr<Daemon> a, b;
    std::unique_ptr<Worker> w;
    std::string id;
  };
  void StartLongJob(const std::string& grace, const std::string& run, LongJob* job) {
    job->a = StartHaDaemon(dir_a_, "10s", grace);
    ASSERT_NE(job->a, nullptr);
    job->b = StartHaDaemon(dir_b_, "10s");
    ASSERT_NE(job->b, nullptr);
    Daemon& a = *job->a;
    job->w = StartWorkerAt(absl::StrCat(a.address(), ",", job->b->address()),
                           {.id = "w1", .mode = {"--simulate", absl::StrCat("100%:", run)}});
    ASSERT_NE(job->w, nullptr);
    ASSERT_TRUE(a.WaitForWorkers(1));
    absl::StatusOr<std::string> id = a.Submit(Spec("echo", absl::StrCat("runs ", run)));
    ASSERT_TRUE(id.ok()) << id.status();
    job->id = *id;
    ASSERT_TRUE(WaitFor(
        [&] {
          absl::StatusOr<v1::Job> j = a.Status(job->id);
          return j.ok() && j->state() == v1::JOB_STATE_RUNNING;
        },
        absl::Seconds(10)));
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

// SIGTERM on a leader under load, with a standby. The leader admits nothing more and assigns
// nothing more, its worker finishes what it runs and reports it there, and the leader then hands
// its lease over: the standby leads within a second of it, where its lease (10 s) alone would
// have it wait for its next try (every 2.5 s). Clients of the standby submit throughout; no job
// is lost and none runs twice.
TEST_F(HaTest, SigtermUnderLoadHandsTheLeaseOverAndLosesNothing) {
  auto a = StartHaDaemon(dir_a_, "10s", "20s");
  ASSERT_NE(a, nullptr);
  auto b = StartHaDaemon(dir_b_, "10s");
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(IsLeader(*a));
  std::unique_ptr<Worker> w =
      StartWorkerAt(absl::StrCat(a->address(), ",", b->address()),
                    {.id = "w1", .slots = 8, .mode = {"--simulate", "100%:200ms-600ms"}});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(a->WaitForWorkers(1));

  std::atomic<bool> stop_load{false};
  absl::Mutex mu;
  std::vector<std::string> ids;
  int refused = 0;
  std::thread load([&] {
    for (int i = 0; !stop_load.load(); ++i) {
      absl::StatusOr<std::string> id = b->Submit(Spec("echo", absl::StrCat("load-", i)));
      absl::MutexLock l(&mu);
      if (id.ok()) {
        ids.push_back(*id);
      } else {
        ++refused;
      }
      absl::SleepFor(absl::Milliseconds(25));
    }
  });
  ASSERT_TRUE(WaitFor([&] { return Placed(*a) > 0 && Queued(*a) > 0; }, absl::Seconds(20)));

  const absl::Time sigterm = absl::Now();
  a->process().Signal(SIGTERM);
  const Handover h = WatchHandover(*a, *b, absl::Seconds(40));
  ASSERT_NE(h.a_exited, absl::InfiniteFuture()) << "the leader did not exit";
  ASSERT_NE(h.b_led, absl::InfiniteFuture()) << "the standby did not take over";
  absl::StatusOr<int> code = a->process().Wait(absl::Seconds(1));
  ASSERT_TRUE(code.ok());
  EXPECT_EQ(*code, 0);
  std::printf(
      "ha: SIGTERM to exit %.2fs; leader last seen leading %.2fs after SIGTERM; standby led "
      "%.2fs after that\n",
      absl::ToDoubleSeconds(h.a_exited - sigterm), absl::ToDoubleSeconds(h.a_led_last - sigterm),
      absl::ToDoubleSeconds(h.b_led - h.a_led_last));
  EXPECT_LE(h.a_exited - sigterm, absl::Seconds(20)) << "stop_grace bounds the stop";
  EXPECT_LE(h.b_led - h.a_led_last, absl::Seconds(1));

  absl::SleepFor(absl::Milliseconds(500));  // the new leader takes load too
  stop_load = true;
  load.join();
  EXPECT_EQ(refused, 0) << "the standby admitted throughout";
  ASSERT_GT(ids.size(), 0u);
  ExpectAllSucceeded(*b, ids);
  EXPECT_TRUE(EachStartedOnce(w->Journal(), ids));
}

// A stopping leader refuses new jobs UNAVAILABLE and waits for the job its worker runs, which
// therefore ends at its first attempt and is recorded before the leader exits.
TEST_F(HaTest, AStoppingLeaderRefusesNewJobsAndWaitsForTheJobItsWorkerRuns) {
  LongJob setup;
  StartLongJob("20s", "3s", &setup);
  ASSERT_FALSE(HasFatalFailure());
  Daemon* a = setup.a.get();
  Daemon* b = setup.b.get();
  const std::string& id = setup.id;

  const absl::Time sigterm = absl::Now();
  a->process().Signal(SIGTERM);
  absl::StatusOr<std::string> refused;
  ASSERT_TRUE(WaitFor(
      [&] {
        refused = a->Submit(Spec("echo", "too late"));
        return !refused.ok();
      },
      absl::Seconds(2)));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.status().message(), HasSubstr("stopping"));
  EXPECT_TRUE(a->process().Running()) << "it waits for the running job";

  absl::StatusOr<int> code = a->process().Wait(absl::Seconds(25));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);
  const absl::Time exited = absl::Now();
  EXPECT_LE(exited - sigterm, absl::Seconds(20));
  ASSERT_TRUE(WaitFor([&] { return IsLeader(*b); }, absl::Seconds(5)));
  absl::StatusOr<v1::Job> job = b->Status(id);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(job->attempt(), 1) << "it ran once, to its end";
  EXPECT_LE(proto_convert::FromProto(job->finished_at()), exited)
      << "recorded by the leader before it exited";
  // A "too late" job that the leader took before it began to stop may have run beside it.
  EXPECT_TRUE(EachStartedOnce(setup.w->Journal(), {id}, OtherJobs::kMayStart));
}

// A job longer than stop_grace: the leader exits at its grace, the job runs on, and its worker
// reports it to the standby that took over. It still runs once.
TEST_F(HaTest, AJobLongerThanStopGraceFinishesUnderTheNextLeader) {
  LongJob setup;
  StartLongJob("1s", "4s", &setup);
  ASSERT_FALSE(HasFatalFailure());
  Daemon* a = setup.a.get();
  Daemon* b = setup.b.get();
  const std::string& id = setup.id;
  const absl::Time sigterm = absl::Now();
  a->process().Signal(SIGTERM);
  ASSERT_TRUE(WaitFor([&] { return IsLeader(*b); }, absl::Seconds(10)));
  const absl::Duration handover = absl::Now() - sigterm;
  std::printf("ha: a leader with a 4s job and stop_grace 1s handed over %.2fs after SIGTERM\n",
              absl::ToDoubleSeconds(handover));
  EXPECT_GE(handover, absl::Seconds(1)) << "it waited out its grace";
  absl::StatusOr<v1::Job> left = b->Status(id);
  ASSERT_TRUE(left.ok()) << left.status();
  EXPECT_EQ(left->state(), v1::JOB_STATE_RUNNING) << "and no longer: the job still runs";
  absl::StatusOr<int> code = a->process().Wait(absl::Seconds(10));
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(*code, 0);

  std::vector<v1::Job> done;
  ASSERT_TRUE(b->WaitForTerminal({id}, &done, absl::Seconds(30)));
  EXPECT_EQ(done[0].state(), v1::JOB_STATE_SUCCEEDED) << done[0].error();
  EXPECT_EQ(done[0].attempt(), 1) << "re-adopted, not run again";
  EXPECT_TRUE(EachStartedOnce(setup.w->Journal(), {id}));
}

}  // namespace
}  // namespace dispatchd::e2e
