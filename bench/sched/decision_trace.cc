// Prints a digest of every decision of a seeded, randomized scheduler run: jobs of types that
// share models, in tiers, from tenants with weights, floors, caps and rates (or, every third
// seed, all in one tenant: unnamed, or alone with its own floor, cap and rates), with conflicts,
// labels and delays, placed on workers of 24 or 80 GB that serve random subsets of the types,
// finished at random and decided with and without a limit. Two builds that print the same line
// for the same arguments made the same decisions, in the same order, on the same workers: the
// check that a change meant to speed the scheduler up left its choices alone.
//
//   sched_decision_trace [SEED [WORKERS [afresh]]]   # default seed 1, 60 workers
//   for s in $(seq 1 60); do ./before/sched_decision_trace $s; done > a
//   for s in $(seq 1 60); do ./after/sched_decision_trace $s; done > b && cmp a b
//
// With `afresh`, every choice walks the fairness orders afresh rather than reuse an answer found
// earlier in the same decision (Scheduler::DisableDecisionMemoForTesting): it must print the
// same line as without.
//
// Output: "SEED DISPATCHES DIGEST", the digest an FNV-1a hash of each dispatch's job, worker,
// model and whether it loads the model.

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"

#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/scheduler.h"

namespace dispatchd::sched {
namespace {

class Run {
 public:
  Run(uint64_t seed, int workers, bool afresh)
      : rng_(seed), tenants_(seed % 3 != 0 ? 4 : (seed % 6 == 0 ? 0 : 1)) {
    const config::Config c = MakeConfig();
    scheduler_ = std::make_unique<Scheduler>(c, now_);
    scheduler_->DisableDecisionMemoForTesting(afresh);
    for (int w = 0; w < workers; ++w) {
      std::vector<std::string> serves;
      for (const std::string& t : types_) {
        if (Uniform(0, 3) > 0) serves.push_back(t);
      }
      job::Labels labels;
      if (Uniform(0, 2) == 0) labels["zone"] = absl::StrCat("z", Uniform(0, 1));
      scheduler_->AddWorker({.id = absl::StrFormat("w%04d", w),
                             .types = serves,
                             .slots = Uniform(1, 6),
                             .labels = labels,
                             .vram_gb = Uniform(0, 4) == 0 ? 24.0 : 80.0});
    }
    keys_ = Uniform(5, 3000);
  }

  // Runs to the end (or 3,000 turns); returns the number of dispatches and the digest.
  std::pair<int64_t, uint64_t> Go() {
    Enqueue(Uniform(100, 5000));
    for (int turn = 0; turn < 3000 && (scheduler_->pending_count() > 0 || !placed_.empty());
         ++turn) {
      now_ += absl::Milliseconds(Uniform(1, 80));
      for (int i = Uniform(0, 40); i > 0 && !placed_.empty(); --i) {
        const size_t k = std::uniform_int_distribution<size_t>(0, placed_.size() - 1)(rng_);
        std::swap(placed_[k], placed_.back());
        scheduler_->Finished(placed_.back(), now_, absl::Milliseconds(Uniform(10, 500)));
        placed_.pop_back();
      }
      if (Uniform(0, 3) == 0) Enqueue(Uniform(0, 200));
      const size_t limit = Uniform(0, 4) == 0 ? static_cast<size_t>(Uniform(1, 10)) : SIZE_MAX;
      for (const Dispatch& d : scheduler_->Decide(now_, limit)) {
        for (char ch : absl::StrCat(d.job_id, " ", d.worker_id, " ", d.loads_model, " ", d.model)) {
          digest_ = (digest_ ^ static_cast<unsigned char>(ch)) * 1099511628211ULL;
        }
        placed_.push_back(d.job_id);
        ++dispatches_;
      }
    }
    return {dispatches_, digest_};
  }

 private:
  int Uniform(int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng_); }

