// The scheduler's worker pool: workers joining and leaving, their slots, rank order, draining and
// memory throttling, which models each has loaded and the VRAM they take, and which groups of jobs
// a worker can run. A placed job is attached to its worker here, and detached when it ends.

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"

#include "lib/sched/scheduler.h"
#include "lib/sched/scheduler_internal.h"
#include "lib/util/check.h"

namespace dispatchd::sched {

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
    if (auto node = unattached_.extract(spec.id); !node.empty()) {
      for (Job* job : node.mapped()) Attach(*job, w);
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
  DropAllResident(w);
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
  DropAllResident(w);
  for (const std::string& name : models) {
    std::unique_ptr<ModelState>& m = models_[name];
    if (m == nullptr) {
      m = std::make_unique<ModelState>();
      m->name = name;
    }
    AddResident(w, m.get());
  }
  // A model in use is loaded whatever the report says (the report may predate the load).
  for (const auto& [model, n] : w.in_use) AddResident(w, model);
}

void Scheduler::AddResident(WorkerState& w, ModelState* model) {
  w.resident.insert(model);
  model->holders.insert(&w);
}

void Scheduler::DropResident(WorkerState& w, ModelState* model) {
  w.resident.erase(model);
  model->holders.erase(&w);
}

void Scheduler::DropAllResident(WorkerState& w) {
  for (ModelState* m : w.resident) m->holders.erase(&w);
  w.resident.clear();
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

bool Scheduler::HeldElsewhere(const WorkerState& w, const Group& g) const {
  auto elsewhere = [&](const WorkerState* other) {
    return other != &w && !other->draining && !other->throttled && ServesAndMatches(*other, g);
  };
  if (g.type->model == nullptr) {
    return std::any_of(by_rank_.begin(), by_rank_.end(),
                       [&](const auto& ranked) { return elsewhere(ranked.second); });
  }
  const absl::flat_hash_set<WorkerState*>& holders = g.type->model->holders;
  return std::any_of(holders.begin(), holders.end(), elsewhere);
}

bool Scheduler::Fits(const WorkerState& w, const ModelState* model) const {
  if (model == nullptr || w.spec.vram_gb < 0) return true;
  if (w.resident.contains(const_cast<ModelState*>(model))) return true;
  return w.vram_in_use + model->vram <= w.spec.vram_gb + 1e-9;
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
      DropResident(w, m);
    }
  }
  AddResident(w, model);
}

void Scheduler::Attach(Job& j, WorkerState& w) {
  j.worker = &w;
  w.jobs.insert(&j);
  ++w.busy;
  if (j.model != nullptr) {
    if (w.in_use[j.model]++ == 0) w.vram_in_use += j.model->vram;
    AddResident(w, j.model);
  }
  UpdateAvailable(w);
}

void Scheduler::Detach(Job& j, WorkerState& w) {
  w.jobs.erase(&j);
  --w.busy;
  DISPATCHD_CHECK(w.busy >= 0, "worker busy count below zero");
  if (j.model != nullptr) {
    auto it = w.in_use.find(j.model);
    if (--it->second == 0) {
      w.in_use.erase(it);
      w.vram_in_use -= j.model->vram;
    }
  }
  UpdateAvailable(w);
}

}  // namespace dispatchd::sched
