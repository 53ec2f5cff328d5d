// Cost of one dispatch decision of dispatchd::sched::Scheduler in steady state under a backlog.
//
// Setup (untimed, once per backlog size N, then reused by every run of that N): 50 job types in
// two tiers, 10 models, 100 workers of 4 slots, N + 400 pending jobs over 1000 skewed fairness
// keys, and one Decide that fills every slot, leaving N pending. Each timed iteration then does
// what the dispatcher loop does when a job ends under a backlog: Finished(one placed job),
// Enqueue(one new job, so the backlog stays at N), Decide(now, 1), which must place exactly one.
// BM_FinishEnqueueDecide times all three, BM_DecideOnly the Decide alone, and
// BM_FinishEnqueueDecide_OneTier all three with the 50 types in a single tier.
// BM_FinishEnqueueDecide_Tenants times all three with the keys spread over tenants (each key's
// jobs owned by one principal, each principal its own tenant): arguments are the backlog, the
// tenants and the keys, up to 1M pending jobs over 100k keys in 10k tenants.
//
// See README.md for how to run it and the numbers measured.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "benchmark/benchmark.h"

#include "lib/config/config.h"
#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

constexpr int kTypes = 50;
constexpr int kFgTypes = 10;  // t00..t09 in tier fg, the rest in bg
constexpr int kModels = 10;
constexpr int kKeys = 1000;  // unless the benchmark names its own
constexpr int kResources = 10'000;
constexpr int kWorkers = 100;
constexpr int kSlots = 4;
constexpr int kTypesPerWorker = 25;
// Fake time advances this much per iteration.
constexpr absl::Duration kTick = absl::Microseconds(3);

std::string TypeName(int i) { return absl::StrFormat("t%02d", i); }

// kTwoTiers: the layout above. kOneTier: the same 50 types all in tier fg, so that every type a
// worker serves competes for each of its slots (with two tiers, fg has work for every worker at
// any backlog of 10k or more, and bg jobs never run: a decision only looks at the 10 fg types).
enum class Layout { kTwoTiers, kOneTier };

config::Config MakeConfig(Layout layout) {
  config::Config c;
  c.tiers = {{.name = "fg", .value = 400}, {.name = "bg", .value = 200}};
  for (int i = 0; i < kTypes; ++i) {
    config::JobTypeConfig t{
        .name = TypeName(i),
        .model = absl::StrCat("m", i % kModels),
        .tier = (layout == Layout::kOneTier || i < kFgTypes) ? "fg" : "bg",
        .default_cost = 0.5 + 0.25 * (i % 7),
        .vram_gb = 10,
        // Long enough that the swap path (which deliberately leaves a freed slot idle until a
        // starved model fits) never fires: the benchmark measures decisions that place a job.
        .max_affinity_wait = absl::Hours(24),
    };
    // Every job gets a resource id; only t05, t15, ..., t45 conflict on it.
    if (i % 10 == 5) t.conflict_group = "g";
    // Model m3 (t03, t13, ...) has a token bucket that never binds.
    if (i % 10 == 3) t.rate = {.per_second = 1e6, .burst = 1000};
    c.types.push_back(std::move(t));
  }
  return c;
}

