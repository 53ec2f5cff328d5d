#include "lib/sched/scheduler.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace dispatchd::sched {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::SizeIs;
using ::testing::UnorderedElementsAre;

const absl::Time kNow = absl::FromUnixSeconds(1'700'000'000);

config::Config TwoTypes(int echo_cap = config::kUnlimited) {
  config::Config c;
  c.types.push_back(config::JobTypeConfig{.name = "echo", .max_concurrency = echo_cap});
  c.types.push_back(config::JobTypeConfig{.name = "embed"});
  return c;
}

PendingJob Job(std::string id, std::string type = "echo", int seconds_after = 0) {
  return PendingJob{
      .id = std::move(id), .type = std::move(type), .arrival = kNow + absl::Seconds(seconds_after)};
}

std::vector<std::string> Pairs(const std::vector<Dispatch>& ds) {
  std::vector<std::string> out;
  for (const Dispatch& d : ds) out.push_back(d.job_id + "@" + d.worker_id);
  return out;
}

TEST(SchedulerTest, NothingIsDispatchedWithoutWorkers) {
  Scheduler s(TwoTypes());
  s.Enqueue(Job("j1"));
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
  EXPECT_EQ(s.WhyWaiting("j1", kNow).reason, WaitReason::kNoWorker);
}

TEST(SchedulerTest, DispatchesInArrivalOrderUpToFreeSlots) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "w1", .types = {"echo"}, .slots = 2});
  s.Enqueue(Job("late", "echo", 5));
  s.Enqueue(Job("early", "echo", 1));
  s.Enqueue(Job("middle", "echo", 3));
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("early@w1", "middle@w1"));
  EXPECT_EQ(s.WhyWaiting("late", kNow).reason, WaitReason::kWorkersBusy);
}

TEST(SchedulerTest, CountsQueuedJobsPerTypeAndFairnessKey) {
  Scheduler s(TwoTypes());
  auto job = [](std::string id, std::string type, std::string key, int seconds_after = 0) {
    PendingJob p = Job(std::move(id), std::move(type));
    p.fairness_key = std::move(key);
    p.not_before = kNow + absl::Seconds(seconds_after);
    return p;
  };
  s.Enqueue(job("a1", "echo", "alice"));
  s.Enqueue(job("a2", "echo", "alice", 60));  // not due yet: still queued
  s.Enqueue(job("a3", "embed", "alice"));
  s.Enqueue(job("b1", "echo", "bob"));
  EXPECT_EQ(s.queued_of("echo", "alice"), 2);
  EXPECT_EQ(s.queued_of("embed", "alice"), 1);
  EXPECT_EQ(s.queued_of("echo", "bob"), 1);
  EXPECT_EQ(s.queued_of("embed", "bob"), 0);
  EXPECT_EQ(s.queued_of("echo", "nobody"), 0);

  s.AddWorker({.id = "w1", .types = {"echo"}, .slots = 1});
  ASSERT_THAT(Pairs(s.Decide(kNow)), SizeIs(1));  // a1 or b1 leaves the queue
  EXPECT_EQ(s.queued_of("echo", "alice") + s.queued_of("echo", "bob"), 2);
  EXPECT_TRUE(s.RemovePending("a3"));
  EXPECT_EQ(s.queued_of("embed", "alice"), 0);
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
}

TEST(SchedulerTest, FillsLowestRankedWorkerFirst) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "first", .types = {"echo"}, .slots = 2});
  s.AddWorker({.id = "second", .types = {"echo"}, .slots = 2});
  for (int i = 0; i < 3; ++i) s.Enqueue(Job("j" + std::to_string(i), "echo", i));
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("j0@first", "j1@first", "j2@second"));
}

TEST(SchedulerTest, ReconnectingWorkerKeepsItsRank) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "a", .types = {"echo"}, .slots = 1});
  s.AddWorker({.id = "b", .types = {"echo"}, .slots = 1});
  s.RemoveWorker("a");
  s.AddWorker({.id = "a", .types = {"echo"}, .slots = 1});
  s.Enqueue(Job("j1"));
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("j1@a"));
}

