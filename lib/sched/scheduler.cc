#include "lib/sched/scheduler.h"

#include <algorithm>
#include <cmath>
#include <tuple>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "lib/sched/scheduler_internal.h"
#include "lib/util/check.h"

namespace dispatchd::sched {

absl::string_view ToString(WaitReason reason) {
  switch (reason) {
    case WaitReason::kNone: return "none";
    case WaitReason::kNotBefore: return "not_before";
    case WaitReason::kTierCap: return "tier_cap";
    case WaitReason::kTypeCap: return "type_cap";
    case WaitReason::kConflict: return "conflict";
    case WaitReason::kRateLimit: return "rate_limit";
    case WaitReason::kTenantCap: return "tenant_cap";
    case WaitReason::kTenantRate: return "tenant_rate";
    case WaitReason::kNoWorker: return "no_worker";
    case WaitReason::kWorkersBusy: return "workers_busy";
    case WaitReason::kMemory: return "memory";
    case WaitReason::kVram: return "vram";
    case WaitReason::kAffinity: return "affinity";
    case WaitReason::kInLine: return "in_line";
  }
  return "unknown";
}

// ---------------------------------------------------------------------------------------------
// Internal state: see scheduler_internal.h.


namespace {

constexpr char kConflictSep = '\x1f';

}  // namespace


// ---------------------------------------------------------------------------------------------
// Configuration.

Scheduler::Scheduler(const config::Config& config, absl::Time now)
    : last_now_(now), next_housekeeping_(now) {
  ApplyConfig(config, now);
}

Scheduler::~Scheduler() = default;

void Scheduler::UpdateConfig(const config::Config& config, absl::Time now) {
  // Conflict groups may have changed: file every queued job again under the new rules.
  std::vector<Job*> queued;
  for (auto& [id, job] : jobs_) {
    if (job->where == Job::Where::kLane) queued.push_back(job.get());
  }
  for (Job* j : queued) RemoveFromLane(*j);
  weight_overrides_.clear();
  ApplyConfig(config, now);
  for (Job* j : queued) {
    j->conflict = ConflictKey(*j->type, j->resource);
    AddToLane(*j);
  }
}

void Scheduler::ApplyConfig(const config::Config& config, absl::Time now) {
  policy_ = config.scheduler.policy;
  alpha_ = config.scheduler.cost_alpha;
  key_ttl_ = config.scheduler.key_ttl;
  costs_.set_alpha(alpha_);
  const bool fifo = policy_ == "fifo";

  // Tiers are keyed by value: the value is the tier. The implicit tier (0) has no cap.
  for (auto& [value, tier] : tiers_) tier->types.clear();
  auto tier_for = [&](int value, absl::string_view name) -> TierState* {
    std::unique_ptr<TierState>& t = tiers_[value];
    if (t == nullptr) {
      t = std::make_unique<TierState>();
      t->priority = value;
      t->cap = value == 0 ? config::kUnlimited : value;
    }
    if (t->name.empty()) {
      t->name = std::string(name);
    } else if (!absl::StrContains(t->name, name)) {
      absl::StrAppend(&t->name, "+", name);
    }
    return t.get();
  };
  for (auto& [value, tier] : tiers_) tier->name.clear();
  TierState* implicit = tier_for(0, "default");

  absl::flat_hash_map<std::string, double> model_vram;
  absl::flat_hash_map<std::string, config::RateLimit> rates;
  for (const config::JobTypeConfig& t : config.types) {
    if (!t.model.empty() && t.vram_gb >= 0) model_vram[t.model] = t.vram_gb;
    if (t.rate.limited()) rates[t.rate_key()] = t.rate;
  }
  for (auto& [name, type] : types_) type->configured = false;
  for (const config::JobTypeConfig& t : config.types) {
    TypeState& type = TypeFor(t.name);
    type.cfg = t;
    type.configured = true;
    const config::TierConfig* tier = config.FindTier(t.tier);
    type.tier = (fifo || tier == nullptr) ? implicit : tier_for(tier->value, tier->name);
    type.tier->types.push_back(&type);
    type.model = nullptr;
    if (!t.model.empty()) {
      std::unique_ptr<ModelState>& m = models_[t.model];
      if (m == nullptr) {
        m = std::make_unique<ModelState>();
        m->name = t.model;
      }
      auto vram = model_vram.find(t.model);
      m->vram = vram == model_vram.end() ? 0 : vram->second;
      type.model = m.get();
    }
  }
  // Buckets: an operator's override wins until the next config.
  absl::flat_hash_set<std::string> rate_keys;
  for (const config::JobTypeConfig& t : config.types) rate_keys.insert(t.rate_key());
  absl::erase_if(rate_overrides_, [&](const auto& kv) { return !rate_keys.contains(kv.first); });
  for (const std::string& key : rate_keys) {
    config::RateLimit limit;
    if (auto it = rates.find(key); it != rates.end()) limit = it->second;
    if (auto it = rate_overrides_.find(key); it != rate_overrides_.end()) limit = it->second;
    if (!limit.limited()) {
      buckets_.erase(key);
    } else if (auto it = buckets_.find(key); it != buckets_.end()) {
      if (!(it->second->limit() == limit)) it->second->Reconfigure(limit, now);
    } else {
      buckets_[key] = std::make_unique<TokenBucket>(limit, now);
    }
  }
  absl::erase_if(buckets_, [&](const auto& kv) { return !rate_keys.contains(kv.first); });
  for (auto& [name, type] : types_) {
    auto it = type->configured ? buckets_.find(type->cfg.rate_key()) : buckets_.end();
    type->bucket = it == buckets_.end() ? nullptr : it->second.get();
  }

  tiers_desc_.clear();
  for (auto& [value, tier] : tiers_) {
    tier->queued = tier->running = 0;
    tiers_desc_.push_back(tier.get());
  }
  std::sort(tiers_desc_.begin(), tiers_desc_.end(),
            [](const TierState* a, const TierState* b) { return a->priority > b->priority; });
  for (auto& [name, type] : types_) {
    if (type->tier == nullptr || !type->configured) type->tier = implicit;
  }
  // Tenants: weights, quotas and buckets. A job's tenant is fixed when it is queued; a reload
  // that moves a principal to another tenant applies to its jobs queued after it.
  tenant_configs_.clear();
  tenant_of_principal_.clear();
  for (const config::TenantConfig& t : config.tenants) {
    tenant_configs_[t.name] = t;
    for (const std::string& p : t.principals) tenant_of_principal_[p] = t.name;
  }
  for (auto& [name, tenant] : tenants_) ApplyTenant(*tenant, now);
  // Lanes follow their type's tier. UpdateConfig has emptied every lane, so none is filed.
  for (auto& [value, tier] : tiers_) tier->tenants.clear();
  for (auto& [name, tenant] : tenants_) tenant->tiers.clear();
  for (auto& [name, key] : keys_) {
    key->tiers.clear();
    for (Lane* lane : key->lanes) TierKeyFor(*key, *lane->group->type->tier).lanes.push_back(lane);
  }
  // Recount tiers and models from the jobs: a type may have moved.
  for (auto& [name, m] : models_) m->queued = m->running = 0;
  for (auto& [id, job] : jobs_) {
    TypeState& t = *job->type;
    if (job->where == Job::Where::kPlaced) {
      ++t.tier->running;
      if (job->model != nullptr) ++job->model->running;
    } else {
      ++t.tier->queued;
      if (t.model != nullptr) ++t.model->queued;
    }
  }
}

bool Scheduler::SetRateLimit(const std::string& rate_key, config::RateLimit limit,
                             absl::Time now) {
  bool known = false;
  for (auto& [name, type] : types_) known |= type->configured && type->cfg.rate_key() == rate_key;
  if (!known) return false;
  rate_overrides_[rate_key] = limit;
  TokenBucket* bucket = nullptr;
  if (!limit.limited()) {
    buckets_.erase(rate_key);
  } else if (auto it = buckets_.find(rate_key); it != buckets_.end()) {
    it->second->Reconfigure(limit, now);
    bucket = it->second.get();
  } else {
    bucket = (buckets_[rate_key] = std::make_unique<TokenBucket>(limit, now)).get();
  }
  for (auto& [name, type] : types_) {
    if (type->configured && type->cfg.rate_key() == rate_key) type->bucket = bucket;
  }
  return true;
}

void Scheduler::SetCostEstimate(const std::string& type, const std::string& resource_id,
                                double cost, absl::Time now) {
  costs_.Set(type, resource_id, cost, now);
}

Scheduler::TypeState& Scheduler::TypeFor(const std::string& name) {
  std::unique_ptr<TypeState>& t = types_[name];
  if (t == nullptr) {
    t = std::make_unique<TypeState>();
    t->name = name;
    t->index = types_.size() - 1;
    t->cfg.name = name;
    for (auto& [id, w] : workers_) {
      w->serves.resize(types_.size(), false);
      w->serves[t->index] =
          std::find(w->spec.types.begin(), w->spec.types.end(), name) != w->spec.types.end();
    }
    if (auto implicit = tiers_.find(0); implicit != tiers_.end()) t->tier = implicit->second.get();
  }
  return *t;
}

Scheduler::Group& Scheduler::GroupFor(TypeState& type, const job::Labels& labels) {
  std::vector<std::pair<std::string, std::string>> sorted(labels.begin(), labels.end());
  std::sort(sorted.begin(), sorted.end());
  std::string sig = absl::StrJoin(sorted, "\x1f", absl::PairFormatter("="));
  for (auto& g : type.groups) {
    if (g->signature == sig) return *g;
  }
  auto g = std::make_unique<Group>();
  g->type = &type;
  g->index = next_group_index_++;
  g->labels = std::move(sorted);
  g->signature = std::move(sig);
  type.groups.push_back(std::move(g));
  return *type.groups.back();
}

Scheduler::Lane& Scheduler::LaneFor(Group& group, KeyState& key) {
  std::unique_ptr<Lane>& lane = group.lanes[&key];
  if (lane == nullptr) {
    lane = std::make_unique<Lane>();
    lane->group = &group;
    lane->key = &key;
    key.lanes.push_back(lane.get());
    TierKeyFor(key, *group.type->tier).lanes.push_back(lane.get());
  }
  return *lane;
}

// ---------------------------------------------------------------------------------------------
// Pending jobs.

void Scheduler::Enqueue(PendingJob p) {
  if (jobs_.contains(p.id)) return;
  auto owned = std::make_unique<Job>();
  Job& j = *owned;
  j.id = p.id;
  j.attempt = p.attempt;
  j.type = &TypeFor(p.type);
  j.resource = std::move(p.resource_id);
  j.conflict = ConflictKey(*j.type, j.resource);
  j.key = &KeyFor(TenantFor(p.owner), p.fairness_key);
  j.labels = std::move(p.labels);
  j.ord = Ord{p.arrival, next_seq_++};
  j.not_before = p.not_before;
  jobs_.emplace(j.id, std::move(owned));

  ++pending_count_;
  ++j.type->queued;
  ++j.type->tier->queued;
  if (j.type->model != nullptr) ++j.type->model->queued;
  CountPending(j, +1);
  if (j.not_before > last_now_) {
    j.where = Job::Where::kDelayed;
    delayed_.insert({j.not_before, &j});
  } else {
    AddToLane(j);
  }
}

bool Scheduler::RemovePending(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->where == Job::Where::kPlaced) return false;
  Job& j = *it->second;
  if (j.where == Job::Where::kDelayed) {
    delayed_.erase({j.not_before, &j});
  } else {
    RemoveFromLane(j);
  }
  --pending_count_;
  --j.type->queued;
  --j.type->tier->queued;
  if (j.type->model != nullptr) --j.type->model->queued;
  CountPending(j, -1);
  jobs_.erase(it);
  return true;
}

