#pragma once

#include "dispatchd/v1/worker_service.grpc.pb.h"
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
  WorkerServiceImpl(const auth::Gate& gate, ha::Leadership& leadership)
      : gate_(gate), leadership_(leadership) {}

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Connect(
      grpc::CallbackServerContext* ctx) override;

 private:
  const auth::Gate& gate_;
  ha::Leadership& leadership_;
};

// OK, or InvalidArgument naming the bad field of a worker's Hello.
absl::Status CheckHello(const v1::Hello& hello);

}  // namespace dispatchd::rpc
