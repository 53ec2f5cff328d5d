// The dispatcher's one write path: turns of owed writes and claims through the TurnWriter, what
// the store made of them, and the reconcile. See dispatcher.h.

#include <algorithm>
#include <chrono>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

#include "server/convert/job_proto.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/dispatcher_internal.h"
#include "server/metrics/daemon_metrics.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {

using job::JobState;
using job::WriteKind;

void Dispatcher::CommitTurn(absl::Time now) {
  // At most postgres.turns_in_flight at once, and none while the reconcile waits to run or
  // reads: a finished turn wakes the loop (its completion is a task), which comes back here.
  if (turns_in_flight_ >= max_turns_in_flight_ || reconcile_due_ || reconcile_in_flight_) return;
  Turn turn;
  store::TurnWrites writes;
  next_flush_ = absl::InfiniteFuture();
  if (now < paused_until_) {
    if (!owed_.empty() || !stray_returns_.empty()) next_flush_ = paused_until_;
  } else {
    std::vector<std::string> taken;
    for (const std::string& id : owed_) {
      auto it = jobs_.find(id);
      if (it == jobs_.end() || it->second.at.owed.kind == WriteKind::kNone) {
        taken.push_back(id);
        continue;
      }
      job::AttemptState& at = it->second.at;
      if (at.writing.kind != WriteKind::kNone) continue;  // behind the write in flight
      if (!job::StartWrite(at, now)) {                    // a RUNNING mark not yet due
        next_flush_ = std::min(next_flush_, at.owed.due);
        continue;
      }
      const job::Write& w = at.writing;
      switch (w.kind) {
        case WriteKind::kMark:
          writes.marks.push_back({.job_id = id, .attempt = w.attempt, .worker_id = at.worker_id});
          break;
        case WriteKind::kSucceed:
        case WriteKind::kFail:
          // Results first: a job whose result is in hand needs no RUNNING mark (the finish
          // accepts the row still DISPATCHED at the attempt before): one write, not two.
          writes.finishes.push_back(
              {.job_id = id,
               .attempt = w.attempt,
               .state = w.kind == WriteKind::kSucceed ? JobState::kSucceeded : JobState::kFailed,
               .result = w.result,
               .error = w.error,
               .ran = w.ran,
               // Answered() tells a waiting RunSync the row from these times; a job past its
               // first attempt has earlier ones in the row only, and is read.
               .row_times = w.attempt <= 1 && events_.Watched(id)});
          break;
        case WriteKind::kRetry:
          // A failure that is not a result (a timeout, a lost worker) reports no run time; the
          // accept, where it was seen, still dates the attempt's start for the row's history.
          writes.retries.push_back(
              {.job_id = id,
               .attempt = w.attempt,
               .not_before = w.not_before,
               .error = w.error,
               .ran = w.ran != absl::InfiniteDuration()
                          ? w.ran
                          : RanSince(at.started_at, now).value_or(absl::InfiniteDuration())});
          break;
        case WriteKind::kReturn:
          writes.returns.push_back({.job_id = id, .attempt = w.attempt});
          break;
        case WriteKind::kNone:
          break;
      }
      turn.jobs.push_back(id);
      taken.push_back(id);
    }
    for (const std::string& id : taken) owed_.erase(id);
    turn.strays = std::move(stray_returns_);
    stray_returns_.clear();
    for (const store::ReturnRequest& r : turn.strays) writes.returns.push_back(r);
    turn.decisions = std::move(decided_);
    decided_.clear();
    std::vector<sched::Dispatch> more = Decide(now);
    if (turn.decisions.empty()) {
      turn.decisions = std::move(more);
    } else {
      for (sched::Dispatch& d : more) turn.decisions.push_back(std::move(d));
    }
  }
  for (const sched::Dispatch& d : turn.decisions) {
    writes.claims.push_back(store::ClaimRequest{d.job_id, d.attempt, d.worker_id});
  }
  if (writes.empty()) return;
  turn.rows = writes.rows();
  turns_gauge_->Set(++turns_in_flight_);
  writer_->Commit(std::move(writes), [this, turn = std::move(turn)](TurnResult result) mutable {
    Post([this, turn = std::move(turn), result = std::move(result)]() mutable {
      loop_role_.Assert();
      FinishTurn(std::move(turn), std::move(result));
    });
  });
}

