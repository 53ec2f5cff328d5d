// The worker's lifecycle: options checked, Drain() and Shutdown(), and the JobContext handlers
// see. Run() and the sessions it opens are in worker_session.cc; the answers to assignments and
// the jobs' runs in worker_handler_pool.cc.

#include "client/cpp/worker.h"

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

#include "client/cpp/worker_log.h"
#include "client/cpp/worker_memory_probe.h"
#include "proto/convert/time_proto.h"

namespace dispatchd::client {
namespace {

using worker_internal::Log;

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
// Worker

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
      gpus_(worker_internal::GpuSource::Create(options_)),
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
