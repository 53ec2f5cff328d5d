// Cost of the dispatch decision at fleet scale: W GPU workers (4 slots, 80 GB each, every one
// serving every type) and 100 job types, each with a model of its own (8, 16, 24 or 40 GB,
// seeded), `max_affinity_wait` 1 s, and 20,000 queued jobs over 10,000 fairness keys: the shape
// of `bench.py fleet` (bench/fleet.py), without PostgreSQL, gRPC or the simulated workers.
//
// - BM_FleetColdDecide/W: one Decide(now) that fills a cold fleet (no model resident), as the
//   daemon's first turn after the workers connect; the fixture is built afresh, untimed, per
//   iteration. Counter `us_per_placement`: the decision's time over the jobs it placed.
// - BM_FleetSteady/W: after that first decision, what the dispatcher loop does when a job ends:
//   Finished(a random placed job), Enqueue(one of the same type and key), Decide(now, 1), with
//   the clock advancing 70 us per iteration (the fleet's 4 slots x W over 275 ms jobs, at
//   W = 1,000). Counter `placed_per_decide`: a decision may place nothing (a worker held for a
//   starved model).
// - BM_FleetDrain/W: the whole drain after that first decision, as `bench.py fleet` runs it: no
//   job is queued after the start, and each turn finishes kTurnJobs random placed jobs, advances
//   the clock by the time the fleet took for that many (kTurnJobs / kFleetRate) and decides with
//   no limit, until the queue is empty. Past the first second every queued job is older than its
//   type's max_affinity_wait, and toward the end most workers are free with a short queue of
//   models that others hold: the decisions that ask every free worker in turn. Counters:
//   `us_per_placement` (the decisions' time over the jobs they placed), `decisions`, and
//   `max_decision_ms`.
//
//   ninja -C build sched_fleet_decision_bench && ./build/bench/sched/sched_fleet_decision_bench

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
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

constexpr int kTypes = 100;
constexpr int kKeys = 10'000;
constexpr int kJobs = 20'000;
constexpr int kSlots = 4;
constexpr double kWorkerVramGb = 80;
constexpr absl::Duration kTick = absl::Microseconds(70);
// BM_FleetDrain: jobs finished per turn, and the fleet's rate (jobs/s) that sets the clock: the
// figures `bench.py fleet` measured on two cores (about 53 jobs per decision, 2,800 jobs/s).
constexpr int kTurnJobs = 50;
constexpr double kFleetRate = 2'800;

std::string TypeName(int i) { return absl::StrFormat("t%03d", i); }

config::Config MakeConfig() {
  config::Config c;
  std::mt19937_64 rng(1);
  const double vram[] = {8, 16, 24, 40};
  for (int i = 0; i < kTypes; ++i) {
    c.types.push_back({.name = TypeName(i),
                       .model = absl::StrCat("m", i),
                       .vram_gb = vram[std::uniform_int_distribution<int>(0, 3)(rng)],
                       .max_affinity_wait = absl::Seconds(1)});
  }
  return c;
}

