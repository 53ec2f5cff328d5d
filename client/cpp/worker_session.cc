// The worker's sessions. Run() connects, serves and reconnects: the configured daemons in turn
// after a failed attempt, at once to the leader a standby names, with jittered exponential backoff
// between attempts. Each session (RunSession) sends Hello, handles Welcome, reads the daemon's
// messages until the stream ends, and has a timer thread for heartbeats and the welcome and drain
// watchdogs. Session, at the top, is the stream they use.

#include "client/cpp/worker_session.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/random/random.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "client/cpp/worker.h"
#include "client/cpp/worker_log.h"
#include "client/cpp/worker_memory_probe.h"
#include "proto/convert/time_proto.h"

namespace dispatchd::client {
namespace worker_internal {

Session::Session(const std::string& target, const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  channel_ = grpc::CreateCustomChannel(target, credentials.channel, args);
  credentials.Apply(context_);
  stub_ = v1::WorkerService::NewStub(channel_);
}

void Session::Connect() {
  // Construct the stream under write_mu_ so that no Write sees it half-made.
  absl::MutexLock l(&write_mu_);
  stream_ = stub_->Connect(&context_);
}

bool Session::Write(const v1::WorkerMessage& message) {
  absl::MutexLock l(&write_mu_);
  if (closed_ || stream_ == nullptr) return false;
  return stream_->Write(message);
}

void Session::WritesDone() {
  absl::MutexLock l(&write_mu_);
  if (closed_ || stream_ == nullptr) return;
  closed_ = true;
  stream_->WritesDone();
}

void Session::Close() {
  absl::MutexLock l(&write_mu_);
  closed_ = true;
}

void Session::SendResult(v1::Result result, bool others_running) {
  if (!Post(absl::MakeSpan(&result, 1))) return;
  // Without this, each handler that finishes writes its own result while the others are still
  // returning: about one write per job under load. One yield lets them join this write.
  if (others_running) std::this_thread::yield();
  FlushOutbox();
}

void Session::SendResults(std::vector<v1::Result> results) {
  if (Post(absl::MakeSpan(results))) FlushOutbox();
}

bool Session::Post(absl::Span<v1::Result> results) {
  if (results.empty()) return false;
  if (!batching_) {
    for (v1::Result& result : results) {
      v1::WorkerMessage m;
      *m.mutable_result() = std::move(result);
      Write(m);
    }
    return false;
  }
  absl::MutexLock l(&out_mu_);
  for (v1::Result& result : results) outbox_.push_back(std::move(result));
  if (flushing_) return false;
  flushing_ = true;
  return true;
}

void Session::FlushOutbox() {
  while (true) {
    v1::WorkerMessage m;
    {
      absl::MutexLock l(&out_mu_);
      if (outbox_.empty()) {
        flushing_ = false;
        return;
      }
      // Up to kMaxBatchBytes of results, and always at least one.
      size_t n = 0, bytes = 0;
      for (; n < outbox_.size(); ++n) {
        const size_t size = outbox_[n].ByteSizeLong();
        if (n > 0 && bytes + size > kMaxBatchBytes) break;
        bytes += size;
      }
      v1::Batch* batch = m.mutable_batch();
      for (size_t i = 0; i < n; ++i) batch->add_results()->Swap(&outbox_[i]);
      outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    Write(m);
  }
}

}  // namespace worker_internal

namespace {

using worker_internal::Log;

}  // namespace

absl::Status Worker::Run() {
  {
    absl::MutexLock l(&mu_);
    if (run_called_) return absl::FailedPreconditionError("Run: already called");
    run_called_ = true;
  }
  std::shared_ptr<spdlog::logger> log = Log();
  log->info("starting worker={} server={} types={} slots={} max_concurrent={}", options_.worker_id,
            options_.server, absl::StrJoin(options_.types, ","), options_.slots, max_concurrent_);
  absl::BitGen rng;
  int failures = 0;
  size_t next_server = 0;
  std::string target = servers_[0];
  absl::StatusOr<Credentials> credentials = LoadCredentials(options_.security);
  if (!credentials.ok()) {
    log->error("credentials worker={}: {}", options_.worker_id,
               std::string(credentials.status().message()));
    return credentials.status();
  }
  auto stop = [this]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return shutdown_ || DrainDoneLocked(); };
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (stop()) break;
    }
    std::string redirect_to;
    absl::Status refusal;
    const SessionEnd end = RunSession(target, *credentials, &redirect_to, &refusal);
    if (end == SessionEnd::kRefused) {
      log->error("refused worker={} server={}: {}", options_.worker_id, target,
                 std::string(refusal.message()));
      return refusal;
    }
    if (end == SessionEnd::kRedirected && !redirect_to.empty() && redirect_to != target) {
      // A standby named the leader: go there at once (a later failure starts the list again).
      log->info("redirected worker={} from={} to leader={}", options_.worker_id, target,
                redirect_to);
      target = redirect_to;
      failures = 0;
      continue;
    }
    if (end != SessionEnd::kWelcomed) {
      // The leader may have moved (a stopping one hands over to a standby): try the next
      // configured daemon.
      next_server = (next_server + 1) % servers_.size();
      target = servers_[next_server];
    }
    const bool served = end == SessionEnd::kWelcomed || end == SessionEnd::kDaemonStopped;
    failures = served ? 0 : std::min(failures + 1, 30);
    absl::Duration delay = options_.reconnect_min;
    for (int i = 1; i < failures && delay < options_.reconnect_max; ++i) delay *= 2;
    delay = std::min(delay, options_.reconnect_max);
    // Jitter: uniform in [delay/2, delay], never below reconnect_min.
    delay = std::max(options_.reconnect_min,
                     absl::Nanoseconds(absl::Uniform<int64_t>(absl::IntervalClosed, rng,
                                                              absl::ToInt64Nanoseconds(delay / 2),
                                                              absl::ToInt64Nanoseconds(delay))));
    absl::MutexLock l(&mu_);
    if (stop()) break;
    log->info("reconnecting worker={} in={}", options_.worker_id, absl::FormatDuration(delay));
    mu_.AwaitWithTimeout(absl::Condition(&stop), delay);
  }
  absl::MutexLock l(&mu_);
  if (results_.empty()) {
    log->info("stopped worker={} reason={}", options_.worker_id,
              shutdown_ ? "shutdown" : "drained");
  } else {
    log->warn("stopped worker={} reason={} undelivered_results={}", options_.worker_id,
              shutdown_ ? "shutdown" : "drained", results_.size());
  }
  return absl::OkStatus();
}

