// The dispatcher's worker streams, and what workers say about their jobs. See dispatcher.h.

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"

#include "lib/sched/memory_throttle.h"
#include "server/convert/job_proto.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/dispatcher_internal.h"
#include "server/metrics/daemon_metrics.h"
#include "server/util/log.h"

namespace dispatchd::dispatch {

using job::JobState;

namespace {

// The `reason` label of a refusal: the enum's name without its prefix, in lower case; a reason
// this daemon does not know counts as unspecified, so that the label stays bounded.
const char* RefusalLabel(v1::Reject::Reason reason) {
  switch (reason) {
    case v1::Reject::REASON_RESOURCE_EXHAUSTED:
      return "resource_exhausted";
    case v1::Reject::REASON_UNSUPPORTED:
      return "unsupported";
    case v1::Reject::REASON_DRAINING:
      return "draining";
    default:
      return "unspecified";
  }
}

}  // namespace

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
    loop_role_.Assert();
    OnHello(link, hello, clock_.TimeNow());
  });
}

void Dispatcher::WorkerMessage(std::shared_ptr<WorkerLink> link, v1::WorkerMessage msg) {
  // A heartbeat waits for the loop's next wake: the worker expects no answer, and what it reports
  // (its jobs, memory, resident models, that it lives) is as good a fraction of a second later.
  const bool unhurried = msg.msg_case() == v1::WorkerMessage::kHeartbeat;
  auto task = [this, link = std::move(link), msg = std::move(msg)] {
    loop_role_.Assert();
    const absl::Time now = clock_.TimeNow();
    std::string worker_id = WorkerIdOf(link);
    if (worker_id.empty()) return;  // a replaced or lost session
    sessions_[worker_id].last_seen = now;
    switch (msg.msg_case()) {
      case v1::WorkerMessage::kAccept:
        OnAccept(worker_id, msg.accept(), now);
        break;
      case v1::WorkerMessage::kReject:
        OnReject(worker_id, msg.reject());
        break;
      case v1::WorkerMessage::kResult:
        OnResult(worker_id, msg.result(), now);
        break;
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
  };
  if (unhurried) {
    PostUnhurried(std::move(task));
  } else {
    Post(std::move(task));
  }
}

void Dispatcher::WorkerDisconnected(std::shared_ptr<WorkerLink> link) {
  Post([this, link = std::move(link)] {
    loop_role_.Assert();
    OnDisconnect(link, clock_.TimeNow());
  });
}

std::vector<v1::WorkerInfo> Dispatcher::Workers() {
  return AskLoop([this] {
           loop_role_.Assert();
           return WorkersNow();
         })
      .value_or(std::vector<v1::WorkerInfo>{});
}

Dispatcher::Gauges Dispatcher::ReadGauges() {
  return AskLoop([this] {
           loop_role_.Assert();
           Gauges out;
           out.scheduler = StatsNow(/*max_keys=*/0);
           for (const auto& [worker_id, session] : sessions_) {
             if (session.link == nullptr) continue;
             const std::optional<sched::WorkerLoad> load = scheduler_.LoadOf(worker_id);
             if (!load.has_value()) continue;
             ++out.workers;
             out.busy += load->busy;
             out.slots += load->slots;
             out.model_loads.emplace_back(worker_id, load->model_loads);
           }
           return out;
         })
      .value_or(Gauges{});
}

absl::StatusOr<v1::WorkerInfo> Dispatcher::DrainWorker(const std::string& worker_id) {
  std::optional<std::optional<v1::WorkerInfo>> answer =
      AskLoop([this, worker_id]() -> std::optional<v1::WorkerInfo> {
        loop_role_.Assert();
        auto it = sessions_.find(worker_id);
        if (it == sessions_.end() || it->second.link == nullptr) return std::nullopt;
        scheduler_.SetDraining(worker_id, true);
        v1::DaemonMessage msg;
        msg.mutable_drain();
        SendTo(worker_id, std::move(msg));
        server::Log("dispatch")->info("draining worker={} (operator request)", worker_id);
        for (v1::WorkerInfo& w : WorkersNow()) {
          if (w.worker_id() == worker_id) return std::move(w);
        }
        return std::nullopt;
      });
  if (!answer.has_value()) {
    return absl::UnavailableError(
        "the dispatcher did not answer within 10 s (busy or stopping); the drain may still "
        "apply: see ListWorkers");
  }
  if (!answer->has_value()) {
    return absl::NotFoundError(absl::StrCat("no connected worker \"", worker_id, "\""));
  }
  return **std::move(answer);
}

bool Dispatcher::StopAssigning(const std::string& why) {
  return RunOnLoop([this, why] {
    loop_role_.Assert();
    stop_assigning_ = why.empty() ? "the daemon is stopping" : why;
    for (const auto& [worker_id, session] : sessions_) {
      if (session.link != nullptr) SendStopping(worker_id);
    }
    server::Log("dispatch")->info("assigning no more jobs: {}", stop_assigning_);
  });
}

int64_t Dispatcher::JobsInFlight() {
  return AskLoop([this] {
           loop_role_.Assert();
           int64_t n = static_cast<int64_t>(owed_.size());
           for (const auto& [worker_id, session] : sessions_) {
             if (session.link == nullptr) continue;
             if (auto load = scheduler_.LoadOf(worker_id)) n += load->busy;
           }
           return n;
         })
      .value_or(-1);
}

void Dispatcher::SendStopping(const std::string& worker_id) {
  scheduler_.SetDraining(worker_id, true);
  v1::DaemonMessage msg;
  msg.mutable_stopping()->set_message(stop_assigning_);
  SendTo(worker_id, std::move(msg));
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
    info.set_ram_used_bytes(s.ram_used_bytes);
    info.set_ram_total_bytes(s.ram_total_bytes);
    *info.mutable_gpus() = s.gpus;
    for (const std::string& m : w.models_resident) info.add_models_resident(m);
    info.set_vram_gb(w.vram_gb);
    info.set_vram_in_use_gb(w.vram_in_use_gb);
    info.set_model_loads(w.model_loads);
    out.push_back(std::move(info));
  }
  return out;
}

