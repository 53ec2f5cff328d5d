// The scheduler's answers to questions: why a job waits and when it should start, when to
// decide again, the snapshot for operators, the self-check of its counts, and accessors. Nothing
// here changes a decision (Audit with `repair` only sets drifted counts right).

#include "lib/sched/scheduler_introspection.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"

namespace dispatchd::sched {

absl::string_view ToString(WaitReason reason) {
  switch (reason) {
    case WaitReason::kNone:
      return "none";
    case WaitReason::kNotBefore:
      return "not_before";
    case WaitReason::kTierCap:
      return "tier_cap";
    case WaitReason::kTypeCap:
      return "type_cap";
    case WaitReason::kConflict:
      return "conflict";
    case WaitReason::kRateLimit:
      return "rate_limit";
    case WaitReason::kTenantCap:
      return "tenant_cap";
    case WaitReason::kTenantRate:
      return "tenant_rate";
    case WaitReason::kNoWorker:
      return "no_worker";
    case WaitReason::kWorkersBusy:
      return "workers_busy";
    case WaitReason::kMemory:
      return "memory";
    case WaitReason::kVram:
      return "vram";
    case WaitReason::kAffinity:
      return "affinity";
    case WaitReason::kInLine:
      return "in_line";
  }
  return "unknown";
}

WaitReason Scheduler::WhyGroupWaits(const Group& g, absl::Time now) const {
  const TypeState& t = *g.type;
  if (!t.configured) return WaitReason::kNoWorker;
  if (t.tier->running >= t.tier->cap) return WaitReason::kTierCap;
  if (t.running >= t.cfg.max_concurrency) return WaitReason::kTypeCap;
  if (t.bucket != nullptr && !t.bucket->Ready(now)) return WaitReason::kRateLimit;
  bool any = false, free = false, unthrottled = false, fits = false;
  for (const auto& [rank, w] : by_rank_) {
    if (!ServesAndMatches(*w, g)) continue;
    any = true;
    if (w->draining || w->busy >= w->capacity) continue;
    free = true;
    if (w->throttled) continue;
    unthrottled = true;
    if (!Fits(*w, t.model)) continue;
    fits = true;
    if (Resident(*w, t.model) && w->swap_to == nullptr) return WaitReason::kInLine;
  }
  if (!any) return WaitReason::kNoWorker;
  if (!free) return WaitReason::kWorkersBusy;
  if (!unthrottled) return WaitReason::kMemory;
  if (!fits) return WaitReason::kVram;
  return WaitReason::kAffinity;
}

WaitInfo Scheduler::WhyWaiting(const std::string& job_id, absl::Time now) const {
  WaitInfo info;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->where == Job::Where::kPlaced) return info;
  info = WhyWaitingNow(*it->second, now);
  Explain(*it->second, now, info);
  return info;
}

void Scheduler::Explain(const Job& j, absl::Time now, WaitInfo& info) const {
  const TenantState& tenant = *j.key->tenant;
  std::tie(info.tenant_share, info.tenant_fair_share) = TenantShares(tenant);
  info.key_share = tenant.placed == 0
                       ? 0
                       : static_cast<double>(j.key->placed) / static_cast<double>(tenant.placed);
  info.key_fair_share = tenant.active_keys > 0 ? 1.0 / static_cast<double>(tenant.active_keys) : 0;
  if (info.reason == WaitReason::kConflict) {
    for (const auto& [rank, w] : by_rank_) {
      for (const Job* other : w->jobs) {
        if (other->conflict == j.conflict) info.conflict_holder = other->id;
      }
    }
  }
  const TokenBucket* bucket = nullptr;
  if (info.reason == WaitReason::kRateLimit) bucket = j.type->bucket;
  if (info.reason == WaitReason::kTenantRate && j.type->configured) {
    auto b = tenant.buckets.find(j.type->cfg.rate_key());
    if (b != tenant.buckets.end()) bucket = b->second.get();
  }
  if (bucket != nullptr) info.next_token_at = bucket->NextTokenAt();
  // Its key gets about (tenant fair share x key fair share) of its type's starts.
  const double rate = StartRate(*j.type, now) * std::max(info.tenant_fair_share, 1e-9) *
                      std::max(info.key_fair_share, 1e-9);
  if (rate > 0 && info.position > 0) {
    info.estimated_start =
        std::max(now, j.not_before) + absl::Seconds(static_cast<double>(info.position) / rate);
  }
}

