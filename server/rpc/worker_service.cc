#include "server/rpc/worker_service.h"

#include <deque>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"

#include "server/metrics/daemon_metrics.h"
#include "server/rpc/raw_call.h"
#include "server/util/grpc_status.h"
#include "server/util/log.h"

namespace dispatchd::rpc {
namespace {

constexpr int kMaxSlots = 100'000;
constexpr int kMaxTypes = 1'000;

class WorkerStream;

// The dispatcher's handle on a stream. It outlives the reactor; once the reactor is done, sends
// are dropped.
class StreamLink final : public dispatch::WorkerLink {
 public:
  StreamLink(WorkerStream* stream, std::string peer) : stream_(stream), peer_(std::move(peer)) {}
  void Send(v1::DaemonMessage msg) override;
  void Close(const absl::Status& status) override;
  std::string peer() const override { return peer_; }
  void Detach() {
    absl::MutexLock l(&mu_);
    stream_ = nullptr;
  }

 private:
  absl::Mutex mu_;
  WorkerStream* stream_ ABSL_GUARDED_BY(mu_);
  const std::string peer_;
};

class WorkerStream final : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  WorkerStream(ha::Leadership& leadership, sched::CallerLimits& limits,
               const config::LimitsConfig& config, std::string peer,
               absl::StatusOr<auth::Principal> caller)
      : leadership_(leadership),
        limits_(limits),
        max_id_bytes_(config.max_id_bytes),
        link_(std::make_shared<StreamLink>(this, std::move(peer))) {
    absl::Status s = caller.status();
    if (s.ok()) {
      caller_ = *std::move(caller);
      s = limits_.Open(sched::CallerLimits::Stream::kWorker, caller_.name,
                       config.worker_streams_per_principal);
      counted_ = s.ok();
      if (!s.ok()) {
        server::Log("grpc")->warn("worker stream refused peer={} error=\"{}\"", link_->peer(),
                                  s.message());
      }
    }
    // A refused caller was logged by the gate.
    if (!s.ok()) {
      Close(s);
      return;
    }
    StartRead(&raw_in_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      if (said_hello_) dispatcher_->WorkerDisconnected(link_);
      Close(absl::OkStatus());
      return;
    }
    if (absl::Status parsed = ParseRequest(&raw_in_, &in_); !parsed.ok()) {
      server::Log("grpc")->warn("worker stream refused peer={} error=\"{}\"", link_->peer(),
                                parsed.message());
      if (said_hello_) dispatcher_->WorkerDisconnected(link_);
      Close(parsed);
      return;
    }
    received_.Inc();
    if (!said_hello_) {
      absl::Status s = in_.has_hello() ? CheckHello(in_.hello(), max_id_bytes_)
                                       : absl::InvalidArgumentError(
                                             "hello: the first message of "
                                             "a worker stream must be a Hello");
      if (s.ok()) {
        s = auth::MayServe(caller_, {in_.hello().types().begin(), in_.hello().types().end()});
      }
      // A worker principal names its workers under its own name, so that it cannot pass for
      // another principal's worker and report on that worker's jobs.
      if (s.ok() && caller_.authenticated && caller_.role == auth::Role::kWorker) {
        in_.mutable_hello()->set_worker_id(
            absl::StrCat(caller_.name, "/", in_.hello().worker_id()));
      }
      if (!s.ok()) {
        server::Log("grpc")->warn("worker refused peer={} error=\"{}\"", link_->peer(),
                                  s.message());
        Close(s);
        return;
      }
      // The stream stays with the dispatcher of the term it said Hello to; when that term ends
      // the dispatcher closes it and the worker connects again.
      dispatcher_ = leadership_.dispatcher();
      if (dispatcher_ == nullptr) {
        Redirect();
        return;
      }
      said_hello_ = true;
      dispatcher_->WorkerConnected(link_, std::move(*in_.mutable_hello()));
    } else {
      dispatcher_->WorkerMessage(link_, std::move(in_));
    }
    in_.Clear();
    StartRead(&raw_in_);
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
    bool finish = false;
    {
      absl::MutexLock l(&mu_);
      out_.pop_front();
      if (ok) sent_.Inc();
      if (!ok) out_.clear();
      if (!out_.empty()) {
        next = &out_.front();
      } else {
        writing_ = false;
        finish = close_requested_ && !finished_;
        if (finish) finished_ = true;
      }
    }
    if (next != nullptr) StartWrite(next);
    if (finish) Finish(close_status_);
  }

