#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "dispatchd/v1/admin_service.pb.h"
#include "dispatchd/v1/worker_service.pb.h"
#include "lib/config/config.h"
#include "lib/job/attempt.h"
#include "lib/job/job.h"
#include "lib/sched/admission_gate.h"
#include "lib/sched/memory_throttle.h"
#include "lib/sched/scheduler.h"
#include "lib/util/clock.h"
#include "lib/util/thread_role.h"
#include "server/dispatch/job_events.h"
#include "server/dispatch/overflow_hook.h"
#include "server/dispatch/queue_pager.h"
#include "server/dispatch/reconciler.h"
#include "server/dispatch/turn_writer.h"
#include "server/dispatch/worker_link.h"
#include "server/store/group_inserter.h"
#include "server/store/job_store.h"

namespace dispatchd::metrics {
class Gauge;
class Histogram;
}  // namespace dispatchd::metrics

namespace dispatchd::dispatch {

// Logs the one line (debug, component "dispatch") that records a terminal transition this daemon
// committed: `finished job=ID state=STATE attempt=N`. Fault tests count them per job.
void LogFinished(const std::string& job_id, job::JobState state, int32_t attempt);

// Connects the scheduler to the store and the worker streams. It owns the sched::Scheduler and
// every in-memory view of jobs and workers, and runs them on one thread (the loop): RPC handlers
// and worker streams post events, the loop applies them (the attempt rules are lib/job/attempt.h,
// the placement rules lib/sched), and each decision owes its job a write. The loop hands the owed
// writes and the scheduler's claims to the TurnWriter in turns, each one transaction off the
// loop thread, and only once a turn is committed tells workers and watchers. The store stays the
// record of truth: a transition the store refuses (the row moved on, e.g. a concurrent cancel)
// is dropped here too. After Start the dispatcher reaches the store only through its writer.
//
//   Submit -> JobQueued -> loop (scheduler) -> writer (claim) -> loop -> worker (Assign)
//   Submit -> Place (loop: scheduler) -> insert, DISPATCHED -> JobQueued -> worker (Assign)
//   worker (Result) -> loop (AttemptState) -> writer (finish) -> loop -> worker (ResultAck)
//
// One Dispatcher runs per leadership term (server/ha/leadership.h): the daemon that leads builds
// one when it wins the lease and stops it when it loses it; its store writes carry the term's
// fence, so a stopped dispatcher of a deposed leader can change nothing.
//
// A job that can run the moment it is submitted takes one commit, not two: as the leader's
// inserter is about to write it, Place asks the loop for a worker, and the insert writes the row
// DISPATCHED to that worker under the term's fence (store::Placer; "One commit to a worker" in
// docs/architecture.md says why each guarantee holds).
//
// Usage:
//   Dispatcher d(config, store, clock, events, gate);
//   DISPATCHD_RETURN_IF_ERROR(d.Start());   // loads active jobs, starts the loop
//   d.JobQueued(std::move(job));             // after the job's row is committed
//
// Thread-safe: public methods post to the loop and return at once (Workers() waits for it).
class Dispatcher final : public store::Placer {
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