void Scheduler::PromoteDue(absl::Time now) {
  while (!delayed_.empty() && delayed_.begin()->first <= now) {
    Job* j = delayed_.begin()->second;
    delayed_.erase(delayed_.begin());
    AddToLane(*j);
  }
}

void Scheduler::AddToLane(Job& j) {
  Group& group = GroupFor(*j.type, j.labels);
  Lane& lane = LaneFor(group, *j.key);
  j.where = Job::Where::kLane;
  j.lane = &lane;
  ++lane.pending;
  if (j.conflict.empty()) {
    ReadyInsert(lane, j);
  } else {
    lane.by_conflict.insert({j.conflict, j.ord, &j});
    ++conflicts_pending_[j.conflict][&lane];
    if (!conflicts_running_.contains(j.conflict)) {
      // Only the head of each resource is ready: j replaces the old head if it arrived earlier.
      auto head = lane.by_conflict.lower_bound({j.conflict, Ord::Min(), nullptr});
      if (std::get<2>(*head) == &j) {
        auto next = std::next(head);
        if (next != lane.by_conflict.end() && std::get<0>(*next) == j.conflict &&
            std::get<2>(*next)->in_ready) {
          ReadyErase(lane, *std::get<2>(*next));
        }
        ReadyInsert(lane, j);
      }
    }
  }
  RefileLane(lane);
}

