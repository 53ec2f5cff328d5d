#include "lib/sched/scheduler.h"

#include <algorithm>
#include <utility>

#include "lib/util/check.h"

namespace dispatchd::sched {

absl::string_view ToString(WaitReason reason) {
  switch (reason) {
    case WaitReason::kNone: return "none";
    case WaitReason::kNotBefore: return "not_before";
    case WaitReason::kTypeCap: return "type_cap";
    case WaitReason::kNoWorker: return "no_worker";
    case WaitReason::kWorkersBusy: return "workers_busy";
  }
  return "unknown";
}

Scheduler::Scheduler(const config::Config& config) { UpdateConfig(config); }

void Scheduler::UpdateConfig(const config::Config& config) {
  type_caps_.clear();
  for (const config::JobTypeConfig& t : config.types) type_caps_[t.name] = t.max_concurrency;
}

void Scheduler::Enqueue(PendingJob job) {
  if (pending_index_.contains(job.id) || placed_.contains(job.id)) return;
  PendingKey key{job.arrival, next_seq_++};
  pending_index_.emplace(job.id, key);
  pending_.emplace(key, std::move(job));
}

bool Scheduler::RemovePending(const std::string& job_id) {
  auto it = pending_index_.find(job_id);
  if (it == pending_index_.end()) return false;
  pending_.erase(it->second);
  pending_index_.erase(it);
  return true;
}

void Scheduler::AddWorker(const WorkerSpec& spec) {
  int64_t rank;
  if (auto known = known_ranks_.find(spec.id); known != known_ranks_.end()) {
    rank = known->second;
  } else {
    rank = next_rank_++;
    known_ranks_.emplace(spec.id, rank);
  }
  Worker& w = workers_[spec.id];
  w.spec = spec;
  w.types = absl::flat_hash_set<std::string>(spec.types.begin(), spec.types.end());
  w.rank = rank;
  w.capacity = std::max(spec.slots, 0);
  w.draining = false;
  workers_by_rank_[rank] = spec.id;
}

std::vector<std::string> Scheduler::RemoveWorker(const std::string& worker_id) {
  std::vector<std::string> orphans;
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) return orphans;
  for (const auto& [job_id, placement] : placed_) {
    if (placement.worker_id == worker_id) orphans.push_back(job_id);
  }
  std::sort(orphans.begin(), orphans.end());
  for (const std::string& id : orphans) Unplace(id);
  workers_by_rank_.erase(it->second.rank);
  workers_.erase(it);
  return orphans;
}

void Scheduler::SetDraining(const std::string& worker_id, bool draining) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) it->second.draining = draining;
}

void Scheduler::Adopt(const std::string& job_id, const std::string& type,
                      const std::string& worker_id) {
  RemovePending(job_id);
  if (placed_.contains(job_id)) Unplace(job_id);
  Place(job_id, type, worker_id);
}

void Scheduler::Refused(const std::string& job_id) {
  auto it = placed_.find(job_id);
  if (it == placed_.end()) return;
  std::string worker_id = it->second.worker_id;
  Unplace(job_id);
  if (auto w = workers_.find(worker_id); w != workers_.end()) {
    // The worker is the authority on its capacity: believe it holds all it can take.
    w->second.capacity = std::min(w->second.capacity, w->second.busy);
  }
}

void Scheduler::Finished(const std::string& job_id) { Unplace(job_id); }

void Scheduler::Heartbeat(const std::string& worker_id) {
  if (auto it = workers_.find(worker_id); it != workers_.end()) {
    it->second.capacity = std::max(it->second.spec.slots, 0);
  }
}

bool Scheduler::TypeAtCap(const std::string& type) const {
  auto cap = type_caps_.find(type);
  if (cap == type_caps_.end()) return true;  // unconfigured type: hold until configured
  return running_of_type(type) >= cap->second;
}

int Scheduler::running_of_type(const std::string& type) const {
  auto it = running_by_type_.find(type);
  return it == running_by_type_.end() ? 0 : it->second;
}

