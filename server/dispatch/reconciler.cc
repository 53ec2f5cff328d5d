#include "server/dispatch/reconciler.h"

#include <utility>

namespace dispatchd::dispatch {

ReconcileReads ReadForReconcile(store::JobStore& store, const HeldSnapshot& held) {
  using job::JobState;
  ReconcileReads out;
  // Placed jobs: the rows the database has DISPATCHED or RUNNING against the jobs placed here.
  absl::StatusOr<std::vector<store::JobRef>> placed = store.LoadPlacedRefs();
  if (!placed.ok()) {
    out.status = placed.status();
    return out;
  }
  absl::flat_hash_map<std::string, const store::JobRef*> placed_rows;
  std::vector<std::string> unknown;
  for (const store::JobRef& r : *placed) {
    placed_rows[r.job_id] = &r;
    if (!held.held.contains(r.job_id) && r.updated_at < held.now - kReconcileSettle) {
      unknown.push_back(r.job_id);
    }
  }
  if (!unknown.empty()) {
    if (absl::StatusOr<std::vector<job::Job>> rows = store.GetMany(unknown); rows.ok()) {
      for (job::Job& row : *rows) {
        if (row.state != JobState::kDispatched && row.state != JobState::kRunning) continue;
        std::string().swap(row.spec.payload);  // a claim returns it when it is needed
        out.strays.push_back(std::move(row));
      }
    }
  }
  std::vector<std::string> suspect;
  for (const auto& [id, state_attempt] : held.placed) {
    auto r = placed_rows.find(id);
    if (r == placed_rows.end() || r->second->state != state_attempt.first ||
        r->second->attempt != state_attempt.second) {
      suspect.push_back(id);
    }
  }
  if (!suspect.empty()) {
    if (absl::StatusOr<std::vector<store::JobRef>> refs = store.GetRefs(suspect); refs.ok()) {
      out.suspects = *std::move(refs);
    }
  }
  // Queued jobs, queue by queue: the rows each queue's window should hold against the jobs held;
  // the rows themselves only where the counts differ.
  absl::StatusOr<std::vector<store::QueueCount>> counts = store.CountQueued(held.bounds);
  if (!counts.ok()) {
    out.count_status = counts.status();
    return out;
  }
  absl::flat_hash_set<QueueId> in_db;
  for (const store::QueueCount& c : *counts) {
    QueueId queue{c.type, c.fairness_key};
    auto h = held.queued.find(queue);
    const int64_t here = h == held.queued.end() ? 0 : static_cast<int64_t>(h->second.size());
    if (here != c.up_to_bound) out.queues.push_back({.queue = queue, .queued = c.queued});
    in_db.insert(std::move(queue));
  }
  for (const auto& [queue, ids] : held.queued) {
    if (!in_db.contains(queue)) out.queues.push_back({.queue = queue, .queued = 0});
  }
  out.counts = *std::move(counts);
  for (ReconcileReads::Queue& q : out.queues) {
    if (auto h = held.queued.find(q.queue); h != held.queued.end() && !h->second.empty()) {
      if (absl::StatusOr<std::vector<store::JobRef>> refs = store.GetRefs(h->second); refs.ok()) {
        q.held = *std::move(refs);
      }
    }
    absl::StatusOr<std::vector<job::Job>> rows =
        store.LoadQueuedPage(q.queue.first, q.queue.second, /*after_seq=*/0, held.window);
    q.rows_status = rows.status();
    if (rows.ok()) q.rows = *std::move(rows);
  }
  return out;
}

}  // namespace dispatchd::dispatch
