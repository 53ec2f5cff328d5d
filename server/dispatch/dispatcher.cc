#include "server/dispatch/dispatcher.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

#include "lib/sched/admission.h"
#include "server/convert/job_proto.h"
#include "server/dispatch/dispatcher_internal.h"
#include "server/dispatch/fair_accounts.h"
#include "server/metrics/daemon_metrics.h"
#include "server/util/cores.h"
#include "server/util/log.h"
#include "server/util/thread_name.h"

namespace dispatchd::dispatch {

using job::JobState;

void LogFinished(const std::string& job_id, job::JobState state, int32_t attempt) {
  server::Log("dispatch")
      ->debug("finished job={} state={} attempt={}", job_id, job::ToString(state), attempt);
}

Dispatcher::Dispatcher(config::Config config, store::JobStore& store, Clock& clock,
                       JobEvents& events, sched::AdmissionGate& admission)
    : config_(std::move(config)),
      usable_cores_(server::UsableCores()),
      max_turns_in_flight_(config_.postgres.TurnsInFlight(usable_cores_)),
      store_(store),
      clock_(clock),
      events_(events),
      pager_(config_.scheduler.queue_window),
      scheduler_(config_, clock.TimeNow()),
      admission_(admission),
      overflow_hook_(config_.overflow_hook, config_.state_dir + "/overflow-hook.log") {}

Dispatcher::~Dispatcher() { Stop(); }

absl::Status Dispatcher::Start() {
  loop_role_.Take();  // until the loop thread starts
  decision_seconds_ = &metrics::Metrics().decision.With({});
  turns_gauge_ = &metrics::Metrics().turns_in_flight.With({});
  for (const std::string& warning : config_.Warnings())
    server::Log("dispatch")->warn("{}", warning);
  absl::StatusOr<std::vector<job::Job>> placed = store_.LoadPlaced();
  if (!placed.ok()) return placed.status();
  absl::StatusOr<store::QueuedHeads> heads = store_.LoadQueuedHeads(config_.scheduler.queue_window);
  if (!heads.ok()) return heads.status();
  const absl::Time now = clock_.TimeNow();
  // Shares as the previous leader left them, before the jobs in service are charged on top.
  if (absl::StatusOr<std::vector<store::AccountRow>> rows = store_.LoadAccounts(); rows.ok()) {
    scheduler_.RestoreAccounts(FromAccountRows(*rows), now);
  } else {
    server::Log("dispatch")
        ->warn("fair-share accounts not loaded, shares start afresh: {}", rows.status().ToString());
  }
  // Dispatched or running under the previous daemon: its worker may still hold it.
  for (job::Job& job : *placed) HoldPlaced(std::move(job), now);
  // Each queue's first rows; a queue with more gets a window over the rest.
  absl::flat_hash_map<QueueId, std::pair<int64_t, int64_t>> loaded;  // rows, last seq
  for (job::Job& job : heads->jobs) {
    auto& [rows, last] = loaded[QueueOf(job)];
    ++rows;
    last = job.seq;
    Keep(std::move(job));
  }
  for (const store::QueueCount& q : heads->queues) {
    const QueueId queue{q.type, q.fairness_key};
    const auto [rows, last] = loaded[queue];
    pager_.Loaded(queue, rows, last, q.queued);
  }
  const int64_t waiting = pager_.unheld();
  server::Log("dispatch")
      ->info(
          "recovered queued={} held_in_memory={} queues={} paged_queues={} "
          "held_by_workers={} grace={} turns_in_flight={} usable_cores={}",
          static_cast<int64_t>(heads->jobs.size()) + waiting, heads->jobs.size(),
          heads->queues.size(), pager_.windows(), placed->size(),
          absl::FormatDuration(config_.orphan_grace), max_turns_in_flight_, usable_cores_);
  next_reconcile_ = now + kReconcileInterval;
  // A thread per turn in flight, and one for the reads, the expiry and the accounts.
  writer_ = std::make_unique<TurnWriter>(store_, max_turns_in_flight_ + 1);
  loop_ = std::thread([this] {
    server::SetThreadName("dispatch-loop");
    Loop();
  });
  return absl::OkStatus();
}

void Dispatcher::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  loop_role_.Take();  // the loop has ended: what it held is this thread's now
  if (writer_ != nullptr && !accounts_in_flight_.load()) SaveAccounts(/*wait=*/true);
  // Turns in flight finish writing; what they wrote is settled by the next term (claimed jobs
  // that were never assigned are DISPATCHED rows it holds for orphan_grace, unacknowledged
  // results come again from their workers).
  writer_.reset();
  if (turns_gauge_ != nullptr) turns_gauge_->Set(0);
  for (auto& [id, session] : sessions_) {
    if (session.link) session.link->Close(absl::UnavailableError("daemon shutting down"));
  }
  sessions_.clear();
  worker_of_link_.clear();
  std::vector<std::weak_ptr<WorkerLink>> links;
  std::deque<absl::AnyInvocable<void()>> dropped;  // destroyed outside the lock
  {
    absl::MutexLock l(&mu_);
    links.swap(links_);
    dropped.swap(tasks_);
  }
  dropped.clear();
  for (const std::weak_ptr<WorkerLink>& weak : links) {
    if (std::shared_ptr<WorkerLink> link = weak.lock()) {
      link->Close(absl::UnavailableError("daemon shutting down"));
    }
  }
}

