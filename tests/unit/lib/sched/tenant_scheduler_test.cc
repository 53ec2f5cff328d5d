// Tenants: two-level fair queuing by weight, honest cost (charged at dispatch, corrected at the
// end), quotas (max_running, min_running with borrowing, rate per tenant and model). Driven by
// hand with a fake clock: each test moves `now` and reports results as a worker would.
#include <algorithm>
#include <cstdio>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

using ::testing::SizeIs;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

config::Config Tenants(std::vector<config::TenantConfig> tenants, double default_cost = 1) {
  config::Config c;
  c.types.push_back({.name = "gen", .default_cost = default_cost});
  c.tenants = std::move(tenants);
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  return c;
}

// A fleet of `slots` slots on one worker, jobs that each run `run` of wall time (reported as
// such), and a clock: enough to watch shares form.
class Fleet {
 public:
  Fleet(const config::Config& c, int slots) : s_(c, kT0) {
    s_.AddWorker({.id = "w", .types = {"gen"}, .slots = slots});
  }

  void Submit(const std::string& owner, const std::string& key, int n,
              absl::Duration run = absl::Seconds(1)) {
    for (int i = 0; i < n; ++i) {
      std::string id = absl::StrCat(owner, "/", key, "/", next_++);
      run_[id] = run;
      owner_[id] = owner;
      s_.Enqueue({.id = id, .type = "gen", .fairness_key = key, .owner = owner, .arrival = now_});
    }
  }

  // Dispatches, then advances the clock by `step`, finishing the jobs due.
  void Step(absl::Duration step = absl::Milliseconds(100)) {
    for (const Dispatch& d : s_.Decide(now_)) {
      running_.push_back({d.job_id, now_ + run_[d.job_id], now_});
      ++started_[owner_[d.job_id]];
    }
    now_ += step;
    std::vector<Running> still;
    for (const Running& r : running_) {
      if (r.until <= now_) {
        s_.Finished(r.id, now_, r.until - r.from);
        served_[owner_[r.id]] += absl::ToDoubleSeconds(r.until - r.from);
      } else {
        still.push_back(r);
      }
    }
    running_ = std::move(still);
  }

  int RunningOf(const std::string& owner) const {
    return static_cast<int>(std::count_if(running_.begin(), running_.end(), [&](const Running& r) {
      return owner_.at(r.id) == owner;
    }));
  }

  Scheduler& s() { return s_; }
  absl::Time now() const { return now_; }
  double served(const std::string& owner) { return served_[owner]; }
  int started(const std::string& owner) { return started_[owner]; }

 private:
  struct Running {
    std::string id;
    absl::Time until;
    absl::Time from;
  };
  Scheduler s_;
  absl::Time now_ = kT0;
  int next_ = 0;
  std::map<std::string, absl::Duration> run_;
  std::map<std::string, std::string> owner_;
  std::vector<Running> running_;
  std::map<std::string, double> served_;
  std::map<std::string, int> started_;
};

TEST(TenantShareTest, WeightsThreeToOneServeThreeQuartersAndOneQuarter) {
  Fleet f(Tenants({{.name = "big", .principals = {"alice"}, .weight = 3},
                   {.name = "small", .principals = {"bob"}, .weight = 1}}),
          /*slots=*/4);
  f.Submit("alice", "alice", 2000);
  f.Submit("bob", "bob", 2000);
  for (int i = 0; i < 1000; ++i) f.Step();  // 100 s: 400 slot-seconds
  const double big = f.served("alice"), small = f.served("bob");
  ASSERT_GT(big + small, 390);
  EXPECT_NEAR(big / (big + small), 0.75, 0.01) << big << " vs " << small;
}

TEST(TenantShareTest, ThousandKeysInOneTenantGetOneTenantsShare) {
  Fleet f(Tenants({}), /*slots=*/4);
  // gw is a gateway naming a thousand end users; carol uses one key. Each is its own tenant.
  for (int k = 0; k < 1000; ++k) f.Submit("gw", absl::StrCat("user", k), 2);
  f.Submit("carol", "carol", 2000);
  for (int i = 0; i < 1000; ++i) f.Step();
  const double gw = f.served("gw"), carol = f.served("carol");
  EXPECT_NEAR(gw / (gw + carol), 0.5, 0.01) << gw << " vs " << carol;
}

