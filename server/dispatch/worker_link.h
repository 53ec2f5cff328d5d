#pragma once

#include <string>

#include "absl/status/status.h"

#include "dispatchd/v1/worker_service.pb.h"

namespace dispatchd::dispatch {

// The daemon's end of one worker stream, as the dispatcher sees it. Implemented by the gRPC
// reactor in server/rpc. Thread-safe; never blocks.
class WorkerLink {
 public:
  virtual ~WorkerLink() = default;
  // Queues a message for the worker; dropped silently once the stream has ended.
  virtual void Send(v1::DaemonMessage msg) = 0;
  // Ends the stream with `status` after the messages already queued.
  virtual void Close(const absl::Status& status) = 0;
  // The worker's address, for logs and ListWorkers.
  virtual std::string peer() const = 0;
};

}  // namespace dispatchd::dispatch