  // A job's QUEUED row was committed: the dispatcher takes the job and its admission reservation
  // (written), moving from both, and drops the reservation once the loop holds the job (or once
  // the term ends without it: the next term loads the row). False, with both untouched, once
  // Stop() has begun: the caller tells whichever daemon leads next (LeaderIntake does).
  // A job Place placed comes here too, its row DISPATCHED (job.state kDispatched), and goes to
  // its worker.
  bool JobQueued(job::Job& job, sched::Reservation& reservation);
  // store::Placer, on the leader's inserter threads: the scheduler places the jobs that can run
  // now (waiting at most kPlaceWait for the loop), and learns what their insert made of it.
  void Place(std::vector<job::Job>& jobs) override;
  void Placed(const std::vector<job::Job>& jobs,
              const absl::StatusOr<std::vector<store::InsertOutcome>>& outcomes) override;
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
  // What a metrics scrape reads, in one wait for the loop: the scheduler's figures without its
  // keys (each type's serving workers among them) and the connected workers' totals. It builds
  // no WorkerInfo: a scrape of a fleet of 1,000 workers would otherwise copy every type, label
  // and resident model of each on the loop's thread. All zero if the loop did not answer.
  struct Gauges {
    sched::SchedulerStats scheduler;
    int64_t workers = 0;  // connected
    int64_t busy = 0;
    int64_t slots = 0;
    // Each connected worker's id and the models it has loaded since it connected.
    std::vector<std::pair<std::string, int64_t>> model_loads;
  };
  Gauges ReadGauges();
  // dispatcher_admin.cc, from here to UpdateConfig.
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
  // after that; NotFound if no such worker is connected, Unavailable if the loop did not answer
  // in time (busy or stopping; the drain may still be applied later).
  absl::StatusOr<v1::WorkerInfo> DrainWorker(const std::string& worker_id);

  // The daemon is stopping: from now on no worker gets a new job, each connected worker (and
  // any that connects later) is sent Stopping with `why`, and results are still recorded. Jobs
  // stay queued for the next leader. Waits for the loop; false if it has stopped.
  bool StopAssigning(const std::string& why);
  // Jobs on connected workers (assigned and not yet ended), plus jobs whose outcome or RUNNING
  // mark is not written yet; -1 if the loop did not answer. A stopping daemon waits for this to
  // reach 0, so that what its workers reported is recorded by its own term. Waits for the loop.
  int64_t JobsInFlight();

  // Limits checked before a job is written (max_active, max_queue_depth). Thread-safe.
  sched::AdmissionGate& admission() { return admission_; }

  // Drifts found and repaired since start: scheduler counts that disagreed with its jobs, jobs a
  // worker stopped reporting, jobs a worker ran that were not its own, rows that changed in the
  // database without the dispatcher hearing of it. Thread-safe.
  int64_t repairs() const { return repairs_.load(); }

  // Turns the store has answered (written or failed) and the loop has applied since Start. For
  // tests, which wait on it rather than on time. Thread-safe.
  int64_t turns_answered() const { return turns_answered_.load(); }

  // When the loop last came round (wall time; it comes round at least every 200 ms while it is
  // not stuck in a task). For the service manager's watchdog. Thread-safe.
  absl::Time LastLoop() const { return absl::FromUnixNanos(last_loop_ns_.load()); }

 private:
  // A job the daemon holds and has not seen end: its row as loaded (spec, timestamps; its state,
  // attempt and worker as committed live in `at`, which the lifecycle functions of
  // lib/job/attempt.h update).
  struct Held {
    job::Job job;
    job::AttemptState at;
    // The worker it is filed under in held_on_worker_; empty if none.
    std::string filed_worker;
  };
  // A job Place placed, from the decision until the loop holds it (JobQueued) or undoes it (its
  // insert wrote no DISPATCHED row). The scheduler counts it placed on its worker meanwhile.
  struct Placing {
    std::string worker_id;
    absl::Time since;
    bool landed = false;   // its row is DISPATCHED; JobQueued brings the job
    bool dropped = false;  // cancelled or ended elsewhere meanwhile: not assigned
  };
  struct Session {
    std::shared_ptr<WorkerLink> link;  // null while disconnected
    v1::Hello hello;
    std::string peer;
    absl::Time connected_at;
    absl::Time last_seen;
    bool throttled = false;  // memory over its throttle threshold, not yet below resume
    // RAM as its last heartbeat reported it.
    int64_t ram_used_bytes = 0;
    int64_t ram_total_bytes = 0;
    // GPUs as its last heartbeat (or Hello, before the first) reported them, for ListWorkers.
    google::protobuf::RepeatedPtrField<v1::Gpu> gpus;
    // Jobs its last heartbeat held that were not its to run, by attempt: stopped only if the
    // next heartbeat still holds them (a result crossing its ack on the wire is not a drift).
    absl::flat_hash_map<std::string, int32_t> not_own;
  };
  // A job type's histograms, looked up in the registry once per type rather than once per job.
  struct TypeMetrics {
    metrics::Histogram* queue_wait = nullptr;
    metrics::Histogram* run_time = nullptr;
  };
  // A turn on its way to the store: the jobs whose owed writes it carries (each job's write is
  // its AttemptState::writing), the scheduler's decisions it claims, and the rows of jobs no
  // longer held that it returns to the queue.
  struct Turn {
    std::vector<std::string> jobs;
    std::vector<sched::Dispatch> decisions;
    std::vector<store::ReturnRequest> strays;
    size_t rows = 0;
  };

