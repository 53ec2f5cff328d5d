#include "server/dispatch/dispatcher.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"

#include "lib/sched/admission.h"
#include "server/convert/job_proto.h"
#include "server/dispatch/fair_accounts.h"
#include "server/metrics/daemon_metrics.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {
namespace {

using job::JobState;

constexpr absl::Duration kSweepInterval = absl::Milliseconds(200);
constexpr absl::Duration kExpiryInterval = absl::Seconds(1);
constexpr absl::Duration kStoreErrorPause = absl::Seconds(1);
constexpr size_t kMaxDispatchesPerRound = 512;
// Turns whose writes are in the database at once (CommitTurn).
constexpr int kMaxTurnsInFlight = 2;
// How often the scheduler's derived counts are recounted (Scheduler::Audit).
constexpr absl::Duration kAuditInterval = absl::Seconds(10);
// How often the jobs held here are compared with the database (Reconcile).
constexpr absl::Duration kReconcileInterval = absl::Seconds(10);
// How often the leader saves the scheduler's fair-share accounts: what a crash can lose.
constexpr absl::Duration kAccountsInterval = absl::Seconds(1);
// Heartbeats in a row that may leave out a job the daemon believes runs on the worker before the
// job counts as lost there. Stream order already makes one miss conclusive for the SDK; two
// tolerate a worker that builds its heartbeat before it writes a result.
constexpr int kHeartbeatMissesToLose = 2;
// A row that changed this recently may simply not have reached the loop yet (a Submit or Cancel
// in flight, a standby's NOTIFY): Reconcile still settles it, but counts and logs it as drift
// only when the change is older.
constexpr absl::Duration kReconcileSettle = absl::Seconds(5);

// An accept's RUNNING mark waits this long before it is written: a job whose result comes first
// (most short jobs) needs no mark at all, since the finish accepts the row still DISPATCHED.
// Status shows such a job DISPATCHED for at most this long after its worker started it.
constexpr absl::Duration kRunningMarkDelay = absl::Milliseconds(50);

const char kExpiredError[] = "capacity: no worker took the job before its dispatch deadline";

}  // namespace


void LogFinished(const std::string& job_id, job::JobState state, int32_t attempt) {
  server::Log("dispatch")
      ->debug("finished job={} state={} attempt={}", job_id, job::ToString(state), attempt);
}

Dispatcher::Dispatcher(config::Config config, store::JobStore& store, Clock& clock,
                       JobEvents& events, sched::AdmissionGate& admission)
    : config_(std::move(config)),
      store_(store),
      clock_(clock),
      events_(events),
      scheduler_(config_, clock.TimeNow()),
      admission_(admission),
      overflow_hook_(config_.overflow_hook, config_.state_dir + "/overflow-hook.log") {}

Dispatcher::~Dispatcher() { Stop(); }

absl::Status Dispatcher::Start() {
  for (const std::string& warning : config_.Warnings()) server::Log("dispatch")->warn("{}", warning);
  absl::StatusOr<std::vector<job::Job>> placed = store_.LoadPlaced();
  if (!placed.ok()) return placed.status();
  absl::StatusOr<store::QueuedHeads> heads =
      store_.LoadQueuedHeads(config_.scheduler.queue_window);
  if (!heads.ok()) return heads.status();
  const absl::Time now = clock_.TimeNow();
  // Shares as the previous leader left them, before the jobs in service are charged on top.
  if (absl::StatusOr<std::vector<store::AccountRow>> rows = store_.LoadAccounts(); rows.ok()) {
    scheduler_.RestoreAccounts(FromAccountRows(*rows), now);
  } else {
    server::Log("dispatch")
        ->warn("fair-share accounts not loaded, shares start afresh: {}", rows.status().ToString());
  }
  for (job::Job& job : *placed) {
    // Dispatched or running under the previous daemon: its worker may still hold it.
    scheduler_.Adopt(ToPlaced(job, job.worker_id));
    std::string id = job.id;
    jobs_.emplace(std::move(id),
                  Entry{.job = std::move(job), .orphan_deadline = now + config_.orphan_grace});
  }
  // Each queue's first rows; a queue with more gets a window over the rest.
  absl::flat_hash_map<QueueId, std::pair<int64_t, int64_t>> loaded;  // rows, last seq
  for (job::Job& job : heads->jobs) {
    auto& [rows, last] = loaded[QueueOf(job)];
    ++rows;
    last = job.seq;
    Keep(std::move(job));
  }
  int64_t waiting = 0;
  for (const store::QueueCount& q : heads->queues) {
    const auto [rows, last] = loaded[{q.type, q.fairness_key}];
    if (q.queued <= rows) continue;
    windows_[{q.type, q.fairness_key}] = Window{.bound = last, .unheld = q.queued - rows};
    waiting += q.queued - rows;
  }
  server::Log("dispatch")
      ->info("recovered queued={} held_in_memory={} queues={} paged_queues={} "
             "held_by_workers={} grace={}",
             static_cast<int64_t>(heads->jobs.size()) + waiting, heads->jobs.size(),
             heads->queues.size(), windows_.size(), placed->size(),
             absl::FormatDuration(config_.orphan_grace));
  next_reconcile_ = now + kReconcileInterval;
  writer_ = std::make_unique<server::Executor>(kMaxTurnsInFlight);
  loop_ = std::thread([this] { Loop(); });
  return absl::OkStatus();
}

void Dispatcher::Stop() {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  if (loop_.joinable()) loop_.join();
  if (writer_ != nullptr && !accounts_in_flight_.load()) SaveAccounts(/*wait=*/true);
  // Turns in flight finish writing; what they wrote is settled by the next term (claimed jobs
  // that were never assigned are DISPATCHED rows it holds for orphan_grace, unacknowledged
  // results come again from their workers).
  writer_.reset();
  for (auto& [id, session] : sessions_) {
    if (session.link) session.link->Close(absl::UnavailableError("daemon shutting down"));
  }
  sessions_.clear();
  std::vector<std::weak_ptr<WorkerLink>> links;
  absl::flat_hash_map<std::pair<std::string, std::string>, int64_t> unsettled;
  {
    absl::MutexLock l(&mu_);
    links.swap(links_);
    unsettled.swap(unsettled_);
    tasks_.clear();
  }
  for (const auto& [type_owner, n] : unsettled) {
    for (int64_t i = 0; i < n; ++i) admission_.Counted(type_owner.first, type_owner.second);
  }
  for (const std::weak_ptr<WorkerLink>& weak : links) {
    if (std::shared_ptr<WorkerLink> link = weak.lock()) {
      link->Close(absl::UnavailableError("daemon shutting down"));
    }
  }
}

void Dispatcher::Post(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
}

void Dispatcher::JobQueued(job::Job job) {
  {
    // The reservation this job holds in the admission gate is settled exactly once: by the task
    // below, or by Stop() if the task never runs (the term ended; the next one loads the row).
    absl::MutexLock l(&mu_);
    if (!stopping_) {
      ++unsettled_[{job.spec.type, job.owner}];
      tasks_.push_back([this, job = std::move(job)]() mutable { TakeQueued(std::move(job)); });
      return;
    }
  }
  admission_.Counted(job.spec.type, job.owner);
  // This term is over; whichever daemon leads next may have loaded its jobs before this row was
  // committed. Tell it, as a standby would (its reconcile would find the row later anyway).
  if (absl::Status told = store_.NotifyChanged(job.id); !told.ok()) {
    server::Log("dispatch")->debug("notify job={} failed status={}", job.id, told.ToString());
  }
}

void Dispatcher::TakeQueued(job::Job job) {
  {
    absl::MutexLock l(&mu_);
    --unsettled_[{job.spec.type, job.owner}];
  }
  admission_.Counted(job.spec.type, job.owner);
  if (jobs_.contains(job.id) || !Hold(job)) return;
  Keep(std::move(job));
}

bool Dispatcher::Hold(const job::Job& row) {
  const QueueId queue = QueueOf(row);
  auto w = windows_.find(queue);
  if (w == windows_.end()) {
    if (row.seq <= 0 ||
        scheduler_.queued_of(queue.first, queue.second) < config_.scheduler.queue_window) {
      return true;
    }
    // The window is full. Every older row of the queue is held or on its way (the queue was
    // complete): from this row on, newer ones wait in the database.
    w = windows_.emplace(queue, Window{.bound = row.seq - 1}).first;
  }
  if (row.seq <= w->second.bound) return true;  // a late arrival inside the window
  ++w->second.unheld;
  return false;
}

