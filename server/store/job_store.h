#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "lib/job/job.h"

namespace dispatchd::store {

// Outcome of Insert.
struct InsertOutcome {
  std::string job_id;
  // True when (fairness_key, idempotency_key) matched an existing job and nothing was inserted.
  bool deduplicated = false;
  // The new row's arrival order (job::Job::seq); 0 when deduplicated.
  int64_t seq = 0;
  // The job named a worker (job::Job::worker_id) and its row was written DISPATCHED to it.
  bool dispatched = false;
};

// One claim: QUEUED -> DISPATCHED to `worker_id`, if the row is still QUEUED at `attempt`.
struct ClaimRequest {
  std::string job_id;
  int32_t attempt = 0;  // attempts started so far, as the caller last saw them
  std::string worker_id;
};

// How a running attempt ended.
struct FinishRequest {
  std::string job_id;
  int32_t attempt = 0;                              // the attempt that ended
  job::JobState state = job::JobState::kSucceeded;  // SUCCEEDED, FAILED or CANCELLED
  std::string result;
  std::string error;
  // How long the attempt ran, if known. A row still DISPATCHED (its RUNNING mark never written:
  // the outcome came first) records started_at as its finish less this.
  absl::Duration ran = absl::InfiniteDuration();
  // Whether WriteTurn reads the row's times back (TurnOutcome::finished_times): for a job someone
  // waits on, whose answer is the row.
  bool row_times = false;
};

// One accept to record: DISPATCHED at attempt - 1 -> RUNNING at attempt on worker_id (or a
// RUNNING row at attempt re-attached).
struct MarkRequest {
  std::string job_id;
  int32_t attempt = 0;
  std::string worker_id;
};

// Another attempt for a failed one (Retry).
struct RetryRequest {
  std::string job_id;
  int32_t attempt = 0;  // the attempt that failed
  absl::Time not_before = absl::InfinitePast();
  std::string error;
  // How long the attempt ran, if known. A row still DISPATCHED (the failure came before its
  // RUNNING mark) keeps, in the attempt it records, its retry less this as the start.
  absl::Duration ran = absl::InfiniteDuration();
};

// A DISPATCHED job back to the queue, no attempt consumed (ReturnToQueue).
struct ReturnRequest {
  std::string job_id;
  int32_t attempt = 0;  // attempts started (unchanged)
};

// What one dispatcher turn writes, and what of it took effect.
struct TurnWrites {
  std::vector<FinishRequest> finishes;
  std::vector<MarkRequest> marks;
  std::vector<ClaimRequest> claims;
  std::vector<RetryRequest> retries;
  std::vector<ReturnRequest> returns;
  bool empty() const {
    return finishes.empty() && marks.empty() && claims.empty() && retries.empty() &&
           returns.empty();
  }
  size_t rows() const {
    return finishes.size() + marks.size() + claims.size() + retries.size() + returns.size();
  }
};
struct TurnOutcome {
  // The ids that changed, as FinishMany, MarkRunningMany, Claim, Retry and ReturnToQueue say.
  std::vector<std::string> finished, marked, claimed, retried, returned;
  std::vector<std::string> claimed_payloads;  // the payload of each claimed job, as Claim's
  // The times of each finished job's row as committed, by `finished`'s index, for the finishes
  // that asked (FinishRequest::row_times); nullopt for the others.
  struct Times {
    absl::Time created_at = absl::InfinitePast();
    absl::Time dispatched_at = absl::InfinitePast();
    absl::Time started_at = absl::InfinitePast();
    absl::Time finished_at = absl::InfinitePast();
    absl::Time not_before = absl::InfinitePast();  // the spec's, or a retry's
  };
  std::vector<std::optional<Times>> finished_times;
};

// The QUEUED jobs of one queue (a job type and a fairness key), as the dispatcher pages them.
struct QueueCount {
  std::string type;
  std::string fairness_key;
  int64_t queued = 0;       // QUEUED rows
  int64_t up_to_bound = 0;  // of those, rows with seq <= the bound asked about (CountQueued)
};
struct QueueBound {
  std::string type;
  std::string fairness_key;
  int64_t bound = 0;
};
// Every queue with QUEUED rows, and the first rows of each.
struct QueuedHeads {
  std::vector<QueueCount> queues;
  std::vector<job::Job> jobs;  // per queue in seq order, without payloads
};

// Job counts by type and state (every state, terminal ones included while retained).
struct TypeStateCount {
  std::string type;
  job::JobState state = job::JobState::kQueued;
  int64_t count = 0;
  // CountActiveByTypeAndState only: the jobs' owner (counts are per type, state and owner).
  std::string owner;
};

// Where a job stands, without its payload or result.
struct JobRef {
  std::string job_id;
  job::JobState state = job::JobState::kQueued;
  int32_t attempt = 0;
  std::string worker_id;
  absl::Time updated_at = absl::InfinitePast();  // last transition, by the database's clock
};

// What SearchJobs looks for; each field left at its default matches every job.
struct JobSearch {
  std::optional<job::JobState> state;
  std::string type;
  std::string fairness_key;
  // Only jobs this principal submitted; nullopt: every owner.
  std::optional<std::string> owner;
  absl::Time created_after = absl::InfinitePast();     // created_at >= this
  absl::Time created_before = absl::InfiniteFuture();  // created_at < this
  int64_t limit = 100;
};

// Outcome of Cancel.
struct CancelOutcome {
  job::Job job;                                     // after the cancellation
  job::JobState previous = job::JobState::kQueued;  // state before it
};

// One row of the scheduler's fair-share accounts (sched::FairAccounts): `kind` is "clock" (the
// virtual time; `a` and `b` empty), "tenant" (`a` the tenant), "key" (`a` the tenant, `b` the
// fairness key) or "estimate" (`a` the type, `b` the resource_id).
struct AccountRow {
  std::string kind;
  std::string a;
  std::string b;
  double value = 0;