void Dispatcher::Post(absl::AnyInvocable<void()> task) {
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
  wake_ = true;
}

void Dispatcher::PostUnhurried(absl::AnyInvocable<void()> task) {
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
}

bool Dispatcher::JobQueued(job::Job& job, sched::Reservation& reservation) {
  absl::MutexLock l(&mu_);
  if (stopping_) return false;
  tasks_.push_back([this, job = std::move(job), reservation = std::move(reservation)]() mutable {
    loop_role_.Assert();
    TakeQueued(std::move(job), std::move(reservation));
  });
  wake_ = true;
  return true;
}

void Dispatcher::TakeQueued(job::Job job, sched::Reservation reservation) {
  // Counted from here: PublishLoad, at the end of this loop turn, includes the job.
  reservation = sched::Reservation();
  if (jobs_.contains(job.id)) return;
  if (job.state == JobState::kDispatched) {
    TakePlaced(std::move(job), clock_.TimeNow());
    return;
  }
  if (!pager_.Hold(job, scheduler_.queued_of(job.spec.type, job.spec.fairness_key))) return;
  Keep(std::move(job));
}

void Dispatcher::HoldPlaced(job::Job row, absl::Time now) {
  scheduler_.Adopt(ToPlaced(row, row.worker_id));
  Held h{.at = job::AttemptState::Of(row)};
  h.at.orphan_deadline = now + config_.orphan_grace;
  h.job = std::move(row);
  std::string id = h.job.id;
  auto [it, inserted] = jobs_.emplace(std::move(id), std::move(h));
  if (inserted) FileByWorker(it->first, it->second);
}

void Dispatcher::FileByWorker(const std::string& id, Held& h) {
  if (h.filed_worker == h.at.worker_id) return;
  UnfileByWorker(id, h);
  if (h.at.worker_id.empty()) return;
  held_on_worker_[h.at.worker_id].insert(id);
  h.filed_worker = h.at.worker_id;
}

void Dispatcher::UnfileByWorker(const std::string& id, Held& h) {
  if (h.filed_worker.empty()) return;
  if (auto it = held_on_worker_.find(h.filed_worker); it != held_on_worker_.end()) {
    it->second.erase(id);
    if (it->second.empty()) held_on_worker_.erase(it);
  }
  h.filed_worker.clear();
}

void Dispatcher::ForgetHeld(absl::flat_hash_map<std::string, Held>::iterator it) {
  owed_.erase(it->first);
  UnfileByWorker(it->first, it->second);
  jobs_.erase(it);
  ++ended_since_publish_;
}