void Dispatcher::Keep(job::Job row) {
  std::string().swap(row.spec.payload);  // the claim returns it
  scheduler_.Enqueue(ToPending(row));
  std::string id = row.id;
  jobs_.emplace(std::move(id), Entry{.job = std::move(row)});
}

void Dispatcher::Refill(absl::Time now) {
  if (windows_.empty() || now < refill_paused_until_) return;
  const int64_t window = config_.scheduler.queue_window;
  std::vector<QueueId> complete;
  for (auto& [queue, w] : windows_) {
    const int64_t held = scheduler_.queued_of(queue.first, queue.second);
    if (held >= window / 2) continue;
    const int64_t limit = window - held;
    absl::StatusOr<std::vector<job::Job>> page =
        store_.LoadQueuedPage(queue.first, queue.second, w.bound, limit);
    if (!page.ok()) {
      server::Log("dispatch")->warn("cannot read queued jobs type={} key={} status={}",
                                    queue.first, queue.second, page.status().ToString());
      refill_paused_until_ = now + kStoreErrorPause;
      break;
    }
    const int64_t rows = static_cast<int64_t>(page->size());
    for (job::Job& row : *page) {
      w.bound = std::max(w.bound, row.seq);
      if (!jobs_.contains(row.id)) Keep(std::move(row));
    }
    w.unheld = std::max<int64_t>(0, w.unheld - rows);
    // Every row the page could see is held now; the rows still to come are on their way.
    if (rows < limit) complete.push_back(queue);
  }
  for (const QueueId& queue : complete) windows_.erase(queue);
}

void Dispatcher::JobCancelled(const std::string& job_id, job::JobState previous) {
  Post([this, job_id, previous] {
    Drop(job_id, "cancelled by client", clock_.TimeNow());
    server::Log("dispatch")->debug("cancelled job={} from={}", job_id, job::ToString(previous));
    events_.Publish(job_id, JobState::kCancelled);
  });
}

void Dispatcher::Drop(const std::string& job_id, const std::string& why, absl::Time now) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  const job::Job& j = it->second.job;
  scheduler_.RemovePending(job_id);
  if (scheduler_.IsPlaced(job_id)) {
    std::string worker = scheduler_.WorkerOf(job_id);
    scheduler_.Finished(job_id, now);
    SendCancel(worker, job_id, HeldAttempt(it->second), why);
  }
  // A result waiting to be written is moot now: let its worker forget it.
  if (it->second.result_waits) SendAck(j.worker_id, job_id, it->second.parked_attempt);
  jobs_.erase(it);
  ++ended_since_publish_;
  if (turns_in_flight_ > 0) dropped_in_flight_.insert(job_id);
}

void Dispatcher::RowsChanged(std::vector<job::Job> rows) {
  Post([this, rows = std::move(rows)] {
    const absl::Time now = clock_.TimeNow();
    for (const job::Job& row : rows) OnRowChanged(row, now);
  });
}

void Dispatcher::OnRowChanged(const job::Job& row, absl::Time now) {
  auto it = jobs_.find(row.id);
  if (row.state == JobState::kQueued) {
    if (it != jobs_.end())
      return;  // already queued here (or the row moved on since: the CAS decides)
    if (Hold(row)) Keep(row);
    return;
  }
  if (job::IsTerminal(row.state) && it != jobs_.end()) {
    Drop(row.id, absl::StrCat("job ", job::ToString(row.state)), now);
    events_.Publish(row.id, row.state);
  }
}
void Dispatcher::WorkerConnected(std::shared_ptr<WorkerLink> link, v1::Hello hello) {
  {
    absl::MutexLock l(&mu_);
    if (stopping_) {
      link->Close(absl::UnavailableError("daemon is not leading any more; reconnect"));
      return;
    }
    links_.erase(std::remove_if(links_.begin(), links_.end(),
                                [](const std::weak_ptr<WorkerLink>& w) { return w.expired(); }),
                 links_.end());
    links_.push_back(link);
  }
  Post([this, link = std::move(link), hello = std::move(hello)] {
    OnHello(link, hello, clock_.TimeNow());
  });
}

void Dispatcher::WorkerMessage(std::shared_ptr<WorkerLink> link, v1::WorkerMessage msg) {
  Post([this, link = std::move(link), msg = std::move(msg)] {
    const absl::Time now = clock_.TimeNow();
    std::string worker_id = WorkerIdOf(link);
    if (worker_id.empty()) return;  // a replaced or lost session
    sessions_[worker_id].last_seen = now;
    switch (msg.msg_case()) {
      case v1::WorkerMessage::kAccept: OnAccept(worker_id, msg.accept(), now); break;
      case v1::WorkerMessage::kReject: OnReject(worker_id, msg.reject()); break;
      case v1::WorkerMessage::kResult: OnResult(worker_id, msg.result(), now); break;
      case v1::WorkerMessage::kBatch:
        for (const v1::Accept& a : msg.batch().accepts()) OnAccept(worker_id, a, now);
        for (const v1::Reject& r : msg.batch().rejects()) OnReject(worker_id, r);
        for (const v1::Result& r : msg.batch().results()) OnResult(worker_id, r, now);
        break;
      case v1::WorkerMessage::kHeartbeat:
        scheduler_.Heartbeat(worker_id);
        CheckMemory(worker_id, msg.heartbeat());
        scheduler_.SetResidentModels(worker_id, {msg.heartbeat().models_resident().begin(),
                                                 msg.heartbeat().models_resident().end()});
        OnHeartbeat(worker_id, msg.heartbeat(), now);
        break;
      case v1::WorkerMessage::kDraining:
        scheduler_.SetDraining(worker_id, true);
        server::Log("dispatch")->info("worker draining worker={}", worker_id);
        break;
      case v1::WorkerMessage::kHello:
        link->Close(absl::InvalidArgumentError("hello: sent twice on one stream"));
        break;
      case v1::WorkerMessage::MSG_NOT_SET:
        link->Close(absl::InvalidArgumentError("msg: empty worker message"));
        break;
    }
  });
}

void Dispatcher::WorkerDisconnected(std::shared_ptr<WorkerLink> link) {
  Post([this, link = std::move(link)] { OnDisconnect(link, clock_.TimeNow()); });
}

std::vector<v1::WorkerInfo> Dispatcher::WorkersNow() const {
  std::vector<v1::WorkerInfo> out;
  for (const sched::WorkerView& w : scheduler_.Workers()) {
    auto it = sessions_.find(w.id);
    if (it == sessions_.end() || !it->second.link) continue;
    const Session& s = it->second;
    v1::WorkerInfo info;
    info.set_worker_id(w.id);
    info.set_peer(s.peer);
    for (const std::string& t : s.hello.types()) info.add_types(t);
    info.set_slots(w.slots);
    info.set_busy(w.busy);
    *info.mutable_labels() = s.hello.labels();
    convert::ToProto(s.connected_at, info.mutable_connected_at());
    convert::ToProto(s.last_seen, info.mutable_last_seen());
    info.set_rank(w.rank);
    info.set_draining(w.draining);
    info.set_memory_throttled(w.throttled);
    for (const std::string& m : w.models_resident) info.add_models_resident(m);
    info.set_vram_gb(w.vram_gb);
    info.set_vram_in_use_gb(w.vram_in_use_gb);
    info.set_model_loads(w.model_loads);
    out.push_back(std::move(info));
  }
  return out;
}

std::vector<v1::WorkerInfo> Dispatcher::Workers() {
  auto out = std::make_shared<std::vector<v1::WorkerInfo>>();
  auto done = std::make_shared<absl::Notification>();
  Post([this, out, done] {
    *out = WorkersNow();
    done->Notify();
  });
  {
    absl::MutexLock l(&mu_);
    if (stopping_) return {};
  }
  done->WaitForNotificationWithTimeout(absl::Seconds(10));
  return done->HasBeenNotified() ? *out : std::vector<v1::WorkerInfo>{};
}

