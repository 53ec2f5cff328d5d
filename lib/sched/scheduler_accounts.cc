// The scheduler's accounts: tenants and fairness keys, what each has been charged, and where each
// stands in its tiers' orders. Two levels of start-time fair queuing: tenants by their cost
// divided by their weight, then the keys inside a tenant by their own cost. A job is charged its
// estimated cost when it is placed, and the charge is corrected to what it used when it ends.
// Keys, tenants and cost estimates idle longer than the key TTL are forgotten (Housekeep).

#include <algorithm>
#include <tuple>

#include "absl/strings/str_cat.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"

namespace dispatchd::sched {
namespace {

constexpr char kKeySep = '\x1f';

}  // namespace

Scheduler::TenantState& Scheduler::TenantFor(const std::string& owner) {
  auto named = tenant_of_principal_.find(owner);
  const std::string& name = named == tenant_of_principal_.end() ? owner : named->second;
  std::unique_ptr<TenantState>& t = tenants_[name];
  if (t == nullptr) {
    t = std::make_unique<TenantState>();
    t->name = name;
    ApplyTenant(*t, last_now_);
    // A tenant new to the scheduler starts at the virtual time: it is owed nothing yet.
    t->cost = VirtualTime();
  }
  return *t;
}

void Scheduler::ApplyTenant(TenantState& t, absl::Time now) {
  auto cfg = tenant_configs_.find(t.name);
  const config::TenantConfig defaults;
  const config::TenantConfig& c = cfg == tenant_configs_.end() ? defaults : cfg->second;
  auto weight = weight_overrides_.find(t.name);
  t.weight = weight == weight_overrides_.end() ? c.weight : weight->second;
  t.max_running = c.max_running;
  t.min_running = c.min_running;
  absl::flat_hash_map<std::string, std::unique_ptr<TokenBucket>> buckets;
  for (const config::TenantRate& r : c.rates) {
    auto old = t.buckets.find(r.model);
    if (old != t.buckets.end()) {
      // Keep the tokens it holds, as the model buckets do.
      if (!(old->second->limit() == r.rate)) old->second->Reconfigure(r.rate, now);
      buckets[r.model] = std::move(old->second);
    } else {
      buckets[r.model] = std::make_unique<TokenBucket>(r.rate, now);
    }
  }
  t.buckets = std::move(buckets);
  RefileTenant(t);
}

bool Scheduler::SetTenantWeight(const std::string& tenant, double weight, absl::Time now) {
  if (!(weight >= 0.001 && weight <= 1e6)) return false;
  weight_overrides_[tenant] = weight;
  if (auto it = tenants_.find(tenant); it != tenants_.end()) ApplyTenant(*it->second, now);
  return true;
}

Scheduler::KeyState& Scheduler::KeyFor(TenantState& tenant, const std::string& name) {
  std::unique_ptr<KeyState>& k = keys_[absl::StrCat(tenant.name, std::string(1, kKeySep), name)];
  if (k == nullptr) {
    k = std::make_unique<KeyState>();
    k->name = name;
    k->tenant = &tenant;
    ++tenant.keys;
    keys_by_name_[name].push_back(k.get());
  }
  return *k;
}

Scheduler::TierKey& Scheduler::TierKeyFor(KeyState& key, TierState& tier) {
  std::unique_ptr<TierKey>& tk = key.tiers[&tier];
  if (tk == nullptr) {
    tk = std::make_unique<TierKey>();
    tk->key = &key;
  }
  return *tk;
}

Scheduler::TierTenant& Scheduler::TierTenantFor(TenantState& tenant, TierState& tier) {
  std::unique_ptr<TierTenant>& tt = tenant.tiers[&tier];
  if (tt == nullptr) {
    tt = std::make_unique<TierTenant>();
    tt->tenant = &tenant;
  }
  return *tt;
}

void Scheduler::SyncKey(TierState& tier, KeyState& key, TierKey& tk) {
  TenantState& tenant = *key.tenant;
  TierTenant& tt = TierTenantFor(tenant, tier);
  const bool ready = !tk.heads.empty();
  const Ord head = ready ? tk.heads.begin()->first : Ord{};
  const bool same_head = tk.filed && ready && tk.filed_head == head;
  if (same_head && tk.filed_cost == key.cost) return;
  if (tk.filed) {
    tt.keys.erase({tk.filed_cost, tk.filed_head, &tk});
    if (!same_head) tt.heads.erase({tk.filed_head, &key});
  }
  tk.filed = ready;
  if (ready) {
    tk.filed_cost = key.cost;
    tk.filed_head = head;
    tt.keys.insert({tk.filed_cost, tk.filed_head, &tk});
    if (!same_head) tt.heads.insert({tk.filed_head, &key});
  }
  SyncTenant(tier, tenant, tt);
}

void Scheduler::SyncTenant(TierState& tier, TenantState& tenant, TierTenant& tt) {
  const bool ready = !tt.heads.empty();
  const int rank = tenant.rank();
  if (tt.filed) {
    if (ready && tt.filed_rank == rank && tt.filed_cost == tenant.cost &&
        tt.filed_head == tt.heads.begin()->first) {
      return;
    }
    tier.tenants.erase({tt.filed_rank, tt.filed_cost, tt.filed_head, &tt});
  }
  tt.filed = ready;
  if (ready) {
    tt.filed_rank = rank;
    tt.filed_cost = tenant.cost;
    tt.filed_head = tt.heads.begin()->first;
    tier.tenants.insert({tt.filed_rank, tt.filed_cost, tt.filed_head, &tt});
  }
}

void Scheduler::RefileKey(KeyState& key) {
  for (auto& [tier, tk] : key.tiers) {
    if (tk->filed && tk->filed_cost != key.cost) SyncKey(*tier, key, *tk);
  }
}

void Scheduler::RefileTenant(TenantState& tenant) {
  const int rank = tenant.rank();
  for (auto& [tier, tt] : tenant.tiers) {
    if (tt->filed && (tt->filed_rank != rank || tt->filed_cost != tenant.cost)) {
      SyncTenant(*tier, tenant, *tt);
    }
  }
}

void Scheduler::ActivateKey(KeyState& key) {
  // A key back from idle starts at its tenant's key virtual time, and a tenant back from idle
  // at the tenants' virtual time: no credit banked while away, at either level.
  TenantState& tenant = *key.tenant;
  if (!key.active) {
    key.active = true;
    ++tenant.active_keys;
  }
  if (tenant.pending == 0 && tenant.placed == 0 && tenant.cost < VirtualTime()) {
    tenant.cost = VirtualTime();
    tenant.changed = true;
    RefileTenant(tenant);
  }
  if (key.cost < KeyVirtualTime(tenant)) {
    key.cost = KeyVirtualTime(tenant);
    key.changed = true;
    RefileKey(key);
  }
}

void Scheduler::DeactivateKey(KeyState& key) {
  key.idle_since = last_now_;
  if (key.active) {
    key.active = false;
    --key.tenant->active_keys;
  }
  if (key.tenant->pending == 0 && key.tenant->placed == 0) key.tenant->idle_since = last_now_;
}

void Scheduler::CountPending(Job& j, int delta) {
  KeyState& key = *j.key;
  if (delta > 0 && key.pending == 0 && key.placed == 0) ActivateKey(key);
  key.pending += delta;
  key.tenant->pending += delta;
  key.pending_by_type[j.type] += delta;
  if (delta < 0 && key.pending == 0 && key.placed == 0) DeactivateKey(key);
}

void Scheduler::CountPlaced(Job& j, int delta) {
  KeyState& key = *j.key;
  TenantState& tenant = *key.tenant;
  if (delta > 0 && key.pending == 0 && key.placed == 0) ActivateKey(key);
  key.placed += delta;
  tenant.placed += delta;
  if (tenant.min_running > 0) RefileTenant(tenant);
  if (delta < 0 && key.pending == 0 && key.placed == 0) DeactivateKey(key);
}

double Scheduler::VirtualTime() const {
  return start_tags_.empty() ? last_virtual_time_ : *start_tags_.begin();
}

double Scheduler::KeyVirtualTime(const TenantState& tenant) {
  return tenant.key_tags.empty() ? tenant.last_key_time : *tenant.key_tags.begin();
}

void Scheduler::Charge(Job& j, absl::Time now) {
  KeyState& key = *j.key;
  TenantState& tenant = *key.tenant;
  j.charged = costs_.Estimate(j.type->name, j.resource, j.type->cfg.default_cost, now);
  j.placed_at = now;
  j.start_tag = tenant.cost;
  j.key_tag = key.cost;
  j.tenant_charged = j.charged / tenant.weight;
  tenant.cost += j.tenant_charged;
  tenant.in_service += j.tenant_charged;
  key.cost += j.charged;
  key.in_service += j.charged;
  start_tags_.insert(j.start_tag);
  last_virtual_time_ = *start_tags_.begin();
  tenant.key_tags.insert(j.key_tag);
  tenant.last_key_time = *tenant.key_tags.begin();
}

void Scheduler::Settle(Job& j, double used) {
  // Takes the job's tags out of service and corrects its charge to what it used.
  if (auto tag = start_tags_.find(j.start_tag); tag != start_tags_.end()) start_tags_.erase(tag);
  KeyState& key = *j.key;
  TenantState& tenant = *key.tenant;
  if (auto tag = tenant.key_tags.find(j.key_tag); tag != tenant.key_tags.end()) {
    tenant.key_tags.erase(tag);
  }
  key.in_service -= j.charged;
  tenant.in_service -= j.tenant_charged;
  key.changed = tenant.changed = true;
  // The tenant's correction is at the weight the job was charged at.
  const double per_cost = j.charged > 0 ? j.tenant_charged / j.charged : 1 / tenant.weight;
  const double delta = std::max(used, 0.0) - j.charged;
  if (delta == 0) return;
  key.cost += delta;
  tenant.cost += delta * per_cost;
  RefileKey(key);
  RefileTenant(tenant);
}

FairAccounts Scheduler::TakeAccounts(bool all) {
  FairAccounts out;
  out.virtual_time = VirtualTime();
  for (auto& [name, t] : tenants_) {
    if (t->changed || all) out.accounts.push_back({t->name, "", t->cost - t->in_service});
    t->changed = false;
  }
  for (auto& [id, k] : keys_) {
    if (k->changed || all) {
      out.accounts.push_back({k->tenant->name, k->name, k->cost - k->in_service});
    }
    k->changed = false;
  }
  costs_.TakeChanged(all, [&](const std::string& type, const std::string& resource, double cost) {
    out.estimates.push_back({type, resource, cost});
  });
  return out;
}

void Scheduler::RestoreAccounts(const FairAccounts& accounts, absl::Time now) {
  last_virtual_time_ = std::max(last_virtual_time_, accounts.virtual_time);
  for (const FairAccounts::Account& a : accounts.accounts) {
    if (!a.key.empty()) continue;
    std::unique_ptr<TenantState>& t = tenants_[a.tenant];
    if (t == nullptr) {
      t = std::make_unique<TenantState>();
      t->name = a.tenant;
      ApplyTenant(*t, now);
    }
    t->cost = a.cost;
    t->idle_since = now;
  }
  for (const FairAccounts::Account& a : accounts.accounts) {
    if (a.key.empty()) continue;
    auto t = tenants_.find(a.tenant);
    if (t == tenants_.end()) continue;  // a key without its tenant's account: starts afresh
    KeyState& k = KeyFor(*t->second, a.key);
    k.cost = a.cost;
    k.idle_since = now;
  }
  for (const FairAccounts::Estimate& e : accounts.estimates) {
    costs_.Set(e.type, e.resource, e.cost, now);
  }
}

bool Scheduler::TenantOpen(const TenantState& tenant, const TypeState& type, absl::Time now) const {
  if (tenant.capped()) return false;
  if (tenant.buckets.empty() || !type.configured) return true;
  auto bucket = tenant.buckets.find(type.cfg.rate_key());
  return bucket == tenant.buckets.end() || bucket->second->Ready(now);
}

bool Scheduler::Before(const Job& a, const Job& b, bool strict_cost) {
  const TenantState& ta = *a.key->tenant;
  const TenantState& tb = *b.key->tenant;
  if (&ta != &tb) {
    if (ta.rank() != tb.rank()) return ta.rank() < tb.rank();
    if (ta.cost != tb.cost) return ta.cost < tb.cost;
  } else if (a.key->cost != b.key->cost) {
    return a.key->cost < b.key->cost;
  }
  return !strict_cost && a.ord < b.ord;
}

Scheduler::Lane* Scheduler::FirstOpenLane(const Group& g, absl::Time now) const {
  for (const auto& [head, lane] : g.by_age) {
    if (TenantOpen(*lane->key->tenant, *g.type, now)) return lane;
  }
  return nullptr;
}

double Scheduler::KeyCost(const std::string& fairness_key) const {
  auto it = keys_by_name_.find(fairness_key);
  return it == keys_by_name_.end() ? 0 : it->second.front()->cost;
}

std::pair<double, double> Scheduler::TenantShares(const TenantState& tenant) const {
  double weights = 0;
  for (const auto& [name, t] : tenants_) {
    if (t->pending > 0 || t->placed > 0) weights += t->weight;
  }
  const double share =
      placed_count_ == 0 ? 0
                         : static_cast<double>(tenant.placed) / static_cast<double>(placed_count_);
  const bool active = tenant.pending > 0 || tenant.placed > 0;
  return {share, active && weights > 0 ? tenant.weight / weights : 0};
}

namespace {

constexpr double kStartRateAlpha = 0.3;

}  // namespace

void Scheduler::CountStart(TypeState& type, absl::Time now) {
  if (type.bucket_start == absl::InfinitePast() || now - type.bucket_start > absl::Minutes(1)) {
    type.start_rate = 0;  // long idle: what came before says nothing
    type.started_in_bucket = 0;
    type.bucket_start = now;
  }
  while (now - type.bucket_start >= absl::Seconds(1)) {
    type.start_rate = kStartRateAlpha * static_cast<double>(type.started_in_bucket) +
                      (1 - kStartRateAlpha) * type.start_rate;
    type.started_in_bucket = 0;
    type.bucket_start += absl::Seconds(1);
  }
  ++type.started_in_bucket;
}

double Scheduler::StartRate(const TypeState& type, absl::Time now) {
  if (type.bucket_start == absl::InfinitePast() || now - type.bucket_start > absl::Minutes(1)) {
    return 0;
  }
  double rate = type.start_rate;
  int64_t started = type.started_in_bucket;
  for (absl::Time b = type.bucket_start; now - b >= absl::Seconds(1); b += absl::Seconds(1)) {
    rate = kStartRateAlpha * static_cast<double>(started) + (1 - kStartRateAlpha) * rate;
    started = 0;
  }
  return rate;
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

int64_t Scheduler::TenantActive(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second->pending + it->second->placed;
}

std::string Scheduler::TenantOfKey(const std::string& fairness_key) const {
  auto it = keys_by_name_.find(fairness_key);
  return it == keys_by_name_.end() ? "" : it->second.front()->tenant->name;
}

double Scheduler::TenantCost(const std::string& tenant) const {
  auto it = tenants_.find(tenant);
  return it == tenants_.end() ? 0 : it->second->cost;
}

}  // namespace dispatchd::sched
