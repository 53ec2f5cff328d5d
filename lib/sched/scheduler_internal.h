#pragma once

// The scheduler's internal state, shared by its .cc files (scheduler.cc and scheduler_*.cc) and
// tests that inject faults (SchedulerTestPeer). Nothing else includes it.

#include <algorithm>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/container/btree_set.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "lib/config/config.h"
#include "lib/sched/scheduler.h"
#include "lib/sched/token_bucket.h"

namespace dispatchd::sched {

// A set of groups, by Group::index: which groups a key or tenant has ready lanes in, and which
// the worker being decided for can take, so that a walk skips what cannot match in one AND.
using GroupMask = absl::InlinedVector<uint64_t, 2>;
inline void SetBit(GroupMask& m, size_t i) {
  if (m.size() <= i / 64) m.resize(i / 64 + 1, 0);
  m[i / 64] |= uint64_t{1} << (i % 64);
}
inline void ClearBit(GroupMask& m, size_t i) {
  if (i / 64 < m.size()) m[i / 64] &= ~(uint64_t{1} << (i % 64));
}
inline bool TestBit(const GroupMask& m, size_t i) {
  return i / 64 < m.size() && (m[i / 64] >> (i % 64) & 1) != 0;
}
inline bool Intersects(const GroupMask& a, const GroupMask& b) {
  for (size_t i = 0, n = std::min(a.size(), b.size()); i < n; ++i) {
    if ((a[i] & b[i]) != 0) return true;
  }
  return false;
}

// Arrival order with a sequence number for ties.
struct Scheduler::Ord {
  absl::Time arrival;
  uint64_t seq;
  static Ord Min() { return {absl::InfinitePast(), 0}; }
  static Ord Max() { return {absl::InfiniteFuture(), UINT64_MAX}; }
  friend bool operator<(const Ord& a, const Ord& b) {
    return a.arrival < b.arrival || (a.arrival == b.arrival && a.seq < b.seq);
  }
  friend bool operator==(const Ord& a, const Ord& b) {
    return a.arrival == b.arrival && a.seq == b.seq;
  }
};

// Internal state. Pending jobs live in lanes: one lane per (group, fairness key), a group being
// the pending jobs of one type with one label set. Everything a skip rule looks at except
// conflicts (tier, type, model, labels) is the same for every job of a group, so Decide tests a
// group once instead of each job. Each tier orders the keys that have ready jobs in it by cost;
// Decide walks them and takes the oldest ready head among a key's lanes in groups the worker can
// take. Conflicts differ per job: a lane of a conflict type keeps its jobs by (conflict key,
// arrival) and only the head of each resource whose conflict key is free is "ready".

struct Scheduler::TierState {
  std::string name;
  int priority = 0;
  int cap = config::kUnlimited;
  int64_t queued = 0;
  int64_t running = 0;
  std::vector<TypeState*> types;
  // Tenants with a ready job in this tier, by (0 if below its floor else 1, weight-normalised
  // cost, its oldest ready head in the tier): among tenants of equal cost the one with the oldest
  // ready job goes first, and a decision takes the first tenant in this order that has a job the
  // freed worker can run.
  absl::btree_set<std::tuple<int, double, Ord, TierTenant*>> tenants;
};

struct Scheduler::ModelState {
  std::string name;
  double vram = 0;
  absl::Time last_served = absl::InfinitePast();
  int64_t queued = 0;
  int64_t running = 0;
  // The workers that have it resident (each one's `resident` holds it), kept by AddResident and
  // DropResident, so that a question about the model's holders walks them, not the whole fleet.
  absl::flat_hash_set<WorkerState*> holders;
};

struct Scheduler::TypeState {
  std::string name;
  size_t index = 0;
  config::JobTypeConfig cfg;
  bool configured = false;
  TierState* tier = nullptr;
  ModelState* model = nullptr;
  TokenBucket* bucket = nullptr;
  int running = 0;
  int64_t queued = 0;
  std::vector<std::unique_ptr<Group>> groups;
  // Jobs started per second lately: an exponential moving average over 1 s buckets.
  double start_rate = 0;
  int64_t started_in_bucket = 0;
  absl::Time bucket_start = absl::InfinitePast();
};

struct Scheduler::Group {
  TypeState* type = nullptr;
  size_t index = 0;                                         // dense, for GroupMask
  std::vector<std::pair<std::string, std::string>> labels;  // sorted
  std::string signature;
  absl::flat_hash_map<KeyState*, std::unique_ptr<Lane>> lanes;
  absl::btree_set<std::pair<Ord, Lane*>> by_age;  // lanes with a ready job, by their head's arrival
  Ord oldest = Ord::Max();                        // by_age's first head, kept beside it
  int64_t ready = 0;                              // ready jobs in all lanes
};

struct Scheduler::Lane {
  Group* group = nullptr;
  KeyState* key = nullptr;
  absl::btree_set<std::pair<Ord, Job*>> ready;
  // Conflict types only: every pending job of the lane by (conflict key's id, arrival).
  absl::btree_set<std::tuple<uint64_t, Ord, Job*>> by_conflict;
  int64_t pending = 0;
  bool filed = false;  // has a ready job: in its group's by_age and counted in its TierKey
  Ord aged_head{};
};

// A tenant's keys with a ready job in one tier, and its place in the tier's tenant order.
struct Scheduler::TierTenant {
  TenantState* tenant = nullptr;
  // Its keys with a ready job in the tier, by (accumulated cost, oldest ready head there).
  absl::btree_set<std::tuple<double, Ord, TierKey*>> keys;
  // Ready lanes of its keys per group, and the groups where that is not 0.
  std::vector<int32_t> ready_by_group;
  GroupMask groups;
  // The same keys by oldest ready head: the tenant's own oldest head is the first.
  absl::btree_set<std::pair<Ord, KeyState*>> heads;
  bool filed = false;
  int filed_rank = 0;
  double filed_cost = 0;
  Ord filed_head{};
};

// A tenant: the first level of fair queuing. Its cost is the service its jobs received divided
// by its weight; its keys are queued fairly among themselves by their own cost.
struct Scheduler::TenantState {
  std::string name;
  double weight = 1;
  int max_running = config::kUnlimited;
  int min_running = 0;
  double cost = 0;
  // Of `cost`, what jobs in service were charged (each at the weight of its day).
  double in_service = 0;
  bool changed = false;  // its settled cost, since TakeAccounts
  int64_t pending = 0;
  int64_t placed = 0;
  int64_t keys = 0;         // KeyStates of this tenant
  int64_t active_keys = 0;  // of them, those with a job pending or placed
  absl::Time idle_since = absl::InfinitePast();
  // Key-level start tags of its jobs in service: its keys' virtual time.
  absl::btree_multiset<double> key_tags;
  double last_key_time = 0;
  // Its own buckets, by rate key (`tenants[i].rates`).
  absl::flat_hash_map<std::string, std::unique_ptr<TokenBucket>> buckets;
  absl::flat_hash_map<TierState*, std::unique_ptr<TierTenant>> tiers;
  // Moved on by a placement that may change which of its jobs BestJob finds first, or whether
  // another tenant's comes before them (Scheduler::ForgetMovedAnswers).
  uint64_t memo_gen = 0;