bool Scheduler::ServesAndMatches(const Worker& w, const PendingJob& job) const {
  if (!w.types.contains(job.type)) return false;
  for (const auto& [key, value] : job.labels) {
    auto it = w.spec.labels.find(key);
    if (it == w.spec.labels.end() || it->second != value) return false;
  }
  return true;
}

Scheduler::Worker* Scheduler::PickWorker(const PendingJob& job) {
  for (const auto& [rank, id] : workers_by_rank_) {
    Worker& w = workers_.at(id);
    if (!w.draining && w.busy < w.capacity && ServesAndMatches(w, job)) return &w;
  }
  return nullptr;
}

WaitReason Scheduler::WorkerAvailability(const PendingJob& job) const {
  bool any = false;
  for (const auto& [rank, id] : workers_by_rank_) {
    const Worker& w = workers_.at(id);
    if (!ServesAndMatches(w, job)) continue;
    any = true;
    if (!w.draining && w.busy < w.capacity) return WaitReason::kNone;
  }
  return any ? WaitReason::kWorkersBusy : WaitReason::kNoWorker;
}

std::vector<Dispatch> Scheduler::Decide(absl::Time now, size_t limit) {
  std::vector<Dispatch> out;
  // Free slots across the fleet bound the work: stop scanning once none is left.
  int free_slots = 0;
  for (const auto& [id, w] : workers_) {
    if (!w.draining) free_slots += std::max(0, w.capacity - w.busy);
  }
  for (auto it = pending_.begin(); it != pending_.end() && free_slots > 0 && out.size() < limit;) {
    const PendingJob& job = it->second;
    if (job.not_before > now || TypeAtCap(job.type)) {
      ++it;
      continue;
    }
    Worker* w = PickWorker(job);
    if (w == nullptr) {
      ++it;
      continue;
    }
    out.push_back(Dispatch{job.id, job.attempt, w->spec.id});
    Place(job.id, job.type, w->spec.id);
    --free_slots;
    pending_index_.erase(job.id);
    it = pending_.erase(it);
  }
  return out;
}

WaitReason Scheduler::WhyWaiting(const std::string& job_id, absl::Time now) const {
  auto idx = pending_index_.find(job_id);
  if (idx == pending_index_.end()) return WaitReason::kNone;
  const PendingJob& job = pending_.at(idx->second);
  if (job.not_before > now) return WaitReason::kNotBefore;
  if (TypeAtCap(job.type)) return WaitReason::kTypeCap;
  return WorkerAvailability(job);
}

absl::Time Scheduler::NextWakeup(absl::Time now) const {
  absl::Time next = absl::InfiniteFuture();
  for (const auto& [key, job] : pending_) {
    if (job.not_before > now) next = std::min(next, job.not_before);
  }
  return next;
}

std::string Scheduler::WorkerOf(const std::string& job_id) const {
  auto it = placed_.find(job_id);
  return it == placed_.end() ? std::string() : it->second.worker_id;
}

std::vector<WorkerView> Scheduler::Workers() const {
  std::vector<WorkerView> out;
  for (const auto& [rank, id] : workers_by_rank_) {
    const Worker& w = workers_.at(id);
    out.push_back(WorkerView{id, rank, w.spec.slots, w.busy, w.capacity, w.draining});
  }
  return out;
}

void Scheduler::Place(const std::string& job_id, const std::string& type,
                      const std::string& worker_id) {
  auto w = workers_.find(worker_id);
  placed_[job_id] = Placement{type, worker_id, w != workers_.end()};
  ++running_by_type_[type];
  if (w != workers_.end()) ++w->second.busy;
}

void Scheduler::Unplace(const std::string& job_id) {
  auto it = placed_.find(job_id);
  if (it == placed_.end()) return;
  int& n = running_by_type_[it->second.type];
  --n;
  DISPATCHD_CHECK(n >= 0, "running count of a type below zero");
  if (auto w = workers_.find(it->second.worker_id);
      it->second.on_worker && w != workers_.end()) {
    --w->second.busy;
    DISPATCHD_CHECK(w->second.busy >= 0, "worker busy count below zero");
  }
  placed_.erase(it);
}

}  // namespace dispatchd::sched