void Scheduler::RemoveFromLane(Job& j) {
  Lane& lane = *j.lane;
  if (j.conflict.empty()) {
    ReadyErase(lane, j);
  } else {
    bool was_ready = j.in_ready;
    if (was_ready) ReadyErase(lane, j);
    lane.by_conflict.erase({j.conflict, j.ord, &j});
    auto pending = conflicts_pending_.find(j.conflict);
    if (--pending->second[&lane] == 0) pending->second.erase(&lane);
    if (pending->second.empty()) conflicts_pending_.erase(pending);
    if (was_ready) {
      auto head = lane.by_conflict.lower_bound({j.conflict, Ord::Min(), nullptr});
      if (head != lane.by_conflict.end() && std::get<0>(*head) == j.conflict) {
        ReadyInsert(lane, *std::get<2>(*head));
      }
    }
  }
  --lane.pending;
  j.lane = nullptr;
  RefileLane(lane);
}

void Scheduler::ReadyInsert(Lane& lane, Job& j) {
  lane.ready.insert({j.ord, &j});
  j.in_ready = true;
  ++lane.group->ready;
}

void Scheduler::ReadyErase(Lane& lane, Job& j) {
  lane.ready.erase({j.ord, &j});
  j.in_ready = false;
  --lane.group->ready;
}

void Scheduler::RefileLane(Lane& lane) {
  Group& g = *lane.group;
  const bool ready = !lane.ready.empty();
  if (lane.filed && ready && lane.aged_head == lane.ready.begin()->first) return;  // same head
  // The lane's head is in its group's age order and its key's, and the key is in its tenant's
  // order in the tier while any of its lanes there has a ready job.
  TierState& tier = *g.type->tier;
  TierKey& tk = TierKeyFor(*lane.key, tier);
  if (lane.filed) {
    g.by_age.erase({lane.aged_head, &lane});
    tk.heads.erase({lane.aged_head, &lane});
  }
  if (lane.filed != ready) {
    TierTenant& tt = TierTenantFor(*lane.key->tenant, tier);
    if (tt.ready_by_group.size() <= g.index) tt.ready_by_group.resize(g.index + 1, 0);
    if (ready) {
      SetBit(tk.groups, g.index);
      if (tt.ready_by_group[g.index]++ == 0) SetBit(tt.groups, g.index);
    } else {
      ClearBit(tk.groups, g.index);
      if (--tt.ready_by_group[g.index] == 0) ClearBit(tt.groups, g.index);
    }
  }
  lane.filed = ready;
  if (ready) {
    lane.aged_head = lane.ready.begin()->first;
    g.by_age.insert({lane.aged_head, &lane});
    tk.heads.insert({lane.aged_head, &lane});
  }
  SyncKey(tier, *lane.key, tk);
}

