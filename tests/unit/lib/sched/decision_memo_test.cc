// One decision asks many free workers in turn, and keeps the answers of its walks of the fairness
// orders while they hold (Scheduler::BestJob, ForgetMovedAnswers): the workers after one that
// found nothing, or a decision that fills a cold fleet. These tests check that what it keeps never
// changes what it places.
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

using ::testing::ElementsAre;

const absl::Time kT0 = absl::FromUnixSeconds(1'700'000'000);

std::vector<std::string> Ids(const std::vector<Dispatch>& ds) {
  std::vector<std::string> out;
  for (const Dispatch& d : ds) out.push_back(d.job_id);
  return out;
}

// Each dispatch as "job@worker".
std::vector<std::string> Placements(const std::vector<Dispatch>& ds) {
  std::vector<std::string> out;
  for (const Dispatch& d : ds) out.push_back(absl::StrCat(d.job_id, "@", d.worker_id));
  return out;
}

// One decision asks each free worker in rank order. Those that find nothing (here the first
// two: gpu0 serves no queued type, and gpu1 would need a load that gpu2's and gpu3's model makes
// needless) are passed over once; the workers after them that ask with the same groups each take
// the next job of the fair order, not the one the worker before them took.
TEST(DecisionMemoTest, WorkersAskingAlikeInOneDecisionTakeSuccessiveJobs) {
  config::Config c;
  c.types.push_back({.name = "gen", .model = "mg", .vram_gb = 20});
  c.types.push_back({.name = "other", .model = "mo", .vram_gb = 20});
  Scheduler s(c, kT0);
  s.AddWorker({.id = "gpu0", .types = {"other"}, .slots = 1, .vram_gb = 80});
  s.AddWorker({.id = "gpu1", .types = {"gen"}, .slots = 1, .vram_gb = 80});
  for (const char* id : {"gpu2", "gpu3"}) {
    s.AddWorker({.id = id, .types = {"gen"}, .slots = 1, .vram_gb = 80, .models_resident = {"mg"}});
  }
  s.Enqueue({.id = "a1", .type = "gen", .fairness_key = "a", .arrival = kT0});
  s.Enqueue({.id = "a2", .type = "gen", .fairness_key = "a", .arrival = kT0 + absl::Seconds(1)});
  s.Enqueue({.id = "b1", .type = "gen", .fairness_key = "b", .arrival = kT0 + absl::Seconds(2)});
  const absl::Time now = kT0 + absl::Seconds(3);
  std::vector<std::string> placed;
  for (const Dispatch& d : s.Decide(now)) {
    EXPECT_FALSE(d.loads_model) << d.job_id;
    placed.push_back(absl::StrCat(d.job_id, "@", d.worker_id));
  }
  // Key a's first job, then key b's (a has used more by then); a2 waits for a slot of mg, which
  // two workers hold: not worth a load on gpu1 within max_affinity_wait.
  EXPECT_THAT(placed, ElementsAre("a1@gpu2", "b1@gpu3"));
  EXPECT_TRUE(s.IsPending("a2"));
  s.Finished("a1", now + absl::Seconds(1), absl::Seconds(1));
  EXPECT_THAT(Ids(s.Decide(now + absl::Seconds(1))), ElementsAre("a2"));
  EXPECT_EQ(s.WorkerOf("a2"), "gpu2");
}

// A worker weighing two models to load asks for the best job of each and takes one; the other
// answer stays kept. When the job it takes makes its resource busy, a kept answer on that
// resource (a job of another type of the conflict group) must not be handed to the next worker
// that asks alike: the decision forgets every kept answer, and that worker takes the next job.
TEST(DecisionMemoTest, AJobThatMakesItsResourceBusyHoldsBackTheKeptAnswersOnIt) {
  config::Config c;
  c.types.push_back({.name = "idle", .model = "mi", .vram_gb = 20});
  c.types.push_back({.name = "ta", .model = "ma", .conflict_group = "disk", .vram_gb = 20});
  c.types.push_back({.name = "tb", .model = "mb", .conflict_group = "disk", .vram_gb = 20});
  Scheduler s(c, kT0);
  // gpu0, first in rank order, serves a type with nothing queued: it finds nothing, and the
  // decision keeps its answers from then on. gpu1 and gpu2 hold no model and fit either.
  s.AddWorker({.id = "gpu0", .types = {"idle"}, .slots = 1, .vram_gb = 80});
  s.AddWorker({.id = "gpu1", .types = {"ta", "tb"}, .slots = 1, .vram_gb = 80});
  s.AddWorker({.id = "gpu2", .types = {"ta", "tb"}, .slots = 1, .vram_gb = 80});
  // Two jobs of each model, each of a key of its own: queues of equal depth, so gpu1 asks for
  // the best of both, x and y, and takes the older, x, which makes r1 busy. y, on r1 too, must
  // wait for it: gpu2, asking for model mb's jobs as gpu1 did, takes z.
  const auto job = [](const char* id, const char* type, const char* resource, int second) {
    return PendingJob{.id = id,
                      .type = type,
                      .resource_id = resource,
                      .fairness_key = absl::StrCat("key-", id),
                      .arrival = kT0 + absl::Seconds(second)};
  };
  s.Enqueue(job("x", "ta", "r1", 0));
  s.Enqueue(job("y", "tb", "r1", 1));
  s.Enqueue(job("w", "ta", "r3", 2));
  s.Enqueue(job("z", "tb", "r2", 3));
  const absl::Time now = kT0 + absl::Seconds(4);
  EXPECT_THAT(Placements(s.Decide(now)), ElementsAre("x@gpu1", "z@gpu2"));
  EXPECT_TRUE(s.IsPending("y"));
  // Once x and z end, r1 is free: each worker takes the job of the model it holds.
  s.Finished("x", now + absl::Seconds(1), absl::Seconds(1));
  s.Finished("z", now + absl::Seconds(1), absl::Seconds(1));
  EXPECT_THAT(Placements(s.Decide(now + absl::Seconds(1))), ElementsAre("w@gpu1", "y@gpu2"));
}

// A worker that could load a model others hold asks for that model's best job and passes it over
// (their slots will run the queue soon enough); the answer stays kept. When another worker then
// takes a job of the same tenant and model, and so the last token of the tenant's rate on the
// model, the kept answer must not be handed to the next worker that asks alike: the tenant's
// answers are forgotten, and that worker finds the tenant's lanes on the model closed.
TEST(DecisionMemoTest, AJobThatTakesItsTenantsLastTokenHoldsBackTheKeptAnswersOfTheTenant) {
  config::Config c;
  c.types.push_back({.name = "idle", .model = "mi", .vram_gb = 20});
  c.types.push_back({.name = "gen", .model = "mg", .vram_gb = 20});
  c.tenants.push_back({.name = "team",
                       .principals = {"alice"},
                       .rates = {{.model = "mg", .rate = {.per_second = 0.001, .burst = 1}}}});
  Scheduler s(c, kT0);
  // In rank order: gpu0 serves a type with nothing queued, so the decision keeps its answers
  // from then on; gpu1 (zone a) holds no model and would load mg; gpu2 (zone b) and gpu3
  // (zone a) hold mg.
  const job::Labels zone_a = {{"zone", "a"}};
  const job::Labels zone_b = {{"zone", "b"}};
  s.AddWorker({.id = "gpu0", .types = {"idle"}, .slots = 1, .vram_gb = 80});
  s.AddWorker({.id = "gpu1", .types = {"gen"}, .slots = 1, .labels = zone_a, .vram_gb = 80});
  for (const auto& [id, labels] : {std::pair{"gpu2", zone_b}, std::pair{"gpu3", zone_a}}) {
    s.AddWorker({.id = id,
                 .types = {"gen"},
                 .slots = 1,
                 .labels = labels,
                 .vram_gb = 80,
                 .models_resident = {"mg"}});
  }
  // Two jobs of the tenant on mg, of two keys: y for zone a, x for zone b.
  s.Enqueue({.id = "y",
             .type = "gen",
             .fairness_key = "k2",
             .owner = "alice",
             .labels = zone_a,
             .arrival = kT0});
  s.Enqueue({.id = "x",
             .type = "gen",
             .fairness_key = "k1",
             .owner = "alice",
             .labels = zone_b,
             .arrival = kT0 + absl::Seconds(1)});
  // gpu1 asks for zone a's best job on mg, y, and passes it over (gpu2 and gpu3 hold mg); gpu2
  // takes x and the tenant's one token; gpu3, asking for zone a's best job on mg as gpu1 did,
  // must not get y.
  EXPECT_THAT(Placements(s.Decide(kT0 + absl::Seconds(2))), ElementsAre("x@gpu2"));
  EXPECT_TRUE(s.IsPending("y"));
}

// A fleet's decisions from cold: 40 workers serving random subsets of 12 types, two types to
// each of 6 models, and 600 jobs over 40 keys, those of 4 types conflicting on 20 shared
// resources, from `tenants` tenants of different weights (0: every job in the unnamed tenant),
// each with a rate on every other model if `rate`. The first decision fills the cold fleet; then
// 30 times, 100 ms on, a random third of the placed jobs finish, 60 more jobs come, and the
// scheduler decides again. Returns every placement ("job@worker", "+load" when it loads the
// model), with the decision memo off if `memo_off`.
std::vector<std::string> FleetFromCold(uint32_t seed, int tenants, bool rate, bool memo_off) {
  config::Config c;
  for (int i = 0; i < 12; ++i) {
    c.types.push_back({.name = absl::StrCat("t", i),
                       .model = absl::StrCat("m", i % 6),
                       .conflict_group = i % 3 == 0 ? "disk" : "",
                       .vram_gb = 8.0 * (1 + i % 6 % 4),
                       .max_affinity_wait = absl::Seconds(1)});
  }
  for (int i = 0; i < tenants; ++i) {
    config::TenantConfig t{
        .name = absl::StrCat("ten", i), .principals = {absl::StrCat("p", i)}, .weight = 1.0 + i};
    for (int m = 0; rate && m < 6; m += 2) {
      t.rates.push_back({.model = absl::StrCat("m", m), .rate = {.per_second = 20, .burst = 4}});
    }
    c.tenants.push_back(t);
  }
  Scheduler s(c, kT0);
  s.DisableDecisionMemoForTesting(memo_off);
  std::mt19937 rng(seed);
  for (int w = 0; w < 40; ++w) {
    std::vector<std::string> types;
    for (int i = 0; i < 12; ++i) {
      if (rng() % 2 != 0) types.push_back(absl::StrCat("t", i));
    }
    s.AddWorker({.id = absl::StrCat("gpu", w), .types = types, .slots = 4, .vram_gb = 80});
  }
  absl::Time now = kT0;
  int next_id = 0;
  auto enqueue = [&](int n) {
    for (int i = 0; i < n; ++i, now += absl::Microseconds(10)) {
      s.Enqueue({.id = absl::StrCat("j", next_id++),
                 .type = absl::StrCat("t", rng() % 12),
                 .resource_id = absl::StrCat("r", rng() % 20),
                 .fairness_key = absl::StrCat("k", rng() % 40),
                 .owner = tenants == 0 ? "" : absl::StrCat("p", rng() % tenants),
                 .arrival = now});
    }
  };
  enqueue(600);
  now += absl::Seconds(2);
  std::vector<std::string> placed, running;
  for (int round = 0; round <= 30; ++round) {
    if (round > 0) {
      now += absl::Milliseconds(100);
      std::vector<std::string> still;
      for (const std::string& id : running) {
        if (rng() % 3 == 0) {
          s.Finished(id, now, absl::Milliseconds(100));
        } else {
          still.push_back(id);
        }
      }
      running = std::move(still);
      enqueue(60);
    }
    for (const Dispatch& d : s.Decide(now)) {
      placed.push_back(absl::StrCat(d.job_id, "@", d.worker_id, d.loads_model ? "+load" : ""));
      running.push_back(d.job_id);
    }
  }
  return placed;
}

// A decision that places many jobs (as one that fills a cold fleet, each worker asking for every
// model tied at the deepest queue) or asks many workers that find nothing keeps the answers of
// its fairness walks across its placements, as long as they hold; it must place what the same
// decision places when it looks afresh each time.
TEST(DecisionMemoTest, DecisionsKeepingTheirAnswersPlaceAsDecisionsLookingAfresh) {
  for (const auto& [tenants, rate] : std::vector<std::pair<int, bool>>{
           {0, false}, {1, false}, {1, true}, {3, false}, {3, true}}) {
    for (uint32_t seed = 1; seed <= 4; ++seed) {
      SCOPED_TRACE(absl::StrCat(tenants, " tenants", rate ? ", with rates" : "", ", seed ", seed));
      const std::vector<std::string> kept = FleetFromCold(seed, tenants, rate, false);
      EXPECT_GT(kept.size(), 600u);
      EXPECT_EQ(kept, FleetFromCold(seed, tenants, rate, true));
    }
  }
}

}  // namespace
}  // namespace dispatchd::sched