void Dispatcher::Keep(job::Job row) {
  std::string().swap(row.spec.payload);  // the claim returns it
  Held h{.at = job::AttemptState::Of(row)};
  h.job = std::move(row);
  scheduler_.Enqueue(ToPending(h));
  std::string id = h.job.id;
  jobs_.emplace(std::move(id), std::move(h));
}

void Dispatcher::Refill(absl::Time now) {
  if (pager_.windows() == 0 || reconcile_in_flight_) return;
  std::vector<QueuePager::Page> pages = pager_.DuePages(
      [this](const QueueId& q) {
        loop_role_.Assert();
        return scheduler_.queued_of(q.first, q.second);
      },
      now);
  for (QueuePager::Page& page : pages) {
    ++reads_in_flight_;
    writer_->Read<absl::StatusOr<std::vector<job::Job>>>(
        [page](store::JobStore& store) {
          return store.LoadQueuedPage(page.queue.first, page.queue.second, page.after_seq,
                                      page.limit);
        },
        [this, page](absl::StatusOr<std::vector<job::Job>> rows) mutable {
          Post([this, page = std::move(page), rows = std::move(rows)]() mutable {
            loop_role_.Assert();
            ApplyPage(page, std::move(rows));
          });
        });
  }
}

void Dispatcher::ApplyPage(const QueuePager::Page& page,
                           absl::StatusOr<std::vector<job::Job>> rows) {
  --reads_in_flight_;
  const absl::Time now = clock_.TimeNow();
  if (!rows.ok()) {
    server::Log("dispatch")
        ->warn("cannot read queued jobs type={} key={} status={}", page.queue.first,
               page.queue.second, rows.status().ToString());
    pager_.PageFailed(page, now);
  } else {
    pager_.Paged(page, *rows);
    for (job::Job& row : *rows) {
      // A job dropped while the page was read (cancelled) must not come back from it.
      if (!jobs_.contains(row.id) && !dropped_in_flight_.contains(row.id)) Keep(std::move(row));
    }
  }
  if (turns_in_flight_ == 0 && reads_in_flight_ == 0 && !reconcile_in_flight_) {
    dropped_in_flight_.clear();
  }
}

void Dispatcher::JobCancelled(const std::string& job_id, job::JobState previous) {
  Post([this, job_id, previous] {
    loop_role_.Assert();
    Drop(job_id, "cancelled by client", clock_.TimeNow());
    server::Log("dispatch")->debug("cancelled job={} from={}", job_id, job::ToString(previous));
    events_.Publish(job_id, JobState::kCancelled);
  });
}

void Dispatcher::Drop(const std::string& job_id, const std::string& why, absl::Time now) {
  if (auto p = placing_.find(job_id); p != placing_.end()) p->second.dropped = true;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const job::AttemptState& at = it->second.at;
  const job::Transition t = job::Ended(at);
  scheduler_.RemovePending(job_id);
  if (scheduler_.IsPlaced(job_id)) scheduler_.Finished(job_id, now);
  if (t.stop_worker) SendCancel(at.worker_id, job_id, t.stop_attempt, why);
  if (t.ack) SendAck(at.worker_id, job_id, t.ack_attempt);
  ForgetHeld(it);
  if (turns_in_flight_ > 0 || reads_in_flight_ > 0 || reconcile_in_flight_) {
    dropped_in_flight_.insert(job_id);
  }
}

void Dispatcher::RowsChanged(std::vector<job::Job> rows) {
  Post([this, rows = std::move(rows)] {
    loop_role_.Assert();
    const absl::Time now = clock_.TimeNow();
    for (const job::Job& row : rows) OnRowChanged(row, now);
  });
}

void Dispatcher::OnRowChanged(const job::Job& row, absl::Time now) {
  auto it = jobs_.find(row.id);
  if (row.state == JobState::kQueued) {
    if (it != jobs_.end()) {
      return;  // already queued here (or the row moved on since: the CAS decides)
    }
    if (pager_.Hold(row, scheduler_.queued_of(row.spec.type, row.spec.fairness_key))) Keep(row);
    return;
  }
  if (auto p = placing_.find(row.id); p != placing_.end() && job::IsTerminal(row.state)) {
    p->second.dropped = true;  // ended before this loop held it
  }
  if (job::IsTerminal(row.state) && it != jobs_.end()) {
    Drop(row.id, absl::StrCat("job ", job::ToString(row.state)), now);
    events_.Publish(row.id, row.state);
  }
}

