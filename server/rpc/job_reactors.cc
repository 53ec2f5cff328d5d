#include "server/rpc/job_reactors.h"

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

#include "server/convert/job_proto.h"
#include "server/rpc/raw_call.h"
#include "server/util/grpc_status.h"

namespace dispatchd::rpc {
namespace {

using job::JobState;

// RunSync: queue the job, then finish when it reaches a terminal state, answering from the row its
// finish committed. The answer is built on the executor, not on the dispatcher's thread that
// publishes the change; OnDone waits for tasks still holding `this` before deleting it.
class RunSyncReactor final : public grpc::ServerUnaryReactor {
 public:
  RunSyncReactor(JobServiceImpl& service, store::JobStore& store, dispatch::JobEvents& events,
                 server::Executor& executor, grpc::CallbackServerContext* ctx,
                 const auth::Principal& caller, v1::RunSyncRequest request,
                 grpc::ByteBuffer* response)
      : store_(store),
        events_(events),
        executor_(executor),
        ctx_(ctx),
        request_(std::move(request)),
        raw_response_(response) {
    Begin(service, request_, caller, ctx->peer());
  }

  void OnCancel() override {
    absl::MutexLock l(&mu_);
    FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED, "call cancelled; the job goes on"));
  }

  void OnDone() override {
    {
      absl::MutexLock l(&mu_);
      done_ = true;
      mu_.Await(absl::Condition(
          +[](int* n) { return *n == 0; }, &in_flight_));
    }
    // Only now is token_ final (the insert's completion may follow another job); a callback
    // that fires before Unsubscribe returns finds done_ set and schedules nothing.
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

  // Runs once, in the constructor on gRPC's thread (so before OnDone, and always), as Submit's
  // admission does: Admit and Enqueue neither block nor read the store, and settle the admission
  // reservation whatever happens to the call afterwards. The insert completes on the inserter's
  // thread; it counts as in flight until then.
  void Begin(JobServiceImpl& service, const v1::RunSyncRequest& req, const auth::Principal& caller,
             const std::string& peer) {
    absl::Duration retry_after = absl::ZeroDuration();
    const v1::JobSpec* spec = &req.spec();
    absl::StatusOr<JobServiceImpl::Admitted> jobs =
        service.Admit(absl::MakeConstSpan(&spec, 1), caller, peer, "", &retry_after);
    if (!jobs.ok()) {
      absl::MutexLock l(&mu_);
      // Trailers must be added before Finish.
      if (!finished_ && absl::IsResourceExhausted(jobs.status())) {
        ctx_->AddTrailingMetadata(kRetryAfterTrailer, RetryAfterMillis(retry_after));
      }
      FinishLocked(server::ToGrpcStatus(jobs.status()));
      return;
    }
    // Subscribed before the row is written, so that no change of the new job can be missed:
    // nothing is published of a job before its insert commits. The row is read only once the
    // job ends, not also to learn whether it ended before a subscription.
    std::string id = jobs->jobs[0].id;
    // The job as it will be stored: with the row its finish commits, the answer needs no read.
    own_ = jobs->jobs[0];
    own_.spec = job::AsStored(std::move(own_.spec));
    Follow(id);
    {
      absl::MutexLock l(&mu_);
      ++in_flight_;
    }
    service.Enqueue(*std::move(jobs),
                    [this, id](absl::StatusOr<std::vector<store::InsertOutcome>> outcomes) {
                      if (!outcomes.ok()) {
                        absl::MutexLock l(&mu_);
                        FinishLocked(server::ToGrpcStatus(outcomes.status()));
                      } else if (const store::InsertOutcome& o = (*outcomes)[0];
                                 o.deduplicated || o.job_id != id) {
                        // The idempotency key names an existing job, which may have ended
                        // already: follow it, and read it once now.
                        Follow(o.job_id);
                        Run([this] { CompleteIfDone(); });
                      }
                      absl::MutexLock l(&mu_);
                      --in_flight_;
                    });
  }

  // Waits for `job_id` to end: from now on its terminal change answers (from the row its finish
  // committed, or by reading it). Runs on gRPC's thread (from Begin) or on the inserter's
  // thread, never on both at once.
  void Follow(const std::string& job_id) {
    {
      absl::MutexLock l(&mu_);
      job_id_ = job_id;
    }
    if (token_ != 0) events_.Unsubscribe(token_);
    const bool own = job_id == own_.id;
    token_ = events_.Subscribe(job_id, [this, own](JobState state, const job::Job* ended) {
      if (!job::IsTerminal(state)) return;
      if (own && ended != nullptr) {
        Run([this, row = *ended]() mutable { CompleteWith(std::move(row)); });
      } else {
        Run([this] { CompleteIfDone(); });
      }
    });
  }

  // Answers with the row its finish committed, `ended`, completed with the spec this call
  // submitted (the row's spec and payload are these, but for a not_before a retry moved).
  void CompleteWith(job::Job ended) {
    const absl::Time not_before = ended.spec.not_before;
    ended.spec = own_.spec;
    ended.spec.not_before = not_before;
    absl::MutexLock l(&mu_);
    if (finished_) return;
    convert::ToProto(ended, response_.mutable_job());
    FinishLocked(grpc::Status::OK);
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
  job::Job own_;  // the job this call submits, as stored; set before Follow, then only read
  grpc::ByteBuffer* const raw_response_;
  v1::RunSyncResponse response_ ABSL_GUARDED_BY(mu_);
  std::atomic<uint64_t> token_ = 0;

  absl::Mutex mu_;
  std::string job_id_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  int in_flight_ ABSL_GUARDED_BY(mu_) = 0;
};

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
    token_ = events_.Subscribe(job_id_, [this](JobState, const job::Job*) { Refresh(); });
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
      mu_.Await(absl::Condition(
          +[](int* n) { return *n == 0; }, &in_flight_));
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

grpc::ServerUnaryReactor* NewRunSyncReactor(JobServiceImpl& service, store::JobStore& store,
                                            dispatch::JobEvents& events, server::Executor& executor,
                                            grpc::CallbackServerContext* ctx,
                                            const auth::Principal& caller,
                                            v1::RunSyncRequest request,
                                            grpc::ByteBuffer* response) {
  return new RunSyncReactor(service, store, events, executor, ctx, caller, std::move(request),
                            response);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* NewWatchReactor(
    store::JobStore& store, dispatch::JobEvents& events, server::Executor& executor,
    sched::CallerLimits& limits, const config::LimitsConfig& config,
    absl::StatusOr<auth::Principal> caller, std::string job_id) {
  return new WatchReactor(store, events, executor, limits, config, std::move(caller),
                          std::move(job_id));
}

}  // namespace dispatchd::rpc