std::vector<sched::Dispatch> Dispatcher::Decide(absl::Time now) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<sched::Dispatch> decisions = scheduler_.Decide(now, kMaxDispatchesPerRound);
  decision_seconds_->Observe(
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return decisions;
}

void Dispatcher::FinishTurn(Turn turn, TurnResult result) {
  turns_gauge_->Set(--turns_in_flight_);
  const absl::Time now = clock_.TimeNow();
  store::TurnOutcome& out = result.out;
  if (absl::Status error = result.first_error(); IsFenced(error)) {
    // Another daemon leads: nothing this term writes can land, and it is about to stop.
    if (paused_until_ != absl::InfiniteFuture()) {
      server::Log("dispatch")
          ->error("another daemon leads; writing nothing more: {}", error.ToString());
    }
    paused_until_ = absl::InfiniteFuture();
  } else if (!error.ok()) {
    server::Log("dispatch")->warn("write failed rows={} status={}", turn.rows, error.ToString());
    // Writes wait and go again; dispatching waits as long.
    paused_until_ = now + kStoreErrorPause;
    next_flush_ = std::min(next_flush_, paused_until_);
  }
  absl::flat_hash_set<std::string> finished(out.finished.begin(), out.finished.end());
  absl::flat_hash_map<std::string, const store::TurnOutcome::Times*> times;
  if (out.finished_times.size() == out.finished.size()) {
    for (size_t i = 0; i < out.finished.size(); ++i) {
      if (out.finished_times[i].has_value()) times[out.finished[i]] = &*out.finished_times[i];
    }
  }
  absl::flat_hash_set<std::string> marked(out.marked.begin(), out.marked.end());
  absl::flat_hash_set<std::string> retried(out.retried.begin(), out.retried.end());
  absl::flat_hash_set<std::string> returned(out.returned.begin(), out.returned.end());
  for (const std::string& id : turn.jobs) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;  // dropped meanwhile (its worker was told then)
    const absl::Status* status = &result.finishes;
    const absl::flat_hash_set<std::string>* changed = &finished;
    switch (it->second.at.writing.kind) {
      case WriteKind::kMark:
        status = &result.marks, changed = &marked;
        break;
      case WriteKind::kRetry:
        status = &result.retries, changed = &retried;
        break;
      case WriteKind::kReturn:
        status = &result.returns, changed = &returned;
        break;
      default:
        break;
    }
    const auto t = times.find(id);
    Answered(it->second, status->ok() && changed->contains(id), !status->ok(), now,
             changed == &finished && t != times.end() ? t->second : nullptr);
  }
  if (!result.returns.ok()) {
    for (store::ReturnRequest& r : turn.strays) stray_returns_.push_back(std::move(r));
  }
  if (result.claims.ok()) {
    ApplyClaims(turn.decisions, out.claimed, out.claimed_payloads, now);
  } else {
    RetractClaims(turn.decisions);
  }
  if (turns_in_flight_ == 0 && reads_in_flight_ == 0 && !reconcile_in_flight_) {
    dropped_in_flight_.clear();
  }
  ++turns_answered_;
}

