#include "bench/fleet/fleet_sim.h"

#include <algorithm>
#include <cstdio>
#include <deque>
#include <set>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace dispatchd::bench {

TimerQueue::TimerQueue() : thread_([this] { Run(); }) {}

TimerQueue::~TimerQueue() {
  {
    absl::MutexLock l(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void TimerQueue::At(absl::Time when, absl::AnyInvocable<void()> fn) {
  absl::MutexLock l(&mu_);
  due_.emplace(std::make_pair(when, seq_++), std::move(fn));
}

void TimerQueue::Run() {
  while (true) {
    absl::AnyInvocable<void()> fn;
    {
      absl::MutexLock l(&mu_);
      while (true) {
        if (stop_) return;
        const absl::Time now = absl::Now();
        if (!due_.empty() && due_.begin()->first.first <= now) break;
        const absl::Time next =
            due_.empty() ? now + absl::Milliseconds(50)
                         : std::min(due_.begin()->first.first, now + absl::Milliseconds(50));
        // Woken early by an At() that may be sooner; each wake checks again.
        auto changed = [this, size = due_.size()]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
          return stop_ || due_.size() != size;
        };
        mu_.AwaitWithDeadline(absl::Condition(&changed), next);
      }
      auto it = due_.begin();
      fn = std::move(it->second);
      due_.erase(it);
    }
    fn();
  }
}

namespace {

int64_t NowMicros() { return absl::ToUnixMicros(absl::Now()); }

}  // namespace

// One stream of one worker; deletes itself in OnDone. Holds one hold for writes started outside
// its reactions (the worker's timers), released once the stream is dead and no such write is
// being started.
class Session final : public grpc::ClientBidiReactor<v1::WorkerMessage, v1::DaemonMessage> {
 public:
  explicit Session(SimWorker& worker) : worker_(worker) {}
  void Begin(v1::WorkerService::Stub& stub);
  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;
  void Cancel() { context_.TryCancel(); }

 private:
  SimWorker& worker_;
  grpc::ClientContext context_;
  v1::DaemonMessage in_;
};

// One simulated worker: the state that outlives its streams. Its mutex guards everything,
// including the current session's write queue.
class SimWorker {
 public:
  SimWorker(Fleet& fleet, std::string id, v1::WorkerService::Stub& stub, uint64_t seed)
      : fleet_(fleet), id_(std::move(id)), stub_(stub), rng_(seed) {}

  void Connect() ABSL_LOCKS_EXCLUDED(mu_);
  void Cancel() ABSL_LOCKS_EXCLUDED(mu_);

  // From the session.
  void OnMessage(const v1::DaemonMessage& msg) ABSL_LOCKS_EXCLUDED(mu_);
  void OnReadFailed() ABSL_LOCKS_EXCLUDED(mu_);
  void OnWritten() ABSL_LOCKS_EXCLUDED(mu_);
  void OnSessionDone() ABSL_LOCKS_EXCLUDED(mu_);
  void Heartbeat() ABSL_LOCKS_EXCLUDED(mu_);
  void Flap() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Held {
    int32_t attempt = 0;
    uint64_t token = 0;  // the completion timer's; a timer whose token differs is stale
    std::string model;
    bool done = false;  // finished, result not yet acknowledged
  };

  void Finish(const std::string& job_id, uint64_t token) ABSL_LOCKS_EXCLUDED(mu_);
  struct Next;
  Next Handle(const v1::DaemonMessage& msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Next SendHeartbeat() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Accept(const v1::Assignment& a, v1::Batch& answer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Release(Held& h) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void LoadModel(const std::string& model) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddResult(const std::string& job_id, int32_t attempt) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Queue(v1::WorkerMessage msg) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // What to do on the stream once mu_ is released: StartWrite and RemoveHold may run a reaction
  // inline, which takes mu_.
  struct Next {
    Session* session = nullptr;
    const v1::WorkerMessage* write = nullptr;  // the front of out_, to start writing
    bool release = false;                      // remove the session's hold
  };
  // The next queued write if none is in flight, else the hold's release if it is due.
  Next Prepare() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Session* TakeRelease() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Run(Next next) ABSL_LOCKS_EXCLUDED(mu_);
  double ModelVram(const std::string& model) const {
    auto it = fleet_.options_.model_vram_gb.find(model);
    return it == fleet_.options_.model_vram_gb.end() ? 0 : it->second;
  }

  Fleet& fleet_;
  const std::string id_;
  v1::WorkerService::Stub& stub_;

  absl::Mutex mu_;
  // The current stream.
  Session* session_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool dead_ ABSL_GUARDED_BY(mu_) = false;      // its read failed: no new writes
  bool released_ ABSL_GUARDED_BY(mu_) = false;  // its hold is removed
  int starting_ ABSL_GUARDED_BY(mu_) = 0;       // writes (or a cancel) started outside mu_
  bool welcomed_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool batching_ ABSL_GUARDED_BY(mu_) = false;
  std::deque<v1::WorkerMessage> out_ ABSL_GUARDED_BY(mu_);  // front: in flight while writing_
  // What outlives streams.
  absl::flat_hash_map<std::string, Held> held_ ABSL_GUARDED_BY(mu_);
  int running_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  std::set<std::string> resident_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int> in_use_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  // Doubles (from reconnect_delay, up to 2 s) while streams end before their Welcome.
  absl::Duration backoff_ ABSL_GUARDED_BY(mu_) = absl::ZeroDuration();
  std::mt19937_64 rng_ ABSL_GUARDED_BY(mu_);
};

void Session::Begin(v1::WorkerService::Stub& stub) {
  stub.async()->Connect(&context_, this);
  AddHold();
  StartRead(&in_);
  StartCall();
}

void Session::OnReadDone(bool ok) {
  if (!ok) {
    worker_.OnReadFailed();
    return;
  }
  worker_.OnMessage(in_);
  StartRead(&in_);
}

void Session::OnWriteDone(bool ok) {
  if (ok) worker_.OnWritten();
}

void Session::OnDone(const grpc::Status& /*status*/) {
  SimWorker& w = worker_;
  delete this;
  w.OnSessionDone();
}

void SimWorker::Connect() {
  Next next;
  {
    absl::MutexLock l(&mu_);
    if (fleet_.stopping_.load()) return;
    session_ = new Session(*this);
    dead_ = released_ = welcomed_ = writing_ = batching_ = false;
    starting_ = 0;
    out_.clear();
    v1::WorkerMessage msg;
    v1::Hello& hello = *msg.mutable_hello();
    hello.set_worker_id(id_);
    for (const std::string& t : fleet_.options_.types) hello.add_types(t);
    hello.set_slots(fleet_.options_.slots);
    v1::Gpu& gpu = *hello.add_gpus();
    gpu.set_id("0");
    gpu.set_memory_total_bytes(static_cast<int64_t>(fleet_.options_.vram_gb * 1e9));
    for (const std::string& m : resident_) hello.add_models_resident(m);
    for (const auto& [job_id, h] : held_) {
      v1::HeldJob& j = *hello.add_running_jobs();
      j.set_job_id(job_id);
      j.set_attempt(h.attempt);
    }
    hello.set_batching(true);
    out_.push_back(std::move(msg));
    fleet_.live_sessions_.fetch_add(1);
    fleet_.counters_.connects.fetch_add(1);
    next = Prepare();
  }
  next.session->Begin(stub_);
  Run(next);
}

SimWorker::Next SimWorker::Handle(const v1::DaemonMessage& msg) {
  FleetCounters& c = fleet_.counters_;
  switch (msg.msg_case()) {
    case v1::DaemonMessage::kWelcome: {
      const v1::Welcome& w = msg.welcome();
      welcomed_ = true;
      batching_ = w.batching();
      c.welcomes.fetch_add(1);
      backoff_ = absl::ZeroDuration();
      fleet_.connected_.fetch_add(1);
      const bool first_welcome = heartbeat_interval_ == absl::ZeroDuration();
      heartbeat_interval_ = absl::Seconds(w.heartbeat_interval().seconds()) +
                            absl::Nanoseconds(w.heartbeat_interval().nanos());
      if (heartbeat_interval_ <= absl::ZeroDuration()) heartbeat_interval_ = absl::Seconds(5);
      absl::flat_hash_set<std::string> adopted;
      for (const v1::HeldJob& j : w.adopted_jobs()) adopted.insert(j.job_id());
      std::vector<std::string> resend;
      for (auto it = held_.begin(); it != held_.end();) {
        auto next = std::next(it);
        if (!adopted.contains(it->first)) {
          c.dropped.fetch_add(1);
          Release(it->second);
          held_.erase(it);
        } else {
          c.adopted.fetch_add(1);
          if (it->second.done) resend.push_back(it->first);
        }
        it = next;
      }
      for (const std::string& id : resend) {
        c.results_resent.fetch_add(1);
        AddResult(id, held_[id].attempt);
      }
      if (first_welcome) {
        // Spread the fleet's heartbeats over the interval.
        std::uniform_int_distribution<int64_t> phase(
            0, absl::ToInt64Microseconds(heartbeat_interval_));
        fleet_.timers_.At(absl::Now() + absl::Microseconds(phase(rng_)), [this] { Heartbeat(); });
      }
      break;
    }
    case v1::DaemonMessage::kAssign: {
      v1::WorkerMessage answer;
      for (const v1::Assignment& a : msg.assign().assignments()) {
        c.assigned.fetch_add(1);
        Accept(a, *answer.mutable_batch());
      }
      Queue(std::move(answer));
      break;
    }
    case v1::DaemonMessage::kResultAck:
      if (auto it = held_.find(msg.result_ack().job_id());
          it != held_.end() && it->second.done &&
          it->second.attempt == msg.result_ack().attempt()) {
        held_.erase(it);
      }
      c.acks.fetch_add(1);
      break;
    case v1::DaemonMessage::kResultAcks:
      for (const v1::ResultAck& ack : msg.result_acks().acks()) {
        if (auto it = held_.find(ack.job_id());
            it != held_.end() && it->second.done && it->second.attempt == ack.attempt()) {
          held_.erase(it);
        }
      }
      c.acks.fetch_add(msg.result_acks().acks_size());
      break;
    case v1::DaemonMessage::kCancel:
      // The daemon ignores the result of a cancelled attempt; the job simply runs out.
      c.cancels.fetch_add(1);
      break;
    default:
      break;
  }
  return Prepare();
}

void SimWorker::OnMessage(const v1::DaemonMessage& msg) {
  Next next;
  {
    absl::MutexLock l(&mu_);
    next = Handle(msg);
  }
  Run(next);
}

void SimWorker::Accept(const v1::Assignment& a, v1::Batch& answer) {
  FleetCounters& c = fleet_.counters_;
  if (running_ >= fleet_.options_.slots || held_.contains(a.job_id())) {
    v1::Reject& r = *answer.add_rejects();
    r.set_job_id(a.job_id());
    r.set_attempt(a.attempt());
    r.set_reason(v1::Reject::REASON_RESOURCE_EXHAUSTED);
    c.rejected.fetch_add(1);
    return;
  }
  const int64_t started_us = NowMicros();
  v1::Accept& acc = *answer.add_accepts();
  acc.set_job_id(a.job_id());
  acc.set_attempt(a.attempt());
  c.accepted.fetch_add(1);
  fleet_.LogStart(a.job_id(), a.attempt(), started_us);
  if (!a.model().empty()) {
    if (!resident_.contains(a.model())) LoadModel(a.model());
    ++in_use_[a.model()];
  }
  ++running_;
  int64_t ms = 0;
  if (!absl::SimpleAtoi(a.payload(), &ms) || ms < 0) {
    std::uniform_int_distribution<int64_t> draw(fleet_.options_.min_ms, fleet_.options_.max_ms);
    ms = draw(rng_);
  }
  const uint64_t token = next_token_++;
  held_[a.job_id()] = Held{.attempt = a.attempt(), .token = token, .model = a.model()};
  fleet_.timers_.At(absl::FromUnixMicros(started_us) + absl::Milliseconds(ms),
                    [this, id = a.job_id(), token] { Finish(id, token); });
}

void SimWorker::LoadModel(const std::string& model) {
  fleet_.counters_.model_loads.fetch_add(1);
  double used = 0;
  for (const std::string& m : resident_) used += ModelVram(m);
  const double need = ModelVram(model);
  // Idle models leave by name until the new one fits, as the scheduler assumes (its LoadModel).
  for (auto it = resident_.begin();
       it != resident_.end() && used + need > fleet_.options_.vram_gb + 1e-9;) {
    if (in_use_.contains(*it)) {
      ++it;
      continue;
    }
    used -= ModelVram(*it);
    it = resident_.erase(it);
    fleet_.counters_.evictions.fetch_add(1);
  }
  resident_.insert(model);
}

void SimWorker::Release(Held& h) {
  if (h.done) return;
  --running_;
  if (!h.model.empty()) {
    if (auto it = in_use_.find(h.model); it != in_use_.end() && --it->second == 0)
      in_use_.erase(it);
  }
  h.done = true;
}

void SimWorker::Finish(const std::string& job_id, uint64_t token) {
  Next next;
  {
    absl::MutexLock l(&mu_);
    auto it = held_.find(job_id);
    if (it == held_.end() || it->second.token != token || it->second.done) return;
    Release(it->second);
    fleet_.counters_.results.fetch_add(1);
    if (welcomed_ && !dead_) AddResult(job_id, it->second.attempt);  // else sent after Welcome
    next = Prepare();
  }
  Run(next);
}

void SimWorker::AddResult(const std::string& job_id, int32_t attempt) {
  // A result joins the batch waiting behind the write in flight, if there is one.
  if (batching_ && out_.size() > 1 && out_.back().has_batch()) {
    v1::Result& r = *out_.back().mutable_batch()->add_results();
    r.set_job_id(job_id);
    r.set_attempt(attempt);
    r.set_output("ok");
    return;
  }
  v1::WorkerMessage msg;
  v1::Result& r = batching_ ? *msg.mutable_batch()->add_results() : *msg.mutable_result();
  r.set_job_id(job_id);
  r.set_attempt(attempt);
  r.set_output("ok");
  Queue(std::move(msg));
}

void SimWorker::Queue(v1::WorkerMessage msg) {
  if (session_ == nullptr || dead_) return;
  out_.push_back(std::move(msg));
}

SimWorker::Next SimWorker::Prepare() {
  if (writing_ || out_.empty() || session_ == nullptr || dead_) {
    return Next{.session = TakeRelease(), .release = true};
  }
  writing_ = true;
  ++starting_;
  return Next{.session = session_, .write = &out_.front()};
}

Session* SimWorker::TakeRelease() {
  if (!dead_ || released_ || starting_ > 0 || session_ == nullptr) return nullptr;
  released_ = true;
  return session_;
}

void SimWorker::Run(Next next) {
  if (next.session == nullptr) return;
  if (next.release) {
    next.session->RemoveHold();
    return;
  }
  next.session->StartWrite(next.write);
  Session* release = nullptr;
  {
    absl::MutexLock l(&mu_);
    --starting_;
    release = TakeRelease();
  }
  if (release != nullptr) release->RemoveHold();
}

void SimWorker::Cancel() {
  Session* s = nullptr;
  {
    absl::MutexLock l(&mu_);
    if (session_ == nullptr || dead_ || released_) return;
    s = session_;
    ++starting_;  // keeps the hold, and so the session, until TryCancel has returned
  }
  s->Cancel();
  Session* release = nullptr;
  {
    absl::MutexLock l(&mu_);
    --starting_;
    release = TakeRelease();
  }
  if (release != nullptr) release->RemoveHold();
}

void SimWorker::OnWritten() {
  Next next;
  {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!out_.empty()) out_.pop_front();
    next = Prepare();
  }
  Run(next);
}

void SimWorker::OnReadFailed() {
  Session* release = nullptr;
  {
    absl::MutexLock l(&mu_);
    dead_ = true;
    release = TakeRelease();
  }
  if (release != nullptr) release->RemoveHold();
}

void SimWorker::OnSessionDone() {
  absl::Duration delay = fleet_.options_.reconnect_delay;
  {
    absl::MutexLock l(&mu_);
    if (welcomed_) {
      fleet_.connected_.fetch_sub(1);
    } else {  // refused (e.g. RESOURCE_EXHAUSTED) or unreachable: back off
      backoff_ = std::min(absl::Seconds(2), std::max(delay, backoff_ * 2));
      delay = backoff_;
    }
    session_ = nullptr;
    welcomed_ = writing_ = false;
    out_.clear();
  }
  fleet_.live_sessions_.fetch_sub(1);
  if (fleet_.stopping_.load()) return;
  fleet_.timers_.At(absl::Now() + delay, [this] { Connect(); });
}

void SimWorker::Heartbeat() {
  Next next;
  {
    absl::MutexLock l(&mu_);
    next = SendHeartbeat();
  }
  Run(next);
}

SimWorker::Next SimWorker::SendHeartbeat() {
  if (fleet_.stopping_.load()) return Next{};
  if (welcomed_ && !dead_) {
    v1::WorkerMessage msg;
    v1::Heartbeat& hb = *msg.mutable_heartbeat();
    for (const auto& [job_id, h] : held_) {
      v1::HeldJob& j = *hb.add_running_jobs();
      j.set_job_id(job_id);
      j.set_attempt(h.attempt);
    }
    double used = 0;
    for (const std::string& m : resident_) {
      hb.add_models_resident(m);
      used += ModelVram(m);
    }
    v1::Gpu& gpu = *hb.add_gpus();
    gpu.set_id("0");
    gpu.set_memory_total_bytes(static_cast<int64_t>(fleet_.options_.vram_gb * 1e9));
    gpu.set_memory_used_bytes(static_cast<int64_t>(used * 1e9));
    Queue(std::move(msg));
    fleet_.counters_.heartbeats.fetch_add(1);
  }
  fleet_.timers_.At(absl::Now() + heartbeat_interval_, [this] { Heartbeat(); });
  return Prepare();
}

void SimWorker::Flap() {
  if (fleet_.stopping_.load()) return;
  fleet_.counters_.flaps.fetch_add(1);
  Cancel();
  fleet_.timers_.At(absl::Now() + fleet_.options_.flap_every, [this] { Flap(); });
}

Fleet::Fleet(FleetOptions options) : options_(std::move(options)) {
  if (!options_.start_log.empty()) {
    absl::MutexLock l(&log_mu_);
    start_log_ = std::fopen(options_.start_log.c_str(), "w");
  }
}

Fleet::~Fleet() {
  absl::MutexLock l(&log_mu_);
  if (start_log_ != nullptr) std::fclose(start_log_);
}

void Fleet::Start() {
  const int per_channel = std::max(1, options_.streams_per_channel);
  for (int i = 0; i < options_.workers; ++i) {
    if (i % per_channel == 0) {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
      args.SetInt("dispatchd.fleet.channel", i);
      channels_.push_back(
          grpc::CreateCustomChannel(options_.server, grpc::InsecureChannelCredentials(), args));
      stubs_.push_back(v1::WorkerService::NewStub(channels_.back()));
    }
    workers_.push_back(std::make_unique<SimWorker>(
        *this, absl::StrCat(options_.id_prefix, options_.first + i), *stubs_.back(),
        options_.seed * 1000003 + static_cast<uint64_t>(options_.first + i)));
  }
  for (auto& w : workers_) w->Connect();
  if (options_.flap_every > absl::ZeroDuration()) {
    for (auto& w : workers_) {
      SimWorker* p = w.get();
      timers_.At(absl::Now() + options_.flap_every, [p] { p->Flap(); });
    }
  }
}

bool Fleet::Stop(absl::Duration grace) {
  stopping_.store(true);
  for (auto& w : workers_) w->Cancel();
  const absl::Time deadline = absl::Now() + grace;
  while (live_sessions_.load() > 0 && absl::Now() < deadline)
    absl::SleepFor(absl::Milliseconds(10));
  absl::MutexLock l(&log_mu_);
  if (start_log_ != nullptr) std::fflush(start_log_);
  return live_sessions_.load() == 0;
}

void Fleet::LogStart(const std::string& job_id, int32_t attempt, int64_t us) {
  absl::MutexLock l(&log_mu_);
  if (start_log_ != nullptr)
    std::fprintf(start_log_, "%s %d %lld\n", job_id.c_str(), attempt, static_cast<long long>(us));
}

}  // namespace dispatchd::bench
