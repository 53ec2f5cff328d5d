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

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "lib/sched/admission.h"
#include "lib/sched/admission_gate.h"
#include "lib/sched/scheduler.h"
#include "server/convert/job_proto.h"
#include "server/metrics/daemon_metrics.h"
#include "server/rpc/raw_call.h"
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

absl::Status CheckJobId(const std::string& id, absl::string_view field, int max_bytes) {
  if (id.empty()) return absl::InvalidArgumentError(absl::StrCat(field, ": required"));
  if (id.size() > static_cast<size_t>(max_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        field, ": at most ", max_bytes, " bytes (limits.max_id_bytes), got ", id.size()));
  }
  return absl::OkStatus();
}

absl::StatusOr<job::Job> GetAs(store::JobStore& store, const auth::Principal& caller,
                               const std::string& id) {
  absl::StatusOr<job::Job> job = store.Get(id);
  if (job.ok() && !auth::MaySee(caller, job->owner)) {
    return absl::NotFoundError(absl::StrCat("job ", id, " not found"));
  }
  return job;
}

std::string RetryAfterMillis(absl::Duration retry_after) {
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(retry_after, absl::Milliseconds(1)));
  return absl::StrCat(std::max<int64_t>(0, ms));
}

absl::StatusOr<std::vector<job::Job>> JobServiceImpl::Admit(
    absl::Span<const v1::JobSpec* const> specs, const auth::Principal& caller,
    const std::string& peer, absl::string_view field_prefix, absl::Duration* retry_after) {
  std::vector<job::Job> jobs;
  jobs.reserve(specs.size());
  const absl::Time now = clock_.TimeNow();
  const std::shared_ptr<const config::Config> config = config_.Get();
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string prefix =
        field_prefix.empty() ? "" : absl::StrCat(field_prefix, "[", i, "].");
    absl::StatusOr<job::JobSpec> spec = convert::FromProto(*specs[i]);
    if (spec.ok()) {
      spec->fairness_key = auth::FairnessKeyFor(caller, spec->fairness_key);
      if (spec->fairness_key.empty()) spec->fairness_key = PeerIdentity(peer);
      spec = sched::ResolveSpec(*config, *std::move(spec));
    }
    if (!spec.ok()) {
      metrics::Metrics().refused.With({specs[i]->type(), "invalid"}).Inc();
      // A lone spec's fields are named `spec.type`; a batch's `specs[3].type`.
      absl::string_view message = spec.status().message();
      if (!prefix.empty()) absl::ConsumePrefix(&message, "spec.");
      return absl::Status(spec.status().code(), absl::StrCat(prefix, message));
    }
    jobs.push_back(job::Job{
        .id = NewJobId(now), .spec = *std::move(spec), .owner = caller.name, .created_at = now});
  }
  if (absl::Status s = limits_.TakeSubmits(caller.name, static_cast<int64_t>(jobs.size()),
                                           config->limits.submit, now, retry_after);
      !s.ok()) {
    metrics::Metrics()
        .refused.With({jobs[0].spec.type, "submit_rate"})
        .Inc(static_cast<double>(jobs.size()));
    return s;
  }
  // Reserve room for every job before anything is written; all or none. From here on each
  // reservation is settled exactly once, by Settle.
  sched::AdmissionGate& gate = leadership_.admission();
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (absl::Status admitted = gate.TryAdmit(jobs[i].spec.type, retry_after); !admitted.ok()) {
      // The gate's message starts with the limit that refused: max_active or max_queue_depth.
      const absl::string_view message = admitted.message();
      metrics::Metrics()
          .refused.With({jobs[i].spec.type, std::string(message.substr(0, message.find(':')))})
          .Inc(static_cast<double>(jobs.size()));
      server::Log("grpc")->debug("refused type={} key={}: {}", jobs[i].spec.type,
                                 jobs[i].spec.fairness_key, admitted.message());
      for (size_t j = 0; j < i; ++j) gate.Release(jobs[j].spec.type);
      return admitted;
    }
  }
  // One registry lookup per type in the call, not per job (a batch holds up to 10,000).
  absl::flat_hash_map<std::string, int64_t> admitted;
  for (const job::Job& job : jobs) ++admitted[job.spec.type];
  for (const auto& [type, n] : admitted) {
    metrics::Metrics().admitted.With({type}).Inc(static_cast<double>(n));
  }
  return jobs;
}

