#pragma once

// The two JobService calls that stay open while a job runs, each a reactor of its own.

#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"

#include "dispatchd/v1/job_service.pb.h"
#include "lib/auth/principal.h"
#include "lib/config/config.h"
#include "lib/sched/caller_limits.h"
#include "server/dispatch/job_events.h"
#include "server/rpc/job_service.h"
#include "server/store/job_store.h"
#include "server/util/executor.h"

namespace dispatchd::rpc {

// RunSync: admits and queues `request`'s job as `caller`'s through `service`, then finishes the
// call with the job's record once it reaches a terminal state (CANCELLED if the caller goes away
// first; the job goes on). The admission and the queueing run on the calling thread, the reads
// and the answer on `executor`; the reactor deletes itself when gRPC is done.
grpc::ServerUnaryReactor* NewRunSyncReactor(JobServiceImpl& service, store::JobStore& store,
                                            dispatch::JobEvents& events, server::Executor& executor,
                                            grpc::CallbackServerContext* ctx,
                                            const auth::Principal& caller,
                                            v1::RunSyncRequest request, grpc::ByteBuffer* response);

// Watch: streams job `job_id` as `caller` may see it, then one event per committed change,
// ending after a terminal state. A `caller` that is not OK (refused, or a request that did not
// parse) finishes the call at once with that status; so does a bad id or a caller that already
// holds `config.watches_per_principal` open watches (counted in `limits` while this one is open).
grpc::ServerWriteReactor<grpc::ByteBuffer>* NewWatchReactor(
    store::JobStore& store, dispatch::JobEvents& events, server::Executor& executor,
    sched::CallerLimits& limits, const config::LimitsConfig& config,
    absl::StatusOr<auth::Principal> caller, std::string job_id);

}  // namespace dispatchd::rpc