Scheduler::Job* Scheduler::BestJob(TierState& tier, const GroupMask& groups, absl::Time now,
                                   bool floor_only) {
  // Tenants in (rank, cost) order, then their keys in cost order: the first with a ready job in
  // one of `groups` wins, except that tenants (and keys) of the very same place are compared by
  // their jobs' arrival, as the order says. Each order breaks ties by the oldest ready head, so
  // the walk stops at an equal place whose oldest head is younger than the best job found. A
  // tenant or key with no ready lane in `groups` is passed over in one mask test.
  Job* best = nullptr;
  std::pair<int, double> best_place;
  for (const auto& [rank, tenant_cost, tenant_head, tt] : tier.tenants) {
    if (floor_only && rank > 0) break;
    if (best != nullptr &&
        (std::make_pair(rank, tenant_cost) > best_place || !(tenant_head < best->ord))) {
      break;
    }
    const TenantState& tenant = *tt->tenant;
    if (!Intersects(tt->groups, groups) || tenant.capped()) continue;
    Job* in_tenant = nullptr;
    double in_cost = 0;
    for (const auto& [cost, key_head, tk] : tt->keys) {
      if (in_tenant != nullptr && (cost > in_cost || !(key_head < in_tenant->ord))) break;
      if (!Intersects(tk->groups, groups)) continue;
      // The key's lanes, oldest head first: the first that matches is the key's best.
      for (const auto& [head, lane] : tk->heads) {
        if (in_tenant != nullptr && !(head < in_tenant->ord)) break;
        if (!TestBit(groups, lane->group->index)) continue;
        if (!tenant.buckets.empty() && !TenantOpen(tenant, *lane->group->type, now)) continue;
        in_tenant = lane->ready.begin()->second;
        in_cost = cost;
        break;
      }
    }
    if (in_tenant != nullptr && (best == nullptr || in_tenant->ord < best->ord)) {
      best = in_tenant;
      best_place = {rank, tenant_cost};
    }
  }
  return best;
}

// ---------------------------------------------------------------------------------------------
// Workers.

void Scheduler::AddWorker(const WorkerSpec& spec) {
  int64_t rank;
  if (auto known = known_ranks_.find(spec.id); known != known_ranks_.end()) {
    rank = known->second;
  } else {
    rank = next_rank_++;
    known_ranks_.emplace(spec.id, rank);
  }
  std::unique_ptr<WorkerState>& slot = workers_[spec.id];
  bool fresh = slot == nullptr;
  if (fresh) slot = std::make_unique<WorkerState>();
  WorkerState& w = *slot;
  w.spec = spec;
  w.rank = rank;
  w.capacity = std::max(spec.slots, 0);
  w.draining = false;
  w.throttled = false;
  w.swap_to = nullptr;
  w.serves.assign(types_.size(), false);
  for (const std::string& t : spec.types) {
    if (auto it = types_.find(t); it != types_.end()) w.serves[it->second->index] = true;
  }
  by_rank_.insert({rank, &w});
  SetResidentModels(spec.id, spec.models_resident);
  if (fresh) {
    // Jobs adopted before this worker connected (a daemon restart) now count on it.
    for (auto& [id, job] : jobs_) {
      if (job->where != Job::Where::kPlaced || job->worker != nullptr || job->worker_id != spec.id) {
        continue;
      }
      Attach(*job, w);
    }
  }
  UpdateAvailable(w);
}

std::vector<std::string> Scheduler::RemoveWorker(const std::string& worker_id) {
  std::vector<std::string> orphans;
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return orphans;
  WorkerState& w = *it->second;
  for (Job* j : w.jobs) orphans.push_back(j->id);
  std::sort(orphans.begin(), orphans.end());
  for (const std::string& id : orphans) {
    auto job = jobs_.find(id);
    // The attempt is lost: its key pays for the time it held the slot, no more.
    Settle(*job->second, absl::ToDoubleSeconds(last_now_ - job->second->placed_at));
    Unplace(*job->second);
    jobs_.erase(job);
  }
  available_.erase({w.rank, &w});
  by_rank_.erase({w.rank, &w});
  workers_.erase(it);
  return orphans;
}

std::vector<std::string> Scheduler::JobsOn(const std::string& worker_id) const {
  std::vector<std::string> ids;
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return ids;
  for (const Job* j : it->second->jobs) ids.push_back(j->id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

void Scheduler::SetDraining(const std::string& worker_id, bool draining) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) {
    it->second->draining = draining;
    UpdateAvailable(*it->second);
  }
}

void Scheduler::SetResidentModels(const std::string& worker_id,
                                  const std::vector<std::string>& models) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return;
  WorkerState& w = *it->second;
  w.resident.clear();
  for (const std::string& name : models) {
    std::unique_ptr<ModelState>& m = models_[name];
    if (m == nullptr) {
      m = std::make_unique<ModelState>();
      m->name = name;
    }
    w.resident.insert(m.get());
  }
  // A model in use is loaded whatever the report says (the report may predate the load).
  for (const auto& [model, n] : w.in_use) w.resident.insert(model);
}

void Scheduler::Heartbeat(const std::string& worker_id) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) {
    it->second->capacity = std::max(it->second->spec.slots, 0);
    UpdateAvailable(*it->second);
  }
}

void Scheduler::SetThrottled(const std::string& worker_id, bool throttled) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) {
    it->second->throttled = throttled;
    UpdateAvailable(*it->second);
  }
}