void Dispatcher::Loop() {
  loop_role_.Take();
  while (true) {
    std::deque<absl::AnyInvocable<void()>> batch;
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = clock_.TimeNow();
      absl::Time wake = std::min({next_sweep_, next_flush_, scheduler_.NextWakeup(now)});
      absl::Duration wait = std::clamp(wake - now, absl::ZeroDuration(), kSweepInterval);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](Dispatcher* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
                                 return d->stopping_ || d->wake_;
                               },
                               this),
                           wait);
      if (stopping_) return;
      batch.swap(tasks_);
      wake_ = false;
    }
    last_loop_ns_.store(absl::ToUnixNanos(absl::Now()));
    for (absl::AnyInvocable<void()>& task : batch) task();
    const absl::Time now = clock_.TimeNow();
    if (now >= next_sweep_) {
      Sweep(now);
      ExpirePlacements(now);
      PublishTenantLoad();
      next_sweep_ = now + kSweepInterval;
    }
    if (now >= next_accounts_ && !accounts_in_flight_.load()) {
      SaveAccounts(/*wait=*/false);
      next_accounts_ = now + kAccountsInterval;
    }
    // The reconcile compares settled state: it waits for the turns and reads in flight.
    if (reconcile_due_ && turns_in_flight_ == 0 && reads_in_flight_ == 0 && !expiry_in_flight_ &&
        placing_.empty()) {
      reconcile_due_ = false;
      next_reconcile_ = now + kReconcileInterval;
      StartReconcile(now);
    }
    Refill(now);
    CommitTurn(now);
    PublishLoad(now);
    FlushAcks();
  }
}

void Dispatcher::PublishTenantLoad() {
  std::vector<std::string> limited = admission_.LimitedTenants();
  if (limited.empty()) return;
  absl::flat_hash_map<std::string, int64_t> active;
  for (const std::string& t : limited) active[t] = scheduler_.TenantActive(t);
  // Rows waiting in the database beyond a queue's window count for the tenant of its key.
  pager_.ForEachUnheld([&](const QueueId& queue, int64_t unheld) {
    loop_role_.Assert();
    auto it = active.find(scheduler_.TenantOfKey(queue.second));
    if (it != active.end()) it->second += unheld;
  });
  admission_.PublishTenants(std::move(active));
}

void Dispatcher::SaveAccounts(bool wait) {
  // What changed since the last save, or everything after a save that failed.
  const bool all = accounts_failed_.exchange(false);
  std::vector<store::AccountRow> rows = ToAccountRows(scheduler_.TakeAccounts(all));
  const absl::Duration ttl = config_.scheduler.key_ttl;
  auto saved = [this](const absl::Status& s) {
    if (!s.ok()) {
      accounts_failed_.store(true);
      server::Log("dispatch")->debug("fair-share accounts not saved: {}", s.ToString());
    }
    accounts_in_flight_.store(false);
  };
  if (wait) {
    saved(writer_->SaveAccountsNow(rows, ttl));
    return;
  }
  accounts_in_flight_.store(true);
  writer_->SaveAccounts(std::move(rows), ttl, std::move(saved));
}

void Dispatcher::PublishLoad(absl::Time now) {
  absl::flat_hash_map<std::string, int64_t> queued;
  for (const config::JobTypeConfig& t : config_.types) {
    queued[t.name] = scheduler_.queued_of_type(t.name);
  }
  int64_t waiting = 0;  // in the database, beyond the windows
  pager_.ForEachUnheld([&](const QueueId& queue, int64_t unheld) {
    queued[queue.first] += unheld;
    waiting += unheld;
  });
  admission_.Publish(static_cast<int64_t>(jobs_.size()) + waiting, std::move(queued));
  if (ended_since_publish_ > 0) admission_.Drained(ended_since_publish_, now);
  ended_since_publish_ = 0;
}

