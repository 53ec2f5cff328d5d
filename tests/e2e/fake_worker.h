#pragma once

// A worker written against the raw protocol (dispatchd/v1/worker_service.proto), for tests that
// need a worker to misbehave in ways the SDK never does: forget a job, go silent, send a result
// late. It speaks only when told to. Thread-safe.

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

#include "dispatchd/v1/worker_service.grpc.pb.h"

namespace dispatchd::e2e {

class FakeWorker {
 public:
  // Opens a stream to `address` and sends `hello`; the Welcome (or anything else) arrives in
  // Next().
  FakeWorker(const std::string& address, const v1::Hello& hello);
  ~FakeWorker();

  bool Send(const v1::WorkerMessage& msg);
  void SendAccept(const std::string& job_id, int attempt);
  void SendHeartbeat(const std::vector<std::pair<std::string, int>>& held);
  void SendResult(const std::string& job_id, int attempt, const std::string& output);

  // The next daemon message for which `match` is true (earlier ones are dropped), or nullopt
  // after `timeout` or once the stream has ended with no such message left.
  std::optional<v1::DaemonMessage> Next(const std::function<bool(const v1::DaemonMessage&)>& match,
                                        absl::Duration timeout);
  // The next Assignment (from an Assign holding one or more).
  std::optional<v1::Assignment> NextAssignment(absl::Duration timeout);
  // True once the daemon has ended the stream.
  bool Ended(absl::Duration timeout);
  // Ends the stream from this side.
  void Close();

 private:
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::DaemonMessage>> stream_;
  std::thread reader_;
  absl::Mutex write_mu_;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;
  absl::Mutex mu_;
  std::deque<v1::DaemonMessage> inbox_ ABSL_GUARDED_BY(mu_);
  std::deque<v1::Assignment> assignments_ ABSL_GUARDED_BY(mu_);
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dispatchd::e2e
