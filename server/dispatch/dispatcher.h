#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "dispatchd/v1/admin_service.pb.h"
#include "dispatchd/v1/worker_service.pb.h"
#include "lib/config/config.h"
#include "lib/job/job.h"
#include "lib/sched/admission_gate.h"
#include "lib/sched/memory_throttle.h"
#include "lib/sched/scheduler.h"
#include "lib/util/clock.h"
#include "server/dispatch/job_events.h"
#include "server/dispatch/overflow_hook.h"
#include "server/dispatch/worker_link.h"
#include "server/store/job_store.h"
#include "server/util/executor.h"

namespace dispatchd::metrics {
class Histogram;
}  // namespace dispatchd::metrics

namespace dispatchd::dispatch {

// Logs the one line (debug, component "dispatch") that records a terminal transition this daemon
// committed: `finished job=ID state=STATE attempt=N`. Fault tests count them per job.
void LogFinished(const std::string& job_id, job::JobState state, int32_t attempt);

// Connects the scheduler to the store and the worker streams. It owns the sched::Scheduler and
// every in-memory view of jobs and workers, and runs them on one thread (the loop): RPC handlers
// and worker streams post events, the loop applies them, asks the scheduler for decisions,
// commits each transition to the store as a compare-and-set and only then tells workers and
// watchers. The store stays the record of truth: a transition the store refuses (the row moved
// on, e.g. a concurrent cancel) is dropped here too.
//
// One Dispatcher runs per leadership term (server/ha/leadership.h): the daemon that leads builds
// one when it wins the lease and stops it when it loses it; its store writes carry the term's
// fence, so a stopped dispatcher of a deposed leader can change nothing.
//
// Usage:
//   Dispatcher d(config, store, clock, events, gate);
//   DISPATCHD_RETURN_IF_ERROR(d.Start());   // loads active jobs, starts the loop
//   d.JobQueued(job);                        // after the job's row is committed
//
// Thread-safe: public methods post to the loop and return at once (Workers() waits for it).
class Dispatcher {
 public:
  Dispatcher(config::Config config, store::JobStore& store, Clock& clock, JobEvents& events,
             sched::AdmissionGate& admission);
  ~Dispatcher();
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Loads QUEUED, DISPATCHED and RUNNING jobs from the store and starts the loop. Jobs that were
  // dispatched or running wait `orphan_grace` for their workers to reconnect and report them.
  absl::Status Start();
  // Stops the loop and ends every worker stream. Jobs keep their rows; workers reconnect to the
  // next daemon and report what they still run.
  void Stop();

  // A job's QUEUED row was committed.
  void JobQueued(job::Job job);
  // A job's row moved to CANCELLED from `previous`; a worker running it is told to stop.
  void JobCancelled(const std::string& job_id, job::JobState previous);
  // Rows that changed behind the dispatcher's back (a standby inserted or cancelled them), as
  // read after the change: a QUEUED job it does not hold is queued, a job it holds that has
  // ended is dropped (its worker told to stop).
  void RowsChanged(std::vector<job::Job> rows);

  // A worker stream sent its Hello (already checked for required fields). Once Stop() has begun
  // the link is closed UNAVAILABLE instead.
  void WorkerConnected(std::shared_ptr<WorkerLink> link, v1::Hello hello);
  // A later message on that stream.
  void WorkerMessage(std::shared_ptr<WorkerLink> link, v1::WorkerMessage msg);
  // The stream ended. Its jobs stay with the worker until it reconnects or goes stale.
  void WorkerDisconnected(std::shared_ptr<WorkerLink> link);