void Dispatcher::Loop() {
  while (true) {
    std::deque<std::function<void()>> batch;
    {
      absl::MutexLock l(&mu_);
      const absl::Time now = clock_.TimeNow();
      absl::Time wake = std::min({next_sweep_, next_flush_, scheduler_.NextWakeup(now)});
      absl::Duration wait = std::clamp(wake - now, absl::ZeroDuration(), kSweepInterval);
      mu_.AwaitWithTimeout(absl::Condition(
                               +[](Dispatcher* d) ABSL_EXCLUSIVE_LOCKS_REQUIRED(d->mu_) {
                                 return d->stopping_ || !d->tasks_.empty();
                               },
                               this),
                           wait);
      if (stopping_) return;
      batch.swap(tasks_);
    }
    last_loop_ns_.store(absl::ToUnixNanos(absl::Now()));
    for (std::function<void()>& task : batch) task();
    const absl::Time now = clock_.TimeNow();
    if (now >= next_sweep_) {
      Sweep(now);
      PublishTenantLoad();
      next_sweep_ = now + kSweepInterval;
    }
    if (now >= next_accounts_ && !accounts_in_flight_.load()) {
      SaveAccounts(/*wait=*/false);
      next_accounts_ = now + kAccountsInterval;
    }
    if (reconcile_due_ && turns_in_flight_ == 0) {
      reconcile_due_ = false;
      next_reconcile_ = now + kReconcileInterval;
      Reconcile(now);
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
  for (const auto& [queue, w] : windows_) {
    if (w.unheld == 0) continue;
    auto it = active.find(scheduler_.TenantOfKey(queue.second));
    if (it != active.end()) it->second += w.unheld;
  }
  admission_.PublishTenants(std::move(active));
}

void Dispatcher::SaveAccounts(bool wait) {
  // What changed since the last save, or everything after a save that failed.
  const bool all = accounts_failed_.exchange(false);
  std::vector<store::AccountRow> rows = ToAccountRows(scheduler_.TakeAccounts(all));
  const absl::Duration ttl = config_.scheduler.key_ttl;
  auto save = [this, rows = std::move(rows), ttl] {
    if (absl::Status s = store_.SaveAccounts(rows, ttl); !s.ok()) {
      accounts_failed_.store(true);
      server::Log("dispatch")->debug("fair-share accounts not saved: {}", s.ToString());
    }
    accounts_in_flight_.store(false);
  };
  if (wait) {
    save();
    return;
  }
  accounts_in_flight_.store(true);
  writer_->Schedule(std::move(save));
}

void Dispatcher::PublishLoad(absl::Time now) {
  absl::flat_hash_map<std::string, int64_t> queued;
  for (const config::JobTypeConfig& t : config_.types) {
    queued[t.name] = scheduler_.queued_of_type(t.name);
  }
  int64_t waiting = 0;  // in the database, beyond the windows
  for (const auto& [queue, w] : windows_) {
    queued[queue.first] += w.unheld;
    waiting += w.unheld;
  }
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

sched::SchedulerStats Dispatcher::SchedulerStats(size_t max_keys) {
  auto out = std::make_shared<sched::SchedulerStats>();
  // A late task may still write *out: read it only if the loop ran it in time.
  if (!RunOnLoop([this, out, max_keys] {
        *out = scheduler_.Stats(clock_.TimeNow(), max_keys);
        for (const auto& [queue, w] : windows_) {
          scheduler_.AddQueued(*out, queue.first, queue.second, w.unheld);
        }
      })) {
    return {};
  }
  return *out;
}

std::optional<sched::WaitInfo> Dispatcher::WhyWaiting(const job::Job& job, bool* paged_out) {
  auto out = std::make_shared<std::optional<sched::WaitInfo>>();
  auto outside = std::make_shared<bool>(false);
  if (!RunOnLoop([this, out, outside, id = job.id, queue = QueueOf(job), seq = job.seq] {
        if (scheduler_.IsPending(id)) {
          *out = scheduler_.WhyWaiting(id, clock_.TimeNow());
          return;
        }
        auto w = windows_.find(queue);
        if (w != windows_.end() && seq > w->second.bound) {
          // In line behind every job of its queue held here.
          *outside = true;
          *out = sched::WaitInfo{
              .reason = sched::WaitReason::kInLine,
              .position = scheduler_.queued_of(queue.first, queue.second) + 1};
        }
      })) {
    return std::nullopt;
  }
  if (paged_out != nullptr) *paged_out = *outside;
  return *out;
}

bool Dispatcher::SetRateLimit(const std::string& rate_key, config::RateLimit limit) {
  auto out = std::make_shared<bool>(false);
  bool ran = RunOnLoop([this, out, rate_key, limit] {
    *out = scheduler_.SetRateLimit(rate_key, limit, clock_.TimeNow());
    if (*out) {
      server::Log("dispatch")->info("rate limit set key={} per_second={} burst={}", rate_key,
                                    limit.per_second, limit.burst);
    }
  });
  return ran && *out;
}

bool Dispatcher::SetTenantWeight(const std::string& tenant, double weight) {
  auto out = std::make_shared<bool>(false);
  bool ran = RunOnLoop([this, out, tenant, weight] {
    *out = scheduler_.SetTenantWeight(tenant, weight, clock_.TimeNow());
    if (*out) {
      server::Log("dispatch")->info("tenant weight set tenant={} weight={}", tenant, weight);
    }
  });
  return ran && *out;
}

std::optional<v1::WorkerInfo> Dispatcher::DrainWorker(const std::string& worker_id) {
  auto out = std::make_shared<std::optional<v1::WorkerInfo>>();
  RunOnLoop([this, out, worker_id] {
    auto it = sessions_.find(worker_id);
    if (it == sessions_.end() || it->second.link == nullptr) return;
    scheduler_.SetDraining(worker_id, true);
    v1::DaemonMessage msg;
    msg.mutable_drain();
    SendTo(worker_id, std::move(msg));
    server::Log("dispatch")->info("draining worker={} (operator request)", worker_id);
    for (v1::WorkerInfo& w : WorkersNow()) {
      if (w.worker_id() == worker_id) *out = std::move(w);
    }
  });
  return *out;
}

Dispatcher::TypeMetrics& Dispatcher::MetricsOf(const std::string& type) {
  auto [it, added] = type_metrics_.try_emplace(type);
  if (added) {
    metrics::DaemonMetrics& m = metrics::Metrics();
    it->second = TypeMetrics{.queue_wait = &m.queue_wait.With({type}),
                             .run_time = &m.run_time.With({type})};
  }
  return it->second;
}

void Dispatcher::ObserveRun(const job::Job& job, absl::Time now) {
  if (job.started_at == absl::InfinitePast()) return;  // never accepted: it did not run
  MetricsOf(job.spec.type).run_time->Observe(absl::ToDoubleSeconds(now - job.started_at));
}

bool Dispatcher::UpdateConfig(config::Config config) {
  return RunOnLoop([this, config = std::move(config)]() mutable {
    config_ = std::move(config);
    scheduler_.UpdateConfig(config_, clock_.TimeNow());
    for (const std::string& warning : config_.Warnings()) {
      server::Log("dispatch")->warn("{}", warning);
    }
  });
}

void Dispatcher::RetractClaims(const std::vector<sched::Dispatch>& decisions, absl::Time now) {
  for (const sched::Dispatch& d : decisions) {
    scheduler_.Retract(d.job_id);
    if (auto it = jobs_.find(d.job_id); it != jobs_.end()) {
      scheduler_.Enqueue(ToPending(it->second.job));
    }
  }
  dispatch_paused_until_ = now + kStoreErrorPause;
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
      // must not stay DISPATCHED with nobody to run it: give it back.
      if (!dropped_in_flight_.contains(d.job_id)) {
        server::Log("dispatch")
            ->error("claimed job={} that is not tracked here: returning it", d.job_id);
        ++repairs_;
      }
      scheduler_.Retract(d.job_id);
      if (absl::StatusOr<bool> back = store_.ReturnToQueue(d.job_id, d.attempt); !back.ok()) {
        server::Log("dispatch")
            ->warn("return to queue failed job={} status={}", d.job_id, back.status().ToString());
      }
      continue;
    }
    if (!won.contains(d.job_id) || it == jobs_.end()) {
      // The row moved on (cancelled) or another session holds it: try again shortly if the
      // job is still ours to run.
      scheduler_.Retract(d.job_id);
      if (it != jobs_.end()) {
        sched::PendingJob p = ToPending(it->second.job);
        p.not_before = std::max(p.not_before, now + absl::Milliseconds(100));
        scheduler_.Enqueue(std::move(p));
      }
      continue;
    }
    job::Job& j = it->second.job;
    MetricsOf(j.spec.type)
        .queue_wait->Observe(
            absl::ToDoubleSeconds(now - std::max(j.created_at, j.spec.not_before)));
    j.state = JobState::kDispatched;
    j.worker_id = d.worker_id;
    v1::Assignment* a = assigns[d.worker_id].mutable_assign()->add_assignments();
    a->set_job_id(j.id);
    a->set_attempt(j.attempt + 1);
    a->set_type(j.spec.type);
    if (std::string* payload = won[d.job_id]; payload != nullptr) {
      a->set_payload(std::move(*payload));
    } else {
      a->set_payload(j.spec.payload);
    }
    a->set_resource_id(j.spec.resource_id);
    convert::ToProto(now + j.spec.timeout, a->mutable_deadline());
    if (const config::JobTypeConfig* t = TypeOf(j)) a->set_model(t->model);
    events_.Publish(j.id, JobState::kDispatched);
  }
  for (auto& [worker_id, msg] : assigns) {
    server::Log("dispatch")
        ->debug("assign worker={} jobs={}", worker_id, msg.assign().assignments_size());
    SendTo(worker_id, std::move(msg));
  }
}

void Dispatcher::Sweep(absl::Time now) {
  // Workers silent past the stale threshold are lost.
  std::vector<std::string> stale;
  for (const auto& [id, s] : sessions_) {
    if (now - s.last_seen > config_.worker_stale_after) stale.push_back(id);
  }
  for (const std::string& id : stale) {
    LoseWorker(id, absl::StrCat("no heartbeat for ",
                                absl::FormatDuration(config_.worker_stale_after)));
  }

  std::vector<std::string> orphaned, timed_out;
  for (auto& [id, e] : jobs_) {
    if (e.orphan_deadline <= now) orphaned.push_back(id);
    if (Runs(e) && e.parked == Parked::kNo && e.run_deadline <= now) timed_out.push_back(id);
  }
  for (const std::string& id : orphaned) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    it->second.orphan_deadline = absl::InfiniteFuture();
    scheduler_.Finished(id, now);
    Orphan(it->second, "its worker did not reconnect after the daemon restarted", now);
  }
  for (const std::string& id : timed_out) {
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !Runs(it->second)) continue;
    Entry& e = it->second;
    std::string worker = e.job.worker_id;
    int32_t attempt = HeldAttempt(e);
    SendCancel(worker, id, attempt, "timeout");
    scheduler_.Finished(id, now, RanSince(e.job.started_at, now));
    server::Log("dispatch")->warn("timeout job={} attempt={} worker={}", id, attempt, worker);
    FailAttempt(e, attempt,
                absl::StrCat("timeout: attempt ", attempt, " ran longer than ",
                             absl::FormatDuration(e.job.spec.timeout)),
                /*retryable=*/true, now);
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
    overflow_hook_.MaybeRun(now, backlog);
  }

  // The scheduler's counts are derived from its jobs; a drift is a bug, but must never freeze a
  // queue or break a cap: recount, log and repair.
  if (now >= next_audit_) {
    next_audit_ = now + kAuditInterval;
    for (const std::string& drift : scheduler_.Audit(/*repair=*/true)) {
      server::Log("dispatch")->error("scheduler count drifted and was repaired: {}", drift);
      ++repairs_;
    }
  }
  // The reconcile compares settled state: it waits for the turns in flight (see Loop).
  if (now >= next_reconcile_) reconcile_due_ = true;

  // Transitions the database refused (it was away) are written once it answers again.
  if (!parked_.empty()) RetryParked(now);

  // Rows a failed write left DISPATCHED go back to the queue once the store answers again.
  if (!unreturned_.empty()) {
    absl::flat_hash_set<std::string> retry;
    retry.swap(unreturned_);
    for (const std::string& id : retry) {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) continue;
      if (!unreturned_.empty()) {
        unreturned_.insert(id);  // the store is still away: try the rest on the next sweep
        continue;
      }
      Requeue(it->second, it->second.job.spec.not_before);
    }
  }

  if (now >= next_expiry_) {
    next_expiry_ = now + kExpiryInterval;
    absl::StatusOr<std::vector<std::string>> expired = store_.ExpireOverdue(now, kExpiredError);
    if (!expired.ok()) {
      server::Log("dispatch")->warn("expiry sweep failed status={}", expired.status().ToString());
    } else {
      for (const std::string& id : *expired) {
        scheduler_.RemovePending(id);
        int32_t attempt = 0;
        if (auto it = jobs_.find(id); it != jobs_.end()) attempt = it->second.job.attempt;
        if (jobs_.erase(id) > 0) ++ended_since_publish_;
        server::Log("dispatch")->info("expired job={}", id);
        LogFinished(id, JobState::kExpired, attempt);
        events_.Publish(id, JobState::kExpired);
      }
    }
  }
}

