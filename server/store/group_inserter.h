#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/job/job.h"
#include "server/store/job_store.h"

namespace dispatchd::store {

// Places jobs on workers in the statement that inserts them (the leader's dispatcher), so that a
// job that can run at once reaches its worker after one commit, not two (insert, then claim).
// Implementations are thread-safe; both calls come from an inserter thread, around the insert.
class Placer {
 public:
  virtual ~Placer() = default;
  // Before the insert: sets worker_id on each job that a worker is to run now, and clears it on
  // the others. May place none (and must, rather than keep the inserts waiting long).
  virtual void Place(std::vector<job::Job>& jobs) = 0;
  // After it: what the insert made of the placements, `outcomes` (one per job, as InsertMany
  // returns them: `dispatched` where the row went to its worker) or the error that wrote
  // nothing. Called for every Place, before any caller's `done` runs.
  virtual void Placed(const std::vector<job::Job>& jobs,
                      const absl::StatusOr<std::vector<InsertOutcome>>& outcomes) = 0;
};

// Group commit for inserts: the jobs of many concurrent Submit calls share one statement, and so
// one round trip and one WAL flush, instead of one each.
//
//   GroupInserter inserter(store, {});
//   inserter.Insert(std::move(jobs), /*notify_leader=*/false,
//                   [](std::vector<job::Job> jobs,
//                      absl::StatusOr<std::vector<InsertOutcome>> outcomes) { ... });
//
// There is no timer: a batch is whatever gathered while the previous ones were being committed,
// up to `max_rows`. At light load a lone job goes straight to the database, so grouping adds no
// latency; under load the batches grow until one commit carries what arrived during the last.
// Each Insert call is a unit: its jobs are committed together or not at all, and `done` runs
// only after the commit, so a caller that answers its client from `done` never acknowledges a
// row that is not durable. A batch refused for any reason but an unreachable database is tried
// again unit by unit, so that one bad unit cannot fail the others.
//
// Thread-safe. `done` runs on one of the inserter's threads: it must not block for long.
class GroupInserter {
 public:
  struct Options {
    // Rows per statement at most (a larger unit goes alone).
    size_t max_rows = 1000;
    // Statements in flight at once; each holds a pooled connection while it runs.
    int flushers = 2;
  };
  // Gets the unit's jobs back (moved through the batch, not copied) and their outcomes.
  using Done = absl::AnyInvocable<void(std::vector<job::Job> jobs,
                                       absl::StatusOr<std::vector<InsertOutcome>> outcomes) &&>;

  GroupInserter(JobStore& store, Options options);
  // Stop().
  ~GroupInserter();
  GroupInserter(const GroupInserter&) = delete;
  GroupInserter& operator=(const GroupInserter&) = delete;

  // Queues `jobs` to be inserted as JobStore::InsertMany would; `done` gets one outcome per job,
  // in order, or the error. With a `placer` (the leader's), the jobs it places are written
  // DISPATCHED to their workers (see Placer). After Stop, `done` runs at once with Unavailable.
  void Insert(std::vector<job::Job> jobs, bool notify_leader, Done done,
              std::shared_ptr<Placer> placer = nullptr) ABSL_LOCKS_EXCLUDED(mu_);

  // Commits what is queued, then joins the threads. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Statements run and rows written so far (for tests and metrics).
  struct Counts {
    int64_t statements = 0;
    int64_t rows = 0;
  };
  Counts counts() const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Unit {
    std::vector<job::Job> jobs;
    bool notify_leader = false;
    Done done;
    std::shared_ptr<Placer> placer;
    // When Insert() took it; InfinitePast once its wait is counted (insert_wait).
    absl::Time queued_at;
  };

  void Run() ABSL_LOCKS_EXCLUDED(mu_);
  // Takes the next batch off the queue: units in order with the first one's notify flag and
  // placer, up to max_rows (at least one unit).
  std::vector<Unit> TakeBatch() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Commit(std::vector<Unit> batch) ABSL_LOCKS_EXCLUDED(mu_);
  // Inserts `units` in one statement; on success splits the outcomes among them.
  absl::Status InsertTogether(std::vector<Unit>& units) ABSL_LOCKS_EXCLUDED(mu_);

  JobStore& store_;
  const Options options_;

  mutable absl::Mutex mu_;
  std::deque<Unit> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  Counts counts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
};

}  // namespace dispatchd::store