Worker::SessionEnd Worker::RunSession(const std::string& target, const Credentials& credentials,
                                      std::string* redirect_to, absl::Status* refusal) {
  std::shared_ptr<spdlog::logger> log = Log();
  auto s = std::make_shared<Session>(target, credentials);

  v1::WorkerMessage hello_message;
  v1::Hello& hello = *hello_message.mutable_hello();
  hello.set_worker_id(options_.worker_id);
  for (const std::string& t : options_.types) hello.add_types(t);
  hello.set_slots(options_.slots);
  hello.set_batching(true);
  for (const auto& [k, v] : options_.labels) (*hello.mutable_labels())[k] = v;
  gpus_->Add(hello.mutable_gpus());
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) return SessionEnd::kFailed;
    session_ = s;
    welcomed_ = false;
    for (const std::string& m : models_resident_) hello.add_models_resident(m);
    AddHeldJobsLocked(hello.mutable_running_jobs());
  }
  std::thread timer(&Worker::SessionTimerLoop, this, s);

  s->Connect();
  bool welcomed = false;
  bool redirected = false;
  bool daemon_stopping = false;
  v1::DaemonMessage message;
  if (!s->Write(hello_message)) {
    s->Cancel();
  } else if (s->Read(&message)) {
    if (message.has_welcome()) {
      welcomed = true;
      HandleWelcome(s, message.welcome());
    } else if (message.has_redirect()) {
      redirected = true;
      *redirect_to = message.redirect().leader_address();
      log->info("standby answered worker={} server={} message={}", options_.worker_id, target,
                message.redirect().message());
    } else {
      log->warn("protocol error worker={} detail=first message is not Welcome (case {})",
                options_.worker_id, static_cast<int>(message.msg_case()));
      s->Cancel();
    }
  }
  if (welcomed) {
    while (s->Read(&message)) {
      switch (message.msg_case()) {
        case v1::DaemonMessage::kAssign:
          HandleAssign(s, message.mutable_assign());
          break;
        case v1::DaemonMessage::kCancel:
          HandleCancel(message.cancel());
          break;
        case v1::DaemonMessage::kResultAck: {
          absl::MutexLock l(&mu_);
          results_.Acknowledge(
              JobKey(message.result_ack().job_id(), message.result_ack().attempt()));
          break;
        }
        case v1::DaemonMessage::kResultAcks: {
          absl::MutexLock l(&mu_);
          for (const v1::ResultAck& ack : message.result_acks().acks()) {
            results_.Acknowledge(JobKey(ack.job_id(), ack.attempt()));
          }
          break;
        }
        case v1::DaemonMessage::kDrain:
          log->info("drain requested by daemon worker={}", options_.worker_id);
          Drain();
          break;
        case v1::DaemonMessage::kStopping:
          // Nothing new comes on this stream; the jobs running finish and report here as usual.
          log->info("daemon stopping worker={} server={} message={}", options_.worker_id, target,
                    message.stopping().message());
          daemon_stopping = true;
          break;
        case v1::DaemonMessage::kWelcome:
          log->warn("protocol error worker={} detail=second Welcome ignored", options_.worker_id);
          break;
        default:
          log->warn("unknown daemon message worker={} case={}", options_.worker_id,
                    static_cast<int>(message.msg_case()));
          break;
      }
    }
  }
  // Drain whatever is left so Finish() may be called.
  while (s->Read(&message)) {
  }
  {
    absl::MutexLock l(&mu_);
    if (session_ == s) session_ = nullptr;
    welcomed_ = false;
  }
  timer.join();
  s->Close();
  grpc::Status status = s->Finish();
  bool quiet;
  {
    absl::MutexLock l(&mu_);
    quiet = shutdown_ || DrainDoneLocked();
  }
  if (quiet || redirected || daemon_stopping) {
    log->info("stream closed worker={}", options_.worker_id);
  } else if (welcomed) {
    log->warn("stream lost worker={} code={} message={}", options_.worker_id,
              static_cast<int>(status.error_code()), status.error_message());
  } else {
    log->warn("connect failed worker={} server={} code={} message={}", options_.worker_id, target,
              static_cast<int>(status.error_code()), status.error_message());
  }
  if (welcomed) return daemon_stopping ? SessionEnd::kDaemonStopped : SessionEnd::kWelcomed;
  if (redirected) return SessionEnd::kRedirected;
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    *refusal =
        absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
    return SessionEnd::kRefused;
  }
  return SessionEnd::kFailed;
}

