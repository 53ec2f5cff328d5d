#include "lib/job/attempt.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace dispatchd::job {
namespace {

// Owes the write that ends `attempt` as failed: another attempt after the policy's backoff while
// attempts remain and the failure may be retried, else the end.
void OweFailure(AttemptState& s, int32_t attempt, std::string error, bool retryable,
                const RetryPolicy& policy, bool from_result) {
  const bool again = retryable && attempt < policy.max_attempts;
  s.owed = Write{.kind = again ? WriteKind::kRetry : WriteKind::kFail,
                 .attempt = attempt,
                 .error = std::move(error),
                 .not_before = again ? policy.retry_at : absl::InfinitePast(),
                 .from_result = from_result};
  s.run_deadline = absl::InfiniteFuture();
}

Transition Owes(const AttemptState& s) {
  return Transition{.write = s.owed.kind, .frees_slot = true};
}

}  // namespace

absl::string_view ToString(WriteKind kind) {
  switch (kind) {
    case WriteKind::kNone:
      return "none";
    case WriteKind::kMark:
      return "mark";
    case WriteKind::kSucceed:
      return "succeed";
    case WriteKind::kFail:
      return "fail";
    case WriteKind::kRetry:
      return "retry";
    case WriteKind::kReturn:
      return "return";
  }
  return "?";
}

AttemptState AttemptState::Of(const Job& row) {
  return AttemptState{.state = row.state,
                      .attempt = row.attempt,
                      .worker_id = row.worker_id,
                      .started_at = row.started_at};
}

int32_t AttemptState::HeldAttempt() const {
  return state == JobState::kDispatched ? attempt + 1 : attempt;
}

bool AttemptState::Runs() const { return (state == JobState::kRunning || accepted) && !Settled(); }

bool AttemptState::IsCurrent(const std::string& worker, int32_t a) const {
  return worker_id == worker && ((state == JobState::kRunning && a == attempt) ||
                                 (state == JobState::kDispatched && a == attempt + 1));
}

bool AttemptState::ResultWaits(const std::string& worker, int32_t a) const {
  const Write& w = Settling();
  return w.Settles() && w.from_result && w.attempt == a && worker_id == worker;
}

void Dispatched(AttemptState& s, const std::string& worker) {
  s.state = JobState::kDispatched;
  s.worker_id = worker;
  s.accepted = false;
  s.heartbeat_misses = 0;
}

Transition OnAccept(AttemptState& s, const std::string& worker, int32_t attempt, absl::Time now,
                    absl::Duration timeout, absl::Duration mark_delay) {
  if (s.state == JobState::kRunning && s.worker_id == worker && s.attempt == attempt) {
    return {};  // a repeated accept
  }
  if (s.state != JobState::kDispatched || s.worker_id != worker || s.attempt + 1 != attempt) {
    // Not this worker's attempt to run (cancelled, expired, placed elsewhere): stop it.
    return Transition{.stop_worker = true, .stop_attempt = attempt};
  }
  if (s.accepted || s.Settled()) return {};  // a repeat, or its outcome is in already
  // From here it counts as running; the RUNNING mark waits `mark_delay`, and is not written at
  // all if the result comes first.
  s.accepted = true;
  s.started_at = now;
  s.run_deadline = now + timeout;
  s.heartbeat_misses = 0;
  s.owed = Write{.kind = WriteKind::kMark, .attempt = attempt, .due = now + mark_delay};
  return Transition{.write = WriteKind::kMark};
}

Transition OnResult(AttemptState& s, const std::string& worker, int32_t attempt,
                    const Outcome& outcome, const RetryPolicy& policy) {
  const bool current = s.IsCurrent(worker, attempt);
  if (current && s.ResultWaits(worker, attempt)) {
    return {};  // the same result again while its write waits: acknowledged once it lands
  }
  if (!current || s.Settled()) {
    return Transition{.ack = true, .ack_attempt = attempt};  // stale: the worker may forget it
  }
  if (outcome.succeeded) {
    // Replaces an owed mark: the finish accepts the row still DISPATCHED.
    s.owed = Write{.kind = WriteKind::kSucceed,
                   .attempt = attempt,
                   .result = outcome.output,
                   .from_result = true};
    s.run_deadline = absl::InfiniteFuture();
  } else {
    OweFailure(s, attempt, outcome.error, outcome.retryable, policy, /*from_result=*/true);
  }
  s.owed.ran = outcome.ran;
  return Owes(s);
}

Transition OnReject(AttemptState& s, const std::string& worker, int32_t attempt) {
  if (s.state != JobState::kDispatched || s.worker_id != worker || s.attempt + 1 != attempt ||
      s.accepted || s.Settled()) {
    return {};
  }
  s.owed = Write{.kind = WriteKind::kReturn, .attempt = s.attempt};
  return Owes(s);
}

Transition Orphan(AttemptState& s, bool requeue, const RetryPolicy& policy,
                  const std::string& reason) {
  if (s.Settled()) return {};  // its outcome is known, only not yet written
  if (s.state == JobState::kDispatched && !s.accepted) {
    s.owed = Write{.kind = WriteKind::kReturn, .attempt = s.attempt};
    return Owes(s);
  }
  if (!s.Runs()) return {};
  OweFailure(s, s.HeldAttempt(), absl::StrCat("interrupted: ", reason), requeue, policy,
             /*from_result=*/false);
  return Owes(s);
}

