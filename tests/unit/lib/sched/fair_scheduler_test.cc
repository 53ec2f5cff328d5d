// Tiers, weighted fair queuing, cost learning and conflict exclusion, checked against the
// simulation in the scheduler design: each of its five scenarios is replayed through Scheduler
// with a fake clock and must print the same ARRIVE, ADMIT and DONE lines, in the same order, as
// the simulation's output (testdata/seed003_simulation.golden.txt, from
// testdata/seed003_simulation.py).
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::SizeIs;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

// ----- The simulation's model, as its Python reads. -----

struct SimType {
  std::string name;
  int max_concurrency;
  std::string conflict_group;
  int priority;
};

struct SimJob {
  std::string type;
  std::string job_id;  // the resource
  std::string key;
  int cost;
  int duration;
  int arrival;

  std::string Repr() const {
    return absl::StrCat(type, "(", job_id, ", fk=", key.empty() ? "bg" : key, ", cost=", cost,
                        ", dur=", duration, ")");
  }
};

// Runs the jobs through Scheduler as the simulation runs them: each tick arrives jobs, completes
// those due, then dispatches; one worker with `slots` slots is the simulation's global limit.
std::vector<std::string> Replay(const std::vector<SimType>& types, int slots,
                                const std::vector<SimJob>& jobs, int until) {
  config::Config c;
  std::map<int, bool> priorities;
  for (const SimType& t : types) priorities[t.priority] = true;
  for (const auto& [p, unused] : priorities) c.tiers.push_back({absl::StrCat("p", p), p});
  std::vector<std::string> names;
  for (const SimType& t : types) {
    c.types.push_back({.name = t.name,
                       .max_concurrency = t.max_concurrency,
                       .tier = absl::StrCat("p", t.priority),
                       .conflict_group = t.conflict_group});
    names.push_back(t.name);
  }
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = names, .slots = slots});
  std::map<std::string, const SimJob*> by_id;
  std::map<std::string, int> priority_of;
  for (const SimType& t : types) priority_of[t.name] = t.priority;
  for (size_t i = 0; i < jobs.size(); ++i) {
    std::string id = absl::StrCat(i);
    by_id[id] = &jobs[i];
    // The simulation gives each job its cost; here it is the learned estimate, seeded.
    s.SetCostEstimate(jobs[i].type, jobs[i].job_id, jobs[i].cost, kT0);
  }
  std::vector<std::string> log;
  std::vector<std::pair<std::string, int>> running;  // id, finish tick; admission order
  std::map<int, int> running_by_priority;
  for (int t = 0; t <= until; ++t) {
    absl::Time now = kT0 + absl::Seconds(t);
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (jobs[i].arrival != t) continue;
      s.Enqueue({.id = absl::StrCat(i),
                 .type = jobs[i].type,
                 .resource_id = jobs[i].job_id,
                 .fairness_key = jobs[i].key,
                 .arrival = now});
      log.push_back(absl::StrFormat(" T=%3d: ARRIVE %s", t, jobs[i].Repr()));
    }
    for (auto it = running.begin(); it != running.end();) {
      if (it->second <= t) {
        const SimJob& j = *by_id[it->first];
        // The simulation's cost is what the job truly uses (its estimate was exact), so it
        // reports that: the charge is corrected by nothing and the log matches line for line.
        s.Finished(it->first, now, absl::Seconds(j.cost));
        --running_by_priority[priority_of[j.type]];
        log.push_back(absl::StrFormat(" T=%3d: DONE %s", t, j.Repr()));
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    for (const Dispatch& d : s.Decide(now)) {
      const SimJob& j = *by_id[d.job_id];
      running.push_back({d.job_id, t + j.duration});
      int p = priority_of[j.type];
      ++running_by_priority[p];
      log.push_back(
          absl::StrFormat(" T=%3d: ADMIT %s (pri=%d, VT[%s]=%d, pri_running=%d, total=%d)", t,
                          j.Repr(), p, j.key.empty() ? "bg" : j.key, static_cast<int>(d.key_cost),
                          running_by_priority[p], running.size()));
    }
  }
  return log;
}