struct Fleet {
  explicit Fleet(int workers)
      : now(absl::FromUnixSeconds(1'700'000'000)), scheduler(MakeConfig(), now), rng(42) {
    std::vector<std::string> types;
    for (int i = 0; i < kTypes; ++i) types.push_back(TypeName(i));
    for (int w = 0; w < workers; ++w) {
      scheduler.AddWorker({.id = absl::StrFormat("w%04d", w),
                           .types = types,
                           .slots = kSlots,
                           .vram_gb = kWorkerVramGb});
    }
    // Queued over the last second, as bench/fleet.py queues them: type i mod 100, key
    // (i * 7919) mod 10,000.
    for (int i = 0; i < kJobs; ++i) {
      Enqueue(i % kTypes, static_cast<int>((int64_t{i} * 7919) % kKeys),
              now - absl::Seconds(1) + absl::Seconds(1) * (static_cast<double>(i) / kJobs));
    }
  }

  void Enqueue(int type, int key, absl::Time arrival) {
    std::string id = absl::StrFormat("%s-k%05d-%09d", TypeName(type), key, next_id++);
    scheduler.Enqueue({.id = std::move(id),
                       .type = TypeName(type),
                       .fairness_key = absl::StrFormat("k%05d", key),
                       .arrival = arrival});
  }

  // Finishes a random placed job; returns its id.
  std::string FinishOne() {
    size_t i = std::uniform_int_distribution<size_t>(0, placed.size() - 1)(rng);
    std::swap(placed[i], placed.back());
    std::string id = std::move(placed.back());
    placed.pop_back();
    scheduler.Finished(id, now, absl::Milliseconds(275));
    return id;
  }

  // Finishes a random placed job and queues one of the same type and key in its place.
  void FinishOneAndRefill() {
    const std::string id = FinishOne();
    // "t042-k01234-000000007": type at [1, 4), key at [6, 11).
    Enqueue(std::stoi(id.substr(1, 3)), std::stoi(id.substr(6, 5)), now);
  }

  void Place(std::vector<Dispatch> out) {
    for (Dispatch& d : out) placed.push_back(std::move(d.job_id));
  }

  absl::Time now;
  Scheduler scheduler;
  std::mt19937_64 rng;
  std::vector<std::string> placed;
  int64_t next_id = 0;
};

void BM_FleetColdDecide(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  double placed = 0, seconds = 0;
  for (auto _ : state) {
    auto fleet = std::make_unique<Fleet>(workers);
    const auto start = std::chrono::steady_clock::now();
    std::vector<Dispatch> out = fleet->scheduler.Decide(fleet->now);
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    seconds += s;
    placed += static_cast<double>(out.size());
  }
  state.counters["placed"] = benchmark::Counter(placed, benchmark::Counter::kAvgIterations);
  state.counters["us_per_placement"] = placed > 0 ? seconds * 1e6 / placed : 0;
}

void BM_FleetSteady(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  Fleet fleet(workers);
  fleet.Place(fleet.scheduler.Decide(fleet.now));
  if (fleet.placed.empty()) {
    state.SkipWithError("the first decision placed nothing");
    return;
  }
  double placed = 0;
  for (auto _ : state) {
    fleet.now += kTick;
    fleet.FinishOneAndRefill();
    std::vector<Dispatch> out = fleet.scheduler.Decide(fleet.now, 1);
    placed += static_cast<double>(out.size());
    fleet.Place(std::move(out));
  }
  state.counters["placed_per_decide"] =
      benchmark::Counter(placed, benchmark::Counter::kAvgIterations);
  state.counters["busy_slots"] = static_cast<double>(fleet.scheduler.placed_count());
}

void BM_FleetDrain(benchmark::State& state) {
  const int workers = static_cast<int>(state.range(0));
  const absl::Duration turn = absl::Seconds(kTurnJobs / kFleetRate);
  double placed = 0, seconds = 0, decisions = 0, max_seconds = 0;
  for (auto _ : state) {
    auto fleet = std::make_unique<Fleet>(workers);
    fleet->Place(fleet->scheduler.Decide(fleet->now));
    double s = 0;
    while (fleet->scheduler.pending_count() > 0 && !fleet->placed.empty()) {
      fleet->now += turn;
      for (int i = 0; i < kTurnJobs && !fleet->placed.empty(); ++i) fleet->FinishOne();
      const auto start = std::chrono::steady_clock::now();
      std::vector<Dispatch> out = fleet->scheduler.Decide(fleet->now);
      const double d =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      s += d;
      max_seconds = std::max(max_seconds, d);
      ++decisions;
      placed += static_cast<double>(out.size());
      fleet->Place(std::move(out));
    }
    state.SetIterationTime(s);
    seconds += s;
  }
  state.counters["us_per_placement"] = placed > 0 ? seconds * 1e6 / placed : 0;
  state.counters["decisions"] = benchmark::Counter(decisions, benchmark::Counter::kAvgIterations);
  state.counters["max_decision_ms"] = max_seconds * 1e3;
}

BENCHMARK(BM_FleetColdDecide)
    ->Arg(4)
    ->Arg(100)
    ->Arg(1000)
    ->Iterations(3)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_FleetSteady)->Arg(4)->Arg(100)->Arg(1000)->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_FleetDrain)
    ->Arg(100)
    ->Arg(1000)
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace dispatchd::sched

BENCHMARK_MAIN();