void Worker::HandleWelcome(const std::shared_ptr<Session>& session, const v1::Welcome& welcome) {
  absl::Duration interval = welcome.has_heartbeat_interval()
                                ? proto_convert::FromProto(welcome.heartbeat_interval())
                                : absl::ZeroDuration();
  if (interval <= absl::ZeroDuration()) interval = options_.default_heartbeat_interval;
  std::set<JobKey> adopted;
  for (const v1::HeldJob& h : welcome.adopted_jobs()) adopted.emplace(h.job_id(), h.attempt());

  std::vector<v1::Result> resend;
  std::vector<JobKey> dropped;
  bool draining;
  session->set_batching(welcome.batching());
  {
    absl::MutexLock l(&mu_);
    heartbeat_interval_ = interval;
    for (auto& [key, job] : running_) {
      if (job->drop_result || adopted.contains(key)) continue;
      job->drop_result = true;
      job->context->Cancel("not re-adopted by the daemon after reconnect");
      dropped.push_back(key);
    }
    if (session_ == session) welcomed_ = true;
    resend = results_.Readopt(adopted, &dropped);
    draining = draining_;
  }
  std::shared_ptr<spdlog::logger> log = Log();
  log->info("connected worker={} session={} heartbeat={} adopted={} resending={}",
            options_.worker_id, welcome.session_id(), absl::FormatDuration(interval),
            adopted.size(), resend.size());
  for (const JobKey& key : dropped) {
    log->warn("cancelled job={} attempt={} reason=not re-adopted", key.first, key.second);
  }
  for (v1::Result& result : resend) {
    session->SendResult(std::move(result), /*others_running=*/false);
  }
  if (draining) {
    v1::WorkerMessage m;
    m.mutable_draining();
    session->Write(m);
  }
}