// The simulation's log lines of scenario `n` (1-based), from the golden output.
std::vector<std::string> Golden(int n) {
  std::ifstream in(DISPATCHD_TESTDATA_DIR "/seed003_simulation.golden.txt");
  EXPECT_TRUE(in.good()) << "missing golden output";
  std::vector<std::string> out;
  std::string line;
  int scenario = 0;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, "SCENARIO ")) scenario = std::atoi(line.c_str() + 9);
    if (scenario == n && absl::StartsWith(line, " T=")) out.push_back(line);
  }
  return out;
}

std::vector<SimType> StandardTypes() {
  return {{"sync-clone", 8, "git", 8}, {"repack", 3, "git", 4}, {"pull", 3, "git", 4}};
}

TEST(SimulationReplayTest, Scenario1BackgroundSaturatedForegroundArrivesLate) {
  std::vector<SimJob> jobs;
  for (int i = 1; i <= 6; ++i) jobs.push_back({"repack", absl::StrCat("r", i), "", 20, 8, 0});
  for (int i = 7; i <= 10; ++i) jobs.push_back({"pull", absl::StrCat("r", i), "", 10, 6, 0});
  jobs.push_back({"sync-clone", "r99", "dev1", 10, 2, 3});
  EXPECT_THAT(Replay(StandardTypes(), 8, jobs, 25), ElementsAreArray(Golden(1)));
}

TEST(SimulationReplayTest, Scenario2TwoClientBurstsBackgroundAndConflicts) {
  std::vector<SimJob> jobs;
  for (int i = 1; i <= 4; ++i) jobs.push_back({"repack", absl::StrCat("repo", i), "", 20, 6, 0});
  for (int i = 1; i <= 10; ++i) {
    jobs.push_back({"sync-clone", absl::StrCat("a", i), "clientA", 10, 3, 1});
  }
  jobs.push_back({"sync-clone", "b1", "clientB", 10, 3, 2});
  jobs.push_back({"sync-clone", "b2", "clientB", 10, 3, 2});
  EXPECT_THAT(Replay(StandardTypes(), 8, jobs, 30), ElementsAreArray(Golden(2)));
}

TEST(SimulationReplayTest, Scenario3ExpensiveVersusCheapClones) {
  std::vector<SimJob> jobs;
  jobs.push_back({"sync-clone", "linux", "clientA", 100, 15, 0});
  for (int i = 1; i <= 8; ++i) {
    jobs.push_back({"sync-clone", absl::StrCat("small", i), "clientB", 5, 2, 0});
  }
  jobs.push_back({"sync-clone", "med1", "clientC", 20, 4, 5});
  jobs.push_back({"sync-clone", "med2", "clientC", 20, 4, 5});
  EXPECT_THAT(Replay(StandardTypes(), 8, jobs, 25), ElementsAreArray(Golden(3)));
}

TEST(SimulationReplayTest, Scenario4ConflictKeyPreventsUnsafeConcurrentAccess) {
  std::vector<SimJob> jobs = {
      {"sync-clone", "repo1", "dev1", 10, 3, 0},
      {"repack", "repo1", "", 20, 4, 0},
      {"sync-clone", "repo2", "dev2", 10, 3, 0},
      {"repack", "repo2", "", 20, 4, 0},
  };
  std::vector<std::string> log = Replay(StandardTypes(), 8, jobs, 20);
  EXPECT_THAT(log, ElementsAreArray(Golden(4)));
}

TEST(SimulationReplayTest, Scenario5ManyBackgroundTypesDoNotStarveForeground) {
  std::vector<SimType> types;
  for (const char* t : {"repack", "pull", "gc", "verify"}) types.push_back({t, 4, "git", 4});
  types.push_back({"sync-clone", 8, "git", 8});
  std::vector<SimJob> jobs;
  for (const char* t : {"repack", "pull", "gc", "verify"}) {
    for (int i = 1; i <= 3; ++i) jobs.push_back({t, absl::StrCat(t, i), "", 15, 6, 0});
  }
  for (int i = 1; i <= 4; ++i) {
    jobs.push_back({"sync-clone", absl::StrCat("clone", i), "clientA", 10, 2, 2});
  }
  EXPECT_THAT(Replay(types, 8, jobs, 30), ElementsAreArray(Golden(5)));
}

// ----- Properties beyond the simulation. -----

config::Config OneType(double default_cost = 1) {
  config::Config c;
  c.types.push_back({.name = "gen", .default_cost = default_cost});
  return c;
}