  bool operator==(const AccountRow&) const = default;
};

// Durable job records. PostgreSQL is the source of truth; every transition is a compare-and-set
// on (id, state, attempt), so a stale writer changes nothing and the Set/Finish calls return false
// instead of overwriting. Timestamps are the database server's clock.
//
// Thread-safe: each call checks a connection out of an internal pool for its duration.
// Errors: Unavailable (database unreachable), Aborted (serialization conflict: retry),
// NotFound, FailedPrecondition, InvalidArgument, Internal.
//
// Fencing: the writes only the leading daemon makes (Claim, MarkRunning, ReturnToQueue, Retry,
// Finish, ExpireOverdue, SaveAccounts) carry the leader epoch set by SetFence and
// change nothing once another daemon has become the leader: then they fail FailedPrecondition
// ("fenced: ..."). Insert, Cancel and the reads are open to every daemon.
class JobStore {
 public:
  virtual ~JobStore() = default;

  // Inserts `job` (state QUEUED, attempt 0; `job.id` set by the caller). When the spec has an
  // idempotency key and a job with the same (fairness_key, idempotency_key) still holds it (the
  // job is active, or ended less than the store's idempotency window ago and is still kept),
  // returns that job's id with deduplicated = true. Race-free: of concurrent inserts of one key,
  // one inserts.
  virtual absl::StatusOr<InsertOutcome> Insert(const job::Job& job) = 0;