TEST(TenantShareTest, KeysInsideATenantShareItsServiceEqually) {
  Fleet f(Tenants({{.name = "t", .principals = {"gw"}}}), /*slots=*/2);
  f.Submit("gw", "u1", 500);
  f.Submit("gw", "u2", 500);
  for (int i = 0; i < 500; ++i) f.Step();
  // Both keys of the one tenant: within one job of each other.
  EXPECT_NEAR(f.s().KeyCost("u1"), f.s().KeyCost("u2"), 1.0 + 1e-9);
}

TEST(TenantShareTest, NoAuthenticationMeansOneTenantAndFlatKeys) {
  Fleet f(Tenants({}), /*slots=*/1);
  f.Submit("", "a", 3);
  f.Submit("", "b", 3);
  f.Step();
  EXPECT_EQ(f.s().WhyWaiting("/a/1", f.now()).tenant, "");
  EXPECT_EQ(f.s().Stats(f.now()).tenants.size(), 1u);
}

TEST(TenantShareTest, SameKeyNameInTwoTenantsIsTwoKeys) {
  Fleet f(Tenants({}), /*slots=*/1);
  f.Submit("gw1", "bob", 1);
  f.Submit("gw2", "bob", 1);
  SchedulerStats st = f.s().Stats(f.now());
  ASSERT_THAT(st.keys, SizeIs(2));
  EXPECT_NE(st.keys[0].tenant, st.keys[1].tenant);
  EXPECT_EQ(f.s().queued_of("gen", "bob"), 2);
}

TEST(HonestCostTest, ChargeIsCorrectedToTheWallTimeUsed) {
  // The type's default says 10 s; jobs take 1 s.
  config::Config c = Tenants({}, /*default_cost=*/10);
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  s.Enqueue({.id = "j", .type = "gen", .fairness_key = "k", .owner = "alice", .arrival = kT0});
  std::vector<Dispatch> d = s.Decide(kT0);
  ASSERT_THAT(d, SizeIs(1));
  EXPECT_DOUBLE_EQ(d[0].cost, 10);  // the estimate, at dispatch
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 10);
  EXPECT_DOUBLE_EQ(s.TenantCost("alice"), 10);
  s.Finished("j", kT0 + absl::Seconds(1), absl::Seconds(1));
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 1);  // corrected by actual - estimate = -9
  EXPECT_DOUBLE_EQ(s.TenantCost("alice"), 1);
}

TEST(HonestCostTest, WrongDefaultDoesNotSkewTenantsArrivingTogether) {
  // default_cost 10x too high for x's jobs and right for y's: charged the estimate alone, x
  // would get one second of service for each ten of y's.
  Fleet f(Tenants({}, /*default_cost=*/10), /*slots=*/1);
  f.Submit("x", "x", 200, absl::Seconds(1));
  f.Submit("y", "y", 20, absl::Seconds(10));
  for (int i = 0; i < 1000; ++i) f.Step();  // 100 s
  EXPECT_NEAR(f.served("x"), f.served("y"), 10 + 1e-9) << "service differs by more than one job";
}

TEST(HonestCostTest, WeightNormalisesTheTenantsCorrection) {
  config::Config c = Tenants({{.name = "t", .principals = {"alice"}, .weight = 4}},
                             /*default_cost=*/8);
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  s.Enqueue({.id = "j", .type = "gen", .fairness_key = "k", .owner = "alice", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));
  EXPECT_DOUBLE_EQ(s.TenantCost("t"), 2);  // 8 / 4
  s.Finished("j", kT0 + absl::Seconds(4), absl::Seconds(4));
  EXPECT_DOUBLE_EQ(s.TenantCost("t"), 1);  // 4 / 4
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 4);
}

TEST(HonestCostTest, CancelRefundsWhatTheJobDidNotUse) {
  Scheduler s(Tenants({}, /*default_cost=*/10), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  s.Enqueue({.id = "j", .type = "gen", .fairness_key = "k", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));
  // Cancelled 3 s in, no outcome reported: it used 3 s of its slot.
  s.Finished("j", kT0 + absl::Seconds(3));
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 3);
}