bool Dispatcher::RunOnLoop(std::function<void()> task) {
  auto done = std::make_shared<absl::Notification>();
  Post([task = std::move(task), done] {
    task();
    done->Notify();
  });
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return false;
  }
  return done->WaitForNotificationWithTimeout(absl::Seconds(10));
}

void Dispatcher::Repaired(const char* kind) {
  ++repairs_;
  metrics::Metrics().accounting_repairs.With({kind}).Inc();
}

Dispatcher::TypeMetrics& Dispatcher::MetricsOf(const std::string& type) {
  auto [it, added] = type_metrics_.try_emplace(type);
  if (added) {
    metrics::DaemonMetrics& m = metrics::Metrics();
    it->second =
        TypeMetrics{.queue_wait = &m.queue_wait.With({type}), .run_time = &m.run_time.With({type})};
  }
  return it->second;
}

void Dispatcher::ObserveRun(const Held& h, absl::Time now) {
  if (h.at.started_at == absl::InfinitePast()) return;  // never accepted: it did not run
  MetricsOf(h.job.spec.type).run_time->Observe(absl::ToDoubleSeconds(now - h.at.started_at));
}

void Dispatcher::Sweep(absl::Time now) {
  // Workers silent past the stale threshold are lost.
  std::vector<std::string> stale;
  for (const auto& [id, s] : sessions_) {
    if (now - s.last_seen > config_.worker_stale_after) stale.push_back(id);
  }
  for (const std::string& id : stale) {
    LoseWorker(id,
               absl::StrCat("no heartbeat for ", absl::FormatDuration(config_.worker_stale_after)));
  }

  std::vector<std::string> orphaned, timed_out;
  for (auto& [id, h] : jobs_) {
    if (h.at.orphan_deadline <= now) orphaned.push_back(id);
    if (h.at.Runs() && h.at.run_deadline <= now) timed_out.push_back(id);
  }
  for (const std::string& id : orphaned) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    it->second.at.orphan_deadline = absl::InfiniteFuture();
    Orphan(it->second, "its worker did not reconnect after the daemon restarted", now);
  }
  for (const std::string& id : timed_out) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    Held& h = it->second;
    const job::Transition t =
        job::TimeOut(h.at, now, h.job.spec.timeout, PolicyOf(h.job, h.at.HeldAttempt(), now));
    if (t.Nothing()) continue;
    SendCancel(h.at.worker_id, id, t.stop_attempt, "timeout");
    scheduler_.Finished(id, now, RanSince(h.at.started_at, now));
    server::Log("dispatch")
        ->warn("timeout job={} attempt={} worker={}", id, t.stop_attempt, h.at.worker_id);
    Owe(id);
  }

  // Spawn on overflow: jobs that wait for capacity (no worker, all busy, throttled or without
  // VRAM), as opposed to caps, conflicts or rate limits, ask for more workers.
  if (overflow_hook_.Due(now)) {
    std::vector<std::pair<std::string, int64_t>> backlog;
    for (const sched::SchedulerStats::Type& t : scheduler_.Stats(now, /*max_keys=*/0).types) {
      bool capacity = t.head == sched::WaitReason::kNoWorker ||
                      t.head == sched::WaitReason::kWorkersBusy ||
                      t.head == sched::WaitReason::kMemory || t.head == sched::WaitReason::kVram;
      if (capacity && t.queued > 0) backlog.emplace_back(t.name, t.queued);
    }
    const bool started = overflow_hook_.MaybeRun(now, backlog);
    const char* outcome = started ? "started" : backlog.empty() ? "quiet" : "failed";
    metrics::Metrics().overflow_hook_checks.With({outcome}).Inc();
  }

  // The scheduler's counts are derived from its jobs; a drift is a bug, but must never freeze a
  // queue or break a cap: recount, log and repair.
  if (now >= next_audit_) {
    next_audit_ = now + kAuditInterval;
    for (const std::string& drift : scheduler_.Audit(/*repair=*/true)) {
      server::Log("dispatch")->error("scheduler count drifted and was repaired: {}", drift);
      Repaired(metrics::repair::kCountDrift);
    }
  }
  if (now >= next_reconcile_ && !reconcile_in_flight_ && !reconcile_due_) {
    reconcile_due_ = true;
    reconcile_due_since_ = now;
  }
  if (reconcile_due_ && !placing_.empty() && now - reconcile_due_since_ > kReconcileWait) {
    // An insert carrying a placement is slow; turns wait while the reconcile is due, so it waits
    // for the next round rather than hold them up.
    server::Log("dispatch")
        ->debug("reconcile: {} placements still being written; put off for {}", placing_.size(),
                absl::FormatDuration(kReconcileInterval));
    reconcile_due_ = false;
    next_reconcile_ = now + kReconcileInterval;
  }
  if (now >= next_expiry_) Expire(now);
}