bool MissedHeartbeat(AttemptState& s, int32_t held_attempt, int misses_to_lose) {
  if (!s.Runs()) return false;
  if (held_attempt == s.HeldAttempt()) {
    s.heartbeat_misses = 0;
    return false;
  }
  return ++s.heartbeat_misses >= misses_to_lose;
}

Transition TimeOut(AttemptState& s, absl::Time now, absl::Duration timeout,
                   const RetryPolicy& policy) {
  if (!s.Runs() || s.run_deadline > now) return {};
  const int32_t attempt = s.HeldAttempt();
  OweFailure(s, attempt,
             absl::StrCat("timeout: attempt ", attempt, " ran longer than ",
                          absl::FormatDuration(timeout)),
             /*retryable=*/true, policy, /*from_result=*/false);
  Transition t = Owes(s);
  t.stop_worker = true;
  t.stop_attempt = attempt;
  return t;
}

Transition Ended(const AttemptState& s) {
  Transition t;
  if ((s.state == JobState::kDispatched || s.state == JobState::kRunning) && !s.Settled()) {
    t.frees_slot = true;
    t.stop_worker = true;
    t.stop_attempt = s.HeldAttempt();
  }
  if (const Write& w = s.Settling(); w.Settles() && w.from_result) {
    t.ack = true;  // the result waiting to be written is moot: let its worker forget it
    t.ack_attempt = w.attempt;
  }
  return t;
}

Reattach OnReattach(AttemptState& s, const std::string& worker, int32_t attempt, absl::Time now,
                    absl::Duration timeout) {
  if (s.worker_id != worker) return Reattach::kNo;
  if (s.Settled()) {
    // Its result waits to be written: the worker keeps it until acknowledged.
    return s.ResultWaits(worker, attempt) ? Reattach::kResultWaits : Reattach::kNo;
  }
  Reattach how;
  if (s.state == JobState::kRunning && s.attempt == attempt) {
    how = Reattach::kRunning;
  } else if (s.state == JobState::kDispatched && s.attempt + 1 == attempt) {
    // An accept that was never recorded: record it now. Until the mark lands the row stays
    // DISPATCHED at the attempt before, which the outcome settles all the same.
    how = Reattach::kAccepted;
    s.accepted = true;
    if (s.owed.kind == WriteKind::kNone) {
      s.owed = Write{.kind = WriteKind::kMark, .attempt = attempt};
    }
  } else {
    return Reattach::kNo;
  }
  s.heartbeat_misses = 0;
  s.orphan_deadline = absl::InfiniteFuture();
  if (s.run_deadline == absl::InfiniteFuture()) s.run_deadline = now + timeout;
  return how;
}

bool HoldsAsItsOwn(const AttemptState& s, const std::string& worker, int32_t attempt) {
  if (s.worker_id != worker) return false;
  if (s.Settled()) return s.ResultWaits(worker, attempt);
  return s.HeldAttempt() == attempt &&
         (s.state == JobState::kRunning || s.state == JobState::kDispatched);
}

bool StartWrite(AttemptState& s, absl::Time now) {
  if (s.owed.kind == WriteKind::kNone || s.writing.kind != WriteKind::kNone) return false;
  if (s.owed.kind == WriteKind::kMark && s.owed.due > now) return false;
  s.writing = std::move(s.owed);
  s.owed = Write{};
  return true;
}

WriteAnswer Written(AttemptState& s, bool changed) {
  WriteAnswer out{.write = std::move(s.writing)};
  s.writing = Write{};
  const Write& w = out.write;
  switch (w.kind) {
    case WriteKind::kNone:
      break;
    case WriteKind::kMark:
      s.accepted = false;
      if (changed) {
        s.state = JobState::kRunning;
        s.attempt = w.attempt;
        out.next = AfterWrite::kRunning;
      } else {
        // The row moved on (a standby cancelled it): stop the attempt unless it is settled, in
        // which case the settling write meets the same row and says so.
        out.next = s.Settled() ? AfterWrite::kNothing : AfterWrite::kStale;
      }
      break;
    case WriteKind::kSucceed:
    case WriteKind::kFail:
      out.next = changed ? AfterWrite::kEnded : AfterWrite::kMovedOn;
      break;
    case WriteKind::kRetry:
    case WriteKind::kReturn:
      if (!changed) {
        out.next = AfterWrite::kMovedOn;
        break;
      }
      if (w.kind == WriteKind::kRetry) {
        s.attempt = w.attempt;
        s.started_at = absl::InfinitePast();
      }
      s.state = JobState::kQueued;
      s.worker_id.clear();
      s.accepted = false;
      s.run_deadline = absl::InfiniteFuture();
      s.heartbeat_misses = 0;
      out.next = AfterWrite::kQueued;
      break;
  }
  return out;
}

void WriteFailed(AttemptState& s) {
  Write w = std::move(s.writing);
  s.writing = Write{};
  // A settle decided since replaces a mark; nothing else is decided while a write is in flight.
  if (s.owed.kind == WriteKind::kNone || (w.Settles() && !s.owed.Settles())) {
    s.owed = std::move(w);
  }
}

}  // namespace dispatchd::job