TEST(HonestCostTest, RefusedAndRetractedJobsAreRefundedInFull) {
  Scheduler s(Tenants({}, /*default_cost=*/10), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 2});
  s.Enqueue({.id = "a", .type = "gen", .fairness_key = "k", .arrival = kT0});
  s.Enqueue({.id = "b", .type = "gen", .fairness_key = "k", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(2));
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 20);
  s.Refused("a");
  s.Retract("b");
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 0);
}

TEST(HonestCostTest, RequeuedJobOfALostWorkerPaysOnlyForItsTimeOnIt) {
  Scheduler s(Tenants({}, /*default_cost=*/10), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  s.Enqueue({.id = "j", .type = "gen", .fairness_key = "k", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(1));
  s.Decide(kT0 + absl::Seconds(2));  // the scheduler's clock moves on
  EXPECT_THAT(s.RemoveWorker("w"), ::testing::ElementsAre("j"));
  EXPECT_DOUBLE_EQ(s.KeyCost("k"), 2);
}

TEST(TenantShareTest, ReturningTenantStartsAtTheVirtualTimeWithNoBankedCredit) {
  Fleet f(Tenants({}), /*slots=*/1);
  f.Submit("alice", "alice", 100);
  for (int i = 0; i < 500; ++i) f.Step();  // alice alone for 50 s
  f.Submit("bob", "bob", 100);
  // bob, back after 50 s away, gets one turn in two, not 50 s of catching up.
  const int alice0 = f.started("alice"), bob0 = f.started("bob");
  for (int i = 0; i < 200; ++i) f.Step();  // 20 s
  EXPECT_NEAR(f.started("alice") - alice0, f.started("bob") - bob0, 2);
}

TEST(TenantQuotaTest, MaxRunningIsACeiling) {
  Fleet f(Tenants({{.name = "t", .principals = {"alice"}, .max_running = 2}}), /*slots=*/8);
  f.Submit("alice", "alice", 10);
  f.Step();
  EXPECT_EQ(f.RunningOf("alice"), 2);
  EXPECT_EQ(f.s().WhyWaiting("alice/alice/5", f.now()).reason, WaitReason::kTenantCap);
  // Another tenant takes the slots alice may not.
  f.Submit("bob", "bob", 10);
  f.Step();
  EXPECT_EQ(f.RunningOf("alice"), 2);
  EXPECT_EQ(f.RunningOf("bob"), 6);
}

TEST(TenantQuotaTest, FloorIsServedFirstAsSlotsFreeAndBorrowedWhileIdle) {
  // The floor tenant's weight is tiny: by cost alone one job would put it behind bob for long.
  Fleet f(Tenants({{.name = "floor", .principals = {"fl"}, .weight = 0.01, .min_running = 4}}),
          /*slots=*/8);
  // bob borrows the whole fleet while the floor tenant has nothing queued.
  f.Submit("bob", "bob", 1000, absl::Seconds(1));
  f.Step(absl::Milliseconds(10));
  EXPECT_EQ(f.RunningOf("bob"), 8);
  f.Submit("fl", "fl", 100, absl::Seconds(1));
  EXPECT_EQ(f.RunningOf("fl"), 0);  // running jobs are never stopped
  // Within one job duration the floor tenant runs 4, and no more: beyond its floor its cost
  // (100 per job at weight 0.01) leaves the rest to bob.
  for (int i = 0; i < 100; ++i) f.Step(absl::Milliseconds(10));
  EXPECT_EQ(f.RunningOf("fl"), 4);
  EXPECT_EQ(f.RunningOf("bob"), 4);
  for (int i = 0; i < 300; ++i) f.Step(absl::Milliseconds(10));
  EXPECT_EQ(f.RunningOf("fl"), 4);
}

TEST(TenantQuotaTest, FloorLoadsAModelRatherThanWaitForAffinity) {
  config::Config c;
  c.types.push_back({.name = "a", .model = "ma"});
  c.types.push_back({.name = "b", .model = "mb"});
  c.tenants.push_back({.name = "floor", .principals = {"fl"}, .min_running = 1});
  ASSERT_TRUE(c.Validate().ok());
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"a", "b"}, .slots = 1, .models_resident = {"ma"}});
  s.Enqueue({.id = "bob1", .type = "a", .fairness_key = "bob", .owner = "bob", .arrival = kT0});
  s.Enqueue({.id = "fl1",
             .type = "b",
             .fairness_key = "fl",
             .owner = "fl",
             .arrival = kT0 + absl::Seconds(1)});
  std::vector<Dispatch> d = s.Decide(kT0 + absl::Seconds(1));
  ASSERT_THAT(d, SizeIs(1));
  EXPECT_EQ(d[0].job_id, "fl1");
  EXPECT_TRUE(d[0].loads_model);
}