  // Connected workers, by rank. Waits for the loop.
  std::vector<v1::WorkerInfo> Workers();
  // The scheduler's queues, caps, buckets and the `max_keys` lowest-cost keys. Waits for the loop.
  sched::SchedulerStats SchedulerStats(size_t max_keys = SIZE_MAX);
  // Why a queued job waits and its place in line; nullopt if the daemon holds no such queued
  // job. A job that waits in the database behind its queue's window (see "Paging" below) is
  // in line behind the jobs held; `*paged_out` says so (its position is then for the caller to
  // count). Waits for the loop.
  std::optional<sched::WaitInfo> WhyWaiting(const job::Job& job, bool* paged_out = nullptr);
  // Changes the rate limit of a model (or of a type without one) until the next config load.
  // False if no configured type uses `rate_key`. Waits for the loop.
  bool SetRateLimit(const std::string& rate_key, config::RateLimit limit);
  // Sets a tenant's weight until the next config (sched::Scheduler::SetTenantWeight). False if
  // the loop did not run it (stopping) or the weight is out of range.
  bool SetTenantWeight(const std::string& tenant, double weight);
  // A reloaded config (see config::MergeReload): types, tiers, rate limits and policy change for
  // the jobs queued now and later; buckets keep their tokens, and a rate set by SetRateLimit
  // gives way to the file's. Waits for the loop; false if it has stopped.
  bool UpdateConfig(config::Config config);
  // An operator drains a connected worker: it gets no new jobs and is sent Drain. Its state
  // after that, or nullopt if no such worker is connected (or the loop has stopped).
  std::optional<v1::WorkerInfo> DrainWorker(const std::string& worker_id);

  // Limits checked before a job is written (max_active, max_queue_depth). Thread-safe.
  sched::AdmissionGate& admission() { return admission_; }

  // Drifts found and repaired since start: scheduler counts that disagreed with its jobs, jobs a
  // worker stopped reporting, jobs a worker ran that were not its own, rows that changed in the
  // database without the dispatcher hearing of it. Thread-safe.
  int64_t repairs() const { return repairs_.load(); }

  // When the loop last came round (wall time; it comes round at least every 200 ms while it is
  // not stuck in a task). For the service manager's watchdog. Thread-safe.
  absl::Time LastLoop() const { return absl::FromUnixNanos(last_loop_ns_.load()); }

 private:
  // The connected workers, by rank (loop-confined; Workers() and DrainWorker() wrap it).
  std::vector<v1::WorkerInfo> WorkersNow() const;

  // A job type's histograms, looked up in the registry once per type rather than once per job.
  struct TypeMetrics {
    metrics::Histogram* queue_wait = nullptr;
    metrics::Histogram* run_time = nullptr;
  };
  TypeMetrics& MetricsOf(const std::string& type);
  // An attempt's run time, from the worker's accept to its result, for a job that was accepted.
  void ObserveRun(const job::Job& job, absl::Time now);

  // A transition decided here but not yet written, because the database refused the write.
  enum class Parked { kNo, kSuccess, kFailure };
  struct ParkedWrite {
    std::string job_id;
    int32_t attempt = 0;
    std::string worker_id;
    bool failed = false;
    std::string output;  // success
    std::string error;   // failure
    bool retryable = false;
    bool ack = false;  // a worker's result: acknowledged once written, so the worker keeps it
  };
  // A job the daemon has not seen end.
  struct Entry {
    job::Job job;  // state and attempt as last committed
    absl::Time run_deadline = absl::InfiniteFuture();     // RUNNING: execution timeout
    absl::Time orphan_deadline = absl::InfiniteFuture();  // after a restart: re-attach grace
    int heartbeat_misses = 0;  // RUNNING: heartbeats in a row from its worker without it
    // DISPATCHED, but its worker accepted attempt job.attempt + 1 and runs it: the RUNNING mark
    // waits in unmarked_ (for the end of the round, or for the database to answer again). It counts
    // as running (timeout, heartbeats, on_orphan), and its outcome settles the row all the same
    // (the store's writes accept the attempt before).
    bool accepted = false;
    // Its attempt ended but the outcome waits in parked_ for the database: it holds no slot,
    // no timeout runs, and its worker's repeats of the result are not acted on again.
    Parked parked = Parked::kNo;
    int32_t parked_attempt = 0;
    bool result_waits = false;  // the parked outcome is its worker's result, not yet acknowledged
  };
  struct Session {
    std::shared_ptr<WorkerLink> link;  // null while disconnected
    v1::Hello hello;
    std::string peer;
    absl::Time connected_at;
    absl::Time last_seen;
    bool throttled = false;  // memory over its throttle threshold, not yet below resume
    // Jobs its last heartbeat held that were not its to run, by attempt: stopped only if the
    // next heartbeat still holds them (a result crossing its ack on the wire is not a drift).
    absl::flat_hash_map<std::string, int32_t> not_own;
  };