WaitInfo Scheduler::WhyWaitingNow(const Job& j, absl::Time now) const {
  WaitInfo info;
  const TenantState& tenant = *j.key->tenant;
  info.tenant = tenant.name;
  if (j.where == Job::Where::kDelayed) {
    info.reason = j.not_before > now ? WaitReason::kNotBefore : WaitReason::kInLine;
    info.position = j.key->pending_by_type.at(j.type);  // due jobs may all go first
    return info;
  }
  const Lane& lane = *j.lane;
  info.position = 1;
  if (j.conflict.empty()) {
    for (const auto& [ord, other] : lane.ready) {
      if (!(ord < j.ord)) break;
      ++info.position;
    }
  } else {
    for (const auto& [conflict, ord, other] : lane.by_conflict) info.position += ord < j.ord;
  }
  if (lane.filed) {
    // Keys served before this job's key in its tier that have ready jobs of the same group: all
    // such keys of tenants placed before its tenant, and those before it in its own tenant.
    TierState* tier = lane.group->type->tier;
    auto count_keys = [&](const TenantState& t, bool own) {
      for (const auto& [cost, head, tk] : t.tiers.at(tier)->keys) {
        const KeyState* key = tk->key;
        if (own && (key == j.key || cost > j.key->cost)) break;
        for (const Lane* other : key->tiers.at(tier)->lanes) {
          if (other->group == lane.group && other->filed) {
            ++info.keys_ahead;
            break;
          }
        }
      }
    };
    for (const auto& [rank, cost, head, tt] : tier->tenants) {
      if (tt->tenant == &tenant) break;
      if (std::make_pair(rank, cost) > std::make_pair(tenant.rank(), tenant.cost)) break;
      count_keys(*tt->tenant, false);
    }
    count_keys(tenant, true);
  }

  if (!j.conflict.empty() && !j.in_ready) {
    info.reason =
        conflicts_running_.contains(j.conflict) ? WaitReason::kConflict : WaitReason::kInLine;
    return info;
  }
  if (tenant.capped()) {
    info.reason = WaitReason::kTenantCap;
  } else if (!TenantOpen(tenant, *j.type, now)) {
    info.reason = WaitReason::kTenantRate;
  } else {
    info.reason = WhyGroupWaits(*lane.group, now);
  }
  return info;
}

absl::Time Scheduler::NextWakeup(absl::Time now) const {
  absl::Time next = next_housekeeping_;
  if (!delayed_.empty()) next = std::min(next, delayed_.begin()->first);
  for (const auto& [name, t] : types_) {
    if (t->bucket == nullptr || t->queued == 0 || t->bucket->Ready(now)) continue;
    next = std::min(next, t->bucket->NextTokenAt());
  }
  for (const auto& [name, t] : tenants_) {
    if (t->pending == 0) continue;
    for (const auto& [key, bucket] : t->buckets) {
      if (!bucket->Ready(now)) next = std::min(next, bucket->NextTokenAt());
    }
  }
  return std::max(next, now);
}

