#pragma once

#include <string>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "dispatchd/v1/job_service.grpc.pb.h"
#include "lib/config/config.h"
#include "lib/util/clock.h"
#include "server/dispatch/dispatcher.h"
#include "server/dispatch/job_events.h"
#include "server/ha/leadership.h"
#include "server/store/job_store.h"
#include "server/util/executor.h"

namespace dispatchd::rpc {

// JobService over the gRPC callback API. Each method validates the request (naming the field in
// any error), converts it, calls the store and the dispatcher, and maps the status back. Every
// daemon serves it: a standby writes the row and tells the leader through the database
// (JobStore::NotifyChanged), and its RunSync and Watch calls learn of changes by polling. Store
// calls run on `executor`, never on gRPC's callback threads. Thread-safe.
class JobServiceImpl final : public v1::JobService::CallbackService {
 public:
  JobServiceImpl(const config::Config& config, store::JobStore& store, ha::Leadership& leadership,
                 dispatch::JobEvents& events, server::Executor& executor, Clock& clock)
      : config_(config),
        store_(store),
        leadership_(leadership),
        events_(events),
        executor_(executor),
        clock_(clock) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx, const v1::SubmitRequest* req,
                                   v1::SubmitResponse* resp) override;
  grpc::ServerUnaryReactor* RunSync(grpc::CallbackServerContext* ctx,
                                    const v1::RunSyncRequest* req,
                                    v1::RunSyncResponse* resp) override;
  grpc::ServerUnaryReactor* Status(grpc::CallbackServerContext* ctx, const v1::StatusRequest* req,
                                   v1::StatusResponse* resp) override;
  grpc::ServerUnaryReactor* Cancel(grpc::CallbackServerContext* ctx, const v1::CancelRequest* req,
                                   v1::CancelResponse* resp) override;
  grpc::ServerWriteReactor<v1::WatchEvent>* Watch(grpc::CallbackServerContext* ctx,
                                                  const v1::WatchRequest* req) override;

  // Validates, admits, records and queues a job: the shared first half of Submit and RunSync.
  // Admission (max_active, the type's max_queue_depth) is checked after validation and before
  // anything is written; a refusal is RESOURCE_EXHAUSTED with the hint in `retry_after`. The
  // admission gate's reservation is settled exactly once: released if nothing new was written
  // (an error or a duplicate), counted by the dispatcher otherwise.
  absl::StatusOr<store::InsertOutcome> Enqueue(const v1::JobSpec& spec, const std::string& peer,
                                               absl::Duration* retry_after);

 private:
  // Fills wait_reason, queue_position and keys_ahead of a QUEUED job the dispatcher holds.
  void AddWaitInfo(v1::Job* job);

  const config::Config& config_;
  store::JobStore& store_;
  ha::Leadership& leadership_;
  dispatch::JobEvents& events_;
  server::Executor& executor_;
  Clock& clock_;
};

// Fairness key for a caller with no key of its own: its address without the port, so that one
// client's connections share a key ("ipv4:127.0.0.1:53210" -> "ipv4:127.0.0.1").
std::string PeerIdentity(const std::string& peer);

// Validates a job id from the wire; InvalidArgument naming `field`.
absl::Status CheckJobId(const std::string& id, absl::string_view field);

// Trailing metadata key of an admission refusal: when to try again, in whole milliseconds.
inline constexpr char kRetryAfterTrailer[] = "retry-after-ms";
// Its value for `retry_after` (rounded up to whole milliseconds).
std::string RetryAfterMillis(absl::Duration retry_after);

}  // namespace dispatchd::rpc
