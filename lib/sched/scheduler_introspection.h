#pragma once

// What the scheduler says about itself: why a job waits, how its workers stand, and the snapshot
// operators read (Scheduler::WhyWaiting, Workers and Stats). Plain values, made on request.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace dispatchd::sched {

// Why a pending job is not dispatched now. One enum so logs, metrics and API messages agree.
enum class WaitReason {
  kNone,         // it would be dispatched now
  kNotBefore,    // its not_before has not passed
  kTierCap,      // its tier runs as many jobs as the tier's value
  kTypeCap,      // its type runs max_concurrency jobs
  kConflict,     // a job of its conflict group runs on its resource_id
  kRateLimit,    // its model's token bucket is empty
  kTenantCap,    // its tenant runs max_running jobs
  kTenantRate,   // its tenant's bucket for its model is empty
  kNoWorker,     // no connected worker serves its type and labels
  kWorkersBusy,  // workers that could take it have no free slot
  kMemory,       // workers with a free slot are memory-throttled
  kVram,         // workers with a free slot have no VRAM for its model
  kAffinity,     // free workers stay on their resident models (see max_affinity_wait)
  kInLine,       // it could run, but other jobs come first
};
absl::string_view ToString(WaitReason reason);

// Why a job waits and where it stands.
struct WaitInfo {
  WaitReason reason = WaitReason::kNone;
  // Jobs of the same fairness key and type ahead of it, plus one.
  int64_t position = 0;
  // Fairness keys whose jobs of this type come before its key's.
  int64_t keys_ahead = 0;
  std::string tenant;
  // Fractions of the placed jobs its tenant holds and is entitled to among the tenants with
  // work (by weight); the same for its key among its tenant's keys with work.
  double tenant_share = 0, tenant_fair_share = 0;
  double key_share = 0, key_fair_share = 0;
  // kConflict: a job placed on its resource.
  std::string conflict_holder;
  // kRateLimit, kTenantRate: when the bucket has a token.
  absl::Time next_token_at = absl::InfinitePast();
  // From its place in line, its fair shares and the rate its type's jobs started at lately;
  // InfiniteFuture when none started lately.
  absl::Time estimated_start = absl::InfiniteFuture();
};

// Per-worker view for AdminService and tests.
struct WorkerView {
  std::string id;
  int64_t rank = 0;
  int slots = 0;
  int busy = 0;      // jobs placed on it (dispatched or running)
  int capacity = 0;  // slots it is believed to accept now (<= slots; lowered by refusals)
  bool draining = false;
  bool throttled = false;  // memory-throttled: no new jobs
  double vram_gb = -1;
  double vram_in_use_gb = 0;
  std::vector<std::string> models_resident;  // sorted
  int64_t model_loads = 0;                   // dispatches that made it load a model
};

// What a worker holds, without its models: for counts taken often (metrics, disconnects).
struct WorkerLoad {
  int slots = 0;
  int busy = 0;  // jobs placed on it (dispatched or running)
  int64_t model_loads = 0;
};

// Snapshot for AdminService.Stats: counts and the reason the best-placed job of each waits.
struct SchedulerStats {
  struct Tier {
    std::string name;
    int priority = 0;
    int cap = 0;  // config::kUnlimited for the implicit tier
    int64_t queued = 0, running = 0;
    WaitReason head = WaitReason::kNone;
  };
  struct Type {
    std::string name;
    int64_t queued = 0, running = 0;
    WaitReason head = WaitReason::kNone;
    // Of `queued`, those added by AddQueued: jobs the caller keeps outside the scheduler (the
    // dispatcher's pager leaves them in the database).
    int64_t queued_outside = 0;
    // Workers that serve it and are not draining (a worker whose stream was lost drains until
    // it comes back); full and memory-throttled ones count.
    int64_t workers = 0;
  };
  struct Model {
    std::string name;  // a model, or a rate-limited type with no model
    int64_t queued = 0, running = 0;
    double tokens = -1;  // tokens in its bucket; negative: no rate limit
    double per_second = 0;
    int burst = 0;
    int64_t resident_on = 0;  // connected workers with it loaded
    WaitReason head = WaitReason::kNone;
  };
  struct Key {
    std::string name;
    int64_t queued = 0, running = 0;
    double cost = 0;
    WaitReason head = WaitReason::kNone;
    std::string tenant;
  };
  struct Tenant {
    std::string name;
    double weight = 1;
    int64_t queued = 0, running = 0;
    double share = 0, fair_share = 0;  // as in WaitInfo
    double cost = 0;                   // weight-normalised service
    int max_running = 0, min_running = 0;
    int64_t keys = 0;
  };
  std::vector<Tier> tiers;      // by priority, highest first
  std::vector<Type> types;      // by name
  std::vector<Model> models;    // by name
  std::vector<Key> keys;        // by accumulated cost, lowest first
  std::vector<Tenant> tenants;  // by name
  int64_t keys_total = 0;       // fairness keys known, also those left out of `keys`
  double virtual_time = 0;
};

}  // namespace dispatchd::sched
