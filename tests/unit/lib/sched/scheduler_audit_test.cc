// Audit: the scheduler recounts what it derives from its jobs, reports drift and repairs it, so a
// leaked slot can never freeze a queue and a lost count can never break a cap.
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"

namespace dispatchd::sched {

// Injects the bugs Audit exists to catch.
class SchedulerTestPeer {
 public:
  static void LeakSlot(Scheduler& s, const std::string& worker_id) {
    Scheduler::WorkerState& w = *s.workers_.at(worker_id);
    ++w.busy;
    s.UpdateAvailable(w);
  }
  static void LoseRunningCount(Scheduler& s, const std::string& type) {
    --s.types_.at(type)->running;
  }
  static void ForgetHolder(Scheduler& s, const std::string& model, const std::string& worker_id) {
    s.models_.at(model)->holders.erase(s.workers_.at(worker_id).get());
  }
  static void LeakConflict(Scheduler& s, const std::string& group, const std::string& resource) {
    std::string key = group + '\x1f' + resource;
    if (s.conflicts_running_[key]++ == 0) s.SetConflictBusy(key, true);
  }
};

namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

config::Config Types() {
  config::Config c;
  c.types.push_back({.name = "gen", .max_concurrency = 1});
  c.types.push_back({.name = "sync", .conflict_group = "git"});
  return c;
}

TEST(SchedulerAuditTest, ConsistentStateHasNoDrift) {
  Scheduler s(Types(), kT0);
  s.AddWorker({.id = "w", .types = {"gen", "sync"}, .slots = 4});
  s.Enqueue({.id = "g1", .type = "gen", .fairness_key = "a", .arrival = kT0});
  s.Enqueue({.id = "g2", .type = "gen", .fairness_key = "b", .arrival = kT0});
  s.Enqueue({.id = "s1", .type = "sync", .resource_id = "r", .arrival = kT0});
  s.Enqueue({.id = "s2", .type = "sync", .resource_id = "r", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(2));
  s.Refused("g1");
  s.Finished("s1", kT0, absl::Seconds(1));
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
}

// Two 12 GB models, workers of 20 GB: each load on a worker evicts the other model.
config::Config ModelTypes() {
  config::Config c;
  c.types.push_back({.name = "a", .model = "ma", .vram_gb = 12});
  c.types.push_back({.name = "b", .model = "mb", .vram_gb = 12});
  return c;
}

TEST(SchedulerAuditTest, ModelHoldersFollowLoadsEvictionsReportsAndDepartures) {
  Scheduler s(ModelTypes(), kT0);
  s.AddWorker({.id = "w1", .types = {"a", "b"}, .slots = 1, .vram_gb = 20});
  s.Enqueue({.id = "a1", .type = "a", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));  // w1 loads ma
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
  s.Finished("a1", kT0, absl::Seconds(1));
  s.Enqueue({.id = "b1", .type = "b", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));  // w1 evicts ma for mb
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
  s.AddWorker(
      {.id = "w2", .types = {"a", "b"}, .slots = 1, .vram_gb = 20, .models_resident = {"mb"}});
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
  s.SetResidentModels("w2", {"ma"});  // a heartbeat's report
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
  s.RemoveWorker("w1");
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
}

TEST(SchedulerAuditTest, ForgottenModelHolderIsFoundAndRepaired) {
  Scheduler s(ModelTypes(), kT0);
  s.AddWorker({.id = "w", .types = {"a"}, .slots = 1, .vram_gb = 20, .models_resident = {"ma"}});
  SchedulerTestPeer::ForgetHolder(s, "ma", "w");
  EXPECT_THAT(s.Audit(/*repair=*/true),
              ElementsAre("model ma: holders 0, workers with it resident 1"));
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
}

TEST(SchedulerAuditTest, LeakedSlotIsFoundAndRepairedSoTheQueueMovesAgain) {
  Scheduler s(Types(), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  SchedulerTestPeer::LeakSlot(s, "w");
  s.Enqueue({.id = "g1", .type = "gen", .arrival = kT0});
  EXPECT_THAT(s.Decide(kT0), IsEmpty());  // frozen: the worker looks full
  std::vector<std::string> drifts = s.Audit(/*repair=*/true);
  EXPECT_THAT(drifts, ElementsAre("worker w: busy 1, jobs placed on it 0"));
  EXPECT_THAT(s.Decide(kT0), SizeIs(1));
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
}

TEST(SchedulerAuditTest, LostRunningCountIsRestoredSoTheCapHolds) {
  Scheduler s(Types(), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 4});
  s.Enqueue({.id = "g1", .type = "gen", .arrival = kT0});
  s.Enqueue({.id = "g2", .type = "gen", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));  // max_concurrency 1
  SchedulerTestPeer::LoseRunningCount(s, "gen");
  EXPECT_THAT(s.Audit(/*repair=*/true),
              ElementsAre(HasSubstr("type gen: running 0, jobs placed 1")));
  EXPECT_THAT(s.Decide(kT0), IsEmpty());  // the cap holds again
}

TEST(SchedulerAuditTest, LeakedConflictIsReleasedAndItsJobsBecomeReady) {
  Scheduler s(Types(), kT0);
  s.AddWorker({.id = "w", .types = {"sync"}, .slots = 4});
  s.Enqueue({.id = "s1", .type = "sync", .resource_id = "r", .arrival = kT0});
  SchedulerTestPeer::LeakConflict(s, "git", "r");
  EXPECT_THAT(s.Decide(kT0), IsEmpty());
  EXPECT_EQ(s.WhyWaiting("s1", kT0).reason, WaitReason::kConflict);
  EXPECT_THAT(s.Audit(/*repair=*/true), ElementsAre(HasSubstr("running 1, jobs placed 0")));
  EXPECT_THAT(s.Decide(kT0), SizeIs(1));
}

}  // namespace
}  // namespace dispatchd::sched