void Scheduler::UpdateAvailable(WorkerState& w) {
  if (!w.draining && !w.throttled && w.busy < w.capacity) {
    available_.insert({w.rank, &w});
  } else {
    available_.erase({w.rank, &w});
  }
}

bool Scheduler::ServesAndMatches(const WorkerState& w, const Group& g) const {
  const TypeState& t = *g.type;
  if (t.index >= w.serves.size() || !w.serves[t.index]) return false;
  for (const auto& [key, value] : g.labels) {
    auto it = w.spec.labels.find(key);
    if (it == w.spec.labels.end() || it->second != value) return false;
  }
  // A model bigger than the worker's whole VRAM never fits there.
  return t.model == nullptr || w.spec.vram_gb < 0 || t.model->vram <= w.spec.vram_gb;
}

bool Scheduler::Resident(const WorkerState& w, const ModelState* model) const {
  return model == nullptr || w.resident.contains(const_cast<ModelState*>(model));
}

bool Scheduler::Fits(const WorkerState& w, const ModelState* model) const {
  if (model == nullptr || w.spec.vram_gb < 0) return true;
  if (w.resident.contains(const_cast<ModelState*>(model))) return true;
  return w.vram_in_use + model->vram <= w.spec.vram_gb + 1e-9;
}

bool Scheduler::Starved(const Group& g, absl::Time now) const {
  const ModelState* m = g.type->model;
  if (m == nullptr || g.by_age.empty()) return false;
  return now - g.by_age.begin()->first.arrival > g.type->cfg.max_affinity_wait;
}

bool Scheduler::GroupOpen(const Group& g, absl::Time now) const {
  const TypeState& t = *g.type;
  return g.ready > 0 && t.configured && t.running < t.cfg.max_concurrency &&
         t.tier->running < t.tier->cap && (t.bucket == nullptr || t.bucket->Ready(now));
}

void Scheduler::LoadModel(WorkerState& w, ModelState* model) {
  ++w.loads;
  if (w.spec.vram_gb >= 0) {
    // Evict idle models, by name for determinism, until the new one fits beside the rest.
    double resident_vram = 0;
    for (ModelState* m : w.resident) resident_vram += m->vram;
    std::vector<ModelState*> idle;
    for (ModelState* m : w.resident) {
      if (!w.in_use.contains(m)) idle.push_back(m);
    }
    std::sort(idle.begin(), idle.end(),
              [](const ModelState* a, const ModelState* b) { return a->name < b->name; });
    for (ModelState* m : idle) {
      if (resident_vram + model->vram <= w.spec.vram_gb + 1e-9) break;
      resident_vram -= m->vram;
      w.resident.erase(m);
    }
  }
  w.resident.insert(model);
}

// ---------------------------------------------------------------------------------------------
// Decisions.

std::vector<Dispatch> Scheduler::Decide(absl::Time now, size_t limit) {
  last_now_ = now;
  if (now >= next_housekeeping_) Housekeep(now);
  PromoteDue(now);
  std::vector<Dispatch> out;
  // A worker that found nothing keeps finding nothing within one call: placements only take
  // capacity, tokens and resources away.
  absl::flat_hash_set<WorkerState*> done;
  while (out.size() < limit && pending_count_ > 0) {
    WorkerState* w = nullptr;
    for (const auto& [rank, candidate] : available_) {
      if (!done.contains(candidate)) {
        w = candidate;
        break;
      }
    }
    if (w == nullptr) break;
    Choice c = policy_ == "fifo" ? ChooseFifo(*w, now) : ChooseFor(*w, now);
    if (c.job == nullptr) {
      done.insert(w);
      continue;
    }
    if (c.loads) {
      // A free worker that has the model loaded beats rank: no load needed there.
      for (const auto& [rank, other] : available_) {
        if (other != w && Resident(*other, c.job->type->model) &&
            ServesAndMatches(*other, *c.job->lane->group)) {
          w = other;
          c.loads = false;
          break;
        }
      }
    }
    out.push_back(Dispatch{.job_id = c.job->id,
                           .attempt = c.job->attempt,
                           .worker_id = w->spec.id,
                           .model = c.job->type->model ? c.job->type->model->name : "",
                           .loads_model = c.loads});
    Place(*c.job, w, now, c.loads);
    out.back().cost = c.job->charged;
    out.back().key_cost = c.job->key->cost;
  }
  return out;
}