TEST(SchedulerTest, TypeCapSkipsWithoutBlockingOtherTypes) {
  Scheduler s(TwoTypes(/*echo_cap=*/1));
  s.AddWorker({.id = "w", .types = {"echo", "embed"}, .slots = 4});
  s.Enqueue(Job("e1", "echo", 0));
  s.Enqueue(Job("e2", "echo", 1));
  s.Enqueue(Job("m1", "embed", 2));
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("e1@w", "m1@w"));
  EXPECT_EQ(s.WhyWaiting("e2", kNow).reason, WaitReason::kTypeCap);
  s.Finished("e1", kNow);
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("e2@w"));
}

TEST(SchedulerTest, WorkerMustServeTypeAndCarryEveryLabel) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "cpu", .types = {"echo"}, .slots = 1, .labels = {{"gpu", "none"}}});
  s.AddWorker({.id = "h100", .types = {"echo"}, .slots = 1, .labels = {{"gpu", "h100"}}});
  PendingJob j = Job("j1");
  j.labels = {{"gpu", "h100"}};
  s.Enqueue(j);
  s.Enqueue(Job("j2", "embed", 1));
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("j1@h100"));
  EXPECT_EQ(s.WhyWaiting("j2", kNow).reason, WaitReason::kNoWorker);
}

TEST(SchedulerTest, NotBeforeHoldsJobUntilDue) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 2});
  PendingJob j = Job("later");
  j.not_before = kNow + absl::Seconds(10);
  s.Enqueue(j);
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
  EXPECT_EQ(s.WhyWaiting("later", kNow).reason, WaitReason::kNotBefore);
  EXPECT_EQ(s.NextWakeup(kNow), kNow + absl::Seconds(10));
  EXPECT_THAT(Pairs(s.Decide(kNow + absl::Seconds(10))), ElementsAre("later@w"));
}

TEST(SchedulerTest, RefusalLowersCapacityUntilHeartbeat) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 4});
  for (int i = 0; i < 4; ++i) s.Enqueue(Job("j" + std::to_string(i), "echo", i));
  ASSERT_THAT(s.Decide(kNow), SizeIs(4));
  // The worker accepts j0 and refuses the rest: it holds all it can take.
  for (const char* id : {"j1", "j2", "j3"}) {
    s.Refused(id);
    s.Enqueue(Job(id, "echo", id[1] - '0'));
  }
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
  // Freeing its one job frees exactly one slot, not four.
  s.Finished("j0", kNow);
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("j1@w"));
  // A heartbeat restores the advertised slots.
  s.Heartbeat("w");
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("j2@w", "j3@w"));
}

TEST(SchedulerTest, RefusedJobKeepsItsPlaceInLine) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "a", .types = {"echo"}, .slots = 1});
  s.Enqueue(Job("old", "echo", 0));
  ASSERT_THAT(Pairs(s.Decide(kNow)), ElementsAre("old@a"));
  s.Enqueue(Job("new", "echo", 5));
  s.Refused("old");
  s.Enqueue(Job("old", "echo", 0));
  s.AddWorker({.id = "b", .types = {"echo"}, .slots = 1});
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("old@b"));
}

TEST(SchedulerTest, RemovingWorkerReturnsItsJobsAndFreesCaps) {
  Scheduler s(TwoTypes(/*echo_cap=*/2));
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 2});
  s.Enqueue(Job("j1", "echo", 0));
  s.Enqueue(Job("j2", "echo", 1));
  ASSERT_THAT(s.Decide(kNow), SizeIs(2));
  EXPECT_THAT(s.RemoveWorker("w"), ElementsAre("j1", "j2"));
  EXPECT_EQ(s.running_of_type("echo"), 0);
  EXPECT_EQ(s.placed_count(), 0u);
}

TEST(SchedulerTest, DrainingWorkerGetsNoNewWork) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 2});
  s.SetDraining("w", true);
  s.Enqueue(Job("j1"));
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
  EXPECT_EQ(s.WhyWaiting("j1", kNow).reason, WaitReason::kWorkersBusy);
}

TEST(SchedulerTest, AdoptedJobCountsAgainstSlotsAndCaps) {
  Scheduler s(TwoTypes(/*echo_cap=*/1));
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 2});
  s.Adopt({.id = "running", .type = "echo", .worker_id = "w"});
  s.Enqueue(Job("next"));
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
  EXPECT_EQ(s.WhyWaiting("next", kNow).reason, WaitReason::kTypeCap);
  s.Finished("running", kNow);
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("next@w"));
}