void Dispatcher::OnHello(const std::shared_ptr<WorkerLink>& link, const v1::Hello& hello,
                         absl::Time now) {
  const std::string& worker_id = hello.worker_id();
  auto existing = sessions_.find(worker_id);
  if (existing != sessions_.end() && existing->second.link && existing->second.link != link) {
    existing->second.link->Close(absl::AbortedError("replaced by a newer session of this worker"));
  }
  Session& s = sessions_[worker_id];
  s.link = link;
  s.hello = hello;
  s.peer = link->peer();
  s.connected_at = now;
  s.last_seen = now;
  // VRAM is the sum over the worker's GPUs; a worker that reports none is not VRAM-limited.
  double vram_gb = -1;
  for (const v1::Gpu& gpu : hello.gpus()) {
    vram_gb = std::max(vram_gb, 0.0) + static_cast<double>(gpu.memory_total_bytes()) / 1e9;
  }
  scheduler_.AddWorker(sched::WorkerSpec{
      .id = worker_id,
      .types = {hello.types().begin(), hello.types().end()},
      .slots = hello.slots(),
      .labels = job::Labels(hello.labels().begin(), hello.labels().end()),
      .vram_gb = vram_gb,
      .models_resident = {hello.models_resident().begin(), hello.models_resident().end()}});

  v1::DaemonMessage welcome;
  v1::Welcome* w = welcome.mutable_welcome();
  convert::ToProto(config_.heartbeat_interval, w->mutable_heartbeat_interval());
  w->set_session_id(absl::StrCat(worker_id, "/", next_session_++));
  w->set_batching(true);

  // Re-adopt the jobs the worker still runs, if they are still its to run.
  absl::flat_hash_set<std::string> adopted;
  for (const v1::HeldJob& held : hello.running_jobs()) {
    auto it = jobs_.find(held.job_id());
    if (it == jobs_.end()) continue;
    Entry& e = it->second;
    job::Job& j = e.job;
    if (j.worker_id != worker_id) continue;
    if (e.parked != Parked::kNo) {
      // Its result waits to be written: the worker keeps it until acknowledged.
      if (e.result_waits && e.parked_attempt == held.attempt()) {
        *w->add_adopted_jobs() = held;
        adopted.insert(j.id);
      }
      continue;
    }
    bool running_here = j.state == JobState::kRunning && j.attempt == held.attempt();
    bool accepted_unrecorded = j.state == JobState::kDispatched && j.attempt + 1 == held.attempt();
    if (!(running_here || accepted_unrecorded)) continue;
    if (accepted_unrecorded) {
      // Record the accept that never was. If the database is away, adopt it all the same: the
      // row stays DISPATCHED at the previous attempt, which its outcome still settles.
      absl::StatusOr<bool> marked = store_.MarkRunning(j.id, held.attempt(), worker_id);
      if (marked.ok() && !*marked) continue;  // the row moved on
      if (marked.ok()) {
        j.state = JobState::kRunning;
        j.attempt = held.attempt();
        e.accepted = false;
        unmarked_.erase(j.id);
      } else {
        e.accepted = true;
        unmarked_.insert(j.id);
      }
    }
    e.heartbeat_misses = 0;
    e.orphan_deadline = absl::InfiniteFuture();
    if (e.run_deadline == absl::InfiniteFuture()) e.run_deadline = now + j.spec.timeout;
    scheduler_.Adopt(ToPlaced(j, worker_id));
    adopted.insert(j.id);
    v1::HeldJob* a = w->add_adopted_jobs();
    a->set_job_id(j.id);
    a->set_attempt(held.attempt());
  }
  // Jobs this worker held that it no longer reports were lost with its previous process.
  std::vector<std::string> lost;
  for (const auto& [id, e] : jobs_) {
    if (e.job.worker_id == worker_id && !adopted.contains(id) && e.parked == Parked::kNo &&
        (e.job.state == JobState::kDispatched || e.job.state == JobState::kRunning)) {
      lost.push_back(id);
    }
  }
  for (const std::string& id : lost) {
    scheduler_.Finished(id, now);
    Orphan(jobs_.at(id), "the worker reconnected without it", now);
  }
  server::Log("dispatch")->info(
      "worker connected worker={} peer={} slots={} types={} adopted={} lost={}", worker_id,
      s.peer, hello.slots(), hello.types_size(), adopted.size(), lost.size());
  link->Send(std::move(welcome));
}

