#include "client/cpp/worker_session.h"

#include <cstddef>
#include <utility>

namespace dispatchd::client::worker_internal {

Session::Session(const std::string& target, const Credentials& credentials) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  channel_ = grpc::CreateCustomChannel(target, credentials.channel, args);
  credentials.Apply(context_);
  stub_ = v1::WorkerService::NewStub(channel_);
}

void Session::Connect() {
  // Construct the stream under write_mu_ so that no Write sees it half-made.
  absl::MutexLock l(&write_mu_);
  stream_ = stub_->Connect(&context_);
}

bool Session::Write(const v1::WorkerMessage& message) {
  absl::MutexLock l(&write_mu_);
  if (closed_ || stream_ == nullptr) return false;
  return stream_->Write(message);
}

void Session::WritesDone() {
  absl::MutexLock l(&write_mu_);
  if (closed_ || stream_ == nullptr) return;
  closed_ = true;
  stream_->WritesDone();
}

void Session::Close() {
  absl::MutexLock l(&write_mu_);
  closed_ = true;
}

void Session::SendResult(v1::Result result) {
  if (!batching_) {
    v1::WorkerMessage m;
    *m.mutable_result() = std::move(result);
    Write(m);
    return;
  }
  {
    absl::MutexLock l(&out_mu_);
    outbox_.push_back(std::move(result));
    if (flushing_) return;
    flushing_ = true;
  }
  while (true) {
    v1::WorkerMessage m;
    {
      absl::MutexLock l(&out_mu_);
      if (outbox_.empty()) {
        flushing_ = false;
        return;
      }
      // Up to kMaxBatchBytes of results, and always at least one.
      size_t n = 0, bytes = 0;
      for (; n < outbox_.size(); ++n) {
        const size_t size = outbox_[n].ByteSizeLong();
        if (n > 0 && bytes + size > kMaxBatchBytes) break;
        bytes += size;
      }
      v1::Batch* batch = m.mutable_batch();
      for (size_t i = 0; i < n; ++i) batch->add_results()->Swap(&outbox_[i]);
      outbox_.erase(outbox_.begin(), outbox_.begin() + static_cast<std::ptrdiff_t>(n));
    }
    Write(m);
  }
}

}  // namespace dispatchd::client::worker_internal