void Dispatcher::OnHello(const std::shared_ptr<WorkerLink>& link, const v1::Hello& hello,
                         absl::Time now) {
  const std::string& worker_id = hello.worker_id();
  auto existing = sessions_.find(worker_id);
  if (existing != sessions_.end() && existing->second.link && existing->second.link != link) {
    existing->second.link->Close(absl::AbortedError("replaced by a newer session of this worker"));
    worker_of_link_.erase(existing->second.link.get());
  }
  Session& s = sessions_[worker_id];
  s.link = link;
  worker_of_link_[link.get()] = worker_id;
  s.hello = hello;
  s.peer = link->peer();
  s.connected_at = now;
  s.last_seen = now;
  s.gpus = hello.gpus();
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
    Held& h = it->second;
    const job::Reattach how =
        job::OnReattach(h.at, worker_id, held.attempt(), now, h.job.spec.timeout);
    if (how == job::Reattach::kNo) continue;
    adopted.insert(h.job.id);
    *w->add_adopted_jobs() = held;
    if (how == job::Reattach::kResultWaits) continue;  // it keeps the result until acknowledged
    // An accept never recorded owes its RUNNING mark; until it lands the row stays DISPATCHED at
    // the attempt before, which the outcome settles all the same.
    if (how == job::Reattach::kAccepted) Owe(h.job.id);
    scheduler_.Adopt(ToPlaced(h.job, worker_id));
  }
  // Jobs this worker held that it no longer reports were lost with its previous process.
  std::vector<std::string> lost;
  if (auto filed = held_on_worker_.find(worker_id); filed != held_on_worker_.end()) {
    for (const std::string& id : filed->second) {
      auto it = jobs_.find(id);
      if (it == jobs_.end()) continue;
      const Held& h = it->second;
      if (h.at.worker_id == worker_id && !adopted.contains(id) && !h.at.Settled() &&
          (h.at.state == JobState::kDispatched || h.at.state == JobState::kRunning)) {
        lost.push_back(id);
      }
    }
  }
  for (const std::string& id : lost) {
    scheduler_.Finished(id, now);
    Orphan(jobs_.at(id), "the worker reconnected without it", now);
  }
  server::Log("dispatch")
      ->info("worker connected worker={} peer={} slots={} types={} adopted={} lost={}", worker_id,
             s.peer, hello.slots(), hello.types_size(), adopted.size(), lost.size());
  link->Send(std::move(welcome));
  if (!stop_assigning_.empty()) SendStopping(worker_id);
}