void Dispatcher::OnAccept(const std::string& worker_id, const v1::Accept& accept, absl::Time now) {
  auto it = jobs_.find(accept.job_id());
  if (it != jobs_.end()) {
    Entry& e = it->second;
    job::Job& j = e.job;
    if (j.state == JobState::kRunning && j.worker_id == worker_id && j.attempt == accept.attempt()) {
      return;  // a repeated accept
    }
    if (j.state == JobState::kDispatched && j.worker_id == worker_id &&
        j.attempt + 1 == accept.attempt()) {
      if (!e.accepted) {
        // From here it counts as running; the RUNNING mark is written with the others of this
        // round (CommitTurn), or not at all if its result comes first.
        j.started_at = now;
        e.run_deadline = now + j.spec.timeout;
        e.heartbeat_misses = 0;
        e.accepted = true;
        unmarked_.insert(j.id);
      }
      return;
    }
  }
  // Not this worker's attempt to run (cancelled, expired, re-dispatched): stop it.
  SendCancel(worker_id, accept.job_id(), accept.attempt(), "attempt is no longer current");
}

void Dispatcher::OnReject(const std::string& worker_id, const v1::Reject& reject) {
  auto it = jobs_.find(reject.job_id());
  if (it == jobs_.end()) return;
  Entry& e = it->second;
  if (e.job.state != JobState::kDispatched || e.job.worker_id != worker_id ||
      e.job.attempt + 1 != reject.attempt()) {
    return;
  }
  server::Log("dispatch")->debug("refused job={} worker={} reason={}", e.job.id, worker_id,
                                 v1::Reject::Reason_Name(reject.reason()));
  scheduler_.Refused(e.job.id);
  if (reject.reason() == v1::Reject::REASON_DRAINING) scheduler_.SetDraining(worker_id, true);
  Requeue(e, e.job.spec.not_before);
}

void Dispatcher::OnResult(const std::string& worker_id, const v1::Result& result,
                          absl::Time now) {
  auto it = jobs_.find(result.job_id());
  bool current = false;
  if (it != jobs_.end()) {
    const job::Job& j = it->second.job;
    current = j.worker_id == worker_id &&
              ((j.state == JobState::kRunning && j.attempt == result.attempt()) ||
               (j.state == JobState::kDispatched && j.attempt + 1 == result.attempt()));
  }
  if (current && it->second.result_waits) {
    return;  // the same result, sent again while its write waits: acknowledged once it lands
  }
  if (!current || it->second.parked != Parked::kNo) {
    server::Log("dispatch")->info("discarded stale result job={} attempt={} worker={}",
                                  result.job_id(), result.attempt(), worker_id);
    SendAck(worker_id, result.job_id(), result.attempt());
    return;
  }
  Entry& e = it->second;
  const std::string job_id = e.job.id;
  const std::optional<absl::Duration> ran =
      result.has_run_time() ? std::optional(convert::FromProto(result.run_time()))
                            : RanSince(e.job.started_at, now);
  if (result.has_failure()) {
    scheduler_.Finished(job_id, now, ran);
    if (!FailAttempt(e, result.attempt(), result.failure().message(), result.failure().retryable(),
                     now, /*ack=*/true)) {
      return;  // parked: acknowledged once written
    }
  } else {
    // Written with the others of this round (CommitTurn), and acknowledged once written: until
    // then the worker keeps the result. The attempt has ended on the worker: its slot is free.
    scheduler_.Finished(job_id, now, ran);
    e.parked = Parked::kSuccess;
    e.parked_attempt = result.attempt();
    e.result_waits = true;
    e.run_deadline = absl::InfiniteFuture();
    parked_.push_back(ParkedWrite{.job_id = job_id,
                                  .attempt = result.attempt(),
                                  .worker_id = worker_id,
                                  .output = result.output()});
    ++unwritten_successes_;
    return;
  }
  SendAck(worker_id, job_id, result.attempt());
}

void Dispatcher::OnDisconnect(const std::shared_ptr<WorkerLink>& link, absl::Time now) {
  std::string worker_id = WorkerIdOf(link);
  if (worker_id.empty()) return;
  Session& s = sessions_[worker_id];
  s.link = nullptr;
  s.last_seen = std::max(s.last_seen, now);
  bool holds_jobs = false;
  for (const sched::WorkerView& w : scheduler_.Workers()) holds_jobs |= (w.id == worker_id && w.busy > 0);
  if (!holds_jobs) {
    scheduler_.RemoveWorker(worker_id);
    sessions_.erase(worker_id);
    server::Log("dispatch")->info("worker disconnected worker={}", worker_id);
    return;
  }
  // Its jobs may still be running: wait for it to reconnect before giving them away.
  scheduler_.SetDraining(worker_id, true);
  server::Log("dispatch")->warn("worker stream lost worker={}; holding its jobs until it "
                                "reconnects or goes stale", worker_id);
}

void Dispatcher::LoseWorker(const std::string& worker_id, const std::string& reason) {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return;
  if (it->second.link) it->second.link->Close(absl::UnavailableError("worker declared lost"));
  sessions_.erase(it);
  std::vector<std::string> orphans = scheduler_.RemoveWorker(worker_id);
  server::Log("dispatch")->warn("worker lost worker={} reason=\"{}\" jobs={}", worker_id, reason,
                                orphans.size());
  const absl::Time now = clock_.TimeNow();
  for (const std::string& id : orphans) {
    if (auto e = jobs_.find(id); e != jobs_.end()) {
      Orphan(e->second, absl::StrCat("worker ", worker_id, " lost: ", reason), now);
    }
  }
}

void Dispatcher::Orphan(Entry& entry, const std::string& reason, absl::Time now) {
  job::Job& j = entry.job;
  if (entry.parked != Parked::kNo) return;  // its outcome is known, only not yet written
  if (j.state == JobState::kDispatched && !entry.accepted) {
    Requeue(entry, j.spec.not_before);
    return;
  }
  if (!Runs(entry)) return;
  const config::JobTypeConfig* type = TypeOf(j);
  bool requeue = type == nullptr || type->on_orphan == config::OnOrphan::kRequeue;
  FailAttempt(entry, HeldAttempt(entry), absl::StrCat("interrupted: ", reason), requeue, now);
}

bool Dispatcher::FailAttempt(Entry& entry, int32_t attempt, const std::string& error,
                             bool retryable, absl::Time now, bool ack) {
  job::Job& j = entry.job;
  const std::string job_id = j.id;
  if (retryable && attempt < j.spec.max_attempts) {
    const config::JobTypeConfig* type = TypeOf(j);
    absl::Time not_before =
        now + (type ? sched::RetryBackoff(*type, attempt, job_id) : absl::Seconds(1));
    absl::StatusOr<bool> ok = store_.Retry(job_id, attempt, not_before, error);
    if (!ok.ok()) {
      server::Log("dispatch")->warn("retry failed job={} status={}; retrying", job_id,
                                    ok.status().ToString());
      Park(entry, attempt, error, retryable, ack);
      return false;
    }
    unmarked_.erase(job_id);
    if (!*ok) {
      if (jobs_.erase(job_id) > 0) ++ended_since_publish_;  // the row moved on (cancelled)
      return true;
    }
    j.state = JobState::kQueued;
    j.attempt = attempt;
    j.worker_id.clear();
    j.error = error;
    j.spec.not_before = not_before;
    entry.run_deadline = absl::InfiniteFuture();
    entry.accepted = false;
    entry.heartbeat_misses = 0;
    scheduler_.Enqueue(ToPending(j));
    server::Log("dispatch")
        ->info("retry job={} attempt={} after={} error=\"{}\"", job_id, attempt,
               absl::FormatDuration(not_before - now), error);
    events_.Publish(job_id, JobState::kQueued);
    return true;
  }
  absl::StatusOr<bool> done = store_.Finish(store::FinishRequest{
      .job_id = job_id, .attempt = attempt, .state = JobState::kFailed, .error = error});
  if (!done.ok()) {
    server::Log("dispatch")->warn("finish failed job={} status={}; retrying", job_id,
                                  done.status().ToString());
    Park(entry, attempt, error, retryable, ack);
    return false;
  }
  unmarked_.erase(job_id);
  ObserveRun(j, now);
  if (jobs_.erase(job_id) > 0) ++ended_since_publish_;
  if (*done) {
    server::Log("dispatch")->info("failed job={} attempt={} error=\"{}\"", job_id, attempt, error);
    LogFinished(job_id, JobState::kFailed, attempt);
    events_.Publish(job_id, JobState::kFailed);
  }
  return true;
}