void Dispatcher::Expire(absl::Time now) {
  if (expiry_in_flight_ || reconcile_in_flight_ || writer_->fenced()) return;
  next_expiry_ = now + kExpiryInterval;
  expiry_in_flight_ = true;
  writer_->Expire(now, kExpiredError, [this](absl::StatusOr<std::vector<std::string>> expired) {
    Post([this, expired = std::move(expired)]() mutable {
      loop_role_.Assert();
      ApplyExpired(std::move(expired));
    });
  });
}

void Dispatcher::ApplyExpired(absl::StatusOr<std::vector<std::string>> expired) {
  expiry_in_flight_ = false;
  if (!expired.ok()) {
    server::Log("dispatch")->warn("expiry sweep failed status={}", expired.status().ToString());
    return;
  }
  for (const std::string& id : *expired) {
    scheduler_.RemovePending(id);
    int32_t attempt = 0;
    if (auto it = jobs_.find(id); it != jobs_.end()) {
      attempt = it->second.at.attempt;
      ForgetHeld(it);
    }
    server::Log("dispatch")->info("expired job={}", id);
    LogFinished(id, JobState::kExpired, attempt);
    events_.Publish(id, JobState::kExpired);
  }
}

sched::PendingJob Dispatcher::ToPending(const Held& h) const {
  return ToPending(h.job, h.at.attempt);
}

sched::PendingJob Dispatcher::ToPending(const job::Job& job, int32_t attempt) {
  return sched::PendingJob{.id = job.id,
                           .type = job.spec.type,
                           .attempt = attempt,
                           .resource_id = job.spec.resource_id,
                           .fairness_key = job.spec.fairness_key,
                           .owner = job.owner,
                           .labels = job.spec.labels,
                           .not_before = job.spec.not_before,
                           .arrival = job.created_at};
}

std::optional<absl::Duration> Dispatcher::RanSince(absl::Time started_at, absl::Time now) {
  if (started_at == absl::InfinitePast() || started_at > now) return std::nullopt;
  return now - started_at;
}

sched::PlacedJob Dispatcher::ToPlaced(const job::Job& job, const std::string& worker_id) const {
  return sched::PlacedJob{.id = job.id,
                          .type = job.spec.type,
                          .resource_id = job.spec.resource_id,
                          .fairness_key = job.spec.fairness_key,
                          .owner = job.owner,
                          .worker_id = worker_id};
}

const config::JobTypeConfig* Dispatcher::TypeOf(const job::Job& job) const {
  return config_.FindType(job.spec.type);
}

job::RetryPolicy Dispatcher::PolicyOf(const job::Job& job, int32_t attempt, absl::Time now) const {
  const config::JobTypeConfig* type = TypeOf(job);
  return job::RetryPolicy{
      .max_attempts = job.spec.max_attempts,
      .retry_at = now + (type ? sched::RetryBackoff(*type, attempt, job.id) : absl::Seconds(1))};
}

bool Dispatcher::RequeuesOrphans(const job::Job& job) const {
  const config::JobTypeConfig* type = TypeOf(job);
  return type == nullptr || type->on_orphan == config::OnOrphan::kRequeue;
}

}  // namespace dispatchd::dispatch
