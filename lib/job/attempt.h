#pragma once

#include <cstdint>
#include <string>

#include "absl/time/time.h"

#include "lib/job/job.h"

namespace dispatchd::job {

// The life of an attempt as the leading daemon sees it, between the rows it has committed and
// what its workers tell it. Each function below takes a job's AttemptState and one event (a
// worker's accept, result or refusal, a heartbeat, a lost worker, a clock), updates the state
// and returns a Transition: what the edges must do, in the order given by its fields. None of
// them reads a clock, a store or a socket, so every edge of the state diagram (DESIGN.md,
// "States") is a unit test with a fake clock (tests/unit/lib/job/attempt_test.cc).
//
//   AttemptState s = AttemptState::Of(row);
//   Transition t = OnResult(s, worker, result_attempt, outcome, now);
//   // t.write goes to the store (server/dispatch/turn_writer.h); once committed,
//   // Written(s, t.write.kind, changed) says what the job is now.
//
// Attempts are counted as the row counts them: `attempt` is the number of attempts started. A
// DISPATCHED job's worker runs attempt `attempt + 1`; a RUNNING job's runs `attempt`.

// A write the store owes one job. Every write is a compare-and-set on (id, state, attempt).
enum class WriteKind : uint8_t {
  kNone,
  kMark,     // DISPATCHED at attempt - 1 -> RUNNING at attempt on the worker (its accept)
  kSucceed,  // RUNNING at attempt (or DISPATCHED at attempt - 1) -> SUCCEEDED
  kFail,     // ... -> FAILED
  kRetry,    // ... -> QUEUED for attempt + 1, not before `not_before`
  kReturn,   // DISPATCHED at attempt -> QUEUED, no attempt consumed
};
absl::string_view ToString(WriteKind kind);

struct Write {
  WriteKind kind = WriteKind::kNone;
  // kReturn: attempts started (unchanged). The others: the attempt that ran.
  int32_t attempt = 0;
  std::string result;                            // kSucceed
  std::string error;                             // kFail, kRetry
  absl::Time not_before = absl::InfinitePast();  // kRetry
  // The outcome is its worker's result: the worker keeps it until it is acknowledged, which
  // happens once the write is committed (or known to be moot).
  bool from_result = false;
  // kMark: not before this time. An accept's RUNNING mark waits a little, so a short job whose
  // result comes first costs one write, not two.
  absl::Time due = absl::InfinitePast();
  // kSucceed, kFail, kRetry from a result: how long the attempt ran, if known (the row's
  // started_at, when its mark was never written).
  absl::Duration ran = absl::InfiniteDuration();

  // A write that settles the attempt (everything but kNone and kMark).
  bool Settles() const { return kind != WriteKind::kNone && kind != WriteKind::kMark; }
};

// What the daemon knows of one job it holds, beyond its spec.
struct AttemptState {
  JobState state = JobState::kQueued;  // as last committed
  int32_t attempt = 0;                 // attempts started, as last committed
  std::string worker_id;               // DISPATCHED or RUNNING: its worker
  // DISPATCHED, and its worker accepted attempt + 1 and runs it; the RUNNING mark is owed. It
  // counts as running (timeout, heartbeats, on_orphan), and its outcome settles the row all the
  // same (the store's settling writes accept the attempt before).
  bool accepted = false;
  absl::Time started_at = absl::InfinitePast();         // the current attempt's accept
  absl::Time run_deadline = absl::InfiniteFuture();     // running: execution timeout
  absl::Time orphan_deadline = absl::InfiniteFuture();  // adopted: re-attach grace
  int heartbeat_misses = 0;  // running: heartbeats in a row from its worker without it
  // The write decided and not yet handed to the store (kind kNone: none), and the one the store
  // is committing. A job has at most one of each: a later decision replaces an owed mark, and
  // waits behind a write in flight (two writes of one row are never in flight at once).
  Write owed;
  Write writing;

  // A job as loaded, or read back, from its row.
  static AttemptState Of(const Job& row);

