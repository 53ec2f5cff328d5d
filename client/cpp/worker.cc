#include "client/cpp/worker.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <exception>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include <grpcpp/grpcpp.h>

#include "client/cpp/worker_log.h"
#include "client/cpp/worker_memory_probe.h"
#include "proto/convert/time_proto.h"

namespace dispatchd::client {
namespace {

using worker_internal::Log;

const char* ReasonName(v1::Reject::Reason r) {
  switch (r) {
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

// ---------------------------------------------------------------------------------------------
// JobContext

JobContext::JobContext(v1::Assignment assignment)
    : assignment_(std::move(assignment)),
      deadline_(assignment_.has_deadline() ? proto_convert::FromProto(assignment_.deadline())
                                           : absl::InfiniteFuture()) {}

bool JobContext::cancelled() const {
  absl::MutexLock l(&mu_);
  return cancelled_;
}

bool JobContext::WaitForCancellation(absl::Duration timeout) const {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&cancelled_), timeout);
  return cancelled_;
}

std::string JobContext::cancel_reason() const {
  absl::MutexLock l(&mu_);
  return cancel_reason_;
}

void JobContext::Cancel(absl::string_view reason) {
  absl::MutexLock l(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  cancel_reason_ = std::string(reason);
}

// ---------------------------------------------------------------------------------------------
// Worker internals

absl::StatusOr<std::unique_ptr<Worker>> Worker::Create(WorkerOptions options, Handler handler) {
  if (options.server.empty()) return absl::InvalidArgumentError("server: empty");
  for (absl::string_view address : absl::StrSplit(options.server, ',')) {
    if (absl::StripAsciiWhitespace(address).empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("server: empty address in \"", options.server, "\""));
    }
  }
  if (options.worker_id.empty()) return absl::InvalidArgumentError("worker_id: empty");
  if (options.types.empty()) return absl::InvalidArgumentError("types: at least one is required");
  for (const std::string& t : options.types) {
    if (t.empty()) return absl::InvalidArgumentError("types: empty type name");
  }
  if (options.slots < 1) {
    return absl::InvalidArgumentError(absl::StrCat("slots: must be >= 1, got ", options.slots));
  }
  if (options.max_concurrent < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_concurrent: must be >= 0, got ", options.max_concurrent));
  }
  if (options.reconnect_min <= absl::ZeroDuration() ||
      options.reconnect_max < options.reconnect_min) {
    return absl::InvalidArgumentError("reconnect_min/reconnect_max: need 0 < min <= max");
  }
  if (options.welcome_timeout <= absl::ZeroDuration() ||
      options.default_heartbeat_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("welcome_timeout/default_heartbeat_interval: must be > 0");
  }
  if (!handler) return absl::InvalidArgumentError("handler: null");
  return std::unique_ptr<Worker>(new Worker(std::move(options), std::move(handler)));
}

Worker::Worker(WorkerOptions options, Handler handler)
    : options_(std::move(options)),
      handler_(std::move(handler)),
      max_concurrent_(options_.max_concurrent > 0 ? options_.max_concurrent : options_.slots),
      types_(options_.types.begin(), options_.types.end()),
      servers_([this] {
        std::vector<std::string> out;
        for (absl::string_view a : absl::StrSplit(options_.server, ',')) {
          out.emplace_back(absl::StripAsciiWhitespace(a));
        }
        return out;
      }()),
      models_resident_(options_.models_resident),
      heartbeat_interval_(options_.default_heartbeat_interval) {}

Worker::~Worker() {
  Shutdown();
  {
    absl::MutexLock l(&mu_);
    mu_.Await(absl::Condition(
        +[](std::map<JobKey, std::shared_ptr<RunningJob>>* r) { return r->empty(); }, &running_));
  }
  // handlers_, the first member destroyed, then joins the handler threads.
}

int Worker::RunningJobsForTest() const {
  absl::MutexLock l(&mu_);
  return static_cast<int>(running_.size());
}

void Worker::SetModelsResident(std::vector<std::string> models) {
  absl::MutexLock l(&mu_);
  models_resident_ = std::move(models);
}

bool Worker::DrainDoneLocked() const {
  return draining_ && running_.empty() &&
         (results_.empty() || absl::Now() >= jobs_done_at_ + options_.drain_result_timeout);
}

absl::Status Worker::Run() {
  {
    absl::MutexLock l(&mu_);
    if (run_called_) return absl::FailedPreconditionError("Run: already called");
    run_called_ = true;
  }
  std::shared_ptr<spdlog::logger> log = Log();
  log->info("starting worker={} server={} types={} slots={} max_concurrent={}",
            options_.worker_id, options_.server, absl::StrJoin(options_.types, ","),
            options_.slots, max_concurrent_);
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
      // The leader may have moved: try the next configured daemon.
      next_server = (next_server + 1) % servers_.size();
      target = servers_[next_server];
    }
    failures = end == SessionEnd::kWelcomed ? 0 : std::min(failures + 1, 30);
    absl::Duration delay = options_.reconnect_min;
    for (int i = 1; i < failures && delay < options_.reconnect_max; ++i) delay *= 2;
    delay = std::min(delay, options_.reconnect_max);
    // Jitter: uniform in [delay/2, delay], never below reconnect_min.
    delay = std::max(options_.reconnect_min,
                     absl::Nanoseconds(absl::Uniform<int64_t>(
                         absl::IntervalClosed, rng, absl::ToInt64Nanoseconds(delay / 2),
                         absl::ToInt64Nanoseconds(delay))));
    absl::MutexLock l(&mu_);
    if (stop()) break;
    log->info("reconnecting worker={} in={}", options_.worker_id, absl::FormatDuration(delay));
    mu_.AwaitWithTimeout(absl::Condition(&stop), delay);
  }
  absl::MutexLock l(&mu_);
  if (results_.empty()) {
    log->info("stopped worker={} reason={}", options_.worker_id, shutdown_ ? "shutdown" : "drained");
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
  for (const WorkerOptions::Gpu& g : options_.gpus) {
    v1::Gpu* gpu = hello.add_gpus();
    gpu->set_id(g.id);
    gpu->set_memory_total_bytes(g.memory_total_bytes);
  }
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
          HandleAssign(s, message.assign());
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
  if (quiet || redirected) {
    log->info("stream closed worker={}", options_.worker_id);
  } else if (welcomed) {
    log->warn("stream lost worker={} code={} message={}", options_.worker_id,
              static_cast<int>(status.error_code()), status.error_message());
  } else {
    log->warn("connect failed worker={} server={} code={} message={}", options_.worker_id, target,
              static_cast<int>(status.error_code()), status.error_message());
  }
  if (welcomed) return SessionEnd::kWelcomed;
  if (redirected) return SessionEnd::kRedirected;
  if (status.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
      status.error_code() == grpc::StatusCode::PERMISSION_DENIED) {
    *refusal = absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                            status.error_message());
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
  for (v1::Result& result : resend) session->SendResult(std::move(result));
  if (draining) {
    v1::WorkerMessage m;
    m.mutable_draining();
    session->Write(m);
  }
}

void Worker::HandleAssign(const std::shared_ptr<Session>& session, const v1::Assign& assign) {
  std::shared_ptr<spdlog::logger> log = Log();
  // What to answer each assignment, decided one by one against the jobs running.
  enum class Action { kAcceptNew, kAcceptAgain, kReject };
  struct Answer {
    const v1::Assignment* assignment;
    Action action = Action::kReject;
    v1::Reject::Reason reason = v1::Reject::REASON_UNSPECIFIED;
    std::string detail;
    std::optional<v1::Result> resend;         // its result, if it already finished
    std::shared_ptr<RunningJob> job;          // kAcceptNew
    int running = 0;                          // jobs running before it
    bool written = false;
  };
  std::vector<Answer> answers;
  answers.reserve(assign.assignments_size());
  {
    absl::MutexLock l(&mu_);
    for (const v1::Assignment& a : assign.assignments()) {
      Answer& ans = answers.emplace_back(Answer{.assignment = &a});
      JobKey key(a.job_id(), a.attempt());
      ans.running = static_cast<int>(running_.size());
      if (running_.contains(key)) {
        ans.action = Action::kAcceptAgain;
      } else if (const v1::Result* kept = results_.Find(key); kept != nullptr) {
        ans.action = Action::kAcceptAgain;
        ans.resend = *kept;
      } else if (shutdown_ || draining_) {
        ans.reason = v1::Reject::REASON_DRAINING;
        ans.detail = "worker is draining";
      } else if (!types_.contains(a.type())) {
        ans.reason = v1::Reject::REASON_UNSUPPORTED;
        ans.detail = absl::StrCat("worker does not serve type \"", a.type(), "\"");
      } else if (ans.running >= max_concurrent_) {
        ans.reason = v1::Reject::REASON_RESOURCE_EXHAUSTED;
        ans.detail = absl::StrCat(ans.running, " of ", max_concurrent_, " jobs running");
      } else {
        ans.action = Action::kAcceptNew;
        ans.job = std::make_shared<RunningJob>();
        ans.job->key = key;
        ans.job->context = std::make_shared<JobContext>(a);
        running_.emplace(key, ans.job);
      }
    }
  }

  // The answers go in one Batch where the daemon reads them, else one message each. A job
  // starts only once its Accept is written.
  auto fill = [](const Answer& ans, v1::Accept* accept, v1::Reject* reject) {
    const v1::Assignment& a = *ans.assignment;
    if (ans.action == Action::kReject) {
      reject->set_job_id(a.job_id());
      reject->set_attempt(a.attempt());
      reject->set_reason(ans.reason);
      reject->set_message(ans.detail);
    } else {
      accept->set_job_id(a.job_id());
      accept->set_attempt(a.attempt());
    }
  };
  if (session->batching() && answers.size() > 1) {
    v1::WorkerMessage out;
    v1::Batch* batch = out.mutable_batch();
    for (const Answer& ans : answers) {
      if (ans.action == Action::kReject) {
        fill(ans, nullptr, batch->add_rejects());
      } else {
        fill(ans, batch->add_accepts(), nullptr);
      }
    }
    const bool written = session->Write(out);
    for (Answer& ans : answers) ans.written = written;
  } else {
    for (Answer& ans : answers) {
      v1::WorkerMessage out;
      if (ans.action == Action::kReject) {
        fill(ans, nullptr, out.mutable_reject());
      } else {
        fill(ans, out.mutable_accept(), nullptr);
      }
      ans.written = session->Write(out);
    }
  }

  for (Answer& ans : answers) {
    const v1::Assignment& a = *ans.assignment;
    switch (ans.action) {
      case Action::kReject:
        log->info("rejected job={} attempt={} reason={} detail={}", a.job_id(), a.attempt(),
                  ReasonName(ans.reason), ans.detail);
        break;
      case Action::kAcceptAgain:
        log->info("accepted again job={} attempt={} (already held)", a.job_id(), a.attempt());
        if (ans.resend.has_value() && ans.written) session->SendResult(*ans.resend);
        break;
      case Action::kAcceptNew: {
        const JobKey& key = ans.job->key;
        absl::MutexLock l(&mu_);
        if (!ans.written) {
          // The daemon never saw the Accept: it will offer the job again.
          running_.erase(key);
          if (draining_ && running_.empty()) jobs_done_at_ = absl::Now();
          log->warn("accept not delivered job={} attempt={}", a.job_id(), a.attempt());
          break;
        }
        if (!handlers_.Start([this, job = ans.job] { RunJob(job); })) {
          running_.erase(key);
          v1::Result result;
          result.set_job_id(key.first);
          result.set_attempt(key.second);
          result.mutable_failure()->set_message("worker could not start a handler thread");
          result.mutable_failure()->set_retryable(true);
          results_.Keep(key, std::move(result));
          log->error("thread start failed job={} attempt={}", key.first, key.second);
          break;
        }
        log->info("accepted job={} attempt={} type={} running={}", a.job_id(), a.attempt(),
                  a.type(), ans.running + 1);
        break;
      }
    }
  }
}

void Worker::HandleCancel(const v1::CancelJob& cancel) {
  std::vector<JobKey> hit;
  {
    absl::MutexLock l(&mu_);
    for (auto it = running_.lower_bound(JobKey(cancel.job_id(), INT32_MIN));
         it != running_.end() && it->first.first == cancel.job_id(); ++it) {
      if (cancel.attempt() != 0 && it->first.second != cancel.attempt()) continue;
      it->second->context->Cancel(cancel.reason().empty() ? "cancelled by the daemon"
                                                          : cancel.reason());
      hit.push_back(it->first);
    }
  }
  if (hit.empty()) {
    Log()->info("cancel for unknown job={} attempt={} (already finished?)", cancel.job_id(),
                cancel.attempt());
  }
  for (const JobKey& key : hit) {
    Log()->info("cancelled job={} attempt={} reason={}", key.first, key.second, cancel.reason());
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
  for (const WorkerOptions::Gpu& g : options_.gpus) {
    v1::Gpu* gpu = hb->add_gpus();
    gpu->set_id(g.id);
    gpu->set_memory_total_bytes(g.memory_total_bytes);
  }
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
    worker_internal::AddMemoryReadings(options_.memory_probe, heartbeat.mutable_heartbeat());
    session->Write(heartbeat);
  }
}

void Worker::RunJob(std::shared_ptr<RunningJob> job) {
  std::shared_ptr<spdlog::logger> log = Log();
  const JobKey key = job->key;
  absl::Time start = absl::Now();
  JobOutcome outcome;
  try {
    outcome = handler_(*job->context);
  } catch (const std::exception& e) {
    outcome = JobOutcome::Failure(absl::StrCat("handler threw: ", e.what()), false);
  } catch (...) {
    outcome = JobOutcome::Failure("handler threw a non-exception", false);
  }
  absl::Duration run_time = absl::Now() - start;
  if (outcome.ok && static_cast<int64_t>(outcome.output.size()) > options_.max_output_bytes) {
    outcome = JobOutcome::Failure(absl::StrCat("output too large: ", outcome.output.size(),
                                               " bytes, limit ", options_.max_output_bytes),
                                  false);
  }

  v1::Result result;
  result.set_job_id(key.first);
  result.set_attempt(key.second);
  if (outcome.ok) {
    result.set_output(std::move(outcome.output));
  } else {
    result.mutable_failure()->set_message(outcome.message);
    result.mutable_failure()->set_retryable(outcome.retryable);
  }
  *result.mutable_run_time() = proto_convert::ToProto(run_time);

  std::shared_ptr<Session> session;
  bool dropped;
  {
    absl::MutexLock l(&mu_);
    running_.erase(key);
    dropped = job->drop_result;
    if (!dropped) {
      results_.Keep(key, result);
      if (welcomed_) session = session_;
    }
    if (draining_ && running_.empty()) jobs_done_at_ = absl::Now();
  }
  if (dropped) {
    log->info("finished job={} attempt={} ok={} run_time={} (result dropped: not re-adopted)",
              key.first, key.second, outcome.ok, absl::FormatDuration(run_time));
    return;
  }
  log->info("finished job={} attempt={} ok={} run_time={}{}{}", key.first, key.second, outcome.ok,
            absl::FormatDuration(run_time), outcome.ok ? "" : " error=", outcome.message);
  if (session != nullptr) session->SendResult(std::move(result));
}

void Worker::Drain() {
  std::shared_ptr<Session> session;
  int running;
  {
    absl::MutexLock l(&mu_);
    if (draining_ || shutdown_) return;
    draining_ = true;
    running = static_cast<int>(running_.size());
    if (running_.empty()) jobs_done_at_ = absl::Now();
    if (welcomed_) session = session_;
    Log()->info("draining worker={} running={}", options_.worker_id, running);
  }
  if (session != nullptr) {
    v1::WorkerMessage m;
    m.mutable_draining();
    session->Write(m);
  }
}

void Worker::Shutdown() {
  std::shared_ptr<Session> session;
  {
    absl::MutexLock l(&mu_);
    if (shutdown_) return;
    shutdown_ = true;
    for (auto& [key, job] : running_) job->context->Cancel("worker shutting down");
    session = session_;
  }
  Log()->info("shutting down worker={}", options_.worker_id);
  if (session != nullptr) session->Cancel();
}

}  // namespace dispatchd::client
