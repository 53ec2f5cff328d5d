// The dispatcher's placements: the jobs the leader's inserts write straight to a free worker
// (store::Placer; "One commit to a worker" in docs/architecture.md). See dispatcher.h.

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

#include "server/dispatch/dispatcher.h"
#include "server/dispatch/dispatcher_internal.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {

using job::JobState;

void Dispatcher::Place(std::vector<job::Job>& jobs) {
  for (job::Job& job : jobs) job.worker_id.clear();
  // The loop sets worker ids in `jobs` while this thread waits. If the wait times out first, the
  // call is abandoned under its mutex, and a task that runs later touches nothing.
  struct Call {
    absl::Mutex mu;
    bool abandoned ABSL_GUARDED_BY(mu) = false;
    bool done ABSL_GUARDED_BY(mu) = false;
  };
  auto call = std::make_shared<Call>();
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    tasks_.push_back([this, call, target = &jobs] {
      loop_role_.Assert();
      absl::MutexLock cl(&call->mu);
      if (call->abandoned) return;
      PlaceNow(*target, clock_.TimeNow());
      call->done = true;
    });
    wake_ = true;
  }
  absl::MutexLock cl(&call->mu);
  if (!call->mu.AwaitWithTimeout(absl::Condition(&call->done), kPlaceWait)) {
    call->abandoned = true;
  }
}

void Dispatcher::PlaceNow(std::vector<job::Job>& jobs, absl::Time now) {
  // Nothing is placed while writes are paused, nor while the reconcile is due or reading: it
  // compares the database with what the loop holds, and must not meet a row written DISPATCHED
  // that the loop does not hold yet.
  if (now < paused_until_ || reconcile_due_ || reconcile_in_flight_) return;
  absl::flat_hash_map<std::string, job::Job*> tentative;
  for (job::Job& job : jobs) {
    // Jobs not yet due wait in the queue; a queue with rows waiting in the database beyond its
    // window (QueuePager) keeps its order by seq: its new jobs queue behind them.
    if (job.spec.not_before > now || jobs_.contains(job.id) || placing_.contains(job.id) ||
        pager_.BoundOf(QueueOf(job)) != INT64_MAX) {
      continue;
    }
    scheduler_.Enqueue(ToPending(job, /*attempt=*/0));
    tentative.emplace(job.id, &job);
  }
  if (tentative.empty()) return;
  // The whole decision, as a turn makes it: the new jobs wait behind older ones, by the same
  // fairness, caps and affinity. Dispatches of held jobs it makes go with the next turn.
  std::vector<sched::Dispatch> decisions = Decide(now);
  for (sched::Dispatch& d : decisions) {
    auto t = tentative.find(d.job_id);
    if (t == tentative.end()) {
      decided_.push_back(std::move(d));
      continue;
    }
    t->second->worker_id = d.worker_id;
    placing_.emplace(d.job_id, Placing{.worker_id = d.worker_id, .since = now});
    tentative.erase(t);
  }
  // The rest are inserted QUEUED and queued again when they come (JobQueued).
  for (const auto& [id, job] : tentative) scheduler_.RemovePending(id);
}

void Dispatcher::Placed(const std::vector<job::Job>& jobs,
                        const absl::StatusOr<std::vector<store::InsertOutcome>>& outcomes) {
  std::vector<std::string> landed, undone;
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (jobs[i].worker_id.empty()) continue;
    if (outcomes.ok() && (*outcomes)[i].dispatched) {
      landed.push_back(jobs[i].id);
    } else {
      undone.push_back(jobs[i].id);  // not written, a duplicate, or QUEUED (fenced)
    }
  }
  if (landed.empty() && undone.empty()) return;
  Post([this, landed = std::move(landed), undone = std::move(undone)] {
    loop_role_.Assert();
    ApplyPlaced(landed, undone);
  });
}

void Dispatcher::ApplyPlaced(const std::vector<std::string>& landed,
                             const std::vector<std::string>& undone) {
  for (const std::string& id : undone) {
    placing_.erase(id);
    scheduler_.Retract(id);
  }
  const absl::Time now = clock_.TimeNow();
  for (const std::string& id : landed) {
    if (auto it = placing_.find(id); it != placing_.end()) {
      it->second.landed = true;
      it->second.since = now;  // ExpirePlacements counts from here
    }
  }
}

void Dispatcher::TakePlaced(job::Job row, absl::Time now) {
  auto p = placing_.find(row.id);
  if (p == placing_.end()) {
    // Placed by an earlier term of this daemon, or forgotten (ExpirePlacements). No Assign went
    // out for it (only the loop that gets its JobQueued sends one), so the row goes back to the
    // queue at once, no attempt used, rather than wait out orphan_grace.
    server::Log("dispatch")
        ->warn("placed job={} came with no placement here: returning it to the queue", row.id);
    const std::string id = row.id;
    HoldPlaced(std::move(row), now);
    Orphan(jobs_.at(id), "placed but never assigned", now);
    return;
  }
  const Placing placing = std::move(p->second);
  placing_.erase(p);
  if (placing.dropped) {
    scheduler_.Retract(row.id);  // it ended while its insert was answered
    return;
  }
  std::string payload = std::move(row.spec.payload);
  // Held as a claim leaves a job: QUEUED at attempt 0, then dispatched to its worker.
  row.state = JobState::kQueued;
  row.worker_id.clear();
  Held h{.at = job::AttemptState::Of(row)};
  h.job = std::move(row);
  const std::string id = h.job.id;
  Held& held = jobs_.emplace(id, std::move(h)).first->second;
  absl::flat_hash_map<std::string, v1::DaemonMessage> assigns;
  Handover(held, placing.worker_id, std::move(payload), assigns, now);
  SendAssigns(assigns);
}

void Dispatcher::ExpirePlacements(absl::Time now) {
  for (auto it = placing_.begin(); it != placing_.end();) {
    auto here = it++;
    // A placement waits for its insert as long as the insert takes; once its row is written,
    // JobQueued follows at once.
    if (!here->second.landed || now - here->second.since < kPlacementTimeout) continue;
    server::Log("dispatch")
        ->error("placed job={} did not come within {} of its placement: forgetting it", here->first,
                absl::FormatDuration(kPlacementTimeout));
    scheduler_.Retract(here->first);
    placing_.erase(here);
  }
}

}  // namespace dispatchd::dispatch
