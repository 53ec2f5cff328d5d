// The scheduler's configuration: job types and the tiers, models, rate-limit buckets and tenants
// they name, applied at construction and again on each reload, and the operator's overrides that
// last until the next reload.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"

namespace dispatchd::sched {

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
  policy_ = &PolicyNamed(config.scheduler.policy);
  alpha_ = config.scheduler.cost_alpha;
  key_ttl_ = config.scheduler.key_ttl;
  costs_.set_alpha(alpha_);

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
    type.tier = (!policy_->tiers || tier == nullptr) ? implicit : tier_for(tier->value, tier->name);
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

bool Scheduler::SetRateLimit(const std::string& rate_key, config::RateLimit limit, absl::Time now) {
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

}  // namespace dispatchd::sched