Scheduler::Choice Scheduler::ChooseFor(WorkerState& w, absl::Time now) {
  if (w.swap_to != nullptr) {
    // Reserved for a starved model: take it once the models in use drain enough to fit.
    ModelState* target = w.swap_to;
    Lane* oldest = nullptr;
    for (TierState* tier : tiers_desc_) {
      for (TypeState* t : tier->types) {
        if (t->model != target) continue;
        for (auto& g : t->groups) {
          if (!GroupOpen(*g, now) || !ServesAndMatches(w, *g) || !Starved(*g, now)) continue;
          Lane* lane = FirstOpenLane(*g, now);
          if (lane != nullptr && (oldest == nullptr || lane->aged_head < oldest->aged_head)) {
            oldest = lane;
          }
        }
      }
    }
    if (oldest == nullptr) {
      w.swap_to = nullptr;  // served elsewhere meanwhile, or nothing left
    } else if (!Fits(w, target)) {
      return {};
    } else {
      return {oldest->ready.begin()->second, !Resident(w, target)};
    }
  }

  struct LoadCandidate {
    ModelState* model;
    int64_t depth;
  };
  std::vector<LoadCandidate> loads;
  GroupMask resident_groups, load_groups;
  ++stamp_;  // forget every group's fit from earlier decisions
  for (TierState* tier : tiers_desc_) {
    if (tier->running >= tier->cap || tier->queued == 0 || tier->tenants.empty()) continue;
    bool any_resident = false;
    Job* starved = nullptr;  // the overdue job, of a model to load, whose key has used least
    loads.clear();
    resident_groups.assign(resident_groups.size(), 0);
    load_groups.assign(load_groups.size(), 0);
    for (TypeState* t : tier->types) {
      if (t->queued == 0 || !t->configured || t->running >= t->cfg.max_concurrency) continue;
      if (t->index >= w.serves.size() || !w.serves[t->index]) continue;
      if (t->bucket != nullptr && !t->bucket->Ready(now)) continue;
      for (auto& owned : t->groups) {
        Group* g = owned.get();
        g->stamp = stamp_;
        g->fit = Fit::kNo;
        if (g->ready == 0 || !ServesAndMatches(w, *g)) continue;
        if (Resident(w, t->model)) {
          g->fit = Fit::kResident;
          SetBit(resident_groups, g->index);
          any_resident = true;
          continue;
        }
        // Of the overdue lanes (the front of by_age), the one owed most service.
        for (const auto& [head, lane] : g->by_age) {
          if (now - head.arrival <= t->cfg.max_affinity_wait) break;
          if (!TenantOpen(*lane->key->tenant, *t, now)) continue;
          Job* j = lane->ready.begin()->second;
          if (starved == nullptr || Before(*j, *starved)) starved = j;
        }
        if (!Fits(w, t->model)) continue;
        g->fit = Fit::kLoad;
        SetBit(load_groups, g->index);
        auto it = std::find_if(loads.begin(), loads.end(),
                               [&](const LoadCandidate& c) { return c.model == t->model; });
        if (it == loads.end()) {
          loads.push_back({t->model, g->ready});
        } else {
          it->depth += g->ready;
        }
      }
    }
    Job* resident = any_resident ? BestJob(*tier, resident_groups, now) : nullptr;
    // A tenant below its floor is served first, with a model load if the worker has none of its
    // work resident.
    if (resident == nullptr || resident->key->tenant->rank() > 0) {
      if (Job* floor = BestJob(*tier, load_groups, now, /*floor_only=*/true)) {
        return {floor, true};
      }
    }
    // An overdue job of another model takes the worker only if its tenant (or, in the same
    // tenant, its key) is owed service more than the one the worker would serve instead, here
    // or with the load it would choose: one client's backlog of many models never makes the
    // worker thrash, but a lighter client never waits much past max_affinity_wait.
    auto take_starved = [&]() -> Choice {
      ModelState* m = starved->type->model;
      if (!Fits(w, m)) {
        w.swap_to = m;  // stop feeding the models in use so that they drain
        return {};
      }
      return {starved, true};
    };
    if (resident != nullptr) {
      if (starved != nullptr && Before(*starved, *resident, /*strict_cost=*/true)) {
        return take_starved();
      }
      return {resident, false};
    }
    Job* pick = nullptr;
    if (!loads.empty()) {
      // Load a model no other worker holds if one waits: it needs a load whoever takes it, where
      // a second worker on a model one worker is serving costs a load the mix did not need
      // (and strands the unserved model's jobs until a worker is free for it). Among those, or
      // if every model is held, the deepest queue, counting each queue per worker that has the
      // model loaded, so that two workers freed at once load two different deep models. Ties
      // go by order.
      struct Counted {
        LoadCandidate c;
        int64_t serving;
      };
      std::vector<Counted> counted;
      for (const LoadCandidate& c : loads) {
        int64_t serving = 1;
        for (const auto& [rank, other] : by_rank_) serving += other != &w && Resident(*other, c.model);
        counted.push_back({{c.model, c.depth / serving}, serving});
      }
      for (const bool unserved_only : {true, false}) {
        int64_t depth = 0;
        for (const auto& [c, serving] : counted) {
          if ((unserved_only && serving > 1) || c.depth < depth) continue;
          GroupMask of_model;
          for (TypeState* t : tier->types) {
            if (t->model != c.model) continue;
            for (auto& g : t->groups) {
              if (g->stamp == stamp_ && g->fit == Fit::kLoad) SetBit(of_model, g->index);
            }
          }
          Job* j = BestJob(*tier, of_model, now);
          if (j == nullptr) continue;
          if (pick == nullptr || c.depth > depth || Before(*j, *pick)) {
            pick = j;
            depth = c.depth;
          }
        }
        if (pick != nullptr) break;
      }
    }
    if (starved != nullptr && (pick == nullptr || Before(*starved, *pick, /*strict_cost=*/true))) {
      return take_starved();
    }
    if (pick != nullptr) return {pick, true};
  }
  return {};
}