void Dispatcher::OnAccept(const std::string& worker_id, const v1::Accept& accept, absl::Time now) {
  auto it = jobs_.find(accept.job_id());
  if (it == jobs_.end()) {
    // Not this worker's attempt to run (cancelled, expired): stop it.
    SendCancel(worker_id, accept.job_id(), accept.attempt(), "attempt is no longer current");
    return;
  }
  Held& h = it->second;
  const job::Transition t =
      job::OnAccept(h.at, worker_id, accept.attempt(), now, h.job.spec.timeout, kRunningMarkDelay);
  if (t.stop_worker) {
    SendCancel(worker_id, accept.job_id(), t.stop_attempt, "attempt is no longer current");
  }
  // From here it counts as running; the RUNNING mark is written with the others of a turn once
  // due, or not at all if its result comes first.
  if (t.write != job::WriteKind::kNone) Owe(h.job.id);
}

void Dispatcher::OnReject(const std::string& worker_id, const v1::Reject& reject) {
  auto it = jobs_.find(reject.job_id());
  if (it == jobs_.end()) return;
  Held& h = it->second;
  if (job::OnReject(h.at, worker_id, reject.attempt()).Nothing()) return;
  server::Log("dispatch")
      ->debug("refused job={} worker={} reason={}", h.job.id, worker_id,
              v1::Reject::Reason_Name(reject.reason()));
  metrics::Metrics().worker_refusals.With({RefusalLabel(reject.reason())}).Inc();
  scheduler_.Refused(h.job.id);
  if (reject.reason() == v1::Reject::REASON_DRAINING) scheduler_.SetDraining(worker_id, true);
  Owe(h.job.id);  // back to the queue, no attempt consumed
}

void Dispatcher::OnResult(const std::string& worker_id, const v1::Result& result, absl::Time now) {
  auto it = jobs_.find(result.job_id());
  if (it == jobs_.end()) {
    server::Log("dispatch")
        ->info("discarded stale result job={} attempt={} worker={}", result.job_id(),
               result.attempt(), worker_id);
    metrics::Metrics().results_discarded.With({}).Inc();
    SendAck(worker_id, result.job_id(), result.attempt());
    return;
  }
  Held& h = it->second;
  job::Outcome outcome{.succeeded = !result.has_failure()};
  job::RetryPolicy policy;
  if (result.has_failure()) {
    outcome.error = result.failure().message();
    outcome.retryable = result.failure().retryable();
    policy = PolicyOf(h.job, result.attempt(), now);
  } else {
    outcome.output = result.output();
  }
  const std::optional<absl::Duration> ran =
      result.has_run_time() ? std::optional(convert::FromProto(result.run_time()))
                            : RanSince(h.at.started_at, now);
  outcome.ran = ran.value_or(absl::InfiniteDuration());
  const job::Transition t = job::OnResult(h.at, worker_id, result.attempt(), outcome, policy);
  if (t.ack) {
    server::Log("dispatch")
        ->info("discarded stale result job={} attempt={} worker={}", result.job_id(),
               result.attempt(), worker_id);
    metrics::Metrics().results_discarded.With({}).Inc();
    SendAck(worker_id, result.job_id(), result.attempt());
    return;
  }
  if (t.Nothing()) return;  // the same result again: acknowledged once its write lands
  // The attempt has ended on the worker: its slot is free. The outcome is written with the
  // others of a turn and acknowledged once written: until then the worker keeps it.
  scheduler_.Finished(h.job.id, now, ran);
  Owe(h.job.id);
}

void Dispatcher::OnDisconnect(const std::shared_ptr<WorkerLink>& link, absl::Time now) {
  std::string worker_id = WorkerIdOf(link);
  if (worker_id.empty()) return;
  Session& s = sessions_[worker_id];
  worker_of_link_.erase(s.link.get());
  s.link = nullptr;
  s.last_seen = std::max(s.last_seen, now);
  const std::optional<sched::WorkerLoad> load = scheduler_.LoadOf(worker_id);
  if (!load.has_value() || load->busy == 0) {
    scheduler_.RemoveWorker(worker_id);
    sessions_.erase(worker_id);
    server::Log("dispatch")->info("worker disconnected worker={}", worker_id);
    return;
  }
  // Its jobs may still be running: wait for it to reconnect before giving them away.
  scheduler_.SetDraining(worker_id, true);
  server::Log("dispatch")
      ->warn(
          "worker stream lost worker={}; holding its jobs until it "
          "reconnects or goes stale",
          worker_id);
}

void Dispatcher::LoseWorker(const std::string& worker_id, const std::string& reason) {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return;
  if (it->second.link) {
    it->second.link->Close(absl::UnavailableError("worker declared lost"));
    worker_of_link_.erase(it->second.link.get());
  }
  sessions_.erase(it);
  std::vector<std::string> orphans = scheduler_.RemoveWorker(worker_id);
  server::Log("dispatch")
      ->warn("worker lost worker={} reason=\"{}\" jobs={}", worker_id, reason, orphans.size());
  const absl::Time now = clock_.TimeNow();
  for (const std::string& id : orphans) {
    if (auto it = jobs_.find(id); it != jobs_.end()) {
      Orphan(it->second, absl::StrCat("worker ", worker_id, " lost: ", reason), now);
    }
  }
}

