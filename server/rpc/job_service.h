#pragma once

#include <string>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "dispatchd/v1/job_service.grpc.pb.h"
#include "lib/auth/principal.h"
#include "lib/config/config.h"
#include "lib/config/live_config.h"
#include "lib/sched/caller_limits.h"
#include "lib/util/clock.h"
#include "server/auth/grpc_auth.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/job_events.h"
#include "server/ha/leadership.h"
#include "server/rpc/raw_call.h"
#include "server/store/group_inserter.h"
#include "server/store/job_store.h"
#include "server/util/executor.h"

namespace dispatchd::rpc {

// JobService over the gRPC callback API. Each method asks the gate who calls and whether it may,
// validates the request (naming the field in any error), converts it, calls the store and the
// dispatcher, and maps the status back. A caller sees only its own jobs (an admin sees all);
// another's job is NOT_FOUND. Every
// daemon serves it: a standby writes the row and tells the leader through the database
// (JobStore::NotifyChanged), and its RunSync and Watch calls learn of changes by polling. Store
// calls run on `executor` or, for inserts, on the group inserter's threads, never on gRPC's
// callback threads. Thread-safe.
// The generated service with every method taking raw bytes (see raw_call.h).
using RawJobService = v1::JobService::WithRawCallbackMethod_Submit<
    v1::JobService::WithRawCallbackMethod_SubmitBatch<v1::JobService::WithRawCallbackMethod_RunSync<
        v1::JobService::WithRawCallbackMethod_Status<v1::JobService::WithRawCallbackMethod_Cancel<
            v1::JobService::WithRawCallbackMethod_Watch<
                v1::JobService::WithRawCallbackMethod_ListJobs<v1::JobService::Service>>>>>>>;

class JobServiceImpl final : public RawJobService {
 public:
  JobServiceImpl(const config::LiveConfig& config, const auth::Gate& gate,
                 sched::CallerLimits& limits, store::JobStore& store,
                 store::GroupInserter& inserter, ha::Leadership& leadership,
                 dispatch::JobEvents& events, server::Executor& executor, Clock& clock)
      : config_(config),
        gate_(gate),
        limits_(limits),
        store_(store),
        inserter_(inserter),
        leadership_(leadership),
        events_(events),
        executor_(executor),
        clock_(clock) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* SubmitBatch(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RunSync(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* Watch(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;

  // Jobs a ListJobs search returns at most, and when it names no limit.
  static constexpr int kMaxListedJobs = 1000;
  static constexpr int kDefaultListedJobs = 100;

  // The shared first half of Submit, SubmitBatch and RunSync, in two steps.
  //
  // Admit validates and resolves `specs` (an error names the field, prefixed with
  // `field_prefix[i].` for a batch) and reserves admission for all of them, or for none:
  // RESOURCE_EXHAUSTED naming the limit, with the hint in `retry_after`. Nothing is written.
  // The jobs belong to `caller`, and queue under the fairness key it may choose (see
  // auth::FairnessKeyFor); with no key, under its address `peer`.
  struct Admitted {
    std::vector<job::Job> jobs;
    std::vector<sched::Reservation> reservations;  // one per job, in order
  };
  absl::StatusOr<Admitted> Admit(absl::Span<const v1::JobSpec* const> specs,
                                 const auth::Principal& caller, const std::string& peer,
                                 absl::string_view field_prefix, absl::Duration* retry_after);
  // Enqueue writes admitted jobs through the group inserter, all or none, and runs `done` (on an
  // inserter thread) once they are committed or have failed. Each reservation is settled first:
  // given back if no row was written (an error or a duplicate), else handed with its job to the
  // intake of the moment (dispatch::JobIntake).
  using EnqueueDone =
      absl::AnyInvocable<void(absl::StatusOr<std::vector<store::InsertOutcome>>) &&>;
  void Enqueue(Admitted admitted, EnqueueDone done);

  // Most jobs in one SubmitBatch.
  static constexpr int kMaxBatchSpecs = 10000;

 private:
  // Fills wait_reason, queue_position and keys_ahead of QUEUED `row` in `job`.
  void AddWaitInfo(const job::Job& row, v1::Job* job);
  // Submit and SubmitBatch: admits `specs` as `caller`'s, enqueues them and finishes the call
  // with `reply`; `answer` fills the response from the outcomes once they are committed.
  using Answer = absl::AnyInvocable<void(const std::vector<store::InsertOutcome>&) &&>;
  using Reply = absl::AnyInvocable<void(const grpc::Status&) &&>;
  void Queue(grpc::CallbackServerContext* ctx, const auth::Principal& caller,
             absl::Span<const v1::JobSpec* const> specs, absl::string_view field_prefix,
             Answer answer, Reply reply);
  // Cancel's work, on the executor.
  void CancelAs(const auth::Principal& caller,
                UnaryCall<v1::CancelRequest, v1::CancelResponse>* call);
  // Hands each job that was written, with its reservation, to `intake`; see Enqueue.
  void Settle(Admitted& admitted, const absl::StatusOr<std::vector<store::InsertOutcome>>& outcomes,
              dispatch::JobIntake& intake, bool notified);

  const config::LiveConfig& config_;  // types as of the last reload
  const auth::Gate& gate_;
  sched::CallerLimits& limits_;
  store::JobStore& store_;
  store::GroupInserter& inserter_;
  ha::Leadership& leadership_;
  dispatch::JobEvents& events_;
  server::Executor& executor_;
  Clock& clock_;
};

// Fairness key for a caller with no key of its own: its address without the port, so that one
// client's connections share a key ("ipv4:127.0.0.1:53210" -> "ipv4:127.0.0.1").
std::string PeerIdentity(const std::string& peer);

// The job `id` as `caller` may see it: NOT_FOUND, as for a job that does not exist, when it
// belongs to another principal.
absl::StatusOr<job::Job> GetAs(store::JobStore& store, const auth::Principal& caller,
                               const std::string& id);

// Validates a job id from the wire (at most `max_bytes`, limits.max_id_bytes); InvalidArgument
// naming `field`.
absl::Status CheckJobId(const std::string& id, absl::string_view field, int max_bytes);

// Trailing metadata key of an admission refusal: when to try again, in whole milliseconds.
inline constexpr char kRetryAfterTrailer[] = "retry-after-ms";
// Its value for `retry_after` (rounded up to whole milliseconds).
std::string RetryAfterMillis(absl::Duration retry_after);

}  // namespace dispatchd::rpc