void Dispatcher::Answered(Held& h, bool changed, bool failed, absl::Time now,
                          const store::TurnOutcome::Times* times) {
  const std::string id = h.job.id;
  if (failed) {
    // Owed again, after the pause; the job keeps counting as running or settled meanwhile.
    job::WriteFailed(h.at);
    Owe(id);
    return;
  }
  const std::string worker = h.at.worker_id;
  const job::WriteAnswer a = job::Written(h.at, changed);
  const job::Write& w = a.write;
  switch (a.next) {
    case job::AfterWrite::kNothing:
      break;
    case job::AfterWrite::kRunning:
      events_.Publish(id, JobState::kRunning);
      break;
    case job::AfterWrite::kStale:
      // The row moved on while the mark was written (a standby cancelled it): the reconcile
      // settles the entry.
      SendCancel(worker, id, w.attempt, "attempt is no longer current");
      break;
    case job::AfterWrite::kQueued:
      if (w.kind == WriteKind::kRetry) {
        h.job.spec.not_before = w.not_before;
        h.job.error = w.error;
        server::Log("dispatch")
            ->info("retry job={} attempt={} after={} error=\"{}\"", id, w.attempt,
                   absl::FormatDuration(std::max(w.not_before - now, absl::ZeroDuration())),
                   w.error);
      }
      scheduler_.Enqueue(ToPending(h));
      events_.Publish(id, JobState::kQueued);
      break;
    case job::AfterWrite::kEnded:
    case job::AfterWrite::kMovedOn:
      if (w.kind == WriteKind::kSucceed || w.kind == WriteKind::kFail) ObserveRun(h, now);
      if (a.next == job::AfterWrite::kEnded) {
        const JobState state =
            w.kind == WriteKind::kSucceed ? JobState::kSucceeded : JobState::kFailed;
        if (state == JobState::kFailed) {
          server::Log("dispatch")
              ->info("failed job={} attempt={} error=\"{}\"", id, w.attempt, w.error);
        }
        LogFinished(id, state, w.attempt);
        if (times != nullptr) {
          // The row as the finish committed it, but for its spec: a RunSync call that has the
          // spec answers from it without reading the row back. The turn asked for the times of a
          // watched job at its first attempt only (CommitTurn): a job past it keeps the earlier
          // attempts in the row only, so its RunSync reads the row.
          job::Job ended;
          ended.id = id;
          ended.seq = h.job.seq;
          ended.owner = h.job.owner;
          ended.state = state;
          ended.attempt = w.attempt;
          ended.worker_id = worker;
          ended.result = w.result;
          ended.error = w.error;
          ended.created_at = times->created_at;
          ended.dispatched_at = times->dispatched_at;
          ended.started_at = times->started_at;
          ended.finished_at = times->finished_at;
          ended.updated_at = times->finished_at;
          ended.spec.not_before = times->not_before;  // a retry moves it
          events_.Publish(id, state, &ended);
        } else {
          events_.Publish(id, state);
        }
      }
      break;
  }
  // A worker's result is acknowledged once its outcome is durable, or known to be moot.
  if (w.Settles() && w.from_result) SendAck(worker, id, w.attempt);
  if (a.next == job::AfterWrite::kEnded || a.next == job::AfterWrite::kMovedOn) {
    ForgetHeld(jobs_.find(id));  // h is held: Answered is called on jobs_'s entries
    return;
  }
  if (h.at.owed.kind != WriteKind::kNone) Owe(id);  // the write that waited behind this one
}

void Dispatcher::RetractClaims(const std::vector<sched::Dispatch>& decisions) {
  for (const sched::Dispatch& d : decisions) {
    scheduler_.Retract(d.job_id);
    if (auto it = jobs_.find(d.job_id); it != jobs_.end())
      scheduler_.Enqueue(ToPending(it->second));
  }
}