TEST(TenantQuotaTest, TenantBucketNeverAllowsMoreThanBurstPlusRateTimesWindow) {
  config::Config c = Tenants(
      {{.name = "t", .principals = {"alice"}, .rates = {{.model = "gen", .rate = {2.0, 3}}}}});
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 1000});
  for (int i = 0; i < 200; ++i) {
    s.Enqueue({.id = absl::StrCat("a", i),
               .type = "gen",
               .fairness_key = "alice",
               .owner = "alice",
               .arrival = kT0});
    s.Enqueue({.id = absl::StrCat("b", i),
               .type = "gen",
               .fairness_key = "bob",
               .owner = "bob",
               .arrival = kT0});
  }
  std::vector<absl::Time> alice;  // dispatch times
  int bob = 0;
  for (absl::Time now = kT0; now < kT0 + absl::Seconds(20); now += absl::Milliseconds(37)) {
    for (const Dispatch& d : s.Decide(now)) {
      if (d.job_id[0] == 'a') {
        alice.push_back(now);
      } else {
        ++bob;
      }
    }
    // Waiting on its bucket, alice says why and when the scheduler should look again.
    if (s.IsPending("a199")) {
      WaitReason r = s.WhyWaiting("a199", now).reason;
      EXPECT_TRUE(r == WaitReason::kTenantRate || r == WaitReason::kNone ||
                  r == WaitReason::kInLine)
          << ToString(r);
    }
  }
  EXPECT_EQ(bob, 200);  // the other tenant is not held by alice's bucket
  ASSERT_GT(alice.size(), 30u);
  for (size_t i = 0; i < alice.size(); ++i) {
    for (size_t j = i; j < alice.size(); ++j) {
      const double window = absl::ToDoubleSeconds(alice[j] - alice[i]);
      ASSERT_LE(static_cast<double>(j - i + 1), 3 + 2.0 * window + 1e-9)
          << "window " << window << "s from dispatch " << i;
    }
  }
}

TEST(TenantWeightTest, SetTenantWeightAppliesAtOnceAndReloadResetsIt) {
  config::Config c = Tenants({{.name = "t", .principals = {"alice"}, .weight = 1}});
  Fleet f(c, /*slots=*/4);
  f.Submit("alice", "alice", 4000);
  f.Submit("bob", "bob", 4000);
  EXPECT_FALSE(f.s().SetTenantWeight("t", 0, f.now()));
  ASSERT_TRUE(f.s().SetTenantWeight("t", 3, f.now()));
  for (int i = 0; i < 1000; ++i) f.Step();
  double a = f.served("alice"), b = f.served("bob");
  EXPECT_NEAR(a / (a + b), 0.75, 0.02);
  f.s().UpdateConfig(c, f.now());  // weight 1 again
  for (int i = 0; i < 1000; ++i) f.Step();
  const double a2 = f.served("alice") - a, b2 = f.served("bob") - b;
  EXPECT_NEAR(a2 / (a2 + b2), 0.5, 0.02);
}

TEST(FairAccountsTest, SettledCostsLeaveOutJobsInServiceAndOnlyChangesAreTaken) {
  Scheduler s(Tenants({{.name = "t", .principals = {"alice"}, .weight = 2}}), kT0);
  s.AddWorker({.id = "w", .types = {"gen"}, .slots = 2});
  s.Enqueue({.id = "a", .type = "gen", .fairness_key = "k", .owner = "alice", .arrival = kT0});
  s.Enqueue({.id = "b", .type = "gen", .fairness_key = "k", .owner = "alice", .arrival = kT0});
  ASSERT_THAT(s.Decide(kT0), SizeIs(2));
  s.Finished("a", kT0 + absl::Seconds(4), absl::Seconds(4));
  FairAccounts taken = s.TakeAccounts();
  std::map<std::string, double> costs;
  for (const FairAccounts::Account& a : taken.accounts) costs[a.tenant + "/" + a.key] = a.cost;
  // "a" used 4 s; "b" is in service and not in the settled cost.
  EXPECT_DOUBLE_EQ(costs["t/k"], 4);
  EXPECT_DOUBLE_EQ(costs["t/"], 2);  // 4 / weight 2
  ASSERT_THAT(taken.estimates, SizeIs(1));
  EXPECT_EQ(taken.estimates[0].type, "gen");
  EXPECT_THAT(s.TakeAccounts().accounts, ::testing::IsEmpty());  // nothing changed since
  EXPECT_THAT(s.TakeAccounts(/*all=*/true).accounts, SizeIs(2));
}