  // 0 while below its floor, else 1: the first part of its place in a tier.
  int rank() const { return placed < min_running ? 0 : 1; }
  bool capped() const { return placed >= max_running; }
};

// A key's lanes in one tier, and its place in its tenant's key order there.
struct Scheduler::TierKey {
  KeyState* key = nullptr;
  std::vector<Lane*> lanes;
  // The groups of its ready lanes (a key has one lane per group).
  GroupMask groups;
  // Its lanes with a ready job, by their head's arrival.
  absl::btree_set<std::pair<Ord, Lane*>> heads;
  bool filed = false;
  double filed_cost = 0;
  Ord filed_head{};
};

struct Scheduler::KeyState {
  std::string name;
  TenantState* tenant = nullptr;
  double cost = 0;
  double in_service = 0;  // of `cost`, what jobs in service were charged
  bool changed = false;   // its settled cost, since TakeAccounts
  bool active = false;    // a job pending or placed (counted in its tenant's active_keys)
  int64_t pending = 0;
  // Of `pending`, by type (entries may be 0).
  absl::flat_hash_map<const TypeState*, int64_t> pending_by_type;
  int64_t placed = 0;
  absl::Time idle_since = absl::InfinitePast();
  std::vector<Lane*> lanes;
  absl::flat_hash_map<TierState*, std::unique_ptr<TierKey>> tiers;
  // Moved on by each placement of one of its jobs (Scheduler::ForgetMovedAnswers).
  uint64_t memo_gen = 0;
};

struct Scheduler::Job {
  enum class Where { kDelayed, kLane, kPlaced };
  std::string id;
  int32_t attempt = 0;
  TypeState* type = nullptr;
  std::string resource;
  std::string conflict;      // "group\x1fresource", or empty when it conflicts with nothing
  uint64_t conflict_id = 0;  // while in a lane: ConflictLanes::id of `conflict`
  KeyState* key = nullptr;
  job::Labels labels;
  Ord ord{};
  absl::Time not_before = absl::InfinitePast();
  Where where = Where::kDelayed;
  Lane* lane = nullptr;
  bool in_ready = false;
  // Placed jobs.
  WorkerState* worker = nullptr;  // null: adopted before its worker connected
  std::string worker_id;
  ModelState* model = nullptr;
  double charged = 0;
  double tenant_charged = 0;  // charged / its tenant's weight then
  double start_tag = 0;       // the tenant's cost when it was charged
  double key_tag = 0;         // the key's cost when it was charged
  absl::Time placed_at = absl::InfinitePast();
};

struct Scheduler::WorkerState {
  WorkerSpec spec;
  int64_t rank = 0;
  std::vector<bool> serves;  // by TypeState::index
  int busy = 0;
  int capacity = 0;
  bool draining = false;
  bool throttled = false;
  double vram_in_use = 0;
  absl::flat_hash_map<ModelState*, int> in_use;
  absl::flat_hash_set<ModelState*> resident;  // changed only by AddResident and DropResident
  ModelState* swap_to = nullptr;
  int64_t loads = 0;
  absl::flat_hash_set<Job*> jobs;
};

struct Scheduler::Choice {
  Job* job = nullptr;
  bool loads = false;
};

// A placement policy: whether types queue in their tiers, and which job a worker with a free slot
// takes. ApplyConfig picks one by the configured name (PolicyNamed) and Decide calls its `choose`
// for each worker it fills, so no decision looks at the name. The policies are constants, one per
// name: "fair" (tiers, fair queuing, model affinity; ChooseFair) and "fifo" (arrival order in one
// tier; ChooseFifo).
struct Scheduler::Policy {
  // Types keep their configured tiers; false: every type queues in the implicit tier, whose cap is
  // unlimited.
  bool tiers = true;
  // The job `w` takes now and whether it loads its model; no job if none fits.
  Choice (Scheduler::*choose)(WorkerState& w, absl::Time now) = nullptr;
};

}  // namespace dispatchd::sched