  // Inserts `jobs` as Insert would each, all or none, in one round trip where no job has an
  // idempotency key. Rows are queued in the vector's order (FIFO follows it); a job whose key is
  // held (by an existing job, or by an earlier job in `jobs`) is not inserted and gets the
  // holder's id with deduplicated = true. One outcome per job, in order. With `notify_leader`
  // each new row is also announced to the leader (NotifyChanged) when, and only if, it commits.
  //
  // A job whose worker_id is set is placed on that worker by the leader that inserts it: its row
  // is written DISPATCHED there (attempt 0, as a claim leaves it; outcome `dispatched`) while
  // this store's fence (SetFence) is the leader's epoch, and otherwise QUEUED and announced like
  // a standby's row, so that a deposed leader places nothing. One commit then takes a job from
  // its Submit to its worker. The other fields of a job's row are not read.
  //
  // InvalidArgument naming `jobs[i]` if a job cannot be stored.
  virtual absl::StatusOr<std::vector<InsertOutcome>> InsertMany(const std::vector<job::Job>& jobs,
                                                                bool notify_leader) = 0;

  // The job with this id, or NotFound.
  virtual absl::StatusOr<job::Job> Get(const std::string& job_id) = 0;

  // The jobs with these ids that exist, in no particular order; one round trip.
  virtual absl::StatusOr<std::vector<job::Job>> GetMany(
      const std::vector<std::string>& job_ids) = 0;

  // Jobs that match `search`, active and ended alike, newest first (by created_at, then seq), at
  // most `search.limit`; without payloads or results. Reads every retained row of the tables it
  // searches: for people and tools, not for hot paths.
  virtual absl::StatusOr<std::vector<job::Job>> SearchJobs(const JobSearch& search) = 0;

  // Every job in QUEUED, DISPATCHED or RUNNING, oldest first.
  virtual absl::StatusOr<std::vector<job::Job>> LoadActive() = 0;

  // What the dispatcher loads. Jobs come without their payloads (job.spec.payload is empty): a
  // claim returns the payload when it is needed.
  //
  // Every DISPATCHED and RUNNING job, oldest first.
  virtual absl::StatusOr<std::vector<job::Job>> LoadPlaced() = 0;
  // Every queue with QUEUED rows, with its count, and its first `per_queue` rows by seq.
  virtual absl::StatusOr<QueuedHeads> LoadQueuedHeads(int64_t per_queue) = 0;
  // The QUEUED rows of one queue with seq > `after_seq`, at most `limit`, by seq.
  virtual absl::StatusOr<std::vector<job::Job>> LoadQueuedPage(const std::string& type,
                                                               const std::string& fairness_key,
                                                               int64_t after_seq,
                                                               int64_t limit) = 0;
  // QUEUED rows of one queue with a seq below `seq`: the jobs ahead of that one.
  virtual absl::StatusOr<int64_t> CountQueuedBefore(const std::string& type,
                                                    const std::string& fairness_key,
                                                    int64_t seq) = 0;
  // Every queue with QUEUED rows, with its count and how many of them have seq <= the queue's
  // entry in `bounds` (all of them for a queue not named).
  virtual absl::StatusOr<std::vector<QueueCount>> CountQueued(
      const std::vector<QueueBound>& bounds) = 0;

  // Claims jobs with SELECT ... FOR UPDATE SKIP LOCKED: a row another session holds is skipped,
  // never waited on. Returns the ids actually claimed (a subset of the requests), and, if
  // `payloads` is not null, fills it with their payloads in the same order.
  virtual absl::StatusOr<std::vector<std::string>> Claim(const std::vector<ClaimRequest>& claims,
                                                         std::vector<std::string>* payloads) = 0;
  absl::StatusOr<std::vector<std::string>> Claim(const std::vector<ClaimRequest>& claims) {
    return Claim(claims, nullptr);
  }

  // DISPATCHED at attempt-1 -> RUNNING at `attempt` on `worker_id` (the worker accepted).
  // Also adopts a row that is already RUNNING at `attempt` on any worker (a re-attach), setting
  // its worker. False if the row is in neither shape.
  virtual absl::StatusOr<bool> MarkRunning(const std::string& job_id, int32_t attempt,
                                           const std::string& worker_id) = 0;