// Two backlogged tenants of weights 3 and 1 share a fleet of 4 slots for 120 s; alice's jobs take
// 20 s, bob's 1 s, and the type's default_cost (1 s) is wrong for alice's, so the shares rest on
// the learned estimates and on the corrections that land as her jobs end. At 21.5 s, just after
// her first jobs ended and bob is owed their excess, the scheduler is replaced by a new one (a
// restart or a failover): restored from the accounts the old one gave, with the running jobs
// adopted and the queue enqueued again. Restored, the shares over the whole run are those of a
// run with no restart; restarted with nothing restored, bob's due is forgotten and alice's jobs
// are charged the default again.
enum class Restart { kNone, kRestored, kAfresh };

double AliceShare(Restart restart) {
  const config::Config c = Tenants({{.name = "big", .principals = {"alice"}, .weight = 3},
                                    {.name = "small", .principals = {"bob"}, .weight = 1}});
  auto s = std::make_unique<Scheduler>(c, kT0);
  s->AddWorker({.id = "w", .types = {"gen"}, .slots = 4});
  const std::map<std::string, absl::Duration> run = {{"alice", absl::Seconds(20)},
                                                     {"bob", absl::Seconds(1)}};
  std::map<std::string, double> served;
  std::map<std::string, std::pair<absl::Time, std::string>> running;  // id -> until, owner
  std::map<std::string, std::string> queued;                          // id -> owner
  absl::Time now = kT0;
  for (const char* owner : {"alice", "bob"}) {
    for (int i = 0; i < 1000; ++i) {
      const std::string id = absl::StrCat(owner, "-", i);
      s->Enqueue({.id = id,
                  .type = "gen",
                  .resource_id = owner,
                  .fairness_key = owner,
                  .owner = owner,
                  .arrival = now});
      queued[id] = owner;
    }
  }
  for (int tick = 0; tick < 1200; ++tick, now += absl::Milliseconds(100)) {
    if (restart != Restart::kNone && tick == 215) {
      FairAccounts saved = s->TakeAccounts(/*all=*/true);

      s = std::make_unique<Scheduler>(c, now);
      if (restart == Restart::kRestored) s->RestoreAccounts(saved, now);
      for (const auto& [id, r] : running) {
        s->Adopt({.id = id,
                  .type = "gen",
                  .resource_id = r.second,
                  .fairness_key = r.second,
                  .owner = r.second,
                  .worker_id = "w"});
      }
      s->AddWorker({.id = "w", .types = {"gen"}, .slots = 4});
      for (const auto& [id, owner] : queued) {
        s->Enqueue({.id = id,
                    .type = "gen",
                    .resource_id = owner,
                    .fairness_key = owner,
                    .owner = owner,
                    .arrival = kT0});
      }
    }
    for (auto it = running.begin(); it != running.end();) {
      if (it->second.first <= now) {
        const std::string& owner = it->second.second;
        s->Finished(it->first, now, run.at(owner));
        served[owner] += absl::ToDoubleSeconds(run.at(owner));
        it = running.erase(it);
      } else {
        ++it;
      }
    }
    for (const Dispatch& d : s->Decide(now)) {
      const std::string owner = queued.at(d.job_id);
      running[d.job_id] = {now + run.at(owner), owner};
      queued.erase(d.job_id);
    }
  }
  return served["alice"] / (served["alice"] + served["bob"]);
}

TEST(FairAccountsTest, RestoredSchedulerKeepsTheWeightedShares) {
  const double steady = AliceShare(Restart::kNone);
  const double restored = AliceShare(Restart::kRestored);
  const double afresh = AliceShare(Restart::kAfresh);
  std::printf("alice's share: steady %.4f, restored %.4f, afresh %.4f\n", steady, restored, afresh);
  EXPECT_NEAR(steady, 0.75, 0.04);  // lumpy 20 s jobs in a 120 s run
  EXPECT_NEAR(restored, steady, 0.01);
  // The case is one where the accounts matter: forgetting them moves the share.
  EXPECT_GT(afresh - steady, 0.02);
}

