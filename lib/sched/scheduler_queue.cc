// The scheduler's pending jobs: where each waits (delayed until its not_before, or in its lane),
// which are ready, and how lanes, keys and tenants are filed in their tier's order as heads come
// and go. Conflicts are kept here too: of the pending jobs of one conflict key only the oldest of
// a lane is ready, and none while a job of that key runs.

#include <algorithm>
#include <iterator>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"

namespace dispatchd::sched {
namespace {

constexpr char kConflictSep = '\x1f';

}  // namespace

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
    ConflictLanes& pending = conflicts_pending_[j.conflict];
    if (pending.id == 0) pending.id = next_conflict_id_++;
    j.conflict_id = pending.id;
    ++pending.lanes[&lane];
    lane.by_conflict.insert({j.conflict_id, j.ord, &j});
    if (!conflicts_running_.contains(j.conflict)) {
      // Only the head of each resource is ready: j replaces the old head if it arrived earlier.
      auto head = lane.by_conflict.lower_bound({j.conflict_id, Ord::Min(), nullptr});
      if (std::get<2>(*head) == &j) {
        auto next = std::next(head);
        if (next != lane.by_conflict.end() && std::get<0>(*next) == j.conflict_id &&
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
    lane.by_conflict.erase({j.conflict_id, j.ord, &j});
    auto pending = conflicts_pending_.find(j.conflict);
    if (--pending->second.lanes[&lane] == 0) pending->second.lanes.erase(&lane);
    if (pending->second.lanes.empty()) conflicts_pending_.erase(pending);
    if (was_ready) {
      auto head = lane.by_conflict.lower_bound({j.conflict_id, Ord::Min(), nullptr});
      if (head != lane.by_conflict.end() && std::get<0>(*head) == j.conflict_id) {
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
  const bool was_oldest = lane.filed && lane.aged_head == g.oldest;
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
  if (was_oldest) {
    g.oldest = g.by_age.empty() ? Ord::Max() : g.by_age.begin()->first;
  } else if (ready && lane.aged_head < g.oldest) {
    g.oldest = lane.aged_head;
  }
  SyncKey(tier, *lane.key, tk);
}

std::string Scheduler::ConflictKey(const TypeState& type, const std::string& resource) {
  const std::string& group = type.cfg.conflict_group;
  if (group.empty() || resource.empty()) return "";
  return absl::StrCat(group, std::string(1, kConflictSep), resource);
}

void Scheduler::SetConflictBusy(const std::string& conflict, bool busy) {
  auto it = conflicts_pending_.find(conflict);
  if (it == conflicts_pending_.end()) return;
  const uint64_t id = it->second.id;
  for (const auto& [lane, n] : it->second.lanes) {
    auto head = lane->by_conflict.lower_bound({id, Ord::Min(), nullptr});
    Job& j = *std::get<2>(*head);
    if (busy && j.in_ready) ReadyErase(*lane, j);
    if (!busy && !j.in_ready) ReadyInsert(*lane, j);
    RefileLane(*lane);
  }
}

}  // namespace dispatchd::sched