SchedulerStats Scheduler::Stats(absl::Time now, size_t max_keys) const {
  SchedulerStats s;
  s.virtual_time = VirtualTime();
  // The best-ordered ready group of a type, or null.
  auto head_of = [&](const TypeState& t) -> WaitReason {
    const Group* best = nullptr;
    for (const auto& g : t.groups) {
      if (g->by_age.empty()) continue;
      if (best == nullptr || g->by_age.begin()->first < best->by_age.begin()->first) best = g.get();
    }
    if (best != nullptr) return WhyGroupWaits(*best, now);
    if (t.queued == 0) return WaitReason::kNone;
    bool delayed = false;
    for (const auto& [when, job] : delayed_) delayed |= job->type == &t;
    return delayed ? WaitReason::kNotBefore : WaitReason::kConflict;
  };
  std::vector<const TypeState*> types;
  for (const auto& [name, t] : types_) {
    if (t->configured || t->queued > 0 || t->running > 0) types.push_back(t.get());
  }
  std::sort(types.begin(), types.end(),
            [](const TypeState* a, const TypeState* b) { return a->name < b->name; });
  // One pass over the workers: each type's serving workers, each model's resident ones.
  std::vector<int64_t> serving(types_.size(), 0);
  absl::flat_hash_map<const ModelState*, int64_t> resident_on;
  for (const auto& [rank, w] : by_rank_) {
    for (const ModelState* m : w->resident) ++resident_on[m];
    if (w->draining) continue;
    for (size_t i = 0; i < w->serves.size() && i < serving.size(); ++i) serving[i] += w->serves[i];
  }
  absl::flat_hash_map<const TypeState*, WaitReason> heads;
  for (const TypeState* t : types) {
    heads[t] = head_of(*t);
    SchedulerStats::Type& out = s.types.emplace_back();
    out.name = t->name;
    out.queued = t->queued;
    out.running = t->running;
    out.head = heads[t];
    out.workers = serving[t->index];
  }
  for (const TierState* tier : tiers_desc_) {
    if (tier->types.empty() && tier->queued == 0 && tier->running == 0) continue;
    SchedulerStats::Tier out{tier->name, tier->priority, tier->cap, tier->queued, tier->running};
    for (const TypeState* t : tier->types) {
      if (t->queued > 0 && out.head == WaitReason::kNone) out.head = heads[t];
    }
    s.tiers.push_back(out);
  }
  // Models and rate-limited types without a model.
  absl::flat_hash_map<std::string, SchedulerStats::Model> models;
  for (const auto& [name, m] : models_) {
    SchedulerStats::Model& out = models[name];
    out.name = name;
    out.queued = m->queued;
    out.running = m->running;
    if (auto it = resident_on.find(m.get()); it != resident_on.end()) out.resident_on = it->second;
  }
  for (const auto& [key, bucket] : buckets_) {
    SchedulerStats::Model& out = models[key];
    out.name = key;
    out.tokens = bucket->TokensAt(now);
    out.per_second = bucket->limit().per_second;
    out.burst = bucket->limit().burst;
  }
  for (const TypeState* t : types) {
    if (t->model == nullptr) {
      auto it = models.find(t->name);
      if (it == models.end()) continue;
      it->second.queued += t->queued;
      it->second.running += t->running;
    }
    auto it = models.find(t->configured ? t->cfg.rate_key() : t->name);
    if (it != models.end() && t->queued > 0 && it->second.head == WaitReason::kNone) {
      it->second.head = heads[t];
    }
  }
  for (auto& [name, m] : models) s.models.push_back(m);
  std::sort(s.models.begin(), s.models.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  // Keys: the `max_keys` lowest-cost ones, each group's reason worked out once.
  std::vector<const KeyState*> keys;
  keys.reserve(keys_.size());
  for (const auto& [name, key] : keys_) keys.push_back(key.get());
  s.keys_total = static_cast<int64_t>(keys.size());
  double active_weights = 0;
  for (const auto& [name, t] : tenants_) {
    if (t->pending > 0 || t->placed > 0) active_weights += t->weight;
  }
  for (const auto& [name, t] : tenants_) {
    const bool active = t->pending > 0 || t->placed > 0;
    s.tenants.push_back({.name = t->name,
                         .weight = t->weight,
                         .queued = t->pending,
                         .running = t->placed,
                         .share = placed_count_ == 0 ? 0
                                                     : static_cast<double>(t->placed) /
                                                           static_cast<double>(placed_count_),
                         .fair_share = active ? t->weight / active_weights : 0,
                         .cost = t->cost,
                         .max_running = t->max_running,
                         .min_running = t->min_running,
                         .keys = t->keys});
  }
  std::sort(s.tenants.begin(), s.tenants.end(),
            [](const auto& a, const auto& b) { return a.name < b.name; });
  auto by_cost = [](const KeyState* a, const KeyState* b) {
    return a->cost != b->cost ? a->cost < b->cost : a->name < b->name;
  };
  size_t n = std::min(keys.size(), max_keys);
  std::partial_sort(keys.begin(), keys.begin() + n, keys.end(), by_cost);
  absl::flat_hash_map<const Group*, WaitReason> group_reasons;
  for (size_t i = 0; i < n; ++i) {
    const KeyState* key = keys[i];
    SchedulerStats::Key out{key->name, key->pending, key->placed, key->cost};
    out.tenant = key->tenant->name;
    const Lane* best = nullptr;
    for (const Lane* lane : key->lanes) {
      if (lane->filed && (best == nullptr || lane->aged_head < best->aged_head)) best = lane;
    }
    if (best != nullptr) {
      auto [it, fresh] = group_reasons.try_emplace(best->group, WaitReason::kNone);
      if (fresh) it->second = WhyGroupWaits(*best->group, now);
      out.head = it->second;
    }
    s.keys.push_back(out);
  }
  return s;
}

void Scheduler::AddQueued(SchedulerStats& stats, const std::string& type,
                          const std::string& fairness_key, int64_t n) const {
  auto t = types_.find(type);
  if (t == types_.end() || n == 0) return;
  const TypeState& ts = *t->second;
  for (SchedulerStats::Type& out : stats.types) {
    if (out.name == ts.name) {
      out.queued += n;
      out.queued_outside += n;
    }
  }
  for (SchedulerStats::Tier& out : stats.tiers) {
    if (ts.tier != nullptr && out.name == ts.tier->name && out.priority == ts.tier->priority) {
      out.queued += n;
    }
  }
  // As in Stats: a type's model, or the type itself when it is rate-limited without one.
  const std::string model = ts.model != nullptr ? ts.model->name : ts.name;
  for (SchedulerStats::Model& out : stats.models) {
    if (out.name == model) out.queued += n;
  }
  for (SchedulerStats::Key& out : stats.keys) {
    if (out.name == fairness_key) out.queued += n;
  }
}

std::vector<std::string> Scheduler::Audit(bool repair) {
  std::vector<std::string> drifts;
  // Compares a held count with the recount, notes a drift and repairs it if asked.
  auto check = [&](auto& held, auto counted, const std::string& what, const char* name,
                   const char* source) {
    if (held == counted) return false;
    drifts.push_back(absl::StrCat(what, ": ", name, " ", held, ", ", source, " ", counted));
    if (repair) held = counted;
    return true;
  };
  struct Counts {
    int64_t running = 0, queued = 0;
  };
  absl::flat_hash_map<const TypeState*, Counts> types;
  absl::flat_hash_map<const TierState*, Counts> tiers;
  absl::flat_hash_map<const ModelState*, Counts> models;
  absl::flat_hash_map<const KeyState*, Counts> keys;
  absl::flat_hash_map<const TenantState*, Counts> tenants;
  absl::flat_hash_map<const KeyState*, absl::flat_hash_map<const TypeState*, int64_t>> key_types;
  absl::flat_hash_map<const WorkerState*, int> busy;
  absl::flat_hash_map<const WorkerState*, absl::flat_hash_map<ModelState*, int>> in_use;
  absl::flat_hash_map<std::string, int> conflicts;
  int64_t placed = 0, pending = 0;
  for (const auto& [id, j] : jobs_) {
    if (j->where == Job::Where::kPlaced) {
      ++placed;
      ++types[j->type].running;
      ++tiers[j->type->tier].running;
      if (j->model != nullptr) ++models[j->model].running;
      ++keys[j->key].running;
      ++tenants[j->key->tenant].running;
      if (j->worker != nullptr) {
        ++busy[j->worker];
        if (j->model != nullptr) ++in_use[j->worker][j->model];
      }
      if (!j->conflict.empty()) ++conflicts[j->conflict];
    } else {
      ++pending;
      ++types[j->type].queued;
      ++tiers[j->type->tier].queued;
      if (j->type->model != nullptr) ++models[j->type->model].queued;
      ++keys[j->key].queued;
      ++tenants[j->key->tenant].queued;
      ++key_types[j->key][j->type];
    }
  }
  check(placed_count_, static_cast<size_t>(placed), "scheduler", "placed", "jobs placed");
  check(pending_count_, static_cast<size_t>(pending), "scheduler", "pending", "jobs pending");
  for (auto& [name, t] : types_) {
    Counts c = types[t.get()];
    check(t->running, static_cast<int>(c.running), "type " + name, "running", "jobs placed");
    check(t->queued, c.queued, "type " + name, "queued", "jobs pending");
  }
  for (auto& [value, tier] : tiers_) {
    Counts c = tiers[tier.get()];
    check(tier->running, c.running, "tier " + tier->name, "running", "jobs placed");
    check(tier->queued, c.queued, "tier " + tier->name, "queued", "jobs pending");
  }
  // Each model's holders are the workers that have it resident.
  absl::flat_hash_map<const ModelState*, absl::flat_hash_set<WorkerState*>> holders;
  for (auto& [id, w] : workers_) {
    for (const ModelState* m : w->resident) holders[m].insert(w.get());
  }
  for (auto& [name, m] : models_) {
    Counts c = models[m.get()];
    check(m->running, c.running, "model " + name, "running", "jobs placed");
    check(m->queued, c.queued, "model " + name, "queued", "jobs pending");
    absl::flat_hash_set<WorkerState*>& want = holders[m.get()];
    if (m->holders != want) {
      drifts.push_back(absl::StrCat("model ", name, ": holders ", m->holders.size(),
                                    ", workers with it resident ", want.size()));
      if (repair) m->holders = want;
    }
  }
  for (auto& [name, k] : keys_) {
    Counts c = keys[k.get()];
    check(k->placed, c.running, "key \"" + name + "\"", "placed", "jobs placed");
    check(k->pending, c.queued, "key \"" + name + "\"", "pending", "jobs pending");
    absl::flat_hash_map<const TypeState*, int64_t>& by_type = key_types[k.get()];
    for (auto& [type, n] : k->pending_by_type) {
      check(n, by_type[type], "key \"" + name + "\" type " + type->name, "pending", "jobs pending");
    }
    for (const auto& [type, n] : by_type) {
      if (!k->pending_by_type.contains(type)) {
        check(k->pending_by_type[type], n, "key \"" + name + "\" type " + type->name, "pending",
              "jobs pending");
      }
    }
  }
  for (auto& [name, t] : tenants_) {
    Counts c = tenants[t.get()];
    bool changed = check(t->placed, c.running, "tenant \"" + name + "\"", "placed", "jobs placed");
    check(t->pending, c.queued, "tenant \"" + name + "\"", "pending", "jobs pending");
    if (repair && changed) RefileTenant(*t);
  }
  for (auto& [id, w] : workers_) {
    const std::string what = "worker " + id;
    bool changed = check(w->busy, busy[w.get()], what, "busy", "jobs placed on it");
    absl::flat_hash_map<ModelState*, int>& want = in_use[w.get()];
    if (w->in_use != want) {
      drifts.push_back(absl::StrCat(what, ": models in use differ from its jobs' models"));
      if (repair) w->in_use = want;
    }
    double vram = 0;
    for (const auto& [model, n] : want) vram += model->vram;
    if (std::abs(w->vram_in_use - vram) > 1e-6) {
      drifts.push_back(
          absl::StrCat(what, ": vram_in_use ", w->vram_in_use, ", its jobs' models ", vram));
      if (repair) w->vram_in_use = vram;
    }
    if (repair && changed) UpdateAvailable(*w);
  }
  // Conflict keys: a count wrong in either direction changes which queued jobs are ready.
  std::vector<std::pair<std::string, bool>> toggles;
  for (const auto& [key, n] : conflicts_running_) {
    auto it = conflicts.find(key);
    int want = it == conflicts.end() ? 0 : it->second;
    if (n == want) continue;
    drifts.push_back(
        absl::StrCat("conflict ", absl::CHexEscape(key), ": running ", n, ", jobs placed ", want));
    if (want == 0) toggles.push_back({key, false});
  }
  for (const auto& [key, n] : conflicts) {
    if (conflicts_running_.contains(key)) continue;
    drifts.push_back(
        absl::StrCat("conflict ", absl::CHexEscape(key), ": running 0, jobs placed ", n));
    toggles.push_back({key, true});
  }
  if (repair) {
    conflicts_running_ = conflicts;
    for (const auto& [key, busy_now] : toggles) SetConflictBusy(key, busy_now);
  }
  for (auto& [name, t] : types_) {
    for (auto& g : t->groups) {
      int64_t ready = 0;
      for (const auto& [key, lane] : g->lanes) ready += static_cast<int64_t>(lane->ready.size());
      check(g->ready, ready, "type " + name + " labels {" + g->signature + "}", "ready",
            "ready jobs in its lanes");
    }
  }
  return drifts;
}

int64_t Scheduler::queued_of_type(const std::string& type) const {
  auto it = types_.find(type);
  return it == types_.end() ? 0 : it->second->queued;
}

int64_t Scheduler::queued_of(const std::string& type, const std::string& fairness_key) const {
  auto t = types_.find(type);
  auto keys = keys_by_name_.find(fairness_key);
  if (t == types_.end() || keys == keys_by_name_.end()) return 0;
  int64_t queued = 0;
  for (const KeyState* k : keys->second) {
    auto n = k->pending_by_type.find(t->second.get());
    if (n != k->pending_by_type.end()) queued += n->second;
  }
  return queued;
}

int Scheduler::running_of_type(const std::string& type) const {
  auto it = types_.find(type);
  return it == types_.end() ? 0 : it->second->running;
}

bool Scheduler::IsPlaced(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second->where == Job::Where::kPlaced;
}

bool Scheduler::IsPending(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it != jobs_.end() && it->second->where != Job::Where::kPlaced;
}

std::string Scheduler::WorkerOf(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->where != Job::Where::kPlaced) return "";
  return it->second->worker_id;
}

std::vector<WorkerView> Scheduler::Workers() const {
  std::vector<WorkerView> out;
  for (const auto& [rank, w] : by_rank_) {
    WorkerView v{.id = w->spec.id,
                 .rank = rank,
                 .slots = w->spec.slots,
                 .busy = w->busy,
                 .capacity = w->capacity,
                 .draining = w->draining,
                 .throttled = w->throttled,
                 .vram_gb = w->spec.vram_gb,
                 .vram_in_use_gb = w->vram_in_use,
                 .model_loads = w->loads};
    for (const ModelState* m : w->resident) v.models_resident.push_back(m->name);
    std::sort(v.models_resident.begin(), v.models_resident.end());
    out.push_back(std::move(v));
  }
  return out;
}

std::optional<WorkerLoad> Scheduler::LoadOf(const std::string& worker_id) const {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return std::nullopt;
  const WorkerState& w = *it->second;
  return WorkerLoad{.slots = w.spec.slots, .busy = w.busy, .model_loads = w.loads};
}

}  // namespace dispatchd::sched