  // Queues `task` for the loop and wakes it.
  void Post(absl::AnyInvocable<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Queues `task` without waking the loop: it runs, in order with every other task, when the loop
  // next wakes, within kSweepInterval. For what no one waits on, such as a heartbeat: a fleet's
  // heartbeats then cost the loop a few wakeups a second instead of one each.
  void PostUnhurried(absl::AnyInvocable<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` on the loop and waits for it (at most 10 s; not at all once stopping). False if
  // it did not run in time: the task may still run later, so the caller must not read what it
  // writes.
  bool RunOnLoop(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `compute` on the loop as RunOnLoop does and returns its answer; nullopt if it did not
  // run in time. A late run's answer goes to a copy no caller reads.
  template <typename F>
  std::optional<std::invoke_result_t<F&>> AskLoop(F compute) ABSL_LOCKS_EXCLUDED(mu_) {
    auto out = std::make_shared<std::optional<std::invoke_result_t<F&>>>();
    if (!RunOnLoop([out, compute = std::move(compute)]() mutable { *out = compute(); })) {
      return std::nullopt;
    }
    return std::move(*out);
  }
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  // Everything below runs on the loop thread only (ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_),
  // checked by the thread-safety analysis; see lib/util/thread_role.h).
  //
  // dispatcher.cc: the loop's housekeeping.
  void TakeQueued(job::Job job, sched::Reservation reservation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // dispatcher_placement.cc: the jobs the leader's inserts place (store::Placer).
  //
  // Place on the loop: sets worker_id on the jobs the scheduler places now.
  void PlaceNow(std::vector<job::Job>& jobs, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Placed on the loop: `landed` rows are DISPATCHED (JobQueued brings them), `undone` not.
  void ApplyPlaced(const std::vector<std::string>& landed, const std::vector<std::string>& undone)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // JobQueued of a placed job: held and assigned to its worker.
  void TakePlaced(job::Job row, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Placements whose row was written but whose job never came (a bug): forgotten after
  // kPlacementTimeout, so that the reconcile, which waits for placements in flight, can run and
  // adopt their rows.
  void ExpirePlacements(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Holds a QUEUED row: into jobs_ and the scheduler, without its payload.
  void Keep(job::Job row) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Holds a DISPATCHED or RUNNING row whose worker may still run it (after a restart, or found
  // by the reconcile): placed on that worker for orphan_grace, then orphaned unless it re-attaches.
  void HoldPlaced(job::Job row, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Files the held job `id` in held_on_worker_ under the worker its attempt names, if any; called
  // wherever that worker is set (a row held, a job handed over).
  void FileByWorker(const std::string& id, Held& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Takes it out of held_on_worker_ (FileByWorker, before filing it under another worker;
  // ForgetHeld, before it leaves jobs_).
  void UnfileByWorker(const std::string& id, Held& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Lets go of a held job for good (it ended, moved on or expired): out of jobs_, owed_ and
  // held_on_worker_, and counted as drained at the next PublishLoad.
  void ForgetHeld(absl::flat_hash_map<std::string, Held>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Reads the next rows of queues whose window ran below half full (QueuePager).
  void Refill(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void ApplyPage(const QueuePager::Page& page, absl::StatusOr<std::vector<job::Job>> rows)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Tells the admission gate what the loop holds now.
  void PublishLoad(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Tells the admission gate the active jobs of each tenant that has a max_active.
  void PublishTenantLoad() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Saves the scheduler's changed fair-share accounts through the writer (waiting, with `wait`).
  void SaveAccounts(bool wait) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void Sweep(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void Expire(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void ApplyExpired(absl::StatusOr<std::vector<std::string>> expired)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void OnRowChanged(const job::Job& row, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Forgets a job whose row ended elsewhere; its worker, if any, is told to stop.
  void Drop(const std::string& job_id, const std::string& why, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  TypeMetrics& MetricsOf(const std::string& type) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // An attempt's run time, from the worker's accept to its result, for a job that was accepted.
  void ObserveRun(const Held& h, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  sched::PendingJob ToPending(const Held& h) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // `job` as the scheduler queues it, at `attempt` (attempts started).
  static sched::PendingJob ToPending(const job::Job& job, int32_t attempt);
  sched::PlacedJob ToPlaced(const job::Job& job, const std::string& worker_id) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // How long an attempt that started at `started_at` has run, if that is known.
  static std::optional<absl::Duration> RanSince(absl::Time started_at, absl::Time now);
  const config::JobTypeConfig* TypeOf(const job::Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // What a failed attempt of this job leads to (max_attempts and the type's backoff).
  job::RetryPolicy PolicyOf(const job::Job& job, int32_t attempt, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Whether a running job whose worker is gone is retried (on_orphan: requeue).
  bool RequeuesOrphans(const job::Job& job) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);

  // dispatcher_turns.cc: the one write path. Each decision owes its job a write
  // (AttemptState::owed, the job listed in owed_); CommitTurn hands the owed writes that may go,
  // with the scheduler's dispatch decisions as claims, to the writer as one turn; FinishTurn
  // applies what the store made of it. On an error the writes are owed again and go after
  // kStoreErrorPause, with dispatching paused as long, and the claims are retracted.
  void Owe(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_) {
    owed_.insert(job_id);
  }
  void CommitTurn(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Scheduler::Decide for up to kMaxDispatchesPerRound, timed into decision_seconds_.
  std::vector<sched::Dispatch> Decide(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void FinishTurn(Turn turn, TurnResult result) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // A job's write in flight was answered: `changed` if the row took it, `failed` if the store
  // did not answer. `times`: a finished row's times as committed, if the store returned them.
  void Answered(Held& h, bool changed, bool failed, absl::Time now,
                const store::TurnOutcome::Times* times = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Hands a held QUEUED job that the store made DISPATCHED to `worker_id` to that worker: an
  // Assignment with `payload` in `assigns`, or an orphan if the worker was lost meanwhile.
  void Handover(Held& h, const std::string& worker_id, std::string payload,
                absl::flat_hash_map<std::string, v1::DaemonMessage>& assigns, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void SendAssigns(absl::flat_hash_map<std::string, v1::DaemonMessage>& assigns)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Assigns the claimed jobs to their workers, with the payloads the claim returned (moved
  // out); the rest go back to the queue.
  void ApplyClaims(const std::vector<sched::Dispatch>& decisions,
                   const std::vector<std::string>& claimed, std::vector<std::string>& payloads,
                   absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The claim of `decisions` failed: back to the queue.
  void RetractClaims(const std::vector<sched::Dispatch>& decisions)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The reconcile (reconciler.h): a snapshot once no turn is in flight, the reads on the
  // writer, and the repairs back on the loop.
  void StartReconcile(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void ApplyReconcile(ReconcileReads reads) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);

  // dispatcher_workers.cc: worker streams and what they say about their jobs.
  void OnHello(const std::shared_ptr<WorkerLink>& link, const v1::Hello& hello, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void OnAccept(const std::string& worker_id, const v1::Accept& accept, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void OnReject(const std::string& worker_id, const v1::Reject& reject)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void OnResult(const std::string& worker_id, const v1::Result& result, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Checks a heartbeat's held jobs against the jobs placed on the worker (both ways).
  void OnHeartbeat(const std::string& worker_id, const v1::Heartbeat& heartbeat, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void OnDisconnect(const std::shared_ptr<WorkerLink>& link, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void LoseWorker(const std::string& worker_id, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Counts a drift found and repaired, of `kind` (metrics::repair): in Stats, and on /metrics.
  void Repaired(const char* kind);
  // A job whose worker is gone: DISPATCHED returns to the queue, RUNNING follows on_orphan.
  void Orphan(Held& h, const std::string& reason, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Applies the memory throttle to a worker from its heartbeat, with hysteresis.
  void CheckMemory(const std::string& worker_id, const v1::Heartbeat& heartbeat)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The connected workers, by rank (Workers() and DrainWorker() wrap it).
  std::vector<v1::WorkerInfo> WorkersNow() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The scheduler's figures with the jobs the pager leaves in the database counted in.
  sched::SchedulerStats StatsNow(size_t max_keys) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Acknowledges a worker's result once its outcome is durable (or known to be stale). Acks are
  // sent at the end of the loop turn, all of a worker's in one ResultAcks if it reads them.
  void SendAck(const std::string& worker_id, const std::string& job_id, int32_t attempt)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void FlushAcks() ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void SendTo(const std::string& worker_id, v1::DaemonMessage msg)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // Marks a connected worker draining and sends it Stopping (see StopAssigning).
  void SendStopping(const std::string& worker_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  void SendCancel(const std::string& worker_id, const std::string& job_id, int32_t attempt,
                  const std::string& reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);
  // The worker id of the session whose link this is, or empty.
  std::string WorkerIdOf(const std::shared_ptr<WorkerLink>& link) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(loop_role_);

  // Plays the loop: Start() until the loop thread starts, then the loop thread, then Stop()
  // once it has joined it.
  util::ThreadRole loop_role_;
  config::Config config_ ABSL_GUARDED_BY(loop_role_);  // UpdateConfig replaces it on the loop
  // The cores it may use (server::UsableCores) and postgres.turns_in_flight for them, as the
  // dispatcher started (a reload does not change them).
  const unsigned usable_cores_;
  const int max_turns_in_flight_;
  store::JobStore& store_;  // read at Start only; everything after goes through writer_
  Clock& clock_;
  JobEvents& events_;

  absl::Mutex mu_;
  // Posted tasks. A task dropped unrun (Stop) drops what it holds: a JobQueued task's admission
  // reservation is then counted, as the next term loads the row.
  std::deque<absl::AnyInvocable<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  // A task that wakes the loop is among them (every one but PostUnhurried's).
  bool wake_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  // Every link handed to WorkerConnected, so that Stop() can close those whose Hello never ran.
  std::vector<std::weak_ptr<WorkerLink>> links_ ABSL_GUARDED_BY(mu_);
  std::thread loop_;
  std::atomic<int64_t> repairs_{0};
  std::atomic<int64_t> turns_answered_{0};
  std::atomic<int64_t> last_loop_ns_{absl::ToUnixNanos(absl::Now())};
  // A save of the fair-share accounts is on the writer; the last one failed (save all next).
  std::atomic<bool> accounts_in_flight_{false};
  std::atomic<bool> accounts_failed_{false};
  std::unique_ptr<TurnWriter> writer_;

  // The loop's state.
  absl::flat_hash_map<std::string, TypeMetrics> type_metrics_ ABSL_GUARDED_BY(loop_role_);
  metrics::Histogram* decision_seconds_ ABSL_GUARDED_BY(loop_role_) = nullptr;  // set by Start
  metrics::Gauge* turns_gauge_ ABSL_GUARDED_BY(loop_role_) = nullptr;           // set by Start
  QueuePager pager_ ABSL_GUARDED_BY(loop_role_);
  sched::Scheduler scheduler_ ABSL_GUARDED_BY(loop_role_);
  sched::AdmissionGate& admission_;
  OverflowHook overflow_hook_ ABSL_GUARDED_BY(loop_role_);
  // Jobs that left jobs_ for good since the last PublishLoad.
  int64_t ended_since_publish_ ABSL_GUARDED_BY(loop_role_) = 0;
  absl::flat_hash_map<std::string, Held> jobs_ ABSL_GUARDED_BY(loop_role_);
  // Held jobs by the worker their attempt was last handed to (Held::filed_worker), so that a
  // worker's Hello finds the jobs it held without a walk of every held job (a fleet's thousand
  // Hellos over tens of thousands of queued jobs). A superset: a job whose attempt moved on stays
  // filed until handed to another worker or forgotten, and readers check its attempt.
  absl::flat_hash_map<std::string, absl::flat_hash_set<std::string>> held_on_worker_
      ABSL_GUARDED_BY(loop_role_);
  absl::flat_hash_set<std::string> owed_ ABSL_GUARDED_BY(loop_role_);  // AttemptState::owed
  absl::flat_hash_map<std::string, Placing> placing_ ABSL_GUARDED_BY(loop_role_);
  // Dispatches of held jobs that a Place decided beside its own: claimed by the next turn.
  std::vector<sched::Dispatch> decided_ ABSL_GUARDED_BY(loop_role_);
  // Claimed rows of jobs no longer held here (cancelled while the claim was in flight): each
  // goes back to the queue in the next turn.
  std::vector<store::ReturnRequest> stray_returns_ ABSL_GUARDED_BY(loop_role_);
  absl::flat_hash_map<std::string, Session> sessions_ ABSL_GUARDED_BY(loop_role_);
  // The worker of each session's link: a message finds its worker in one lookup, not a walk of
  // every session (a fleet's thousand per message). An entry per session with a link, kept where
  // a session's link is set or dropped (OnHello, OnDisconnect, LoseWorker, the loop's end).
  absl::flat_hash_map<const WorkerLink*, std::string> worker_of_link_ ABSL_GUARDED_BY(loop_role_);
  int turns_in_flight_ ABSL_GUARDED_BY(loop_role_) = 0;
  int reads_in_flight_ ABSL_GUARDED_BY(loop_role_) = 0;  // page reads
  bool expiry_in_flight_ ABSL_GUARDED_BY(loop_role_) = false;
  // The reconcile is due (it starts once no turn or read is in flight), or its reads are on the
  // writer (no turn starts until they are applied).
  bool reconcile_due_ ABSL_GUARDED_BY(loop_role_) = false;
  absl::Time reconcile_due_since_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  bool reconcile_in_flight_ ABSL_GUARDED_BY(loop_role_) = false;
  // Jobs dropped (cancelled, ended elsewhere) while a turn or a read was in flight: a claim of
  // one that comes back won is no bug, and a page that still lists one does not hold it.
  absl::flat_hash_set<std::string> dropped_in_flight_ ABSL_GUARDED_BY(loop_role_);
  // After a write the store refused for want of an answer: writes and claims wait till then.
  absl::Time paused_until_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  // When CommitTurn must run next: a RUNNING mark falls due, or a paused write may go again.
  absl::Time next_flush_ ABSL_GUARDED_BY(loop_role_) = absl::InfiniteFuture();
  // Acks of this loop turn, by worker, sent by FlushAcks.
  absl::flat_hash_map<std::string, v1::ResultAcks> unsent_acks_ ABSL_GUARDED_BY(loop_role_);
  absl::Time next_sweep_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  absl::Time next_expiry_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  absl::Time next_audit_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  absl::Time next_reconcile_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  absl::Time next_accounts_ ABSL_GUARDED_BY(loop_role_) = absl::InfinitePast();
  uint64_t next_session_ ABSL_GUARDED_BY(loop_role_) = 1;
  // Why the daemon stops (StopAssigning); empty while it assigns.
  std::string stop_assigning_ ABSL_GUARDED_BY(loop_role_);
};

}  // namespace dispatchd::dispatch
