#include "server/rpc/job_service.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <memory>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "lib/sched/admission.h"
#include "lib/sched/admission_gate.h"
#include "lib/sched/scheduler.h"
#include "server/convert/job_proto.h"
#include "server/util/grpc_status.h"
#include "server/util/log.h"

namespace dispatchd::rpc {
namespace {

using job::JobState;

// Time-ordered, unguessable ids: 48 bits of milliseconds, then 64 random bits.
std::string NewJobId(absl::Time now) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("j_%012x%016x", absl::ToUnixMillis(now) & 0xffffffffffffULL, rng());
}

}  // namespace

std::string PeerIdentity(const std::string& peer) {
  // "ipv4:1.2.3.4:5678", "ipv6:[::1]:5678", "unix:/path".
  if (peer.rfind("unix:", 0) == 0) return peer;
  size_t colon = peer.rfind(':');
  size_t first = peer.find(':');
  if (colon == std::string::npos || colon == first) return peer;
  return peer.substr(0, colon);
}

absl::Status CheckJobId(const std::string& id, absl::string_view field) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  if (id.size() > 64) {
    return absl::InvalidArgumentError(absl::StrCat(field, ": at most 64 bytes, got ", id.size()));
  }
  return absl::OkStatus();
}

std::string RetryAfterMillis(absl::Duration retry_after) {
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(retry_after, absl::Milliseconds(1)));
  return absl::StrCat(std::max<int64_t>(0, ms));
}

absl::StatusOr<store::InsertOutcome> JobServiceImpl::Enqueue(const v1::JobSpec& wire,
                                                             const std::string& peer,
                                                             absl::Duration* retry_after) {
  absl::StatusOr<job::JobSpec> spec = convert::FromProto(wire);
  if (!spec.ok()) return spec.status();
  if (spec->fairness_key.empty()) spec->fairness_key = PeerIdentity(peer);
  absl::StatusOr<job::JobSpec> resolved = sched::ResolveSpec(config_, *std::move(spec));
  if (!resolved.ok()) return resolved.status();
  // Reserve room before anything is written. From here on the reservation is settled exactly
  // once: Release below when nothing new was written, or Counted by the dispatcher when it takes
  // in the job handed to it by JobQueued.
  sched::AdmissionGate& gate = leadership_.admission();
  const std::string type = resolved->type;
  if (absl::Status admitted = gate.TryAdmit(type, retry_after); !admitted.ok()) {
    server::Log("grpc")->debug("refused type={} key={}: {}", type, resolved->fairness_key,
                               admitted.message());
    return admitted;
  }
  const absl::Time now = clock_.TimeNow();
  job::Job job{.id = NewJobId(now), .spec = *std::move(resolved), .created_at = now};
  absl::StatusOr<store::InsertOutcome> outcome = store_.Insert(job);
  if (!outcome.ok() || outcome->deduplicated) {
    gate.Release(type);
    return outcome;
  }
  server::Log("grpc")->debug("queued job={} type={} key={}", job.id, job.spec.type,
                             job.spec.fairness_key);
  if (std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher()) {
    d->JobQueued(std::move(job));
  } else {
    // A standby: the leader learns of the row from the database (now, or at its next recount).
    gate.Counted(type);
    if (absl::Status told = store_.NotifyChanged(job.id); !told.ok()) {
      server::Log("grpc")->warn("could not notify the leader of job={}: {}", job.id,
                                told.message());
    }
  }
  return outcome;
}

grpc::ServerUnaryReactor* JobServiceImpl::Submit(grpc::CallbackServerContext* ctx,
                                                 const v1::SubmitRequest* req,
                                                 v1::SubmitResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor_.Schedule([this, ctx, req, resp, reactor] {
    absl::Duration retry_after = absl::ZeroDuration();
    absl::StatusOr<store::InsertOutcome> outcome = Enqueue(req->spec(), ctx->peer(), &retry_after);
    if (outcome.ok()) {
      resp->set_job_id(outcome->job_id);
      resp->set_deduplicated(outcome->deduplicated);
    } else if (absl::IsResourceExhausted(outcome.status())) {
      ctx->AddTrailingMetadata(kRetryAfterTrailer, RetryAfterMillis(retry_after));
    }
    reactor->Finish(server::ToGrpcStatus(outcome.status()));
  });
  return reactor;
}