Scheduler::Choice Scheduler::ChooseFifo(WorkerState& w, absl::Time now) {
  // Tenants' quotas hold here too; their weights and floors do not.
  Lane* oldest = nullptr;
  for (TierState* tier : tiers_desc_) {
    if (tier->running >= tier->cap || tier->queued == 0) continue;
    for (TypeState* t : tier->types) {
      if (t->index >= w.serves.size() || !w.serves[t->index]) continue;
      for (auto& g : t->groups) {
        if (!GroupOpen(*g, now) || !ServesAndMatches(w, *g) || !Fits(w, t->model)) continue;
        Lane* lane = FirstOpenLane(*g, now);
        if (lane != nullptr && (oldest == nullptr || lane->aged_head < oldest->aged_head)) {
          oldest = lane;
        }
      }
    }
  }
  if (oldest == nullptr) return {};
  return {oldest->ready.begin()->second, !Resident(w, oldest->group->type->model)};
}

void Scheduler::Place(Job& j, WorkerState* w, absl::Time now, bool loads_model) {
  TypeState& t = *j.type;
  // Charge the key before refiling, so that the lane files at its new cost.
  Charge(j, now);
  RemoveFromLane(j);
  --pending_count_;
  --t.queued;
  --t.tier->queued;
  // Pending to placed: the key and its tenant stay active throughout.
  --j.key->pending;
  --j.key->tenant->pending;
  --j.key->pending_by_type[&t];
  if (t.model != nullptr) --t.model->queued;
  Occupy(j, w->spec.id);
  if (t.bucket != nullptr) {
    bool took = t.bucket->TryTake(now);
    DISPATCHD_CHECK(took, "placed a job whose bucket was empty");
  }
  if (auto b = j.key->tenant->buckets.find(t.cfg.rate_key()); b != j.key->tenant->buckets.end()) {
    bool took = b->second->TryTake(now);
    DISPATCHD_CHECK(took, "placed a job whose tenant's bucket was empty");
  }
  CountStart(t, now);
  if (t.model != nullptr) {
    t.model->last_served = now;
    if (loads_model) LoadModel(*w, t.model);
    if (w->swap_to == t.model) w->swap_to = nullptr;
  }
  Attach(j, *w);
}

void Scheduler::Occupy(Job& j, const std::string& worker_id) {
  TypeState& t = *j.type;
  ++placed_count_;
  CountPlaced(j, +1);
  j.where = Job::Where::kPlaced;
  j.worker_id = worker_id;
  j.model = t.model;
  ++t.running;
  ++t.tier->running;
  if (t.model != nullptr) ++t.model->running;
  if (!j.conflict.empty() && conflicts_running_[j.conflict]++ == 0) {
    SetConflictBusy(j.conflict, true);
  }
}

void Scheduler::Attach(Job& j, WorkerState& w) {
  j.worker = &w;
  w.jobs.insert(&j);
  ++w.busy;
  if (j.model != nullptr) {
    if (w.in_use[j.model]++ == 0) w.vram_in_use += j.model->vram;
    w.resident.insert(j.model);
  }
  UpdateAvailable(w);
}

std::string Scheduler::ConflictKey(const TypeState& type, const std::string& resource) {
  const std::string& group = type.cfg.conflict_group;
  if (group.empty() || resource.empty()) return "";
  return absl::StrCat(group, std::string(1, kConflictSep), resource);
}

void Scheduler::Unplace(Job& j) {
  TypeState& t = *j.type;
  --placed_count_;
  --t.running;
  --t.tier->running;
  DISPATCHD_CHECK(t.running >= 0 && t.tier->running >= 0, "running count below zero");
  if (j.model != nullptr) --j.model->running;
  if (!j.conflict.empty()) {
    auto it = conflicts_running_.find(j.conflict);
    if (--it->second == 0) {
      conflicts_running_.erase(it);
      SetConflictBusy(j.conflict, false);
    }
  }
  if (WorkerState* w = j.worker; w != nullptr) {
    w->jobs.erase(&j);
    --w->busy;
    DISPATCHD_CHECK(w->busy >= 0, "worker busy count below zero");
    if (j.model != nullptr) {
      auto it = w->in_use.find(j.model);
      if (--it->second == 0) {
        w->in_use.erase(it);
        w->vram_in_use -= j.model->vram;
      }
    }
    UpdateAvailable(*w);
  }
  CountPlaced(j, -1);
}

void Scheduler::SetConflictBusy(const std::string& conflict, bool busy) {
  auto it = conflicts_pending_.find(conflict);
  if (it == conflicts_pending_.end()) return;
  for (const auto& [lane, n] : it->second) {
    auto head = lane->by_conflict.lower_bound({conflict, Ord::Min(), nullptr});
    Job& j = *std::get<2>(*head);
    if (busy && j.in_ready) ReadyErase(*lane, j);
    if (!busy && !j.in_ready) ReadyInsert(*lane, j);
    RefileLane(*lane);
  }
}

void Scheduler::Adopt(const PlacedJob& p) {
  if (auto it = jobs_.find(p.id); it != jobs_.end()) {
    if (it->second->where == Job::Where::kPlaced) {
      Settle(*it->second, absl::ToDoubleSeconds(last_now_ - it->second->placed_at));
      Unplace(*it->second);
      jobs_.erase(it);
    } else {
      RemovePending(p.id);
    }
  }
  auto owned = std::make_unique<Job>();
  Job& j = *owned;
  j.id = p.id;
  j.type = &TypeFor(p.type);
  j.resource = p.resource_id;
  j.conflict = ConflictKey(*j.type, j.resource);
  j.key = &KeyFor(TenantFor(p.owner), p.fairness_key);
  j.ord = Ord{last_now_, next_seq_++};
  jobs_.emplace(j.id, std::move(owned));
  if (j.key->placed == 0 && j.key->pending == 0) ActivateKey(*j.key);
  Charge(j, last_now_);
  Occupy(j, p.worker_id);
  if (auto w = workers_.find(p.worker_id); w != workers_.end()) Attach(j, *w->second);
}