void Dispatcher::Park(Entry& entry, int32_t attempt, const std::string& error, bool retryable,
                      bool ack) {
  if (entry.parked != Parked::kNo) return;  // already waiting to be written
  entry.parked = Parked::kFailure;
  entry.parked_attempt = attempt;
  entry.result_waits = ack;
  entry.run_deadline = absl::InfiniteFuture();
  parked_.push_back(ParkedWrite{.job_id = entry.job.id,
                                .attempt = attempt,
                                .worker_id = entry.job.worker_id,
                                .failed = true,
                                .error = error,
                                .retryable = retryable,
                                .ack = ack});
}

void Dispatcher::RetryParked(absl::Time now) {
  // Failed attempts only: successes are CommitTurn' (they stay in parked_).
  std::vector<ParkedWrite> parked;
  parked.swap(parked_);
  bool store_away = false;  // after one write fails, leave the rest for the next sweep
  for (ParkedWrite& p : parked) {
    auto it = jobs_.find(p.job_id);
    if (it == jobs_.end() || it->second.parked == Parked::kNo) continue;  // settled otherwise
    if (store_away) {
      parked_.push_back(std::move(p));
      continue;
    }
    Entry& e = it->second;
    if (!p.failed) {
      parked_.push_back(std::move(p));  // CommitTurn writes these
      continue;
    }
    e.parked = Parked::kNo;
    e.result_waits = false;
    if (FailAttempt(e, p.attempt, p.error, p.retryable, now, p.ack)) {
      if (p.ack) SendAck(p.worker_id, p.job_id, p.attempt);
    } else {
      store_away = true;  // parked again
    }
  }
}

void Dispatcher::CommitTurn(absl::Time now) {
  // At most kMaxTurnsInFlight at once, and none while the reconcile waits to run: a finished
  // turn wakes the loop (its completion is a task), which comes back here.
  if (turns_in_flight_ >= kMaxTurnsInFlight || reconcile_due_) return;
  TurnInFlight turn;
  store::TurnWrites& writes = turn.writes;
  next_flush_ = absl::InfiniteFuture();
  if (now < writes_paused_until_) {
    if (unwritten_successes_ > 0 || !unmarked_.empty()) next_flush_ = writes_paused_until_;
  } else {
    // Results first: a job whose result is in hand needs no RUNNING mark (the finish accepts
    // the row still DISPATCHED at the attempt before), so a short job costs one write, not two.
    TakeSuccesses(&writes.finishes, &turn.successes);
    TakeDueMarks(now, &writes.marks);
  }
  if (now >= dispatch_paused_until_) {
    turn.decisions = scheduler_.Decide(now, kMaxDispatchesPerRound);
  }
  for (const sched::Dispatch& d : turn.decisions) {
    writes.claims.push_back(store::ClaimRequest{d.job_id, d.attempt, d.worker_id});
  }
  if (writes.empty()) return;
  for (const store::MarkRequest& m : writes.marks) marking_.insert(m.job_id);
  ++turns_in_flight_;
  writer_->Schedule([this, turn = std::move(turn)]() mutable {
    const absl::Time start = absl::Now();
    absl::StatusOr<store::TurnOutcome> out = store_.WriteTurn(turn.writes);
    if (out.ok()) {
      metrics::DaemonMetrics& m = metrics::Metrics();
      m.store_rows.With({"turn"}).Observe(static_cast<double>(
          turn.writes.finishes.size() + turn.writes.marks.size() + turn.writes.claims.size()));
      m.store_commit.With({"turn"}).Observe(absl::ToDoubleSeconds(absl::Now() - start));
    }
    Post([this, turn = std::move(turn), out = std::move(out)]() mutable {
      FinishTurn(std::move(turn), std::move(out));
    });
  });
}

void Dispatcher::FinishTurn(TurnInFlight turn, absl::StatusOr<store::TurnOutcome> out) {
  --turns_in_flight_;
  for (const store::MarkRequest& m : turn.writes.marks) marking_.erase(m.job_id);
  const absl::Time now = clock_.TimeNow();
  const store::TurnWrites& writes = turn.writes;
  if (!out.ok()) {
    server::Log("dispatch")
        ->warn("write failed finishes={} marks={} claims={} status={}", writes.finishes.size(),
               writes.marks.size(), writes.claims.size(), out.status().ToString());
    // One kind of write the database refuses (a row a trigger or constraint rejects) must not
    // hold up the others: try each kind on its own before giving up on it.
    const int kinds = !writes.finishes.empty() + !writes.marks.empty() + !writes.claims.empty();
    absl::Status finished = out.status(), marked = out.status(), claimed = out.status();
    store::TurnOutcome alone;
    if (kinds > 1 && !absl::IsUnavailable(out.status())) {
      if (!writes.finishes.empty()) {
        absl::StatusOr<std::vector<std::string>> f = store_.FinishMany(writes.finishes);
        finished = f.status();
        if (f.ok()) alone.finished = *std::move(f);
      }
      if (!writes.marks.empty()) {
        absl::StatusOr<std::vector<std::string>> m = store_.MarkRunningMany(writes.marks);
        marked = m.status();
        if (m.ok()) alone.marked = *std::move(m);
      }
      if (!writes.claims.empty()) {
        absl::StatusOr<std::vector<std::string>> c =
            store_.Claim(writes.claims, &alone.claimed_payloads);
        claimed = c.status();
        if (c.ok()) alone.claimed = *std::move(c);
      }
    }
    if (finished.ok()) {
      ApplyFinishes(turn.successes, alone.finished);
    } else if (!writes.finishes.empty()) {
      // The results wait, unacknowledged (their workers keep them).
      writes_paused_until_ = now + kStoreErrorPause;
      unwritten_successes_ += static_cast<int64_t>(turn.successes.size());
      for (ParkedWrite& p : turn.successes) parked_.push_back(std::move(p));
    }
    if (marked.ok()) {
      ApplyMarks(writes.marks, alone.marked);
    } else if (!writes.marks.empty()) {
      // The accepted jobs count as running meanwhile: their outcomes settle the rows even if
      // no mark ever lands. The marks go again after the pause.
      writes_paused_until_ = now + kStoreErrorPause;
      for (const store::MarkRequest& m : writes.marks) {
        if (auto it = jobs_.find(m.job_id); it != jobs_.end() && it->second.accepted) {
          unmarked_.insert(m.job_id);
        }
      }
    }
    if (claimed.ok()) {
      ApplyClaims(turn.decisions, alone.claimed, alone.claimed_payloads, now);
    } else if (!turn.decisions.empty()) {
      RetractClaims(turn.decisions, now);
    }
    if (writes_paused_until_ > now) next_flush_ = std::min(next_flush_, writes_paused_until_);
    if (turns_in_flight_ == 0) dropped_in_flight_.clear();
    return;
  }
  ApplyFinishes(turn.successes, out->finished);
  ApplyMarks(writes.marks, out->marked);
  ApplyClaims(turn.decisions, out->claimed, out->claimed_payloads, now);
  if (turns_in_flight_ == 0) dropped_in_flight_.clear();
}

void Dispatcher::TakeSuccesses(std::vector<store::FinishRequest>* reqs,
                               std::vector<ParkedWrite>* taken) {
  if (unwritten_successes_ == 0) return;
  std::vector<ParkedWrite> rest;
  int64_t waiting = 0;
  for (ParkedWrite& p : parked_) {
    auto it = jobs_.find(p.job_id);
    if (p.failed || it == jobs_.end() || it->second.parked != Parked::kSuccess ||
        it->second.parked_attempt != p.attempt) {
      if (p.failed) rest.push_back(std::move(p));  // a failure, or a success settled otherwise
      continue;
    }
    if (marking_.contains(p.job_id)) {  // its RUNNING mark is being written: the next turn
      rest.push_back(std::move(p));
      ++waiting;
      continue;
    }
    reqs->push_back(store::FinishRequest{.job_id = p.job_id,
                                         .attempt = p.attempt,
                                         .state = JobState::kSucceeded,
                                         .result = p.output});
    taken->push_back(std::move(p));
  }
  parked_ = std::move(rest);
  unwritten_successes_ = waiting;
}

