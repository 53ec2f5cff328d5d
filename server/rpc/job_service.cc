#include "server/rpc/job_service.h"

#include <algorithm>
#include <cstdint>
#include <memory>
#include <optional>
#include <random>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "absl/types/span.h"

#include "lib/sched/admission.h"
#include "lib/sched/admission_gate.h"
#include "lib/sched/scheduler.h"
#include "server/convert/job_proto.h"
#include "server/metrics/daemon_metrics.h"
#include "server/rpc/job_reactors.h"
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
  if (absl::StartsWith(peer, "unix:")) return peer;
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

// The store search a ListJobs request asks for, limited to the jobs `caller` may see; or
// INVALID_ARGUMENT naming the field.
absl::StatusOr<store::JobSearch> SearchOf(const v1::ListJobsRequest& req,
                                          const auth::Principal& caller) {
  store::JobSearch search;
  if (req.state() != v1::JOB_STATE_UNSPECIFIED) {
    search.state = convert::FromProto(req.state());
    if (!search.state.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat("state: unknown state ", req.state()));
    }
  }
  search.type = req.type();
  search.fairness_key = req.fairness_key();
  if (req.has_created_after()) search.created_after = convert::FromProto(req.created_after());
  if (req.has_created_before()) search.created_before = convert::FromProto(req.created_before());
  if (req.limit() < 0 || req.limit() > JobServiceImpl::kMaxListedJobs) {
    return absl::InvalidArgumentError(absl::StrCat(
        "limit: must be in [0, ", JobServiceImpl::kMaxListedJobs, "], got ", req.limit()));
  }
  search.limit = req.limit() == 0 ? JobServiceImpl::kDefaultListedJobs : req.limit();
  // A caller that is not an admin sees its own jobs only, as Status does (auth::MaySee).
  if (caller.role != auth::Role::kAdmin) search.owner = caller.name;
  return search;
}

std::string RetryAfterMillis(absl::Duration retry_after) {
  const int64_t ms = absl::ToInt64Milliseconds(absl::Ceil(retry_after, absl::Milliseconds(1)));
  return absl::StrCat(std::max<int64_t>(0, ms));
}

absl::StatusOr<JobServiceImpl::Admitted> JobServiceImpl::Admit(
    absl::Span<const v1::JobSpec* const> specs, const auth::Principal& caller,
    const std::string& peer, absl::string_view field_prefix, absl::Duration* retry_after) {
  std::vector<job::Job> jobs;
  jobs.reserve(specs.size());
  const absl::Time now = clock_.TimeNow();
  const std::shared_ptr<const config::Config> config = config_.Get();
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string prefix = field_prefix.empty() ? "" : absl::StrCat(field_prefix, "[", i, "].");
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
  // Reserve room for every job before anything is written; all or none (the reservations taken
  // go back when a later one is refused and they go out of scope).
  sched::AdmissionGate& gate = leadership_.admission();
  std::vector<sched::Reservation> reservations;
  reservations.reserve(jobs.size());
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::StatusOr<sched::Reservation> reserved =
        gate.TryAdmit(jobs[i].spec.type, jobs[i].owner, retry_after);
    if (reserved.ok()) {
      reservations.push_back(*std::move(reserved));
    } else {
      const absl::Status& admitted = reserved.status();
      // The gate's message starts with the limit that refused: max_active, max_queue_depth or
      // tenants[name].max_active (counted as tenant_max_active).
      const absl::string_view message = admitted.message();
      const absl::string_view limit = message.substr(0, message.find(':'));
      metrics::Metrics()
          .refused
          .With({jobs[i].spec.type,
                 absl::StartsWith(limit, "tenants[") ? "tenant_max_active" : std::string(limit)})
          .Inc(static_cast<double>(jobs.size()));
      server::Log("grpc")->debug("refused type={} key={}: {}", jobs[i].spec.type,
                                 jobs[i].spec.fairness_key, admitted.message());
      return admitted;
    }
  }
  // One registry lookup per type in the call, not per job (a batch holds up to 10,000).
  absl::flat_hash_map<std::string, int64_t> admitted;
  for (const job::Job& job : jobs) ++admitted[job.spec.type];
  for (const auto& [type, n] : admitted) {
    metrics::Metrics().admitted.With({type}).Inc(static_cast<double>(n));
  }
  return Admitted{.jobs = std::move(jobs), .reservations = std::move(reservations)};
}

void JobServiceImpl::Enqueue(Admitted admitted, EnqueueDone done) {
  // A standby tells the leader of its rows in the insert's own statement; a leader hands them to
  // its dispatcher, once they are committed.
  std::shared_ptr<dispatch::JobIntake> intake = leadership_.intake();
  const bool notify_leader = intake->NotifiesOnInsert();
  std::vector<sched::Reservation> reservations = std::move(admitted.reservations);
  inserter_.Insert(
      std::move(admitted.jobs), notify_leader,
      [this, notify_leader, reservations = std::move(reservations), done = std::move(done)](
          std::vector<job::Job> jobs,
          absl::StatusOr<std::vector<store::InsertOutcome>> outcomes) mutable {
        Admitted written{.jobs = std::move(jobs), .reservations = std::move(reservations)};
        // The intake of the moment: leadership may have changed while the rows were written.
        Settle(written, outcomes, *leadership_.intake(), notify_leader);
        std::move(done)(std::move(outcomes));
      },
      intake->placer());
}