std::vector<std::string> Drain(Scheduler& s, absl::Time& now, int n) {
  std::vector<std::string> order;
  for (int i = 0; i < n; ++i) {
    std::vector<Dispatch> d = s.Decide(now, 1);
    if (d.empty()) break;
    order.push_back(d[0].job_id);
    now += absl::Seconds(1);
    s.Finished(d[0].job_id, now, absl::Seconds(1));
  }
  return order;
}

TEST(FairQueuingTest, SmallClientOvertakesABigBacklog) {
  Scheduler s(OneType(), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  for (int i = 0; i < 1000; ++i) {
    s.Enqueue({.id = absl::StrCat("a", i),
               .type = "gen",
               .fairness_key = "A",
               .arrival = kT0 + absl::Microseconds(i)});
  }
  absl::Time now = kT0;
  ASSERT_THAT(Drain(s, now, 5), SizeIs(5));
  for (int i = 0; i < 10; ++i) {
    s.Enqueue({.id = absl::StrCat("b", i), .type = "gen", .fairness_key = "B", .arrival = now});
  }
  std::vector<std::string> order = Drain(s, now, 20);
  // B alternates with A from the moment it arrives: all ten of B's within the next 20.
  int b = 0;
  for (const std::string& id : order) b += id[0] == 'b';
  EXPECT_EQ(b, 10);
}

TEST(FairQueuingTest, ReturningKeyStartsAtVirtualTimeWithoutBankedCredit) {
  Scheduler s(OneType(), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  absl::Time now = kT0;
  // B runs one job and leaves; A then runs 100.
  s.Enqueue({.id = "b0", .type = "gen", .fairness_key = "B", .arrival = now});
  ASSERT_THAT(Drain(s, now, 1), ElementsAre("b0"));
  for (int i = 0; i < 200; ++i) {
    s.Enqueue({.id = absl::StrCat("a", i),
               .type = "gen",
               .fairness_key = "A",
               .arrival = now + absl::Microseconds(i)});
  }
  ASSERT_THAT(Drain(s, now, 100), SizeIs(100));
  // B comes back: it must not get 100 jobs in a row for having been away.
  for (int i = 1; i <= 10; ++i) {
    s.Enqueue({.id = absl::StrCat("b", i), .type = "gen", .fairness_key = "B", .arrival = now});
  }
  EXPECT_GE(s.KeyCost("B"), s.KeyCost("A") - 1);
  std::vector<std::string> order = Drain(s, now, 6);
  int b = 0;
  for (const std::string& id : order) b += id[0] == 'b';
  EXPECT_LE(b, 4);
  EXPECT_GE(b, 2);
}

TEST(FairQueuingTest, LearnedCostMakesExpensiveWorkYield) {
  config::Config c = OneType(/*default_cost=*/1);
  c.scheduler.cost_alpha = 0.5;
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  absl::Time now = kT0;
  // linux takes 60 s, git 5 s: after one observation each, the estimates move halfway.
  s.Enqueue(
      {.id = "l", .type = "gen", .resource_id = "linux", .fairness_key = "A", .arrival = now});
  ASSERT_THAT(s.Decide(now), SizeIs(1));
  s.Finished("l", now + absl::Seconds(60), absl::Seconds(60));
  s.Enqueue({.id = "g", .type = "gen", .resource_id = "git", .fairness_key = "B", .arrival = now});
  ASSERT_THAT(s.Decide(now), SizeIs(1));
  s.Finished("g", now + absl::Seconds(5), absl::Seconds(5));
  s.Enqueue(
      {.id = "l2", .type = "gen", .resource_id = "linux", .fairness_key = "A", .arrival = now});
  s.Enqueue({.id = "g2", .type = "gen", .resource_id = "git", .fairness_key = "B", .arrival = now});
  // Each job is charged its estimate when it is dispatched.
  std::vector<Dispatch> d = s.Decide(now, 2);
  ASSERT_THAT(d, SizeIs(1));  // one slot
  std::map<std::string, double> charged = {{d[0].job_id, d[0].cost}};
  s.Finished(d[0].job_id, now, absl::Seconds(1));
  d = s.Decide(now);
  ASSERT_THAT(d, SizeIs(1));
  charged[d[0].job_id] = d[0].cost;
  EXPECT_NEAR(charged["l2"], 30.5, 1e-9);  // 0.5 * 60 + 0.5 * 1
  EXPECT_NEAR(charged["g2"], 3, 1e-9);     // 0.5 * 5 + 0.5 * 1
}

TEST(ConflictTest, SameGroupSameResourceNeverRunsTogetherAcrossTypes) {
  config::Config c;
  c.types.push_back({.name = "sync", .conflict_group = "git"});
  c.types.push_back({.name = "repack", .conflict_group = "git"});
  c.types.push_back({.name = "snapshot"});
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"sync", "repack", "snapshot"}, .slots = 8});
  s.Enqueue({.id = "sync1", .type = "sync", .resource_id = "repo1", .arrival = kT0});
  s.Enqueue({.id = "repack1", .type = "repack", .resource_id = "repo1", .arrival = kT0});
  s.Enqueue({.id = "sync1b", .type = "sync", .resource_id = "repo1", .arrival = kT0});
  s.Enqueue({.id = "snap1", .type = "snapshot", .resource_id = "repo1", .arrival = kT0});
  s.Enqueue({.id = "sync2", .type = "sync", .resource_id = "repo2", .arrival = kT0});
  std::vector<Dispatch> d = s.Decide(kT0);
  std::vector<std::string> ids;
  for (const Dispatch& x : d) ids.push_back(x.job_id);
  EXPECT_THAT(ids, ElementsAre("sync1", "snap1", "sync2"));
  EXPECT_EQ(s.WhyWaiting("repack1", kT0).reason, WaitReason::kConflict);
  s.Finished("sync1", kT0);
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));
  EXPECT_TRUE(s.IsPlaced("repack1"));
  EXPECT_EQ(s.WhyWaiting("sync1b", kT0).reason, WaitReason::kConflict);
}

