// The scheduler's placement policies: which job a worker with a free slot takes. "fair" walks the
// tiers, the tenants and keys in fair-queuing order and prefers the models the worker has loaded
// (see the Scheduler class comment); "fifo" takes the oldest job any lane can run. Both skip what
// a cap, a conflict, a rate limit or the worker's VRAM holds back.

#include <algorithm>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"

namespace dispatchd::sched {

const Scheduler::Policy& Scheduler::PolicyNamed(absl::string_view name) {
  static constexpr Policy kFair{.tiers = true, .choose = &Scheduler::ChooseFair};
  static constexpr Policy kFifo{.tiers = false, .choose = &Scheduler::ChooseFifo};
  return name == "fifo" ? kFifo : kFair;
}

bool Scheduler::GroupOpen(const Group& g, absl::Time now) const {
  const TypeState& t = *g.type;
  return g.ready > 0 && t.configured && t.running < t.cfg.max_concurrency &&
         t.tier->running < t.tier->cap && (t.bucket == nullptr || t.bucket->Ready(now));
}

bool Scheduler::Starved(const Group& g, absl::Time now) const {
  const ModelState* m = g.type->model;
  if (m == nullptr || g.by_age.empty()) return false;
  return now - g.oldest.arrival > g.type->cfg.max_affinity_wait;
}

Scheduler::Job* Scheduler::BestJob(TierState& tier, const GroupMask& groups, absl::Time now,
                                   bool floor_only) {
  // Within one Decide, the workers that ask with the same groups get the same answer until a
  // placement moves its job's key or tenant (ForgetMovedAnswers): in a fleet's last jobs,
  // hundreds of free workers in turn ask for the same models, and when a cold fleet fills, each
  // worker asks for every model tied at the deepest queue; each walk can pass over thousands of
  // keys. A decision that places a few jobs keeps nothing, so the memo starts with the first
  // worker of the Decide that found nothing, or after its first kMemoAfterPlacements.
  if (!memo_on_) return BestJobWalk(tier, groups, now, floor_only);
  auto [memo, inserted] = best_memo_.try_emplace(BestMemoKey{&tier, floor_only, groups});
  const BestMemo& m = memo->second;
  if (!inserted && (m.job == nullptr || (m.job->key->memo_gen == m.key_gen &&
                                         m.job->key->tenant->memo_gen == m.tenant_gen))) {
    return m.job;
  }
  Job* j = BestJobWalk(tier, groups, now, floor_only);
  memo->second =
      j == nullptr ? BestMemo{} : BestMemo{j, j->key->memo_gen, j->key->tenant->memo_gen};
  return j;
}

Scheduler::Job* Scheduler::BestJobWalk(TierState& tier, const GroupMask& groups, absl::Time now,
                                       bool floor_only) {
  // Tenants in (rank, cost, oldest ready head) order: the first with a ready job in one of
  // `groups` wins, so that tenants of equal cost go by their oldest job whether or not this
  // worker can run it (comparing the matching jobs of every tenant at one cost meant walking
  // them all). Inside the tenant, keys in cost order, and among keys of equal cost the oldest
  // matching job: each key order breaks ties by the oldest ready head, so that walk stops at an
  // equal key whose oldest head is younger than the match. A tenant or key with no ready lane
  // in `groups` is passed over in one mask test.
  for (const auto& [rank, tenant_cost, tenant_head, tt] : tier.tenants) {
    if (floor_only && rank > 0) break;
    const TenantState& tenant = *tt->tenant;
    if (!Intersects(tt->groups, groups) || tenant.capped()) continue;
    Job* best = nullptr;
    double best_cost = 0;
    for (const auto& [cost, key_head, tk] : tt->keys) {
      if (best != nullptr && (cost > best_cost || !(key_head < best->ord))) break;
      if (!Intersects(tk->groups, groups)) continue;
      // The key's lanes, oldest head first: the first that matches is the key's best.
      for (const auto& [head, lane] : tk->heads) {
        if (best != nullptr && !(head < best->ord)) break;
        if (!TestBit(groups, lane->group->index)) continue;
        if (!tenant.buckets.empty() && !TenantOpen(tenant, *lane->group->type, now)) continue;
        best = lane->ready.begin()->second;
        best_cost = cost;
        break;
      }
    }
    // A tenant whose matching lanes are all held by its own rate limit is passed over.
    if (best != nullptr) return best;
  }
  return nullptr;
}

Scheduler::Choice Scheduler::ChooseFair(WorkerState& w, absl::Time now) {
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
        if (g->ready == 0 || !ServesAndMatches(w, *g)) continue;
        if (Resident(w, t->model)) {
          SetBit(resident_groups, g->index);
          any_resident = true;
          continue;
        }
        // Of the overdue lanes (the front of by_age), the one owed most service. The group's
        // oldest head, kept beside by_age, says whether there are any without a walk. A model
        // another worker holds and serves is not starved: its queue moves, and whether it is
        // deep enough to repay a second load is the load choice's question.
        if (Starved(*g, now) && !HeldElsewhere(w, *g)) {
          for (const auto& [head, lane] : g->by_age) {
            if (now - head.arrival <= t->cfg.max_affinity_wait) break;
            if (!TenantOpen(*lane->key->tenant, *t, now)) continue;
            Job* j = lane->ready.begin()->second;
            if (starved == nullptr || Before(*j, *starved)) starved = j;
          }
        }
        if (!Fits(w, t->model)) continue;
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
      // go by order. A model other workers hold is joined only if their slots alone would take
      // longer than its max_affinity_wait to run its queue: a shorter queue does not repay a
      // load, and a job it leaves waiting past that bound is taken as an overdue one.
      struct Counted {
        LoadCandidate c;
        int64_t per_worker;  // queue per worker holding the model, this one included
        int64_t holders = 0;
        int64_t holder_slots = 0;
      };
      std::vector<Counted> counted;
      for (const LoadCandidate& c : loads) {
        Counted n{c, 0};
        for (const WorkerState* other : c.model->holders) {
          if (other == &w || other->draining || other->throttled) continue;
          ++n.holders;
          n.holder_slots += other->capacity;
        }
        n.per_worker = c.depth / (n.holders + 1);
        counted.push_back(n);
      }
      for (const bool unserved_only : {true, false}) {
        int64_t depth = 0;
        for (const Counted& n : counted) {
          if ((unserved_only && n.holders > 0) || n.per_worker < depth) continue;
          // The model's groups the worker can take after a load.
          GroupMask of_model;
          for (TypeState* t : tier->types) {
            if (t->model != n.c.model) continue;
            for (auto& g : t->groups) {
              if (TestBit(load_groups, g->index)) SetBit(of_model, g->index);
            }
          }
          Job* j = BestJob(*tier, of_model, now);
          if (j == nullptr) continue;
          if (n.holders > 0 && n.holder_slots > 0) {
            const double each =
                costs_.Estimate(j->type->name, j->resource, j->type->cfg.default_cost, now);
            const double alone =
                static_cast<double>(n.c.depth) * each / static_cast<double>(n.holder_slots);
            if (absl::Seconds(alone) <= j->type->cfg.max_affinity_wait) continue;
          }
          if (pick == nullptr || n.per_worker > depth || Before(*j, *pick)) {
            pick = j;
            depth = n.per_worker;
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

}  // namespace dispatchd::sched