void Scheduler::Retract(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->where != Job::Where::kPlaced) return;
  Job& j = *it->second;
  // The job did not run: give its cost back.
  Settle(j, 0);
  Unplace(j);
  jobs_.erase(it);
}

void Scheduler::Refused(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->where != Job::Where::kPlaced) return;
  WorkerState* w = it->second->worker;
  Retract(job_id);
  if (w != nullptr) {
    // The worker is the authority on its capacity: believe it holds all it can take.
    w->capacity = std::min(w->capacity, w->busy);
    UpdateAvailable(*w);
  }
}

void Scheduler::Finished(const std::string& job_id, absl::Time now,
                         std::optional<absl::Duration> ran) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->where != Job::Where::kPlaced) return;
  Job& j = *it->second;
  if (ran.has_value()) {
    costs_.Observe(j.type->name, j.resource, *ran, j.type->cfg.default_cost, now);
  }
  // Honest cost: the charge becomes what the attempt used, its reported wall time or, for one
  // that did not run to an outcome (cancelled, timed out), the time it held its slot.
  const absl::Duration used = ran.has_value() ? *ran : now - j.placed_at;
  Settle(j, absl::ToDoubleSeconds(used));
  Unplace(j);
  jobs_.erase(it);
}

void Scheduler::Housekeep(absl::Time now) {
  next_housekeeping_ = now + std::min(key_ttl_ / 4, absl::Minutes(1));
  costs_.Expire(now, key_ttl_);
  std::vector<std::string> idle;
  for (const auto& [name, key] : keys_) {
    if (key->pending == 0 && key->placed == 0 && key->idle_since + key_ttl_ < now) {
      idle.push_back(name);
    }
  }
  for (const std::string& name : idle) {
    KeyState* key = keys_.at(name).get();
    for (Lane* lane : key->lanes) lane->group->lanes.erase(key);
    for (auto& [tier, tk] : key->tiers) {
      auto tt = key->tenant->tiers.find(tier);
      if (!tk->filed || tt == key->tenant->tiers.end()) continue;
      tt->second->keys.erase({tk->filed_cost, tk->filed_head, tk.get()});
      tt->second->heads.erase({tk->filed_head, key});
      SyncTenant(*tier, *key->tenant, *tt->second);
    }
    --key->tenant->keys;
    std::vector<KeyState*>& same_name = keys_by_name_[key->name];
    same_name.erase(std::find(same_name.begin(), same_name.end(), key));
    if (same_name.empty()) keys_by_name_.erase(key->name);
    keys_.erase(name);
  }
  // A tenant is forgotten with its last key; back, it starts at the virtual time.
  absl::erase_if(tenants_, [&](const auto& kv) {
    const TenantState& t = *kv.second;
    return t.keys == 0 && t.pending == 0 && t.placed == 0 && t.idle_since + key_ttl_ < now;
  });
}

// ---------------------------------------------------------------------------------------------
// Introspection.

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
    info.reason = conflicts_running_.contains(j.conflict) ? WaitReason::kConflict
                                                          : WaitReason::kInLine;
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
  absl::flat_hash_map<const TypeState*, WaitReason> heads;
  for (const TypeState* t : types) {
    heads[t] = head_of(*t);
    s.types.push_back({t->name, t->queued, t->running, heads[t]});
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
    for (const auto& [rank, w] : by_rank_) out.resident_on += w->resident.contains(m.get());
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
    if (out.name == ts.name) out.queued += n;
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
  absl::flat_hash_map<const KeyState*, absl::flat_hash_map<const TypeState*, int64_t>>
      key_types;
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
  for (auto& [name, m] : models_) {
    Counts c = models[m.get()];
    check(m->running, c.running, "model " + name, "running", "jobs placed");
    check(m->queued, c.queued, "model " + name, "queued", "jobs pending");
  }
  for (auto& [name, k] : keys_) {
    Counts c = keys[k.get()];
    check(k->placed, c.running, "key \"" + name + "\"", "placed", "jobs placed");
    check(k->pending, c.queued, "key \"" + name + "\"", "pending", "jobs pending");
    absl::flat_hash_map<const TypeState*, int64_t>& by_type = key_types[k.get()];
    for (auto& [type, n] : k->pending_by_type) {
      check(n, by_type[type], "key \"" + name + "\" type " + type->name, "pending",
            "jobs pending");
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
      drifts.push_back(absl::StrCat(what, ": vram_in_use ", w->vram_in_use, ", its jobs' models ",
                                    vram));
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
    drifts.push_back(absl::StrCat("conflict ", absl::CHexEscape(key), ": running ", n,
                                  ", jobs placed ", want));
    if (want == 0) toggles.push_back({key, false});
  }
  for (const auto& [key, n] : conflicts) {
    if (conflicts_running_.contains(key)) continue;
    drifts.push_back(absl::StrCat("conflict ", absl::CHexEscape(key), ": running 0, jobs placed ",
                                  n));
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

}  // namespace dispatchd::sched