TEST(TierTest, TierValueCapsItAndHigherTiersGoFirst) {
  config::Config c;
  c.tiers = {{"fg", 4}, {"bg", 2}};
  c.types.push_back({.name = "interactive", .tier = "fg"});
  c.types.push_back({.name = "batch", .tier = "bg"});
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"interactive", "batch"}, .slots = 10});
  for (int i = 0; i < 5; ++i) {
    s.Enqueue({.id = absl::StrCat("b", i), .type = "batch", .arrival = kT0});
  }
  for (int i = 0; i < 6; ++i) {
    s.Enqueue(
        {.id = absl::StrCat("i", i), .type = "interactive", .arrival = kT0 + absl::Seconds(1)});
  }
  std::vector<Dispatch> d = s.Decide(kT0 + absl::Seconds(1));
  ASSERT_THAT(d, SizeIs(6));  // 4 fg + 2 bg
  EXPECT_EQ(d[0].job_id, "i0");
  EXPECT_EQ(s.running_of_type("interactive"), 4);
  EXPECT_EQ(s.running_of_type("batch"), 2);
  EXPECT_EQ(s.WhyWaiting("i4", kT0).reason, WaitReason::kTierCap);
}

TEST(RateLimitTest, LimitedModelWaitsWithoutBlockingOthersAndChangesAtRunTime) {
  config::Config c;
  c.types.push_back({.name = "slow", .model = "m1", .rate = {.per_second = 1, .burst = 2}});
  c.types.push_back({.name = "fast", .model = "m2"});
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"slow", "fast"}, .slots = 100});
  for (int i = 0; i < 10; ++i) {
    s.Enqueue({.id = absl::StrCat("s", i), .type = "slow", .arrival = kT0});
  }
  for (int i = 0; i < 5; ++i) {
    s.Enqueue({.id = absl::StrCat("f", i), .type = "fast", .arrival = kT0 + absl::Seconds(1)});
  }
  EXPECT_THAT(s.Decide(kT0), SizeIs(7));  // the burst of 2, and every fast job
  EXPECT_EQ(s.WhyWaiting("s2", kT0).reason, WaitReason::kRateLimit);
  EXPECT_EQ(s.NextWakeup(kT0), kT0 + absl::Seconds(1));
  EXPECT_THAT(s.Decide(kT0 + absl::Seconds(1)), SizeIs(1));
  ASSERT_TRUE(s.SetRateLimit("m1", {.per_second = 10, .burst = 1}, kT0 + absl::Seconds(1)));
  EXPECT_THAT(s.Decide(kT0 + absl::Milliseconds(1100)), SizeIs(1));
  EXPECT_FALSE(s.SetRateLimit("nope", {.per_second = 1, .burst = 1}, kT0));
  ASSERT_TRUE(s.SetRateLimit("m1", {}, kT0 + absl::Seconds(2)));  // no limit
  EXPECT_THAT(s.Decide(kT0 + absl::Seconds(2)), SizeIs(6));
}