void Dispatcher::Orphan(Held& h, const std::string& reason, absl::Time now) {
  const job::Transition t =
      job::Orphan(h.at, RequeuesOrphans(h.job), PolicyOf(h.job, h.at.HeldAttempt(), now), reason);
  if (t.Nothing()) return;
  if (scheduler_.IsPlaced(h.job.id)) scheduler_.Finished(h.job.id, now);
  Owe(h.job.id);
}

void Dispatcher::OnHeartbeat(const std::string& worker_id, const v1::Heartbeat& heartbeat,
                             absl::Time now) {
  absl::flat_hash_map<std::string, int32_t> held;
  for (const v1::HeldJob& h : heartbeat.running_jobs()) held[h.job_id()] = h.attempt();

  // Jobs placed on the worker that it no longer holds: their slots would leak for good.
  std::vector<std::string> lost;
  for (const std::string& id : scheduler_.JobsOn(worker_id)) {
    auto it = jobs_.find(id);
    if (it == jobs_.end()) continue;
    auto h = held.find(id);
    if (job::MissedHeartbeat(it->second.at, h == held.end() ? 0 : h->second,
                             kHeartbeatMissesToLose)) {
      lost.push_back(id);
    }
  }
  for (const std::string& id : lost) {
    Held& h = jobs_.at(id);
    const int32_t attempt = h.at.HeldAttempt();
    server::Log("dispatch")
        ->error(
            "worker={} has not reported job={} attempt={} in {} heartbeats: treating it as lost "
            "there",
            worker_id, id, attempt, kHeartbeatMissesToLose);
    Repaired(metrics::repair::kLostOnWorker);
    SendCancel(worker_id, id, attempt, "not reported by its worker");
    Orphan(h, absl::StrCat("worker ", worker_id, " stopped reporting it"), now);
  }

  // Jobs the worker runs that are not its to run (cancelled, retried elsewhere): stop them. A
  // worker also lists the results it has not seen acknowledged, so one heartbeat may cross an
  // ack on the wire: only a job held in two heartbeats in a row counts.
  auto session = sessions_.find(worker_id);
  if (session == sessions_.end()) return;
  absl::flat_hash_map<std::string, int32_t> not_own;
  for (const auto& [id, attempt] : held) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() && job::HoldsAsItsOwn(it->second.at, worker_id, attempt)) continue;
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
      Repaired(metrics::repair::kNotOwn);
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

void Dispatcher::CheckMemory(const std::string& worker_id, const v1::Heartbeat& heartbeat) {
  auto it = sessions_.find(worker_id);
  if (it == sessions_.end()) return;
  it->second.ram_used_bytes = heartbeat.ram_used_bytes();
  it->second.ram_total_bytes = heartbeat.ram_total_bytes();
  sched::MemoryUse use{.ram_used_bytes = heartbeat.ram_used_bytes(),
                       .ram_total_bytes = heartbeat.ram_total_bytes()};
  if (!heartbeat.gpus().empty()) it->second.gpus = heartbeat.gpus();
  for (const v1::Gpu& g : heartbeat.gpus()) {
    use.gpus.push_back({.used_bytes = g.memory_used_bytes(),
                        .total_bytes = g.memory_total_bytes(),
                        .worker_bytes = g.has_memory_used_by_worker_bytes()
                                            ? g.memory_used_by_worker_bytes()
                                            : -1});
  }
  std::string why;
  bool& throttled = it->second.throttled;
  bool next = sched::NextThrottleState(throttled, use, config_.memory_throttle, &why);
  if (next == throttled) return;
  throttled = next;
  scheduler_.SetThrottled(worker_id, next);
  if (next) {
    server::Log("dispatch")
        ->warn("memory throttle on worker={}: {}; no new jobs until it drops", worker_id, why);
  } else {
    server::Log("dispatch")->info("memory throttle off worker={}: {}", worker_id, why);
  }
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

std::string Dispatcher::WorkerIdOf(const std::shared_ptr<WorkerLink>& link) const {
  auto it = worker_of_link_.find(link.get());
  return it == worker_of_link_.end() ? "" : it->second;
}

}  // namespace dispatchd::dispatch