  // The attempt its worker holds: attempt + 1 while DISPATCHED, attempt while RUNNING.
  int32_t HeldAttempt() const;
  // Its attempt's outcome is decided (owed or being written): it holds no slot any more.
  bool Settled() const { return owed.Settles() || writing.Settles(); }
  // The attempt runs on its worker: RUNNING, or accepted, and not settled.
  bool Runs() const;
  // The worker's `attempt` is the one this job runs now (or ran, if settled).
  bool IsCurrent(const std::string& worker, int32_t attempt) const;
  // The outcome decided for it is `worker`'s result for `attempt`, not yet acknowledged.
  bool ResultWaits(const std::string& worker, int32_t attempt) const;
  // The settling write owed or in flight (kind kNone if none).
  const Write& Settling() const { return writing.Settles() ? writing : owed; }
};

// What the edges do after a decision.
struct Transition {
  // Owed to the store now (already in AttemptState::owed); kind kNone: nothing to write.
  WriteKind write = WriteKind::kNone;
  // The attempt no longer holds its slot on the worker (the scheduler's slot is free).
  bool frees_slot = false;
  // Tell the worker to stop `stop_attempt` of this job.
  bool stop_worker = false;
  int32_t stop_attempt = 0;
  // Acknowledge the worker's result for `ack_attempt` at once: it is stale, or moot.
  bool ack = false;
  int32_t ack_attempt = 0;
  // Nothing changed and nothing is to be done (a repeat).
  bool Nothing() const { return write == WriteKind::kNone && !frees_slot && !stop_worker && !ack; }
};

// The scheduler placed the job on `worker` and the store committed its claim.
void Dispatched(AttemptState& s, const std::string& worker);

// `worker` accepted `attempt` at `now`; the attempt may run for `timeout`. Starts it (the RUNNING
// mark owed, due `mark_delay` later); a repeat changes nothing; an attempt that is not current
// (cancelled, expired, placed elsewhere) is stopped.
Transition OnAccept(AttemptState& s, const std::string& worker, int32_t attempt, absl::Time now,
                    absl::Duration timeout, absl::Duration mark_delay);

// How a worker's attempt ended.
struct Outcome {
  bool succeeded = false;
  std::string output;  // succeeded
  std::string error;   // failed
  bool retryable = false;
  absl::Duration ran = absl::InfiniteDuration();  // how long it ran, if known
};
// What a failed attempt leads to: another attempt after a backoff, or the end.
struct RetryPolicy {
  int32_t max_attempts = 1;
  // When the next attempt may start, if there is one.
  absl::Time retry_at = absl::InfinitePast();
};

// `worker` reports `attempt` ended. The current attempt's outcome is owed (success, retry or
// failure); a result for an attempt that is not current is acknowledged and dropped; the same
// result again while its write waits changes nothing.
Transition OnResult(AttemptState& s, const std::string& worker, int32_t attempt,
                    const Outcome& outcome, const RetryPolicy& policy);

// `worker` refused attempt `attempt` (full, draining, no such type). A current DISPATCHED job
// goes back to the queue, no attempt consumed.
Transition OnReject(AttemptState& s, const std::string& worker, int32_t attempt);

// A heartbeat of the job's worker, which lists the job at `held_attempt` (0: not listed). True
// once a running job has been missing from `misses_to_lose` heartbeats in a row: it is lost on
// its worker, which the edges tell to stop it before they apply Orphan.
bool MissedHeartbeat(AttemptState& s, int32_t held_attempt, int misses_to_lose);

// The job's worker is gone (lost, stale, or it reconnected without the job, or it never came back
// after a restart). DISPATCHED and not accepted: back to the queue. Running: the type's
// on_orphan: `requeue` retries (attempts allowing), else the job fails.
Transition Orphan(AttemptState& s, bool requeue, const RetryPolicy& policy,
                  const std::string& reason);

// A running attempt past its run deadline at `now`: stopped, and failed as retryable.
Transition TimeOut(AttemptState& s, absl::Time now, absl::Duration timeout,
                   const RetryPolicy& policy);

// The row ended elsewhere (a client cancelled it, a standby or the reconcile found it ended):
// the worker stops its attempt, and a result waiting to be written is acknowledged as moot.
Transition Ended(const AttemptState& s);

// What a worker that reconnects says it holds: `attempt` of this job.
enum class Reattach {
  kNo,           // not its attempt to run: not adopted
  kRunning,      // RUNNING here at that attempt: adopted
  kAccepted,     // DISPATCHED and accepted: adopted, and the RUNNING mark owed at once
  kResultWaits,  // its result waits to be written: adopted, so the worker keeps it
};
Reattach OnReattach(AttemptState& s, const std::string& worker, int32_t attempt, absl::Time now,
                    absl::Duration timeout);

// Whether `worker` holding `attempt` in a heartbeat holds it as its own.
bool HoldsAsItsOwn(const AttemptState& s, const std::string& worker, int32_t attempt);

// Hands the owed write to the store: it moves to `writing`. False if there is none, if a write
// of this job is in flight already (the owed one waits for it), or if it is a mark not due at
// `now`.
bool StartWrite(AttemptState& s, absl::Time now);

// What the job is after a write the store answered.
enum class AfterWrite {
  kNothing,  // nothing for the edges to do (a refused mark whose attempt is settled already)
  kRunning,  // a mark committed: RUNNING at its attempt
  kQueued,   // a retry or return committed: QUEUED (enqueue it)
  kEnded,    // a settle committed: the job ended (forget it)
  kMovedOn,  // the row had moved on (cancelled, ended elsewhere): forget it
  kStale,    // a mark the row refused while the job runs: stop the worker (the reconcile settles)
};
struct WriteAnswer {
  AfterWrite next = AfterWrite::kNothing;
  Write write;  // the write the store answered
};
// The store answered the write in flight: `changed` if the row took it. The next owed write, if
// any, may go now.
WriteAnswer Written(AttemptState& s, bool changed);
// The store did not answer the write in flight (an error): it is owed again, unless a later
// decision replaced it.
void WriteFailed(AttemptState& s);

}  // namespace dispatchd::job