// One scheduler in steady state: a backlog of N pending jobs and every worker slot taken.
struct Fixture {
  Fixture(int64_t n, Layout layout, int key_count = kKeys, int tenant_count = 0)
      : now(absl::FromUnixSeconds(1'700'000'000)),
        scheduler(MakeConfig(layout), now),
        rng(42),
        tenants(tenant_count) {
    // Fleet: each worker serves a fixed random subset of 25 types, no labels, 40 GB, with 4 of
    // the 10 models loaded (a warm fleet: a worker loads a model another worker holds only when
    // the holders would take longer than max_affinity_wait, which is never here).
    std::vector<std::string> all;
    for (int i = 0; i < kTypes; ++i) all.push_back(TypeName(i));
    std::vector<std::string> models;
    for (int m = 0; m < kModels; ++m) models.push_back(absl::StrCat("m", m));
    for (int w = 0; w < kWorkers; ++w) {
      std::shuffle(all.begin(), all.end(), rng);
      std::shuffle(models.begin(), models.end(), rng);
      const std::string id = absl::StrFormat("w%03d", w);
      scheduler.AddWorker({.id = id,
                           .types = {all.begin(), all.begin() + kTypesPerWorker},
                           .slots = kSlots,
                           .vram_gb = 40});
      scheduler.SetResidentModels(id, {models.begin(), models.begin() + 4});
    }
    // Fairness keys, Zipf-like (weight 1/(rank+1)): the top 20% of keys hold ~80% of the jobs.
    std::vector<double> weights;
    for (int k = 0; k < key_count; ++k) {
      keys.push_back(absl::StrFormat("k%06d", k));
      weights.push_back(1.0 / (k + 1));
    }
    key_dist = std::discrete_distribution<int>(weights.begin(), weights.end());

    // The backlog arrived over the last 10 s, oldest first, with random types: N jobs left
    // pending once the fleet's 400 slots are taken.
    const int64_t total = n + kWorkers * kSlots;
    const absl::Duration spacing = absl::Seconds(10) / static_cast<double>(total);
    std::uniform_int_distribution<int> type_dist(0, kTypes - 1);
    for (int64_t i = 0; i < total; ++i) {
      Enqueue(type_dist(rng), key_dist(rng),
              now - absl::Seconds(10) + spacing * static_cast<double>(i));
    }
    // Saturate the fleet.
    for (const Dispatch& d : scheduler.Decide(now)) placed.push_back(d.job_id);
    now += kTick;
  }

  // Job ids carry their type and fairness key: "t07-k000123-000012345".
  static int TypeOf(const std::string& id) { return (id[1] - '0') * 10 + (id[2] - '0'); }
  static int KeyOf(const std::string& id) {
    int key = 0;
    for (size_t i = 5; i < 11; ++i) key = key * 10 + (id[i] - '0');
    return key;
  }

  void Enqueue(int type, int key, absl::Time arrival) {
    std::string id = absl::StrFormat("t%02d-k%06d-%09d", type, key, next_id++);
    scheduler.Enqueue({.id = std::move(id),
                       .type = TypeName(type),
                       .resource_id = absl::StrFormat("r%05d", resource_dist(rng)),
                       .fairness_key = keys[key],
                       // With tenants, key k belongs to tenant k mod tenants (the keys of a tenant
                       // are spread over the Zipf ranks); without, to no one.
                       .owner = tenants > 0 ? absl::StrCat("p", key % tenants) : "",
                       .arrival = arrival});
  }

  // Finishes a random placed job and enqueues one of the same type and fairness key in its place.
  // What arrives is what was served, so the backlog keeps its size and its mix of types and keys
  // (every key that has a backlog keeps it). Refilling with keys drawn afresh from the skewed
  // distribution would drain the light keys' backlogs (fair queuing serves every backlogged key
  // alike) and leave a backlog of a few heavy keys: an easier case than the one to measure.
  void FinishOneAndRefill() {
    size_t i = std::uniform_int_distribution<size_t>(0, placed.size() - 1)(rng);
    std::swap(placed[i], placed.back());
    const std::string& id = placed.back();
    const int type = TypeOf(id);
    const int key = KeyOf(id);
    scheduler.Finished(id, now, absl::Milliseconds(500 + 50 * (type % 7)));
    placed.pop_back();
    Enqueue(type, key, now);
  }

  absl::Time now;
  Scheduler scheduler;
  std::mt19937_64 rng;
  std::vector<std::string> keys;
  std::discrete_distribution<int> key_dist;
  std::uniform_int_distribution<int> resource_dist{0, kResources - 1};
  std::vector<std::string> placed;  // ids of placed jobs, from the Dispatch results
  int64_t next_id = 0;
  int tenants = 0;
};

// Built once per N and kept: a run leaves the fixture in the same steady state it found it in
// (backlog N, fleet full), so later runs and the other benchmark continue from there.
Fixture& FixtureFor(int64_t n, Layout layout, int keys = kKeys, int tenants = 0) {
  // Never destroyed: tearing down a million jobs at exit is time for nothing.
  static auto* fixtures =
      new std::map<std::tuple<int64_t, Layout, int, int>, std::unique_ptr<Fixture>>();
  std::unique_ptr<Fixture>& f = (*fixtures)[{n, layout, keys, tenants}];
  if (f == nullptr) f = std::make_unique<Fixture>(n, layout, keys, tenants);
  return *f;
}

bool CheckSetup(benchmark::State& state, const Fixture& f, int64_t n) {
  if (f.scheduler.placed_count() != static_cast<size_t>(kWorkers * kSlots)) {
    state.SkipWithError(absl::StrCat("fleet not saturated: ", f.scheduler.placed_count(),
                                     " placed of ", kWorkers * kSlots)
                            .c_str());
    return false;
  }
  if (f.scheduler.pending_count() != static_cast<size_t>(n)) {
    state.SkipWithError(
        absl::StrCat("backlog is ", f.scheduler.pending_count(), ", want ", n).c_str());
    return false;
  }
  return true;
}

// After the timed loop: backlog size, fairness keys and tenants holding pending jobs, jobs on
// workers.
void SetCounters(benchmark::State& state, const Fixture& f) {
  const SchedulerStats stats = f.scheduler.Stats(f.now);
  int64_t keys = 0, tenants = 0;
  for (const SchedulerStats::Key& k : stats.keys) keys += k.queued > 0;
  for (const SchedulerStats::Tenant& t : stats.tenants) tenants += t.queued > 0;
  state.counters["pending"] = static_cast<double>(f.scheduler.pending_count());
  state.counters["keys"] = static_cast<double>(keys);
  state.counters["tenants"] = static_cast<double>(tenants);
  state.counters["placed"] = static_cast<double>(f.scheduler.placed_count());
}

// One iteration: Finished + Enqueue + Decide(now, 1), all timed.
void FinishEnqueueDecide(benchmark::State& state, Layout layout, int keys = kKeys,
                         int tenants = 0) {
  const int64_t n = state.range(0);
  Fixture& f = FixtureFor(n, layout, keys, tenants);
  if (!CheckSetup(state, f, n)) return;
  for (auto _ : state) {
    f.FinishOneAndRefill();
    std::vector<Dispatch> out = f.scheduler.Decide(f.now, 1);
    if (out.size() != 1) {
      state.SkipWithError(absl::StrCat("Decide placed ", out.size(), " jobs, want 1").c_str());
      break;
    }
    f.placed.push_back(std::move(out.front().job_id));
    f.now += kTick;
  }
  SetCounters(state, f);
}

void BM_FinishEnqueueDecide(benchmark::State& state) {
  FinishEnqueueDecide(state, Layout::kTwoTiers);
}
void BM_FinishEnqueueDecide_OneTier(benchmark::State& state) {
  FinishEnqueueDecide(state, Layout::kOneTier);
}
// Arguments: backlog, tenants, keys.
void BM_FinishEnqueueDecide_Tenants(benchmark::State& state) {
  FinishEnqueueDecide(state, Layout::kOneTier, static_cast<int>(state.range(2)),
                      static_cast<int>(state.range(1)));
}

// The same loop, timing Decide(now, 1) alone. PauseTiming/ResumeTiming cost time of their own
// (clock reads), part of which lands in the measured interval.
void DecideOnly(benchmark::State& state, Layout layout, int keys = kKeys, int tenants = 0) {
  const int64_t n = state.range(0);
  Fixture& f = FixtureFor(n, layout, keys, tenants);
  if (!CheckSetup(state, f, n)) return;
  for (auto _ : state) {
    f.FinishOneAndRefill();
    const auto start = std::chrono::steady_clock::now();
    std::vector<Dispatch> out = f.scheduler.Decide(f.now, 1);
    state.SetIterationTime(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    if (out.size() != 1) {
      state.SkipWithError(absl::StrCat("Decide placed ", out.size(), " jobs, want 1").c_str());
      break;
    }
    f.placed.push_back(std::move(out.front().job_id));
    f.now += kTick;
  }
  SetCounters(state, f);
}

void BM_DecideOnly(benchmark::State& state) { DecideOnly(state, Layout::kTwoTiers); }
// Arguments: backlog, tenants, keys.
void BM_DecideOnly_Tenants(benchmark::State& state) {
  DecideOnly(state, Layout::kOneTier, static_cast<int>(state.range(2)),
             static_cast<int>(state.range(1)));
}

BENCHMARK(BM_FinishEnqueueDecide)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecideOnly)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FinishEnqueueDecide_OneTier)
    ->Arg(1'000)
    ->Arg(10'000)
    ->Arg(100'000)
    ->Arg(1'000'000)
    ->Unit(benchmark::kMicrosecond);
// Each of backlog, tenants and keys grown tenfold with the others held; tenants 0 (every job in
// one tenant, as without authentication) is the flat reference for the same keys and backlog.
void TenantArgs(benchmark::internal::Benchmark* b) {
  b->Args({100'000, 0, 100'000})
      ->Args({100'000, 10'000, 100'000})
      ->Args({1'000'000, 0, 100'000})
      ->Args({1'000'000, 1'000, 100'000})
      ->Args({1'000'000, 10'000, 10'000})
      ->Args({1'000'000, 10'000, 100'000});
}
BENCHMARK(BM_FinishEnqueueDecide_Tenants)->Apply(TenantArgs)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_DecideOnly_Tenants)->Apply(TenantArgs)->UseManualTime()->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace dispatchd::sched

BENCHMARK_MAIN();