TEST(StatusTest, QueuedJobSaysWhyAndItsPlaceInLine) {
  Scheduler s(OneType(), kT0);
  for (int i = 0; i < 3; ++i) {
    s.Enqueue({.id = absl::StrCat("a", i), .type = "gen", .fairness_key = "A", .arrival = kT0});
  }
  s.Enqueue({.id = "b0", .type = "gen", .fairness_key = "B", .arrival = kT0 + absl::Seconds(1)});
  WaitInfo a2 = s.WhyWaiting("a2", kT0);
  EXPECT_EQ(a2.reason, WaitReason::kNoWorker);
  EXPECT_EQ(a2.position, 3);
  EXPECT_EQ(a2.keys_ahead, 0);
  EXPECT_EQ(s.WhyWaiting("b0", kT0).keys_ahead, 1);
  SchedulerStats stats = s.Stats(kT0);
  ASSERT_THAT(stats.types, SizeIs(1));
  EXPECT_EQ(stats.types[0].queued, 4);
  EXPECT_EQ(stats.types[0].head, WaitReason::kNoWorker);
  ASSERT_THAT(stats.keys, SizeIs(2));
}

TEST(ReconfigureTest, NewRulesApplyToQueuedJobsAndBucketsKeepTheirTokens) {
  config::Config c;
  c.types.push_back({.name = "sync", .model = "m", .rate = {.per_second = 1, .burst = 3}});
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"sync"}, .slots = 10});
  for (int i = 0; i < 6; ++i) {
    s.Enqueue({.id = absl::StrCat("j", i), .type = "sync", .resource_id = "repo", .arrival = kT0});
  }
  ASSERT_THAT(s.Decide(kT0), SizeIs(3));  // the burst
  // Now the type joins a conflict group and a tier of 4, and the bucket grows: the queued jobs
  // are refiled under the new rules, and the emptied bucket is not refilled by the change.
  c.tiers = {{"fg", 4}};
  c.types[0].tier = "fg";
  c.types[0].conflict_group = "git";
  c.types[0].rate = {.per_second = 100, .burst = 100};
  s.UpdateConfig(c, kT0);
  EXPECT_THAT(s.Decide(kT0), SizeIs(0));
  // 10 ms later the bucket holds one token. The three jobs placed under the old rules hold no
  // resource, so one new job takes "repo" and the rest wait on it, and the tier is then full.
  std::vector<Dispatch> d = s.Decide(kT0 + absl::Milliseconds(10));
  ASSERT_THAT(d, SizeIs(1));
  EXPECT_EQ(s.WhyWaiting("j4", kT0 + absl::Seconds(1)).reason, WaitReason::kConflict);
  SchedulerStats stats = s.Stats(kT0 + absl::Seconds(1));
  ASSERT_THAT(stats.tiers, SizeIs(1));
  EXPECT_EQ(stats.tiers[0].name, "fg");
  EXPECT_EQ(stats.tiers[0].running, 4);
  EXPECT_EQ(stats.tiers[0].cap, 4);
  s.Finished(d[0].job_id, kT0 + absl::Seconds(1));
  EXPECT_THAT(s.Decide(kT0 + absl::Seconds(1)), SizeIs(1));
  EXPECT_EQ(s.WhyWaiting("j5", kT0 + absl::Seconds(1)).reason, WaitReason::kConflict);
}

TEST(FairQueuingTest, RetractedDispatchRefundsItsCost) {
  Scheduler s(OneType(/*default_cost=*/5), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  s.Enqueue({.id = "a", .type = "gen", .fairness_key = "A", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));
  EXPECT_DOUBLE_EQ(s.KeyCost("A"), 5);
  s.Retract("a");
  EXPECT_DOUBLE_EQ(s.KeyCost("A"), 0);
  EXPECT_FALSE(s.IsPlaced("a"));
  s.Enqueue({.id = "a", .type = "gen", .fairness_key = "A", .arrival = kT0});
  EXPECT_THAT(s.Decide(kT0), SizeIs(1));  // the slot came back
}

}  // namespace
}  // namespace dispatchd::sched