void Dispatcher::ApplyClaims(const std::vector<sched::Dispatch>& decisions,
                             const std::vector<std::string>& claimed,
                             std::vector<std::string>& payloads, absl::Time now) {
  // The claim returned each payload: the loop keeps none in memory.
  absl::flat_hash_map<std::string, std::string*> won;
  for (size_t i = 0; i < claimed.size(); ++i) {
    won[claimed[i]] = i < payloads.size() ? &payloads[i] : nullptr;
  }
  absl::flat_hash_map<std::string, v1::DaemonMessage> assigns;
  for (const sched::Dispatch& d : decisions) {
    auto it = jobs_.find(d.job_id);
    if (won.contains(d.job_id) && it == jobs_.end()) {
      // Claimed a job this loop no longer tracks. A cancel while the claim was being written
      // does that (the cancel then ended the row); anything else is a bug. Either way the row
      // must not stay DISPATCHED with nobody to run it: give it back in the next turn.
      if (!dropped_in_flight_.contains(d.job_id)) {
        server::Log("dispatch")
            ->error("claimed job={} that is not tracked here: returning it", d.job_id);
        Repaired(metrics::repair::kUntrackedClaim);
      }
      scheduler_.Retract(d.job_id);
      stray_returns_.push_back({.job_id = d.job_id, .attempt = d.attempt});
      continue;
    }
    if (!won.contains(d.job_id) || it == jobs_.end()) {
      // The row moved on (cancelled) or another session holds it: try again shortly if the
      // job is still ours to run.
      scheduler_.Retract(d.job_id);
      if (it != jobs_.end()) {
        sched::PendingJob p = ToPending(it->second);
        p.not_before = std::max(p.not_before, now + kClaimRetryDelay);
        scheduler_.Enqueue(std::move(p));
      }
      continue;
    }
    std::string* payload = won[d.job_id];
    Handover(it->second, d.worker_id,
             payload != nullptr ? std::move(*payload) : it->second.job.spec.payload, assigns, now);
  }
  SendAssigns(assigns);
}

void Dispatcher::Handover(Held& h, const std::string& worker_id, std::string payload,
                          absl::flat_hash_map<std::string, v1::DaemonMessage>& assigns,
                          absl::Time now) {
  job::Dispatched(h.at, worker_id);
  FileByWorker(h.job.id, h);
  if (scheduler_.WorkerOf(h.job.id) != worker_id) {
    // Its worker was lost while the row was written: the row goes back to the queue.
    const job::Transition t =
        job::Orphan(h.at, RequeuesOrphans(h.job), PolicyOf(h.job, h.at.HeldAttempt(), now),
                    "its worker was lost before the job reached it");
    if (!t.Nothing()) Owe(h.job.id);
    return;
  }
  const job::Job& j = h.job;
  MetricsOf(j.spec.type)
      .queue_wait->Observe(absl::ToDoubleSeconds(now - std::max(j.created_at, j.spec.not_before)));
  v1::Assignment* a = assigns[worker_id].mutable_assign()->add_assignments();
  a->set_job_id(j.id);
  a->set_attempt(h.at.HeldAttempt());
  a->set_type(j.spec.type);
  a->set_payload(std::move(payload));
  a->set_resource_id(j.spec.resource_id);
  convert::ToProto(now + j.spec.timeout, a->mutable_deadline());
  if (const config::JobTypeConfig* t = TypeOf(j)) a->set_model(t->model);
  events_.Publish(j.id, JobState::kDispatched);
}

void Dispatcher::SendAssigns(absl::flat_hash_map<std::string, v1::DaemonMessage>& assigns) {
  for (auto& [worker_id, msg] : assigns) {
    server::Log("dispatch")
        ->debug("assign worker={} jobs={}", worker_id, msg.assign().assignments_size());
    SendTo(worker_id, std::move(msg));
  }
}

void Dispatcher::StartReconcile(absl::Time now) {
  auto held = std::make_shared<HeldSnapshot>();
  held->now = now;
  held->window = pager_.window();
  held->bounds = pager_.Bounds();
  held->held.reserve(jobs_.size());
  for (const auto& [id, h] : jobs_) {
    held->held.insert(id);
    if (h.at.state == JobState::kDispatched || h.at.state == JobState::kRunning) {
      held->placed.emplace(id, std::pair{h.at.state, h.at.attempt});
    } else if (h.at.state == JobState::kQueued) {
      held->queued[QueueOf(h.job)].push_back(id);
    }
  }
  reconcile_in_flight_ = true;
  writer_->Read<ReconcileReads>(
      [held](store::JobStore& store) { return ReadForReconcile(store, *held); },
      [this](ReconcileReads reads) {
        Post([this, reads = std::move(reads)]() mutable {
          loop_role_.Assert();
          ApplyReconcile(std::move(reads));
        });
      });
}