void JobServiceImpl::Settle(Admitted& admitted,
                            const absl::StatusOr<std::vector<store::InsertOutcome>>& outcomes,
                            dispatch::JobIntake& intake, bool notified) {
  for (size_t i = 0; i < admitted.jobs.size(); ++i) {
    job::Job& job = admitted.jobs[i];
    sched::Reservation& reservation = admitted.reservations[i];
    if (!outcomes.ok() || (*outcomes)[i].deduplicated) {
      reservation = sched::Reservation();  // nothing written: the room goes back
      continue;
    }
    job.seq = (*outcomes)[i].seq;
    if ((*outcomes)[i].dispatched) {
      job.state = job::JobState::kDispatched;  // placed on job.worker_id by its insert
      server::Log("grpc")->debug("dispatched job={} type={} key={} worker={}", job.id,
                                 job.spec.type, job.spec.fairness_key, job.worker_id);
    } else {
      server::Log("grpc")->debug("queued job={} type={} key={}", job.id, job.spec.type,
                                 job.spec.fairness_key);
    }
    reservation.Written();
    intake.Queued(std::move(job), std::move(reservation), notified);
  }
}

void JobServiceImpl::Queue(grpc::CallbackServerContext* ctx, const auth::Principal& caller,
                           absl::Span<const v1::JobSpec* const> specs,
                           absl::string_view field_prefix, Answer answer, Reply reply) {
  absl::Duration retry_after = absl::ZeroDuration();
  absl::StatusOr<Admitted> jobs = Admit(specs, caller, ctx->peer(), field_prefix, &retry_after);
  if (!jobs.ok()) {
    if (absl::IsResourceExhausted(jobs.status())) {
      ctx->AddTrailingMetadata(kRetryAfterTrailer, RetryAfterMillis(retry_after));
    }
    std::move(reply)(server::ToGrpcStatus(jobs.status()));
    return;
  }
  Enqueue(*std::move(jobs),
          [answer = std::move(answer), reply = std::move(reply)](
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
        absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kSubmitBatch);
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
  return NewRunSyncReactor(*this, store_, events_, executor_, ctx, *caller, std::move(req),
                           response);
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
  bool paged_out = false;
  // Only the leader's scheduler knows; a standby's intake says nothing.
  std::optional<sched::WaitInfo> info = leadership_.intake()->WhyWaiting(row, &paged_out);
  if (!info.has_value()) return;  // a standby, or a QUEUED row not held here (a race)
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
  job->set_tenant(info->tenant);
  job->set_tenant_share(info->tenant_share);
  job->set_tenant_fair_share(info->tenant_fair_share);
  job->set_key_share(info->key_share);
  job->set_key_fair_share(info->key_fair_share);
  job->set_conflict_holder(info->conflict_holder);
  if (info->next_token_at != absl::InfinitePast()) {
    convert::ToProto(info->next_token_at, job->mutable_next_token_at());
  }
  if (info->estimated_start != absl::InfiniteFuture()) {
    convert::ToProto(info->estimated_start, job->mutable_estimated_start_at());
  }
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
                           ? absl::StrCat("cancelled by ", ToString(caller.role), " ", caller.name)
                           : std::string("cancelled by client"));
    if (outcome.ok() && caller.authenticated && outcome->job.owner != caller.name) {
      server::Log("audit")->info("action=cancel principal={} role={} job={} owner={}", caller.name,
                                 ToString(caller.role), outcome->job.id, outcome->job.owner);
    }
    if (outcome.ok()) {
      dispatch::LogFinished(outcome->job.id, JobState::kCancelled, outcome->job.attempt);
      leadership_.intake()->Cancelled(outcome->job.id, outcome->previous);
      convert::ToProto(outcome->job, resp->mutable_job());
    }
    status = outcome.status();
  }
  call->Reply(status);
}

grpc::ServerUnaryReactor* JobServiceImpl::ListJobs(grpc::CallbackServerContext* ctx,
                                                   const grpc::ByteBuffer* request,
                                                   grpc::ByteBuffer* response) {
  using Call = UnaryCall<v1::ListJobsRequest, v1::ListJobsResponse>;
  return ServeUnary<v1::ListJobsRequest, v1::ListJobsResponse>(request, response, [&](Call* call) {
    absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kListJobs);
    if (!caller.ok()) return call->Reply(caller.status());
    absl::StatusOr<store::JobSearch> search = SearchOf(call->request(), *caller);
    if (!search.ok()) return call->Reply(search.status());
    executor_.Schedule([this, call, search = *std::move(search)] {
      absl::StatusOr<std::vector<job::Job>> jobs = store_.SearchJobs(search);
      if (jobs.ok()) {
        for (const job::Job& job : *jobs) convert::ToProto(job, call->response().add_jobs());
      }
      call->Reply(jobs.status());
    });
  });
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* JobServiceImpl::Watch(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* request) {
  v1::WatchRequest req;
  absl::StatusOr<auth::Principal> caller = gate_.Authorize(*ctx, auth::Method::kWatch);
  if (absl::Status parsed = ParseRequest(request, &req); caller.ok() && !parsed.ok()) {
    caller = parsed;
  }
  return NewWatchReactor(store_, events_, executor_, limits_, config_.Get()->limits,
                         std::move(caller), req.job_id());
}

}  // namespace dispatchd::rpc