  void Post(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` on the loop and waits for it (at most 10 s; not at all once stopping). False if
  // it did not run in time: the task may still run later, so the caller must not read what it
  // writes.
  bool RunOnLoop(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // Everything below runs on the loop thread only.
  void TakeQueued(job::Job job);
  // Paging. A queue is a job type and a fairness key; the loop holds the first QUEUED rows of
  // each queue, by seq, up to `scheduler.queue_window`, and reads the next ones in as it drains.
  // Hold() says whether a QUEUED row that arrives (a Submit, a standby's insert, a reconcile)
  // is held here; if not it waits in the database, counted in its window's `unheld`.
  bool Hold(const job::Job& row);
  // Holds a QUEUED row: into jobs_ and the scheduler, without its payload.
  void Keep(job::Job row);
  // Reads the next rows of queues whose window ran below half full.
  void Refill(absl::Time now);
  // Tells the admission gate what the loop holds now.
  void PublishLoad(absl::Time now);
  // Tells the admission gate the active jobs of each tenant that has a max_active.
  void PublishTenantLoad();
  // Saves the scheduler's changed fair-share accounts on the writer, or here with `wait`.
  void SaveAccounts(bool wait);
  void Sweep(absl::Time now);
  void OnHello(const std::shared_ptr<WorkerLink>& link, const v1::Hello& hello, absl::Time now);
  void OnAccept(const std::string& worker_id, const v1::Accept& accept, absl::Time now);
  void OnReject(const std::string& worker_id, const v1::Reject& reject);
  void OnResult(const std::string& worker_id, const v1::Result& result, absl::Time now);
  // Checks a heartbeat's held jobs against the jobs placed on the worker (both ways).
  void OnHeartbeat(const std::string& worker_id, const v1::Heartbeat& heartbeat, absl::Time now);
  void OnRowChanged(const job::Job& row, absl::Time now);
  // Compares the jobs held here with the active rows in the database and repairs differences.
  void Reconcile(absl::Time now);
  // Forgets a job whose row ended elsewhere; its worker, if any, is told to stop.
  void Drop(const std::string& job_id, const std::string& why, absl::Time now);

  void OnDisconnect(const std::shared_ptr<WorkerLink>& link, absl::Time now);
  void LoseWorker(const std::string& worker_id, const std::string& reason);
  // A job whose worker is gone: DISPATCHED returns to the queue, RUNNING follows on_orphan.
  void Orphan(Entry& entry, const std::string& reason, absl::Time now);
  // Ends a running attempt as failed: retried after backoff while attempts remain. False if the
  // database refused the write: the outcome is parked (and `ack`, a worker's result, is sent
  // once it is written).
  bool FailAttempt(Entry& entry, int32_t attempt, const std::string& error, bool retryable,
                   absl::Time now, bool ack = false);
  // A DISPATCHED job that never started goes back to the queue, no attempt consumed.
  void Requeue(Entry& entry, absl::Time not_before);
  // Keeps a failed attempt whose write the database refused, to be written by RetryParked.
  void Park(Entry& entry, int32_t attempt, const std::string& error, bool retryable, bool ack);
  void RetryParked(absl::Time now);
  // Group commit: the results and RUNNING marks this turn gathered and the claims of its
  // dispatch decisions, written in one transaction (store::JobStore::WriteTurn) on the writer's
  // thread while the loop goes on; FinishTurn then acknowledges the results and assigns the
  // claimed jobs. Up to kMaxTurnsInFlight turns are written at once, so the loop keeps taking
  // results and deciding while the database commits. On an error the results and marks wait
  // kStoreErrorPause and go again (the entries keep counting as running or ended meanwhile),
  // and the decisions are retracted.
  void CommitTurn(absl::Time now);
  // A turn's writes on their way to the store.
  struct TurnInFlight {
    store::TurnWrites writes;
    std::vector<ParkedWrite> successes;
    std::vector<sched::Dispatch> decisions;
  };
  void FinishTurn(TurnInFlight turn, absl::StatusOr<store::TurnOutcome> out);
  // Moves the successes waiting in parked_ into `reqs` (and `taken`).
  void TakeSuccesses(std::vector<store::FinishRequest>* reqs, std::vector<ParkedWrite>* taken);
  // The RUNNING marks that are due (kRunningMarkDelay after their accept).
  void TakeDueMarks(absl::Time now, std::vector<store::MarkRequest>* marks);
  void ApplyFinishes(const std::vector<ParkedWrite>& written,
                     const std::vector<std::string>& finished_ids);
  void ApplyMarks(const std::vector<store::MarkRequest>& marks,
                  const std::vector<std::string>& marked_ids);
  // Assigns the claimed jobs to their workers, with the payloads the claim returned (moved
  // out); the rest go back to the queue.
  void ApplyClaims(const std::vector<sched::Dispatch>& decisions,
                   const std::vector<std::string>& claimed, std::vector<std::string>& payloads,
                   absl::Time now);
  // The claim of `decisions` failed: back to the queue, and dispatching pauses.
  void RetractClaims(const std::vector<sched::Dispatch>& decisions, absl::Time now);
  // Acknowledges a worker's result once its outcome is durable (or known to be stale). Acks are
  // sent at the end of the loop turn, all of a worker's in one ResultAcks if it reads them.
  void SendAck(const std::string& worker_id, const std::string& job_id, int32_t attempt);
  void FlushAcks();
  // Whether the job's attempt runs on its worker (RUNNING, or accepted and not yet marked), and
  // the attempt its worker holds.
  static bool Runs(const Entry& e) { return e.job.state == job::JobState::kRunning || e.accepted; }
  static int32_t HeldAttempt(const Entry& e) {
    return e.job.state == job::JobState::kDispatched ? e.job.attempt + 1 : e.job.attempt;
  }
  void Finish(const std::string& job_id, job::JobState state, const std::string& result,
              const std::string& error);
  void SendTo(const std::string& worker_id, v1::DaemonMessage msg);
  void SendCancel(const std::string& worker_id, const std::string& job_id, int32_t attempt,
                  const std::string& reason);
  // Applies the memory throttle to a worker from its heartbeat, with hysteresis.
  void CheckMemory(const std::string& worker_id, const v1::Heartbeat& heartbeat);
  sched::PendingJob ToPending(const job::Job& job) const;
  sched::PlacedJob ToPlaced(const job::Job& job, const std::string& worker_id) const;
  // How long an attempt that started at `started_at` has run, if that is known.
  static std::optional<absl::Duration> RanSince(absl::Time started_at, absl::Time now);
  const config::JobTypeConfig* TypeOf(const job::Job& job) const;
  // The worker id of the session whose link this is, or empty.
  std::string WorkerIdOf(const std::shared_ptr<WorkerLink>& link) const;

  config::Config config_;  // loop-confined after Start (UpdateConfig replaces it on the loop)
  store::JobStore& store_;
  Clock& clock_;
  JobEvents& events_;

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every link handed to WorkerConnected, so that Stop() can close those whose Hello never ran.
  std::vector<std::weak_ptr<WorkerLink>> links_ ABSL_GUARDED_BY(mu_);
  // Jobs handed to JobQueued whose admission reservation the loop has not settled yet, by type
  // and owner.
  absl::flat_hash_map<std::pair<std::string, std::string>, int64_t> unsettled_ ABSL_GUARDED_BY(mu_);
  std::thread loop_;
  std::atomic<int64_t> repairs_{0};
  std::atomic<int64_t> last_loop_ns_{absl::ToUnixNanos(absl::Now())};
  // A save of the fair-share accounts is on the writer; the last one failed (save all next).
  std::atomic<bool> accounts_in_flight_{false};
  std::atomic<bool> accounts_failed_{false};
  // Runs the turns' writes (kMaxTurnsInFlight threads), each on a pooled connection of its own.
  std::unique_ptr<server::Executor> writer_;

  // Loop-confined state.
  absl::flat_hash_map<std::string, TypeMetrics> type_metrics_;
  using QueueId = std::pair<std::string, std::string>;  // (type, fairness key)
  // A queue whose QUEUED rows are not all held: every one with seq <= bound is held (or on its
  // way: JobQueued, RowsChanged), and the `unheld` ones above wait in the database. A queue with
  // no window is complete: all its rows are held, or on their way.
  struct Window {
    int64_t bound = 0;
    int64_t unheld = 0;  // as last counted, give or take rows that ended in the database since
  };
  static QueueId QueueOf(const job::Job& job) { return {job.spec.type, job.spec.fairness_key}; }
  absl::flat_hash_map<QueueId, Window> windows_;
  // Reconcile for one queue whose count differs: drops held jobs that ended, holds the rows its
  // window covers that are missing. `held`: its QUEUED jobs held; `queued`: its QUEUED rows.
  void ReconcileQueue(const QueueId& queue, const std::vector<std::string>& held, int64_t queued,
                      absl::Time now);
  absl::Time refill_paused_until_ = absl::InfinitePast();
  sched::Scheduler scheduler_;
  sched::AdmissionGate& admission_;
  OverflowHook overflow_hook_;
  int64_t ended_since_publish_ = 0;  // jobs that left jobs_ for good since the last PublishLoad
  absl::flat_hash_map<std::string, Entry> jobs_;
  absl::flat_hash_map<std::string, Session> sessions_;
  absl::flat_hash_set<std::string> unreturned_;  // DISPATCHED rows a failed write left to return
  absl::flat_hash_set<std::string> unmarked_;    // accepted jobs whose RUNNING mark is not written
  int64_t unwritten_successes_ = 0;              // kSuccess entries of parked_ to write
  absl::Time writes_paused_until_ = absl::InfinitePast();
  int turns_in_flight_ = 0;
  // Jobs whose RUNNING mark is in a turn in flight: their success waits for it (two turns in
  // flight never write one row, so they cannot deadlock on row locks).
  absl::flat_hash_set<std::string> marking_;
  // The reconcile is due: it runs once no turn is in flight (it compares settled state).
  bool reconcile_due_ = false;
  // Jobs dropped (cancelled, ended elsewhere) while a turn was in flight: a claim of one of them
  // that comes back won is no bug (ApplyClaims).
  absl::flat_hash_set<std::string> dropped_in_flight_;
  // When CommitTurn must run next: a RUNNING mark falls due, or a paused write may go again.
  absl::Time next_flush_ = absl::InfiniteFuture();
  std::vector<ParkedWrite> parked_;       // outcomes to write once the database answers
  // Acks of this loop turn, by worker, sent by FlushAcks.
  absl::flat_hash_map<std::string, v1::ResultAcks> unsent_acks_;
  absl::Time next_sweep_ = absl::InfinitePast();
  absl::Time next_expiry_ = absl::InfinitePast();
  absl::Time next_audit_ = absl::InfinitePast();
  absl::Time next_reconcile_ = absl::InfinitePast();
  absl::Time next_accounts_ = absl::InfinitePast();
  absl::Time dispatch_paused_until_ = absl::InfinitePast();
  uint64_t next_session_ = 1;
};

}  // namespace dispatchd::dispatch