  void OnDone() override {
    if (counted_) limits_.Close(sched::CallerLimits::Stream::kWorker, caller_.name);
    link_->Detach();
    if (said_hello_) dispatcher_->WorkerDisconnected(link_);
    delete this;
  }

  // A standby's answer to Hello: where the leader is, then the end of the stream.
  void Redirect() {
    const ha::LeaderInfo leader = leadership_.leader();
    v1::DaemonMessage msg;
    v1::Redirect* r = msg.mutable_redirect();
    r->set_leader_address(leader.address);
    r->set_message(
        leader.address.empty()
            ? std::string("this daemon is a standby and no leader is known yet")
            : absl::StrCat("this daemon is a standby; the leader is at ", leader.address));
    server::Log("grpc")->debug("worker redirected peer={} leader={}", link_->peer(),
                               leader.address);
    metrics::Metrics().worker_redirects.With({}).Inc();
    std::string message = r->message();
    Send(msg);
    Close(absl::UnavailableError(message));
  }

  void Send(const v1::DaemonMessage& msg) {
    const grpc::ByteBuffer* first = nullptr;
    grpc::ByteBuffer raw;
    SerializeTo(msg, &raw);
    {
      absl::MutexLock l(&mu_);
      if (close_requested_) return;
      out_.push_back(std::move(raw));
      if (!writing_) {
        writing_ = true;
        first = &out_.front();
      }
    }
    if (first != nullptr) StartWrite(first);
  }

  void Close(const absl::Status& status) {
    bool finish_now = false;
    {
      absl::MutexLock l(&mu_);
      if (close_requested_) return;
      close_requested_ = true;
      close_status_ = server::ToGrpcStatus(status);
      if (!writing_) {
        finished_ = true;
        finish_now = true;
      }
    }
    if (finish_now) Finish(close_status_);
  }

 private:
  ha::Leadership& leadership_;
  sched::CallerLimits& limits_;
  const int max_id_bytes_;
  bool counted_ = false;                              // holds one of the caller's worker streams
  std::shared_ptr<dispatch::Dispatcher> dispatcher_;  // the term this stream said Hello to
  std::shared_ptr<StreamLink> link_;
  auth::Principal caller_;   // set before the first read
  grpc::ByteBuffer raw_in_;  // touched only by the read chain
  v1::WorkerMessage in_;     // raw_in_ parsed
  bool said_hello_ = false;
  metrics::Counter& received_ = metrics::Metrics().worker_stream_messages.With({"received"});
  metrics::Counter& sent_ = metrics::Metrics().worker_stream_messages.With({"sent"});

  absl::Mutex mu_;
  std::deque<grpc::ByteBuffer> out_ ABSL_GUARDED_BY(mu_);  // front is being written
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool close_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status close_status_;  // written once before Finish
};

void StreamLink::Send(v1::DaemonMessage msg) {
  absl::MutexLock l(&mu_);
  if (stream_ != nullptr) stream_->Send(msg);
}

void StreamLink::Close(const absl::Status& status) {
  absl::MutexLock l(&mu_);
  if (stream_ != nullptr) stream_->Close(status);
}

}  // namespace

absl::Status CheckHello(const v1::Hello& hello, int max_id_bytes) {
  if (hello.worker_id().empty()) return absl::InvalidArgumentError("hello.worker_id: required");
  if (hello.worker_id().size() > static_cast<size_t>(max_id_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat("hello.worker_id: at most ", max_id_bytes,
                                                   " bytes (limits.max_id_bytes), got ",
                                                   hello.worker_id().size()));
  }
  if (hello.types().empty()) return absl::InvalidArgumentError("hello.types: at least one type");
  if (hello.types_size() > kMaxTypes) {
    return absl::InvalidArgumentError(absl::StrCat("hello.types: at most ", kMaxTypes));
  }
  if (hello.slots() < 1 || hello.slots() > kMaxSlots) {
    return absl::InvalidArgumentError(
        absl::StrCat("hello.slots: must be in [1, ", kMaxSlots, "], got ", hello.slots()));
  }
  return absl::OkStatus();
}

grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* WorkerServiceImpl::Connect(
    grpc::CallbackServerContext* ctx) {
  return new WorkerStream(leadership_, limits_, config_.Get()->limits, ctx->peer(),
                          gate_.Authorize(*ctx, auth::Method::kConnect));
}

}  // namespace dispatchd::rpc