TEST(SchedulerTest, CancelledPendingJobIsNeverDispatched) {
  Scheduler s(TwoTypes());
  s.Enqueue(Job("j1"));
  EXPECT_TRUE(s.RemovePending("j1"));
  EXPECT_FALSE(s.RemovePending("j1"));
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 1});
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
}

TEST(SchedulerTest, UnconfiguredTypeWaitsInsteadOfRunning) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "w", .types = {"ghost"}, .slots = 1});
  s.Enqueue(Job("j1", "ghost"));
  EXPECT_THAT(s.Decide(kNow), IsEmpty());
}

TEST(SchedulerTest, LimitBoundsOneDecision) {
  Scheduler s(TwoTypes());
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 10});
  for (int i = 0; i < 5; ++i) s.Enqueue(Job("j" + std::to_string(i), "echo", i));
  EXPECT_THAT(s.Decide(kNow, 2), SizeIs(2));
  EXPECT_EQ(s.pending_count(), 3u);
}

}  // namespace
}  // namespace dispatchd::sched

namespace dispatchd::sched {
namespace {

TEST(SchedulerRecoveryTest, JobAdoptedBeforeItsWorkerReturnsCountsOnce) {
  Scheduler s(TwoTypes(/*echo_cap=*/5));
  // After a restart the job is known to run on "w", which has not reconnected yet.
  s.Adopt({.id = "j1", .type = "echo", .worker_id = "w"});
  EXPECT_EQ(s.running_of_type("echo"), 1);
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 2});
  // The worker reports it: the re-adoption now counts it in the worker's slots.
  s.Adopt({.id = "j1", .type = "echo", .worker_id = "w"});
  EXPECT_EQ(s.running_of_type("echo"), 1);
  ASSERT_THAT(s.Workers(), SizeIs(1));
  EXPECT_EQ(s.Workers()[0].busy, 1);
  s.Finished("j1", kNow);
  EXPECT_EQ(s.Workers()[0].busy, 0);
  EXPECT_EQ(s.running_of_type("echo"), 0);
}

// Jobs adopted after a restart wait for their own worker: each worker that connects takes up
// the slots of its jobs and no other's, including after one of them has ended unreported.
TEST(SchedulerRecoveryTest, AdoptedJobsCountOnTheirOwnWorkerWhenItConnects) {
  Scheduler s(TwoTypes());
  s.Adopt({.id = "a1", .type = "echo", .worker_id = "a"});
  s.Adopt({.id = "b1", .type = "echo", .worker_id = "b"});
  s.Adopt({.id = "a2", .type = "echo", .worker_id = "a"});
  s.Adopt({.id = "b2", .type = "echo", .worker_id = "b"});
  s.Finished("b1", kNow);  // its worker never reported it
  s.AddWorker({.id = "a", .types = {"echo"}, .slots = 3});
  s.AddWorker({.id = "c", .types = {"echo"}, .slots = 1});
  s.AddWorker({.id = "b", .types = {"echo"}, .slots = 2});
  std::map<std::string, int> busy;
  for (const WorkerView& w : s.Workers()) busy[w.id] = w.busy;
  EXPECT_THAT(busy, ElementsAre(Pair("a", 2), Pair("b", 1), Pair("c", 0)));
  EXPECT_THAT(s.JobsOn("a"), UnorderedElementsAre("a1", "a2"));
  EXPECT_THAT(s.JobsOn("b"), ElementsAre("b2"));
  EXPECT_THAT(s.Audit(/*repair=*/false), IsEmpty());
}

TEST(SchedulerRecoveryTest, UnreportedAdoptionFreesCapWithoutTouchingWorkerSlots) {
  Scheduler s(TwoTypes());
  s.Adopt({.id = "j1", .type = "echo", .worker_id = "w"});
  s.AddWorker({.id = "w", .types = {"echo"}, .slots = 1});
  s.Finished("j1", kNow);  // grace over, the worker never reported it
  EXPECT_EQ(s.Workers()[0].busy, 0);
  s.Enqueue(Job("j2"));
  EXPECT_THAT(Pairs(s.Decide(kNow)), ElementsAre("j2@w"));
}

}  // namespace
}  // namespace dispatchd::sched
