#pragma once

// The worker SDK's stream to the daemon. Internal to the SDK (worker.h).

#include <atomic>
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include <grpcpp/grpcpp.h>

#include "client/cpp/credentials.h"
#include "dispatchd/v1/worker_service.grpc.pb.h"

namespace dispatchd::client::worker_internal {

namespace v1 = ::dispatchd::v1;

// One WorkerService.Connect call from a worker to one daemon: the channel, the stream, and the
// writes to it, results batched when the daemon reads Batch messages.
//
//   auto session = std::make_shared<Session>(target, credentials);
//   session->Connect();
//   session->Write(hello);
//   while (session->Read(&message)) { ... session->SendResult(result, others_running); ... }
//   session->Close();
//   grpc::Status status = session->Finish();
//
// Thread contract: the stream is read by the session's thread only (the one that connects, reads
// and finishes it); writes from any thread go through Write(), SendResult() and SendResults(),
// one at a time.
// Cancel() may be called from any thread, at any time.
class Session {
 public:
  // A channel to `target` with the worker's credentials; nothing is sent before Connect().
  Session(const std::string& target, const Credentials& credentials);
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  // Starts the call. Once, on the session's thread, before Read() and Finish().
  void Connect() ABSL_LOCKS_EXCLUDED(write_mu_);
  // The next message from the daemon; false once the stream has ended. The session's thread only.
  bool Read(v1::DaemonMessage* message) { return stream_->Read(message); }
  // The call's status, once Read() returned false. The session's thread only.
  grpc::Status Finish() { return stream_->Finish(); }
  // Ends the call (a blocked Read() returns false). Any thread.
  void Cancel() { context_.TryCancel(); }

  // False if the stream is closed or broken (the caller relies on a resend after reconnect).
  bool Write(const v1::WorkerMessage& message) ABSL_LOCKS_EXCLUDED(write_mu_);
  // Half-closes the stream: no more writes.
  void WritesDone() ABSL_LOCKS_EXCLUDED(write_mu_);
  // No more writes, without telling the daemon (the session is finishing).
  void Close() ABSL_LOCKS_EXCLUDED(write_mu_);

  // Whether the daemon's Welcome said it reads Batch messages; set before any result is sent.
  bool batching() const { return batching_; }
  void set_batching(bool batching) { batching_ = batching; }

  // Sends a result. With batching, results that become ready while another write is under way
  // wait for it and then go together in one Batch, written by whichever thread finds the outbox
  // unattended: a lone result is written at once, and under load one write carries many. A
  // result whose write fails stays unacknowledged and is sent again after the next Welcome.
  //
  // `others_running` says that other jobs of this worker were still running when this one
  // finished. The thread that finds the outbox unattended then yields the CPU once before it
  // writes: jobs that finish together (the jobs of one Assign, typically) add their results in
  // the meantime, and one write carries them all instead of one write each. A result that is
  // the worker's last is written at once.
  void SendResult(v1::Result result, bool others_running) ABSL_LOCKS_EXCLUDED(write_mu_, out_mu_);
  // Sends results that are ready together: with batching, in one Batch (or as few as
  // kMaxBatchBytes allows), joining any results another thread is writing out.
  void SendResults(std::vector<v1::Result> results) ABSL_LOCKS_EXCLUDED(write_mu_, out_mu_);

 private:
  // Results in one Batch at most (a larger result goes alone), well below the daemon's limit on
  // a message.
  static constexpr size_t kMaxBatchBytes = 1 << 20;

  // Without batching, writes each of `results` alone and returns false. With it, adds them to
  // the outbox and returns true if the caller is now the one to write it out (FlushOutbox).
  bool Post(absl::Span<v1::Result> results) ABSL_LOCKS_EXCLUDED(write_mu_, out_mu_);
  // Writes the outbox out, one Batch at a time, until it is empty; the caller set flushing_.
  void FlushOutbox() ABSL_LOCKS_EXCLUDED(write_mu_, out_mu_);

  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::DaemonMessage>> stream_;

  absl::Mutex write_mu_;
  // No more writes: WritesDone was sent or the session is finishing.
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;

  std::atomic<bool> batching_ = false;

  absl::Mutex out_mu_ ABSL_ACQUIRED_BEFORE(write_mu_);
  std::vector<v1::Result> outbox_ ABSL_GUARDED_BY(out_mu_);
  // A thread is writing the outbox out.
  bool flushing_ ABSL_GUARDED_BY(out_mu_) = false;
};

}  // namespace dispatchd::client::worker_internal