void Dispatcher::ApplyReconcile(ReconcileReads reads) {
  reconcile_in_flight_ = false;
  const absl::Time now = clock_.TimeNow();
  const absl::Time settled = now - kReconcileSettle;
  if (!reads.status.ok()) {
    server::Log("dispatch")
        ->warn("reconcile: cannot read placed jobs status={}", reads.status.ToString());
    return;
  }
  for (job::Job& row : reads.strays) {
    if (jobs_.contains(row.id)) continue;
    // Its worker may run it: hold it there for the re-attach grace, as after a restart, then
    // apply on_orphan if the worker does not claim it.
    server::Log("dispatch")
        ->error(
            "reconcile: job={} is {} on worker={} in the database but not known here: holding "
            "it for {}",
            row.id, job::ToString(row.state), row.worker_id,
            absl::FormatDuration(config_.orphan_grace));
    Repaired(metrics::repair::kStray);
    HoldPlaced(std::move(row), now);
  }
  // A job held here that ended in the database: dropped.
  auto ended = [&](const store::JobRef& r, const char* what) {
    loop_role_.Assert();
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end() || !job::IsTerminal(r.state)) return;
    if (r.updated_at < settled) {
      server::Log("dispatch")
          ->error("reconcile: {}job={} is {} in the database: dropping it", what, r.job_id,
                  job::ToString(r.state));
      Repaired(metrics::repair::kEndedElsewhere);
    }
    Drop(r.job_id, "ended elsewhere", now);
    events_.Publish(r.job_id, r.state);
  };
  for (const store::JobRef& r : reads.suspects) {
    auto it = jobs_.find(r.job_id);
    if (it == jobs_.end()) continue;
    if (r.state == it->second.at.state && r.attempt == it->second.at.attempt) continue;
    ended(r, "");
  }
  if (!reads.count_status.ok()) {
    server::Log("dispatch")
        ->warn("reconcile: cannot count queued jobs status={}", reads.count_status.ToString());
    return;
  }
  for (const store::QueueCount& c : reads.counts) {
    pager_.SetUnheld({c.type, c.fairness_key}, c.queued - c.up_to_bound);
  }
  for (ReconcileReads::Queue& q : reads.queues) {
    for (const store::JobRef& r : q.held) ended(r, "queued ");
    if (!q.rows_status.ok()) {
      server::Log("dispatch")
          ->warn("reconcile: cannot read queued jobs type={} key={} status={}", q.queue.first,
                 q.queue.second, q.rows_status.ToString());
      continue;
    }
    // Rows the window covers that are not held: held now.
    const int64_t bound = pager_.BoundOf(q.queue);
    const size_t rows = q.rows.size();
    const int64_t last = q.rows.empty() ? 0 : q.rows.back().seq;
    for (job::Job& row : q.rows) {
      if (row.seq > bound) break;
      if (jobs_.contains(row.id) || dropped_in_flight_.contains(row.id)) continue;
      if (row.updated_at < settled) {
        server::Log("dispatch")
            ->warn("reconcile: queued job={} was not known here: queuing it", row.id);
        Repaired(metrics::repair::kUnknownQueued);
      }
      Keep(std::move(row));
    }
    if (bound == INT64_MAX && static_cast<int64_t>(rows) == pager_.window()) {
      // A complete queue with more rows than a window (their news never came): page the rest.
      pager_.Open(q.queue, last, q.queued - pager_.window());
    }
  }
  if (turns_in_flight_ == 0 && reads_in_flight_ == 0) dropped_in_flight_.clear();
}

}  // namespace dispatchd::dispatch
