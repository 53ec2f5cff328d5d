// The scheduler's decision loop and the life of a placed job: Decide fills free workers with what
// the placement policy chooses, and placing, adopting, retracting, refusing and finishing a job
// keep the caps, conflicts, slots and charges it holds. See the Scheduler class comment.

#include "lib/sched/scheduler.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "lib/sched/scheduler_internal.h"
#include "lib/util/check.h"

namespace dispatchd::sched {

Scheduler::Scheduler(const config::Config& config, absl::Time now)
    : last_now_(now), next_housekeeping_(now) {
  ApplyConfig(config, now);
}

Scheduler::~Scheduler() = default;

// ---------------------------------------------------------------------------------------------
// Decisions.

std::vector<Dispatch> Scheduler::Decide(absl::Time now, size_t limit) {
  last_now_ = now;
  if (now >= next_housekeeping_) Housekeep(now);
  PromoteDue(now);
  std::vector<Dispatch> out;
  memo_on_ = false;  // best_memo_ is empty: the last Decide cleared it
  // The worker filled next is the first in rank order that has not found nothing. A worker that
  // found nothing keeps finding nothing within one call (placements only take capacity, tokens
  // and resources away), and it was the first such worker when it found nothing, so the workers
  // that found nothing are a prefix of `available_` (which only loses workers here): the next
  // one to ask is the first after the last that found nothing.
  std::optional<std::pair<int64_t, WorkerState*>> last_found_nothing;
  while (out.size() < limit && pending_count_ > 0) {
    auto next = last_found_nothing.has_value() ? available_.upper_bound(*last_found_nothing)
                                               : available_.begin();
    if (next == available_.end()) break;
    WorkerState* w = next->second;
    Choice c = (this->*policy_->choose)(*w, now);
    if (c.job == nullptr) {
      last_found_nothing = *next;
      memo_on_ = !memo_disabled_;
      continue;
    }
    if (c.loads) {
      // A free worker that has the model loaded beats rank: no load needed there. Of those, the
      // first in rank order, found among the model's holders.
      WorkerState* holder = nullptr;
      for (WorkerState* other : c.job->type->model->holders) {
        if (other == w || !available_.contains({other->rank, other}) ||
            !ServesAndMatches(*other, *c.job->lane->group)) {
          continue;
        }
        if (holder == nullptr || other->rank < holder->rank) holder = other;
      }
      if (holder != nullptr) {
        w = holder;
        c.loads = false;
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
    if (out.size() == kMemoAfterPlacements) memo_on_ = !memo_disabled_;
  }
  best_memo_.clear();
  return out;
}

void Scheduler::Place(Job& j, WorkerState* w, absl::Time now, bool loads_model) {
  TypeState& t = *j.type;
  const int rank_before = j.key->tenant->rank();
  // Charge before the job leaves its lane, so that the key and the tenant refile once, at
  // their new cost and their new oldest head together.
  Charge(j, now);
  RemoveFromLane(j);
  RefileKey(*j.key);
  RefileTenant(*j.key->tenant);
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
  if (memo_on_) ForgetMovedAnswers(j, rank_before);
}

void Scheduler::ForgetMovedAnswers(const Job& placed, int rank_before) {
  // A placement takes its job out of its lane and charges its key and tenant: they cost more and
  // their oldest ready heads get no older, so they only move later in the orders BestJob walks,
  // and no job anywhere becomes ready. So a walk that found nothing still finds nothing, and a
  // walk that found a job of another key still finds it, unless:
  // - the placed job's conflict key turned busy, holding back pending jobs of any key and
  //   tenant, whose heads then move: every answer goes;
  // - the answer is of the placed job's tenant and that tenant moved past another tenant that
  //   has ready jobs in one of its tiers (tenants of equal cost go by their oldest heads), left
  //   or joined its floor, reached its max_running, or took a token from one of its own buckets,
  //   which may close lanes of its other keys.
  if (!placed.conflict.empty()) {
    if (auto it = conflicts_running_.find(placed.conflict);
        it != conflicts_running_.end() && it->second == 1) {
      best_memo_.clear();
      return;
    }
  }
  KeyState& key = *placed.key;
  TenantState& tenant = *key.tenant;
  ++key.memo_gen;
  bool tenant_moved = tenant.rank() != rank_before || tenant.capped() || !tenant.buckets.empty();
  for (auto it = tenant.tiers.begin(); !tenant_moved && it != tenant.tiers.end(); ++it) {
    tenant_moved = it->first->tenants.size() > 1;
  }
  if (tenant_moved) ++tenant.memo_gen;
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
  if (j.worker != nullptr) {
    Detach(j, *j.worker);
  } else if (auto it = unattached_.find(j.worker_id); it != unattached_.end()) {
    it->second.erase(&j);
    if (it->second.empty()) unattached_.erase(it);
  }
  CountPlaced(j, -1);
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
  RefileKey(*j.key);
  RefileTenant(*j.key->tenant);
  Occupy(j, p.worker_id);
  if (auto w = workers_.find(p.worker_id); w != workers_.end()) {
    Attach(j, *w->second);
  } else {
    unattached_[p.worker_id].insert(&j);
  }
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

}  // namespace dispatchd::sched