void Dispatcher::TakeDueMarks(absl::Time now, std::vector<store::MarkRequest>* marks) {
  std::vector<std::string> gone;
  for (const std::string& id : unmarked_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !it->second.accepted || it->second.parked != Parked::kNo) {
      gone.push_back(id);
      continue;
    }
    const job::Job& j = it->second.job;
    if (const absl::Time due = j.started_at + kRunningMarkDelay; due > now) {
      next_flush_ = std::min(next_flush_, due);
      continue;
    }
    marks->push_back(
        store::MarkRequest{.job_id = id, .attempt = j.attempt + 1, .worker_id = j.worker_id});
    gone.push_back(id);  // in this turn's write now (FinishTurn puts it back if that fails)
  }
  for (const std::string& id : gone) unmarked_.erase(id);
}

void Dispatcher::ApplyFinishes(const std::vector<ParkedWrite>& written,
                               const std::vector<std::string>& finished_ids) {
  absl::flat_hash_set<std::string> finished(finished_ids.begin(), finished_ids.end());
  const absl::Time now = clock_.TimeNow();
  for (const ParkedWrite& p : written) {
    if (auto it = jobs_.find(p.job_id); it != jobs_.end()) ObserveRun(it->second.job, now);
    if (jobs_.erase(p.job_id) > 0) ++ended_since_publish_;
    unmarked_.erase(p.job_id);
    if (finished.contains(p.job_id)) {  // else the row had moved on: nothing to record
      LogFinished(p.job_id, JobState::kSucceeded, p.attempt);
      events_.Publish(p.job_id, JobState::kSucceeded);
    }
    SendAck(p.worker_id, p.job_id, p.attempt);
  }
}

void Dispatcher::ApplyMarks(const std::vector<store::MarkRequest>& marks,
                            const std::vector<std::string>& marked_ids) {
  absl::flat_hash_set<std::string> running(marked_ids.begin(), marked_ids.end());
  for (const store::MarkRequest& m : marks) {
    // The job may have moved on while its mark was being written: ended, retried or dropped.
    auto it = jobs_.find(m.job_id);
    if (it == jobs_.end()) continue;
    Entry& e = it->second;
    if (!e.accepted || e.job.state != JobState::kDispatched || e.job.attempt + 1 != m.attempt) {
      continue;
    }
    e.accepted = false;
    if (!running.contains(m.job_id)) {
      // The row moved on (a standby cancelled it): the reconcile settles the entry.
      SendCancel(m.worker_id, m.job_id, m.attempt, "attempt is no longer current");
      continue;
    }
    e.job.state = JobState::kRunning;
    e.job.attempt = m.attempt;
    events_.Publish(m.job_id, JobState::kRunning);
  }
}

void Dispatcher::Requeue(Entry& entry, absl::Time not_before) {
  job::Job& j = entry.job;
  if (j.state != JobState::kDispatched || entry.accepted) return;  // back already, or started
  absl::StatusOr<bool> ok = store_.ReturnToQueue(j.id, j.attempt);
  if (!ok.ok()) {
    server::Log("dispatch")->warn("return to queue failed job={} status={}", j.id,
                                  ok.status().ToString());
    unreturned_.insert(j.id);
    return;
  }
  unreturned_.erase(j.id);
  if (!*ok) {
    if (jobs_.erase(j.id) > 0) ++ended_since_publish_;  // the row moved on (cancelled)
    return;
  }
  j.state = JobState::kQueued;
  j.worker_id.clear();
  j.spec.not_before = not_before;
  entry.heartbeat_misses = 0;
  scheduler_.Enqueue(ToPending(j));
  events_.Publish(j.id, JobState::kQueued);
}

void Dispatcher::SendAck(const std::string& worker_id, const std::string& job_id, int32_t attempt) {
  v1::ResultAck* ack = unsent_acks_[worker_id].add_acks();
  ack->set_job_id(job_id);
  ack->set_attempt(attempt);
}

void Dispatcher::FlushAcks() {
  for (auto& [worker_id, acks] : unsent_acks_) {
    auto it = sessions_.find(worker_id);
    if (it == sessions_.end() || !it->second.link) continue;
    if (it->second.hello.batching()) {
      v1::DaemonMessage msg;
      *msg.mutable_result_acks() = std::move(acks);
      it->second.link->Send(std::move(msg));
      continue;
    }
    for (v1::ResultAck& ack : *acks.mutable_acks()) {
      v1::DaemonMessage msg;
      *msg.mutable_result_ack() = std::move(ack);
      it->second.link->Send(std::move(msg));
    }
  }
  unsent_acks_.clear();
}

void Dispatcher::SendTo(const std::string& worker_id, v1::DaemonMessage msg) {
  auto it = sessions_.find(worker_id);
  if (it != sessions_.end() && it->second.link) it->second.link->Send(std::move(msg));
}

void Dispatcher::SendCancel(const std::string& worker_id, const std::string& job_id,
                            int32_t attempt, const std::string& reason) {
  v1::DaemonMessage msg;
  v1::CancelJob* c = msg.mutable_cancel();
  c->set_job_id(job_id);
  c->set_attempt(attempt);
  c->set_reason(reason);
  SendTo(worker_id, std::move(msg));
}

void Dispatcher::OnHeartbeat(const std::string& worker_id, const v1::Heartbeat& heartbeat,
                             absl::Time now) {
  absl::flat_hash_map<std::string, int32_t> held;
  for (const v1::HeldJob& h : heartbeat.running_jobs()) held[h.job_id()] = h.attempt();

  // Jobs placed on the worker that it no longer holds: their slots would leak for good.
  std::vector<std::string> lost;
  for (const std::string& id : scheduler_.JobsOn(worker_id)) {
    auto it = jobs_.find(id);
    if (it == jobs_.end() || !Runs(it->second)) continue;
    Entry& e = it->second;
    auto h = held.find(id);
    if (h != held.end() && h->second == HeldAttempt(e)) {
      e.heartbeat_misses = 0;
    } else if (++e.heartbeat_misses >= kHeartbeatMissesToLose) {
      lost.push_back(id);
    }
  }
  for (const std::string& id : lost) {
    Entry& e = jobs_.at(id);
    const int32_t attempt = HeldAttempt(e);
    server::Log("dispatch")
        ->error(
            "worker={} has not reported job={} attempt={} in {} heartbeats: treating it as lost "
            "there",
            worker_id, id, attempt, kHeartbeatMissesToLose);
    ++repairs_;
    SendCancel(worker_id, id, attempt, "not reported by its worker");
    scheduler_.Finished(id, now);
    Orphan(e, absl::StrCat("worker ", worker_id, " stopped reporting it"), now);
  }

  // Jobs the worker runs that are not its to run (cancelled, retried elsewhere): stop them. A
  // worker also lists the results it has not seen acknowledged, so one heartbeat may cross an
  // ack on the wire: only a job held in two heartbeats in a row counts.
  auto session = sessions_.find(worker_id);
  if (session == sessions_.end()) return;
  absl::flat_hash_map<std::string, int32_t> not_own;
  for (const auto& [id, attempt] : held) {
    auto it = jobs_.find(id);
    bool current = false;
    if (it != jobs_.end()) {
      const Entry& e = it->second;
      current = e.job.worker_id == worker_id &&
                (e.parked != Parked::kNo
                     ? e.result_waits && e.parked_attempt == attempt
                     : HeldAttempt(e) == attempt && (e.job.state == JobState::kRunning ||
                                                     e.job.state == JobState::kDispatched));
    }
    if (current) continue;
    auto before = session->second.not_own.find(id);
    if (before == session->second.not_own.end() || before->second != attempt) {
      not_own.emplace(id, attempt);
      continue;
    }
    if (it != jobs_.end()) {
      // The daemon tracks the job, but as someone else's or at another attempt: a real drift.
      server::Log("dispatch")
          ->warn("worker={} runs job={} attempt={} that is not its own: stopping it", worker_id, id,
                 attempt);
      ++repairs_;
    } else {
      // The job ended (its cancel may have been lost with an old stream): just stop it.
      server::Log("dispatch")
          ->info("worker={} still holds ended job={} attempt={}: stopping it", worker_id, id,
                 attempt);
    }
    SendCancel(worker_id, id, attempt, "attempt is no longer current");
  }
  session->second.not_own = std::move(not_own);
}