void JobServiceImpl::Enqueue(std::vector<job::Job> jobs, EnqueueDone done) {
  // A standby tells the leader of its rows in the insert's own statement; a leader hands them to
  // its dispatcher below, once they are committed.
  const bool notify_leader = leadership_.dispatcher() == nullptr;
  inserter_.Insert(
      std::move(jobs), notify_leader,
      [this, notify_leader, done = std::move(done)](
          std::vector<job::Job> jobs,
          absl::StatusOr<std::vector<store::InsertOutcome>> outcomes) mutable {
        Settle(jobs, outcomes, notify_leader);
        std::move(done)(std::move(outcomes));
      });
}

void JobServiceImpl::Settle(std::vector<job::Job>& jobs,
                            const absl::StatusOr<std::vector<store::InsertOutcome>>& outcomes,
                            bool notified) {
  sched::AdmissionGate& gate = leadership_.admission();
  std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
  for (size_t i = 0; i < jobs.size(); ++i) {
    job::Job& job = jobs[i];
    if (!outcomes.ok() || (*outcomes)[i].deduplicated) {
      gate.Release(job.spec.type);
      continue;
    }
    job.seq = (*outcomes)[i].seq;
    server::Log("grpc")->debug("queued job={} type={} key={}", job.id, job.spec.type,
                               job.spec.fairness_key);
    if (d != nullptr) {
      d->JobQueued(std::move(job));
      continue;
    }
    // A standby: the leader learns of the row from the database (now, or at its next recount).
    gate.Counted(job.spec.type);
    if (notified) continue;
    // Leadership was lost while the row was being written: tell whoever leads now.
    if (absl::Status told = store_.NotifyChanged(job.id); !told.ok()) {
      server::Log("grpc")->warn("could not notify the leader of job={}: {}", job.id,
                                told.message());
    }
  }
}

