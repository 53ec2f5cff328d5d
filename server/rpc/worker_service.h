#pragma once

#include "dispatchd/v1/worker_service.grpc.pb.h"
#include "lib/config/live_config.h"
#include "lib/sched/caller_limits.h"
#include "server/auth/grpc_auth.h"
#include "server/dispatch/dispatcher.h"
#include "server/ha/leadership.h"

namespace dispatchd::rpc {

// WorkerService: one bidirectional stream per worker process, handed to the dispatcher as a
// WorkerLink once its Hello checks out: the caller is a worker (or admin) principal and may serve
// every type it names. No thread is held per stream. Thread-safe.
// Takes the stream's messages as raw bytes and parses them itself (see raw_call.h), so that a
// message that does not parse ends the stream INVALID_ARGUMENT, naming the problem.
class WorkerServiceImpl final
    : public v1::WorkerService::WithRawCallbackMethod_Connect<v1::WorkerService::Service> {
 public:
  // Each open stream counts against its principal's limits.worker_streams_per_principal.
  WorkerServiceImpl(const config::LiveConfig& config, const auth::Gate& gate,
                    sched::CallerLimits& limits, ha::Leadership& leadership)
      : config_(config), gate_(gate), limits_(limits), leadership_(leadership) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Connect(
      grpc::CallbackServerContext* ctx) override;

 private:
  const config::LiveConfig& config_;
  const auth::Gate& gate_;
  sched::CallerLimits& limits_;
  ha::Leadership& leadership_;
};

// OK, or InvalidArgument naming the bad field of a worker's Hello; `max_id_bytes` bounds its
// worker_id (limits.max_id_bytes).
absl::Status CheckHello(const v1::Hello& hello, int max_id_bytes);

}  // namespace dispatchd::rpc