TEST(ExplainTheWaitTest, StatusNamesTheSharesTheHolderTheTokenAndAnEstimatedStart) {
  config::Config c;
  c.types.push_back({.name = "gen", .conflict_group = "doc"});
  c.types.push_back({.name = "slow", .rate = {.per_second = 0.5, .burst = 1}});
  c.tenants.push_back({.name = "big", .principals = {"alice"}, .weight = 3});
  ASSERT_TRUE(c.Validate().ok());
  Scheduler s(c, kT0);
  s.AddWorker({.id = "w", .types = {"gen", "slow"}, .slots = 4});
  absl::Time now = kT0;
  // A job of alice's holds doc-1; bob's job on doc-1 waits for it.
  s.Enqueue({.id = "a1",
             .type = "gen",
             .resource_id = "doc-1",
             .fairness_key = "alice",
             .owner = "alice",
             .arrival = now});
  ASSERT_THAT(s.Decide(now), SizeIs(1));
  s.Enqueue({.id = "b1",
             .type = "gen",
             .resource_id = "doc-1",
             .fairness_key = "bob",
             .owner = "bob",
             .arrival = now});
  EXPECT_THAT(s.Decide(now), SizeIs(0));
  WaitInfo w = s.WhyWaiting("b1", now);
  EXPECT_EQ(w.reason, WaitReason::kConflict);
  EXPECT_EQ(w.conflict_holder, "a1");
  EXPECT_EQ(w.tenant, "bob");
  EXPECT_DOUBLE_EQ(w.tenant_share, 0);          // bob runs nothing of the 1 placed job
  EXPECT_DOUBLE_EQ(w.tenant_fair_share, 0.25);  // weight 1 of 3 + 1
  EXPECT_DOUBLE_EQ(w.key_fair_share, 1);
  // The rate-limited type: one token, then one every 2 s.
  s.Enqueue({.id = "s1", .type = "slow", .fairness_key = "bob", .owner = "bob", .arrival = now});
  s.Enqueue({.id = "s2", .type = "slow", .fairness_key = "bob", .owner = "bob", .arrival = now});
  ASSERT_THAT(s.Decide(now), SizeIs(1));
  w = s.WhyWaiting("s2", now);
  EXPECT_EQ(w.reason, WaitReason::kRateLimit);
  EXPECT_EQ(w.next_token_at, now + absl::Seconds(2));
  // Jobs of "gen" started at one a second for a while: a queue of 10 behind one key of a lone
  // tenant is expected to start in about 10 s.
  Scheduler r(Tenants({}), kT0);
  r.AddWorker({.id = "w", .types = {"gen"}, .slots = 1});
  now = kT0;
  for (int i = 0; i < 30; ++i) {
    r.Enqueue({.id = absl::StrCat("x", i), .type = "gen", .fairness_key = "k", .arrival = kT0});
  }
  for (int i = 0; i < 15; ++i, now += absl::Seconds(1)) {
    std::vector<Dispatch> d = r.Decide(now);
    ASSERT_THAT(d, SizeIs(1));
    r.Finished(d[0].job_id, now + absl::Seconds(1), absl::Seconds(1));
  }
  w = r.WhyWaiting("x24", now);
  EXPECT_EQ(w.position, 10);
  ASSERT_NE(w.estimated_start, absl::InfiniteFuture());
  EXPECT_NEAR(absl::ToDoubleSeconds(w.estimated_start - now), 10, 1.5);
}

TEST(TenantAuditTest, TenantCountsAgreeWithTheJobs) {
  Fleet f(Tenants({{.name = "t", .principals = {"alice"}, .min_running = 1}}), /*slots=*/2);
  f.Submit("alice", "alice", 5);
  f.Submit("bob", "bob", 5);
  for (int i = 0; i < 25; ++i) f.Step();
  EXPECT_THAT(f.s().Audit(/*repair=*/false), ::testing::IsEmpty());
}

}  // namespace
}  // namespace dispatchd::sched