  // DISPATCHED -> QUEUED with no attempt consumed (every worker refused it, or its worker left
  // before accepting). `attempt` is the number of attempts started (unchanged). False if stale.
  virtual absl::StatusOr<bool> ReturnToQueue(const std::string& job_id, int32_t attempt) = 0;

  // RUNNING at `attempt` (or DISPATCHED at the attempt before: a failure that overtook its
  // accept) -> QUEUED for another attempt, not before `not_before`, keeping `error` as the last
  // failure. False if stale.
  virtual absl::StatusOr<bool> Retry(const std::string& job_id, int32_t attempt,
                                     absl::Time not_before, const std::string& error) = 0;

  // RUNNING (or DISPATCHED) at `attempt` -> the terminal state in `req`. False if stale: the job
  // ended already or its attempt is no longer current.
  virtual absl::StatusOr<bool> Finish(const FinishRequest& req) = 0;

  // MarkRunning and Finish for many jobs in one statement (one commit); the ids that changed.
  // A request that is stale is left out, as the single forms would return false for it.
  virtual absl::StatusOr<std::vector<std::string>> MarkRunningMany(
      const std::vector<MarkRequest>& marks) = 0;
  virtual absl::StatusOr<std::vector<std::string>> FinishMany(
      const std::vector<FinishRequest>& reqs) = 0;
  // FinishMany, MarkRunningMany, Claim, Retry and ReturnToQueue in one transaction: one commit
  // (one WAL flush) for a whole turn. The writes must name disjoint jobs. All or nothing.
  virtual absl::StatusOr<TurnOutcome> WriteTurn(const TurnWrites& writes) = 0;

  // QUEUED, DISPATCHED or RUNNING -> CANCELLED with `reason` as error. NotFound for an unknown
  // id, FailedPrecondition if the job already ended.
  virtual absl::StatusOr<CancelOutcome> Cancel(const std::string& job_id,
                                               const std::string& reason) = 0;

  // QUEUED -> EXPIRED with `error` for every QUEUED job whose dispatch deadline is before `now`
  // (in one transaction, at most a million a call: the rest wait for the next). Returns the ids
  // expired.
  virtual absl::StatusOr<std::vector<std::string>> ExpireOverdue(absl::Time now,
                                                                 const std::string& error) = 0;

  // Counts by type and state.
  virtual absl::StatusOr<std::vector<TypeStateCount>> CountByTypeAndState() = 0;

  // Jobs in QUEUED, DISPATCHED or RUNNING.
  virtual absl::StatusOr<int64_t> CountActive() = 0;

  // Counts of QUEUED, DISPATCHED and RUNNING jobs by type, state and owner.
  virtual absl::StatusOr<std::vector<TypeStateCount>> CountActiveByTypeAndState() = 0;

  // State, attempt and worker of each job in `job_ids` that exists (in no particular order).
  virtual absl::StatusOr<std::vector<JobRef>> GetRefs(const std::vector<std::string>& job_ids) = 0;

  // Every DISPATCHED and RUNNING job.
  virtual absl::StatusOr<std::vector<JobRef>> LoadPlacedRefs() = 0;

  // Tells the leading daemon, wherever it runs, that the row of `job_id` changed behind its back
  // (a standby inserted or cancelled it). Best effort: the leader also recounts on a schedule.
  virtual absl::Status NotifyChanged(const std::string& job_id) = 0;

  // The leader epoch the fenced writes carry from now on (see the class comment).
  virtual void SetFence(int64_t epoch) = 0;

  // Writes `rows` over the saved ones of the same (kind, a, b), and deletes the rows not written
  // for `ttl` (what the scheduler forgets after that idle time). Fenced.
  virtual absl::Status SaveAccounts(const std::vector<AccountRow>& rows, absl::Duration ttl) = 0;
  // Every saved row.
  virtual absl::StatusOr<std::vector<AccountRow>> LoadAccounts() = 0;
};

}  // namespace dispatchd::store