void Dispatcher::Reconcile(absl::Time now) {
  // Placed jobs: the rows the database has DISPATCHED or RUNNING against the jobs placed here.
  absl::StatusOr<std::vector<store::JobRef>> placed = store_.LoadPlacedRefs();
  if (!placed.ok()) {
    server::Log("dispatch")
        ->warn("reconcile: cannot read placed jobs status={}", placed.status().ToString());
    return;
  }
  absl::flat_hash_map<std::string, const store::JobRef*> placed_rows;
  std::vector<std::string> unknown;  // placed in the database, not known here
  for (const store::JobRef& r : *placed) {
    placed_rows[r.job_id] = &r;
    if (!jobs_.contains(r.job_id) && r.updated_at < now - kReconcileSettle) {
      unknown.push_back(r.job_id);
    }
  }
  if (!unknown.empty()) {
    // Its worker may run it: hold it there for the re-attach grace, as after a restart, then
    // apply on_orphan if the worker does not claim it.
    absl::StatusOr<std::vector<job::Job>> rows = store_.GetMany(unknown);
    if (rows.ok()) {
      for (job::Job& row : *rows) {
        if (jobs_.contains(row.id) ||
            (row.state != JobState::kDispatched && row.state != JobState::kRunning)) {
          continue;
        }
        server::Log("dispatch")
            ->error(
                "reconcile: job={} is {} on worker={} in the database but not known here: holding "
                "it for {}",
                row.id, job::ToString(row.state), row.worker_id,
                absl::FormatDuration(config_.orphan_grace));
        ++repairs_;
        scheduler_.Adopt(ToPlaced(row, row.worker_id));
        std::string().swap(row.spec.payload);
        std::string id = row.id;
        jobs_.emplace(std::move(id),
                      Entry{.job = std::move(row), .orphan_deadline = now + config_.orphan_grace});
      }
    }
  }
  std::vector<std::string> suspect;
  for (const auto& [id, e] : jobs_) {
    if (e.job.state != JobState::kDispatched && e.job.state != JobState::kRunning) continue;
    auto r = placed_rows.find(id);
    if (r == placed_rows.end() || r->second->state != e.job.state ||
        r->second->attempt != e.job.attempt) {
      suspect.push_back(id);
    }
  }
  // Queued jobs, queue by queue: the rows each queue's window should hold against the jobs held;
  // the rows themselves only where the counts differ.
  std::vector<store::QueueBound> bounds;
  for (const auto& [queue, w] : windows_) {
    bounds.push_back({.type = queue.first, .fairness_key = queue.second, .bound = w.bound});
  }
  absl::StatusOr<std::vector<store::QueueCount>> counts = store_.CountQueued(bounds);

  if (!suspect.empty()) {
    absl::StatusOr<std::vector<store::JobRef>> refs = store_.GetRefs(suspect);
    if (refs.ok()) {
      for (const store::JobRef& r : *refs) {
        auto it = jobs_.find(r.job_id);
        if (it == jobs_.end()) continue;
        const job::Job& j = it->second.job;
        if (r.state == j.state && r.attempt == j.attempt) continue;  // moved on while we read
        if (job::IsTerminal(r.state)) {
          if (r.updated_at < now - kReconcileSettle) {
            server::Log("dispatch")->error(
                "reconcile: job={} is {} in the database but {} here: dropping it", r.job_id,
                job::ToString(r.state), job::ToString(j.state));
            ++repairs_;
          }
          Drop(r.job_id, "ended elsewhere", now);
          events_.Publish(r.job_id, r.state);
        }
      }
    }
  }
  if (!counts.ok()) {
    server::Log("dispatch")
        ->warn("reconcile: cannot count queued jobs status={}", counts.status().ToString());
    return;
  }
  absl::flat_hash_map<QueueId, std::vector<std::string>> held;  // QUEUED jobs held, by queue
  for (const auto& [id, e] : jobs_) {
    if (e.job.state == JobState::kQueued) held[QueueOf(e.job)].push_back(id);
  }
  // A queue differs when the jobs held are not the rows its window covers.
  std::vector<std::pair<QueueId, int64_t>> differ;  // queue, its QUEUED rows
  absl::flat_hash_set<QueueId> in_db;
  for (const store::QueueCount& c : *counts) {
    QueueId queue{c.type, c.fairness_key};
    if (auto w = windows_.find(queue); w != windows_.end()) {
      w->second.unheld = c.queued - c.up_to_bound;
    }
    auto h = held.find(queue);
    const int64_t here = h == held.end() ? 0 : static_cast<int64_t>(h->second.size());
    if (here != c.up_to_bound) differ.emplace_back(queue, c.queued);
    in_db.insert(std::move(queue));
  }
  for (const auto& [queue, ids] : held) {
    if (!in_db.contains(queue)) differ.emplace_back(queue, 0);  // none QUEUED in the database
  }
  for (const auto& [queue, queued] : differ) {
    auto h = held.find(queue);
    ReconcileQueue(queue, h == held.end() ? std::vector<std::string>{} : h->second, queued, now);
  }
}

void Dispatcher::ReconcileQueue(const QueueId& queue, const std::vector<std::string>& held,
                                int64_t queued, absl::Time now) {
  // Jobs held here that are no longer QUEUED in the database and have ended: dropped.
  if (!held.empty()) {
    absl::StatusOr<std::vector<store::JobRef>> refs = store_.GetRefs(held);
    if (refs.ok()) {
      for (const store::JobRef& r : *refs) {
        if (!job::IsTerminal(r.state) || !jobs_.contains(r.job_id)) continue;
        if (r.updated_at < now - kReconcileSettle) {
          server::Log("dispatch")->error("reconcile: queued job={} is {} in the database: dropping it",
                                         r.job_id, job::ToString(r.state));
          ++repairs_;
        }
        Drop(r.job_id, "ended elsewhere", now);
        events_.Publish(r.job_id, r.state);
      }
    }
  }
  // Rows the window covers that are not held: held now.
  const int64_t window = config_.scheduler.queue_window;
  auto w = windows_.find(queue);
  const int64_t bound = w == windows_.end() ? INT64_MAX : w->second.bound;
  absl::StatusOr<std::vector<job::Job>> rows =
      store_.LoadQueuedPage(queue.first, queue.second, /*after_seq=*/0, window);
  if (!rows.ok()) {
    server::Log("dispatch")->warn("reconcile: cannot read queued jobs type={} key={} status={}",
                                  queue.first, queue.second, rows.status().ToString());
    return;
  }
  for (job::Job& row : *rows) {
    if (row.seq > bound) break;
    if (jobs_.contains(row.id)) continue;
    if (row.updated_at < now - kReconcileSettle) {
      server::Log("dispatch")->warn("reconcile: queued job={} was not known here: queuing it",
                                    row.id);
      ++repairs_;
    }
    Keep(std::move(row));
  }
  if (w == windows_.end() && static_cast<int64_t>(rows->size()) == window) {
    // A complete queue with more rows than a window (their news never came): page the rest.
    windows_[queue] = Window{.bound = rows->back().seq, .unheld = queued - window};
  }
}

void Dispatcher::CheckMemory(const std::string& worker_id, const v1::Heartbeat& heartbeat) {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return;
  sched::MemoryUse use{.ram_used_bytes = heartbeat.ram_used_bytes(),
                       .ram_total_bytes = heartbeat.ram_total_bytes()};
  for (const v1::Gpu& g : heartbeat.gpus()) {
    use.gpus.push_back({.used_bytes = g.memory_used_bytes(), .total_bytes = g.memory_total_bytes()});
  }
  std::string why;
  bool& throttled = it->second.throttled;
  bool next = sched::NextThrottleState(throttled, use, config_.memory_throttle, &why);
  if (next == throttled) return;
  throttled = next;
  scheduler_.SetThrottled(worker_id, next);
  if (next) {
    server::Log("dispatch")->warn("memory throttle on worker={}: {}; no new jobs until it drops",
                                  worker_id, why);
  } else {
    server::Log("dispatch")->info("memory throttle off worker={}: {}", worker_id, why);
  }
}

sched::PendingJob Dispatcher::ToPending(const job::Job& job) const {
  return sched::PendingJob{.id = job.id,
                           .type = job.spec.type,
                           .attempt = job.attempt,
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

std::string Dispatcher::WorkerIdOf(const std::shared_ptr<WorkerLink>& link) const {
  for (const auto& [id, s] : sessions_) {
    if (s.link == link) return id;
  }
  return "";
}

}  // namespace dispatchd::dispatch