namespace {

// RunSync: queue the job, then finish when it reaches a terminal state, re-reading the row.
// Work runs on the executor; OnDone waits for tasks still holding `this` before deleting it.
class RunSyncReactor final : public grpc::ServerUnaryReactor {
 public:
  RunSyncReactor(JobServiceImpl& service, store::JobStore& store, dispatch::JobEvents& events,
                 server::Executor& executor, grpc::CallbackServerContext* ctx,
                 const v1::RunSyncRequest* req, v1::RunSyncResponse* resp)
      : store_(store), events_(events), executor_(executor), ctx_(ctx), resp_(resp) {
    Run([this, &service, req, peer = ctx->peer()] { Begin(service, *req, peer); });
  }

  void OnCancel() override {
    absl::MutexLock l(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled; the job goes on"));
  }

  void OnDone() override {
    if (token_ != 0) events_.Unsubscribe(token_);
    {
      absl::MutexLock l(&mu_);
      done_ = true;
      mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
    }
    delete this;
  }

 private:
  void Run(std::function<void()> task) {
    {
      absl::MutexLock l(&mu_);
      if (done_) return;
      ++in_flight_;
    }
    executor_.Schedule([this, task = std::move(task)] {
      task();
      absl::MutexLock l(&mu_);
      --in_flight_;
    });
  }

  // Runs once, from the constructor (before OnDone can run, so it always runs): Enqueue settles
  // the admission reservation whatever happens to the call afterwards.
  void Begin(JobServiceImpl& service, const v1::RunSyncRequest& req, const std::string& peer) {
    absl::Duration retry_after = absl::ZeroDuration();
    absl::StatusOr<store::InsertOutcome> outcome = service.Enqueue(req.spec(), peer, &retry_after);
    if (!outcome.ok()) {
      absl::MutexLock l(&mu_);
      // Trailers must be added before Finish; OnCancel may have finished the call already.
      if (!finished_ && absl::IsResourceExhausted(outcome.status())) {
        ctx_->AddTrailingMetadata(kRetryAfterTrailer, RetryAfterMillis(retry_after));
      }
      FinishLocked(server::ToGrpcStatus(outcome.status()));
      return;
    }
    {
      absl::MutexLock l(&mu_);
      job_id_ = outcome->job_id;
    }
    token_ = events_.Subscribe(outcome->job_id, [this](JobState state) {
      if (job::IsTerminal(state)) Run([this] { CompleteIfDone(); });
    });
    // The job may have ended before the subscription (a fast worker, or a deduplicated job).
    CompleteIfDone();
  }

  void CompleteIfDone() {
    std::string id;
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      id = job_id_;
    }
    absl::StatusOr<job::Job> job = store_.Get(id);
    absl::MutexLock l(&mu_);
    if (!job.ok()) {
      FinishLocked(server::ToGrpcStatus(job.status()));
      return;
    }
    if (!job::IsTerminal(job->state) || finished_) return;
    convert::ToProto(*job, resp_->mutable_job());
    FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  store::JobStore& store_;
  dispatch::JobEvents& events_;
  server::Executor& executor_;
  grpc::CallbackServerContext* const ctx_;
  v1::RunSyncResponse* resp_;
  std::atomic<uint64_t> token_ = 0;

  absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::RunSync(grpc::CallbackServerContext* ctx,
                                                  const v1::RunSyncRequest* req,
                                                  v1::RunSyncResponse* resp) {
  return new RunSyncReactor(*this, store_, events_, executor_, ctx, req, resp);
}

grpc::ServerUnaryReactor* JobServiceImpl::Status(grpc::CallbackServerContext* ctx,
                                                 const v1::StatusRequest* req,
                                                 v1::StatusResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor_.Schedule([this, req, resp, reactor] {
    absl::Status status = CheckJobId(req->job_id(), "job_id");
    if (status.ok()) {
      absl::StatusOr<job::Job> job = store_.Get(req->job_id());
      if (job.ok()) {
        convert::ToProto(*job, resp->mutable_job());
        if (job->state == JobState::kQueued) AddWaitInfo(resp->mutable_job());
      }
      status = job.status();
    }
    reactor->Finish(server::ToGrpcStatus(status));
  });
  return reactor;
}

void JobServiceImpl::AddWaitInfo(v1::Job* job) {
  std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
  if (d == nullptr) return;  // only the leader's scheduler knows
  std::optional<sched::WaitInfo> info = d->WhyWaiting(job->id());
  if (!info.has_value()) return;  // the row is QUEUED but the daemon does not hold it (a race)
  // kNone: nothing holds it back; it goes at the dispatcher's next turn, behind what goes first.
  const sched::WaitReason reason =
      info->reason == sched::WaitReason::kNone ? sched::WaitReason::kInLine : info->reason;
  job->set_wait_reason(std::string(sched::ToString(reason)));
  job->set_queue_position(info->position);
  job->set_keys_ahead(info->keys_ahead);
}

grpc::ServerUnaryReactor* JobServiceImpl::Cancel(grpc::CallbackServerContext* ctx,
                                                 const v1::CancelRequest* req,
                                                 v1::CancelResponse* resp) {
  grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
  executor_.Schedule([this, req, resp, reactor] {
    absl::Status status = CheckJobId(req->job_id(), "job_id");
    if (status.ok()) {
      absl::StatusOr<store::CancelOutcome> outcome =
          store_.Cancel(req->job_id(), "cancelled by client");
      if (outcome.ok()) {
        dispatch::LogFinished(outcome->job.id, JobState::kCancelled, outcome->job.attempt);
        if (std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher()) {
          d->JobCancelled(outcome->job.id, outcome->previous);
        } else {
          if (absl::Status told = store_.NotifyChanged(outcome->job.id); !told.ok()) {
            server::Log("grpc")->warn("could not notify the leader of job={}: {}", outcome->job.id,
                                      told.message());
          }
          events_.Publish(outcome->job.id, JobState::kCancelled);
        }
        convert::ToProto(outcome->job, resp->mutable_job());
      }
      status = outcome.status();
    }
    reactor->Finish(server::ToGrpcStatus(status));
  });
  return reactor;
}

namespace {

// Watch: the job's current state, then one event per committed change, ending after a terminal
// state. Each event re-reads the row, so a burst of changes may coalesce into fewer events, but
// the last event is always the terminal record.
class WatchReactor final : public grpc::ServerWriteReactor<v1::WatchEvent> {
 public:
  WatchReactor(store::JobStore& store, dispatch::JobEvents& events, server::Executor& executor,
               std::string job_id)
      : store_(store), events_(events), executor_(executor), job_id_(std::move(job_id)) {
    if (absl::Status s = CheckJobId(job_id_, "job_id"); !s.ok()) {
      Finish(server::ToGrpcStatus(s));
      return;
    }
    token_ = events_.Subscribe(job_id_, [this](JobState) { Refresh(); });
    Refresh();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock l(&mu_);
    writing_ = false;
    if (!ok) {
      FinishLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE, "watch stream broke"));
      return;
    }
    WriteNextLocked();
  }

  void OnCancel() override {
    absl::MutexLock l(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  }

  void OnDone() override {
    if (token_ != 0) events_.Unsubscribe(token_);
    // Refreshes scheduled on the executor may still hold `this`; wait for them.
    {
      absl::MutexLock l(&mu_);
      finished_ = true;
      mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
    }
    delete this;
  }

 private:
  void Refresh() {
    {
      absl::MutexLock l(&mu_);
      if (finished_) return;
      ++in_flight_;
    }
    executor_.Schedule([this] {
      absl::StatusOr<job::Job> job = store_.Get(job_id_);
      absl::MutexLock l(&mu_);
      --in_flight_;
      if (finished_) return;
      if (!job.ok()) {
        FinishLocked(server::ToGrpcStatus(job.status()));
        return;
      }
      // Skip repeats of a state already sent (several events may read the same row).
      if (last_state_ == job->state && last_attempt_ == job->attempt) return;
      last_state_ = job->state;
      last_attempt_ = job->attempt;
      v1::WatchEvent event;
      convert::ToProto(*job, event.mutable_job());
      queue_.push_back(std::move(event));
      if (job::IsTerminal(job->state)) terminal_queued_ = true;
      WriteNextLocked();
    });
  }

  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (writing_ || finished_) return;
    if (!queue_.empty()) {
      current_ = std::move(queue_.front());
      queue_.pop_front();
      writing_ = true;
      StartWrite(&current_);
      return;
    }
    if (terminal_queued_) FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    Finish(status);
  }

  store::JobStore& store_;
  dispatch::JobEvents& events_;
  server::Executor& executor_;
  const std::string job_id_;
  uint64_t token_ = 0;

  absl::Mutex mu_;
  std::deque<v1::WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
  v1::WatchEvent current_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool terminal_queued_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<JobState> last_state_ ABSL_GUARDED_BY(mu_);
  int32_t last_attempt_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace

grpc::ServerWriteReactor<v1::WatchEvent>* JobServiceImpl::Watch(grpc::CallbackServerContext*,
                                                               const v1::WatchRequest* req) {
  return new WatchReactor(store_, events_, executor_, req->job_id());
}

}  // namespace dispatchd::rpc