  config::Config MakeConfig() {
    config::Config c;
    const double vram[] = {8, 16, 24, 40};
    const int types = Uniform(5, 40);
    const int models = Uniform(3, 20);
    for (int i = 0; i < 3; ++i)
      c.tiers.push_back({.name = absl::StrCat("tier", i), .value = i + 1});
    // A model's rate limit is the same on each of its types.
    std::vector<config::RateLimit> model_rate(models);
    for (config::RateLimit& r : model_rate) {
      if (Uniform(0, 6) == 0) {
        r = {.per_second = static_cast<double>(Uniform(5, 200)), .burst = Uniform(1, 10)};
      }
    }
    std::string some_model;
    for (int i = 0; i < types; ++i) {
      config::JobTypeConfig t{.name = absl::StrCat("t", i)};
      if (Uniform(0, 9) > 0) {
        const int m = Uniform(0, models - 1);
        t.model = absl::StrCat("m", m);
        t.vram_gb = vram[m % 4];
        t.rate = model_rate[m];
        some_model = t.model;
      }
      t.max_affinity_wait = absl::Milliseconds(Uniform(100, 2000));
      if (Uniform(0, 5) == 0) t.max_concurrency = Uniform(1, 20);
      if (Uniform(0, 2) == 0) t.tier = absl::StrCat("tier", Uniform(0, 2));
      if (Uniform(0, 6) == 0) t.conflict_group = absl::StrCat("g", Uniform(0, 1));
      t.default_cost = Uniform(1, 10) / 10.0;
      c.types.push_back(t);
      types_.push_back(t.name);
    }
    // Principals p0..p3 in tenants of their own; p4 is in none. Every sixth seed has no tenants
    // at all and every job in the one unnamed tenant, as without authentication; every sixth
    // from the third, one tenant (p0's) owns every job.
    for (int i = 0; i < tenants_; ++i) {
      config::TenantConfig t{.name = absl::StrCat("ten", i), .principals = {absl::StrCat("p", i)}};
      t.weight = Uniform(1, 4);
      if (Uniform(0, 2) == 0) t.max_running = Uniform(5, 60);
      if (Uniform(0, 2) == 0) t.min_running = std::min(Uniform(1, 20), t.max_running);
      if (Uniform(0, tenants_ == 1 ? 1 : 2) == 0 && !some_model.empty()) {
        t.rates.push_back({.model = some_model, .rate = {.per_second = 50, .burst = 5}});
      }
      c.tenants.push_back(t);
    }
    if (absl::Status s = c.Validate(); !s.ok()) {
      std::fprintf(stderr, "decision_trace: invalid config: %s\n", s.ToString().c_str());
      std::exit(2);
    }
    return c;
  }

  void Enqueue(int n) {
    for (int i = 0; i < n; ++i) {
      job::Labels labels;
      if (Uniform(0, 5) == 0) labels["zone"] = absl::StrCat("z", Uniform(0, 1));
      const std::string type = types_[Uniform(0, static_cast<int>(types_.size()) - 1)];
      const std::string resource = Uniform(0, 3) == 0 ? absl::StrCat("r", Uniform(0, 20)) : "";
      const std::string key = absl::StrCat("k", Uniform(0, keys_ - 1));
      const std::string owner = tenants_ == 0   ? ""
                                : tenants_ == 1 ? "p0"
                                                : absl::StrCat("p", Uniform(0, 4));
      const absl::Time not_before =
          Uniform(0, 9) == 0 ? now_ + absl::Milliseconds(Uniform(1, 500)) : absl::InfinitePast();
      scheduler_->Enqueue({.id = absl::StrFormat("j%07d", next_id_++),
                           .type = type,
                           .resource_id = resource,
                           .fairness_key = key,
                           .owner = owner,
                           .labels = labels,
                           .not_before = not_before,
                           .arrival = now_});
    }
  }

  std::mt19937_64 rng_;
  int tenants_;  // named tenants: 4, or 1 that owns every job, or 0 (every job unnamed)
  absl::Time now_ = absl::FromUnixSeconds(1'700'000'000);
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::string> types_;
  int keys_ = 1;
  int64_t next_id_ = 0;
  std::vector<std::string> placed_;
  int64_t dispatches_ = 0;
  uint64_t digest_ = 1469598103934665603ULL;
};

}  // namespace
}  // namespace dispatchd::sched

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 1;
  const int workers = argc > 2 ? std::atoi(argv[2]) : 60;
  const bool afresh = argc > 3 && std::strcmp(argv[3], "afresh") == 0;
  auto [dispatches, digest] = dispatchd::sched::Run(seed, workers, afresh).Go();
  std::printf("%llu %lld %016llx\n", static_cast<unsigned long long>(seed),
              static_cast<long long>(dispatches), static_cast<unsigned long long>(digest));
  return 0;
}