void JobServiceImpl::Queue(grpc::CallbackServerContext* ctx, const auth::Principal& caller,
                           absl::Span<const v1::JobSpec* const> specs,
                           absl::string_view field_prefix, Answer answer, Reply reply) {
  absl::Duration retry_after = absl::ZeroDuration();
  absl::StatusOr<std::vector<job::Job>> jobs =
      Admit(specs, caller, ctx->peer(), field_prefix, &retry_after);
  if (!jobs.ok()) {
    if (absl::IsResourceExhausted(jobs.status())) {
      ctx->AddTrailingMetadata(kRetryAfterTrailer, RetryAfterMillis(retry_after));
    }
    std::move(reply)(server::ToGrpcStatus(jobs.status()));
    return;
  }
  Enqueue(*std::move(jobs), [answer = std::move(answer), reply = std::move(reply)](
                                absl::StatusOr<std::vector<store::InsertOutcome>> outcomes) mutable {
    if (outcomes.ok()) std::move(answer)(*outcomes);
    std::move(reply)(server::ToGrpcStatus(outcomes.status()));
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::Submit(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::SubmitRequest, v1::SubmitResponse>;
  return ServeUnary<v1::SubmitRequest, v1::SubmitResponse>(request, response, [&](Call* call) {
    absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kSubmit);
    if (!caller.ok()) return call->Reply(caller.status());
    const v1::JobSpec* spec = &call->request().spec();
    Queue(
        ctx, *caller, absl::MakeConstSpan(&spec, 1), "",
        [call](const std::vector<store::InsertOutcome>& outcomes) {
          call->response().set_job_id(outcomes[0].job_id);
          call->response().set_deduplicated(outcomes[0].deduplicated);
        },
        [call](const grpc::Status& status) { call->Reply(status); });
  });
}

grpc::ServerUnaryReactor* JobServiceImpl::SubmitBatch(grpc::CallbackServerContext* ctx,
                                                      const grpc::ByteBuffer* request,
                                                      grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::SubmitBatchRequest, v1::SubmitBatchResponse>;
  return ServeUnary<v1::SubmitBatchRequest, v1::SubmitBatchResponse>(
      request, response, [&](Call* call) {
        // Authorized first: a caller that may not submit learns nothing of the batch's shape.
        absl::StatusOr<auth::Principal> caller =
            gate_.Authorize(*ctx, auth::Method::kSubmitBatch);
        if (!caller.ok()) return call->Reply(caller.status());
        const v1::SubmitBatchRequest& req = call->request();
        if (req.specs_size() < 1 || req.specs_size() > kMaxBatchSpecs) {
          return call->Reply(absl::InvalidArgumentError(absl::StrCat(
              "specs: between 1 and ", kMaxBatchSpecs, " jobs, got ", req.specs_size())));
        }
        Queue(
            ctx, *caller, absl::MakeConstSpan(req.specs().data(), req.specs_size()), "specs",
            [call](const std::vector<store::InsertOutcome>& outcomes) {
              for (const store::InsertOutcome& o : outcomes) {
                v1::SubmitResponse* r = call->response().add_results();
                r->set_job_id(o.job_id);
                r->set_deduplicated(o.deduplicated);
              }
            },
            [call](const grpc::Status& status) { call->Reply(status); });
      });
}

namespace {

// RunSync: queue the job, then finish when it reaches a terminal state, re-reading the row.
// Work runs on the executor; OnDone waits for tasks still holding `this` before deleting it.
class RunSyncReactor final : public grpc::ServerUnaryReactor {
 public:
  RunSyncReactor(JobServiceImpl& service, store::JobStore& store, dispatch::JobEvents& events,
                 server::Executor& executor, grpc::CallbackServerContext* ctx,
                 auth::Principal caller, v1::RunSyncRequest request, grpc::ByteBuffer* response)
      : store_(store),
        events_(events),
        executor_(executor),
        ctx_(ctx),
        request_(std::move(request)),
        raw_response_(response) {
    Run([this, &service, caller = std::move(caller), peer = ctx->peer()] {
      Begin(service, request_, caller, peer);
    });
  }

  void OnCancel() override {
    absl::MutexLock l(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled; the job goes on"));
  }

  void OnDone() override {
    {
      absl::MutexLock l(&mu_);
      done_ = true;
      mu_.Await(absl::Condition(+[](int* n) { return *n == 0; }, &in_flight_));
    }
    // Only now is token_ final (the insert's completion subscribes); a callback that fires
    // before Unsubscribe returns finds done_ set and schedules nothing.
    if (token_ != 0) events_.Unsubscribe(token_);
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

  // Runs once, from the constructor (before OnDone can run, so it always runs): Admit and
  // Enqueue settle the admission reservation whatever happens to the call afterwards. The insert
  // completes on the inserter's thread; it counts as in flight until then.
  void Begin(JobServiceImpl& service, const v1::RunSyncRequest& req,
             const auth::Principal& caller, const std::string& peer) {
    absl::Duration retry_after = absl::ZeroDuration();
    const v1::JobSpec* spec = &req.spec();
    absl::StatusOr<std::vector<job::Job>> jobs =
        service.Admit(absl::MakeConstSpan(&spec, 1), caller, peer, "", &retry_after);
    if (!jobs.ok()) {
      absl::MutexLock l(&mu_);
      // Trailers must be added before Finish; OnCancel may have finished the call already.
      if (!finished_ && absl::IsResourceExhausted(jobs.status())) {
        ctx_->AddTrailingMetadata(kRetryAfterTrailer, RetryAfterMillis(retry_after));
      }
      FinishLocked(server::ToGrpcStatus(jobs.status()));
      return;
    }
    {
      absl::MutexLock l(&mu_);
      ++in_flight_;
    }
    service.Enqueue(*std::move(jobs),
                    [this](absl::StatusOr<std::vector<store::InsertOutcome>> outcomes) {
                      if (outcomes.ok()) {
                        Queued((*outcomes)[0].job_id);
                      } else {
                        absl::MutexLock l(&mu_);
                        FinishLocked(server::ToGrpcStatus(outcomes.status()));
                      }
                      absl::MutexLock l(&mu_);
                      --in_flight_;
                    });
  }

  // The row is committed: wait for the job to end. Runs on the inserter's thread, so the store
  // is read on the executor.
  void Queued(const std::string& job_id) {
    {
      absl::MutexLock l(&mu_);
      job_id_ = job_id;
    }
    token_ = events_.Subscribe(job_id, [this](JobState state) {
      if (job::IsTerminal(state)) Run([this] { CompleteIfDone(); });
    });
    // The job may have ended before the subscription (a fast worker, or a deduplicated job).
    Run([this] { CompleteIfDone(); });
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
    convert::ToProto(*job, response_.mutable_job());
    FinishLocked(grpc::Status::OK);
  }

  void FinishLocked(const grpc::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_) return;
    finished_ = true;
    if (status.ok()) SerializeTo(response_, raw_response_);
    Finish(status);
  }

  store::JobStore& store_;
  dispatch::JobEvents& events_;
  server::Executor& executor_;
  grpc::CallbackServerContext* const ctx_;
  const v1::RunSyncRequest request_;
  grpc::ByteBuffer* const raw_response_;
  v1::RunSyncResponse response_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> token_ = 0;

  absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

grpc::ServerUnaryReactor* JobServiceImpl::RunSync(grpc::CallbackServerContext* ctx,
                                                  const grpc::ByteBuffer* request,
                                                  grpc::ByteBuffer* response) {
  v1::RunSyncRequest req;
  absl::Status refused = ParseRequest(request, &req);
  absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kRunSync);
  if (!caller.ok()) refused = caller.status();
  if (!refused.ok()) {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    reactor->Finish(server::ToGrpcStatus(refused));
    return reactor;
  }
  return new RunSyncReactor(*this, store_, events_, executor_, ctx, *std::move(caller),
                            std::move(req), response);
}

grpc::ServerUnaryReactor* JobServiceImpl::Status(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::StatusRequest, v1::StatusResponse>;
  return ServeUnary<v1::StatusRequest, v1::StatusResponse>(request, response, [&](Call* call) {
    absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kStatus);
    if (!caller.ok()) return call->Reply(caller.status());
    executor_.Schedule([this, call, caller = *std::move(caller)] {
      const std::string& id = call->request().job_id();
      absl::Status status = CheckJobId(id, "job_id", config_.Get()->limits.max_id_bytes);
      if (status.ok()) {
        absl::StatusOr<job::Job> job = GetAs(store_, caller, id);
        if (job.ok()) {
          v1::Job* out = call->response().mutable_job();
          convert::ToProto(*job, out);
          if (job->state == JobState::kQueued) AddWaitInfo(*job, out);
        }
        status = job.status();
      }
      call->Reply(status);
    });
  });
}

void JobServiceImpl::AddWaitInfo(const job::Job& row, v1::Job* job) {
  std::shared_ptr<dispatch::Dispatcher> d = leadership_.dispatcher();
  if (d == nullptr) return;  // only the leader's scheduler knows
  bool paged_out = false;
  std::optional<sched::WaitInfo> info = d->WhyWaiting(row, &paged_out);
  if (!info.has_value()) return;  // the row is QUEUED but the daemon does not hold it (a race)
  if (paged_out) {
    // It waits in the database behind its queue's window: count the rows ahead of it.
    absl::StatusOr<int64_t> ahead =
        store_.CountQueuedBefore(row.spec.type, row.spec.fairness_key, row.seq);
    if (ahead.ok()) info->position = *ahead + 1;
  }
  // kNone: nothing holds it back; it goes at the dispatcher's next turn, behind what goes first.
  const sched::WaitReason reason =
      info->reason == sched::WaitReason::kNone ? sched::WaitReason::kInLine : info->reason;
  job->set_wait_reason(std::string(sched::ToString(reason)));
  job->set_queue_position(info->position);
  job->set_keys_ahead(info->keys_ahead);
}

grpc::ServerUnaryReactor* JobServiceImpl::Cancel(grpc::CallbackServerContext* ctx,
                                                 const grpc::ByteBuffer* request,
                                                 grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::CancelRequest, v1::CancelResponse>;
  return ServeUnary<v1::CancelRequest, v1::CancelResponse>(request, response, [&](Call* call) {
    absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kCancel);
    if (!caller.ok()) return call->Reply(caller.status());
    executor_.Schedule([this, call, caller = *std::move(caller)] { CancelAs(caller, call); });
  });
}

void JobServiceImpl::CancelAs(const auth::Principal& caller,
                              UnaryCall<v1::CancelRequest, v1::CancelResponse>* call) {
  const v1::CancelRequest* req = &call->request();
  v1::CancelResponse* resp = &call->response();
  absl::Status status = CheckJobId(req->job_id(), "job_id", config_.Get()->limits.max_id_bytes);
  // Only an admin may cancel another's job; an owner never changes, so reading it first is
  // enough.
  if (status.ok() && caller.role != auth::Role::kAdmin) {
    status = GetAs(store_, caller, req->job_id()).status();
  }
  if (status.ok()) {
    absl::StatusOr<store::CancelOutcome> outcome = store_.Cancel(
        req->job_id(), caller.authenticated
                           ? absl::StrCat("cancelled by ", ToString(caller.role), " ",
                                          caller.name)
                           : std::string("cancelled by client"));
    if (outcome.ok() && caller.authenticated && outcome->job.owner != caller.name) {
      server::Log("audit")->info("action=cancel principal={} role={} job={} owner={}",
                                 caller.name, ToString(caller.role), outcome->job.id,
                                 outcome->job.owner);
    }
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
  call->Reply(status);
}

namespace {

// Watch: the job's current state, then one event per committed change, ending after a terminal
// state. Each event re-reads the row, so a burst of changes may coalesce into fewer events, but
// the last event is always the terminal record.
class WatchReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  // A `caller` that is not OK (refused, or a request that did not parse) finishes the call at
  // once with that status.
  // Each open Watch counts against its principal's limits.watches_per_principal.
  WatchReactor(store::JobStore& store, dispatch::JobEvents& events, server::Executor& executor,
               sched::CallerLimits& limits, const config::LimitsConfig& config,
               absl::StatusOr<auth::Principal> caller, std::string job_id)
      : store_(store),
        events_(events),
        executor_(executor),
        limits_(limits),
        job_id_(std::move(job_id)) {
    absl::Status s = caller.status();
    if (s.ok()) s = CheckJobId(job_id_, "job_id", config.max_id_bytes);
    if (s.ok()) {
      caller_ = *std::move(caller);
      s = limits_.Open(sched::CallerLimits::Stream::kWatch, caller_.name,
                       config.watches_per_principal);
      counted_ = s.ok();
    }
    if (!s.ok()) {
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
    if (counted_) limits_.Close(sched::CallerLimits::Stream::kWatch, caller_.name);
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
      absl::StatusOr<job::Job> job = GetAs(store_, caller_, job_id_);
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
      SerializeTo(queue_.front(), &current_);
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
  sched::CallerLimits& limits_;
  auth::Principal caller_;  // set once, before any refresh
  const std::string job_id_;
  bool counted_ = false;  // holds one of the caller's Watch subscriptions
  uint64_t token_ = 0;

  absl::Mutex mu_;
  std::deque<v1::WatchEvent> queue_ ABSL_GUARDED_BY(mu_);
  grpc::ByteBuffer current_ ABSL_GUARDED_BY(mu_);  // the event being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool terminal_queued_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
  std::optional<JobState> last_state_ ABSL_GUARDED_BY(mu_);
  int32_t last_attempt_ ABSL_GUARDED_BY(mu_) = -1;
};

}  // namespace

grpc::ServerWriteReactor<grpc::ByteBuffer>* JobServiceImpl::Watch(
    grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request) {
  v1::WatchRequest req;
  absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kWatch);
  if (absl::Status parsed = ParseRequest(request, &req); caller.ok() && !parsed.ok()) {
    caller = parsed;
  }
  return new WatchReactor(store_, events_, executor_, limits_, config_.Get()->limits,
                          std::move(caller), req.job_id());
}

}  // namespace dispatchd::rpc
