#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/time/time.h"
#include "lib/config/config.h"
#include "lib/job/job.h"

namespace dispatchd::sched {

// A job waiting for a worker, as the scheduler sees it.
struct PendingJob {
  std::string id;
  std::string type;
  int32_t attempt = 0;  // attempts started so far
  job::Labels labels;
  absl::Time not_before = absl::InfinitePast();
  // Arrival (the job's created_at): FIFO order, kept when a refused job returns to the queue.
  absl::Time arrival = absl::InfinitePast();
};

// A connected worker, as it registered.
struct WorkerSpec {
  std::string id;
  std::vector<std::string> types;
  int slots = 1;
  job::Labels labels;
};

// Decision: offer job `job_id` (at `attempt` attempts started) to worker `worker_id`.
struct Dispatch {
  std::string job_id;
  int32_t attempt = 0;
  std::string worker_id;
};

// Why a pending job is not dispatched now. One enum so logs, metrics and API messages agree.
enum class WaitReason {
  kNone,           // dispatchable
  kNotBefore,      // its not_before has not passed
  kTypeCap,        // its type runs max_concurrency jobs
  kNoWorker,       // no connected worker serves its type and labels
  kWorkersBusy,    // workers that could take it have no free slot
};
absl::string_view ToString(WaitReason reason);

// Per-worker view for AdminService and tests.
struct WorkerView {
  std::string id;
  int64_t rank = 0;
  int slots = 0;
  int busy = 0;           // jobs placed on it (dispatched or running)
  int capacity = 0;       // slots it is believed to accept now (<= slots; lowered by refusals)
  bool draining = false;
};

// Decides which pending job goes to which worker. Dispatch is FIFO by arrival among jobs that can
// run now; a job that cannot run (type at its cap, no eligible worker with a free slot, not yet
// due) is skipped, never waited on, so it never blocks the jobs behind it. Among eligible workers
// the lowest stable rank (join order) wins, so load concentrates and surplus workers drain idle.
//
// The scheduler is pure: it takes events (job queued, worker joined/left, refusal, job finished)
// and returns decisions; it never touches a socket, a database or a clock. The caller passes `now`.
//
// Usage:
//   Scheduler s(config);
//   s.AddWorker({.id = "w1", .types = {"echo"}, .slots = 2});
//   s.Enqueue({.id = "j1", .type = "echo"});
//   for (const Dispatch& d : s.Decide(now)) { /* claim in the store, send to the worker */ }
//
// Not thread-safe: owned and driven by the dispatcher loop.
class Scheduler {
 public:
  explicit Scheduler(const config::Config& config);

  // Replaces the job-type table (caps). Jobs of types no longer configured stay queued until a
  // config names them again.
  void UpdateConfig(const config::Config& config);

  // A job became QUEUED. Re-enqueueing a job the scheduler already holds keeps one copy.
  void Enqueue(PendingJob job);

  // Removes a pending job (cancelled, expired). True if it was pending.
  bool RemovePending(const std::string& job_id);

  // A worker connected. Rejoining with a known id replaces its registration but keeps its rank.
  void AddWorker(const WorkerSpec& worker);

  // A worker is gone. Returns the ids of the jobs placed on it, which no longer count against any
  // cap; the caller decides their fate (return to queue, re-adopt, on_orphan).
  std::vector<std::string> RemoveWorker(const std::string& worker_id);

  // The worker stops taking new work.
  void SetDraining(const std::string& worker_id, bool draining);

  // Records a job already running on a worker (re-adoption after a reconnect or restart). It
  // counts against caps and slots as any placed job.
  void Adopt(const std::string& job_id, const std::string& type, const std::string& worker_id);

  // The worker refused the job because its own slots are full. The job leaves the worker (the
  // caller re-enqueues it once it is QUEUED again) and the worker is believed to accept no more
  // than it holds now, until it frees a slot or reports its load.
  void Refused(const std::string& job_id);

  // A placed job ended (result, cancel, timeout): its slot and cap are free.
  void Finished(const std::string& job_id);

  // The worker reported its load: it is believed to accept its advertised slots again.
  void Heartbeat(const std::string& worker_id);

  // Picks the dispatches possible now, at most `limit`, and counts each as placed.
  std::vector<Dispatch> Decide(absl::Time now, size_t limit = SIZE_MAX);

  // Why the pending job waits, or kNone if it would be dispatched now (before `limit`).
  WaitReason WhyWaiting(const std::string& job_id, absl::Time now) const;

  // The earliest not_before among pending jobs that is after `now`, or InfiniteFuture: when the
  // caller should call Decide again if nothing else happens.
  absl::Time NextWakeup(absl::Time now) const;

  size_t pending_count() const { return pending_.size(); }
  size_t placed_count() const { return placed_.size(); }
  int running_of_type(const std::string& type) const;
  bool IsPlaced(const std::string& job_id) const { return placed_.contains(job_id); }
  bool IsPending(const std::string& job_id) const { return pending_index_.contains(job_id); }
  // Worker holding a placed job, or empty.
  std::string WorkerOf(const std::string& job_id) const;
  std::vector<WorkerView> Workers() const;

 private:
  struct Worker {
    WorkerSpec spec;
    absl::flat_hash_set<std::string> types;
    int64_t rank = 0;
    int busy = 0;
    int capacity = 0;
    bool draining = false;
  };
  struct Placement {
    std::string type;
    std::string worker_id;
    // False when the worker was not registered at placement (a job re-adopted after a restart,
    // before its worker reconnected): it then never counted in that worker's busy slots.
    bool on_worker = false;
  };

  // The lowest-ranked worker that can take `job` now, or nullptr.
  Worker* PickWorker(const PendingJob& job);
  // Why no worker takes `job`: kNoWorker or kWorkersBusy; kNone if one would.
  WaitReason WorkerAvailability(const PendingJob& job) const;
  bool ServesAndMatches(const Worker& w, const PendingJob& job) const;
  bool TypeAtCap(const std::string& type) const;
  void Place(const std::string& job_id, const std::string& type, const std::string& worker_id);
  void Unplace(const std::string& job_id);

  absl::flat_hash_map<std::string, int> type_caps_;
  // Pending jobs in arrival order; the sequence number breaks ties deterministically.
  using PendingKey = std::pair<absl::Time, uint64_t>;
  std::map<PendingKey, PendingJob> pending_;
  absl::flat_hash_map<std::string, PendingKey> pending_index_;
  uint64_t next_seq_ = 0;

  absl::flat_hash_map<std::string, Worker> workers_;
  std::map<int64_t, std::string> workers_by_rank_;
  absl::flat_hash_map<std::string, int64_t> known_ranks_;  // kept across reconnects
  int64_t next_rank_ = 0;

  absl::flat_hash_map<std::string, Placement> placed_;
  absl::flat_hash_map<std::string, int> running_by_type_;
};

}  // namespace dispatchd::sched