void Worker::AddHeldJobsLocked(google::protobuf::RepeatedPtrField<v1::HeldJob>* held) const {
  for (const auto& [key, job] : running_) {
    if (job->drop_result) continue;
    v1::HeldJob* h = held->Add();
    h->set_job_id(key.first);
    h->set_attempt(key.second);
  }
  // Finished jobs whose results were never acknowledged are still held: the daemon must keep
  // their attempts current until the results arrive, or it would run them again, and it counts
  // a job its worker stops reporting as lost.
  for (const auto& [key, result] : results_) {
    if (running_.contains(key)) continue;
    v1::HeldJob* h = held->Add();
    h->set_job_id(key.first);
    h->set_attempt(key.second);
  }
}

v1::WorkerMessage Worker::HeartbeatLocked() const {
  v1::WorkerMessage m;
  v1::Heartbeat* hb = m.mutable_heartbeat();
  AddHeldJobsLocked(hb->mutable_running_jobs());
  for (const std::string& model : models_resident_) hb->add_models_resident(model);
  return m;
}

void Worker::SessionTimerLoop(std::shared_ptr<Session> session) {
  std::shared_ptr<spdlog::logger> log = Log();
  {
    absl::MutexLock l(&mu_);
    auto settled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return welcomed_ || session_ != session || shutdown_;
    };
    mu_.AwaitWithTimeout(absl::Condition(&settled), options_.welcome_timeout);
    if (session_ != session || shutdown_) {
      if (shutdown_) session->Cancel();
      return;
    }
    if (!welcomed_) {
      log->warn("no Welcome within {} worker={}", absl::FormatDuration(options_.welcome_timeout),
                options_.worker_id);
      session->Cancel();
      return;
    }
  }
  while (true) {
    v1::WorkerMessage heartbeat;
    bool drained = false;
    {
      absl::MutexLock l(&mu_);
      auto stop = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return session_ != session || shutdown_ || DrainDoneLocked();
      };
      mu_.AwaitWithTimeout(absl::Condition(&stop), heartbeat_interval_);
      if (session_ != session || shutdown_) return;
      drained = DrainDoneLocked();
      if (!drained) heartbeat = HeartbeatLocked();
    }
    if (drained) {
      log->info("drained worker={}: closing the stream", options_.worker_id);
      // Drain() announces itself too, but may lose the race with this thread; a repeat is harmless.
      v1::WorkerMessage draining;
      draining.mutable_draining();
      session->Write(draining);
      session->WritesDone();
      absl::MutexLock l(&mu_);
      auto gone = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return session_ != session; };
      if (!mu_.AwaitWithTimeout(absl::Condition(&gone), absl::Seconds(2))) {
        session->Cancel();
      }
      return;
    }
    gpus_->Add(heartbeat.mutable_heartbeat()->mutable_gpus());
    worker_internal::AddMemoryReadings(options_.memory_probe, heartbeat.mutable_heartbeat());
    session->Write(heartbeat);
  }
}

}  // namespace dispatchd::client
