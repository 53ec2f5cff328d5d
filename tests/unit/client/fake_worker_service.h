#pragma once

// An in-test fake of the daemon's WorkerService: records what each worker session sends and lets
// the test answer. Every wait is bounded by kWait. Thread-safe.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include <grpcpp/grpcpp.h>

#include "dispatchd/v1/worker_service.grpc.pb.h"

namespace dispatchd::client::fake {

namespace v1 = ::dispatchd::v1;

constexpr absl::Duration kWait = absl::Seconds(5);

using Stream = grpc::ServerReaderWriter<v1::DaemonMessage, v1::WorkerMessage>;
using Pred = std::function<bool(const v1::WorkerMessage&)>;

// One Connect call as the fake daemon sees it. Thread-safe.
class FakeSession {
 public:
  FakeSession(grpc::ServerContext* context, Stream* stream) : context_(context), stream_(stream) {}

  // The first received message at index >= `from` matching `pred`, waiting up to kWait.
  std::optional<v1::WorkerMessage> WaitFor(const Pred& pred, size_t from = 0) {
    absl::MutexLock l(&mu_);
    std::optional<v1::WorkerMessage> found;
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      for (size_t i = from; i < received_.size(); ++i) {
        if (pred(received_[i])) {
          found = received_[i];
          return true;
        }
      }
      return false;
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), kWait);
    return found;
  }
  std::vector<v1::WorkerMessage> Received() {
    absl::MutexLock l(&mu_);
    return received_;
  }
  bool Send(const v1::DaemonMessage& m) {
    absl::MutexLock l(&mu_);
    return !done_ && stream_->Write(m);
  }
  // Breaks the stream from the daemon's side.
  void Close() {
    absl::MutexLock l(&mu_);
    if (!done_) context_->TryCancel();
  }
  bool WaitDone() {
    absl::MutexLock l(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&done_), kWait);
  }

  // Called by the service thread.
  void Add(const v1::WorkerMessage& m) {
    absl::MutexLock l(&mu_);
    received_.push_back(m);
  }
  void MarkDone() {
    absl::MutexLock l(&mu_);
    done_ = true;
  }

 private:
  absl::Mutex mu_;
  grpc::ServerContext* const context_;
  Stream* const stream_;
  std::vector<v1::WorkerMessage> received_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
};

class FakeWorkerService final : public v1::WorkerService::Service {
 public:
  grpc::Status Connect(grpc::ServerContext* context, Stream* stream) override {
    auto session = std::make_shared<FakeSession>(context, stream);
    {
      absl::MutexLock l(&mu_);
      sessions_.push_back(session);
    }
    v1::WorkerMessage m;
    while (stream->Read(&m)) session->Add(m);
    session->MarkDone();
    return grpc::Status::OK;
  }

  // The `index`-th session (0-based), waiting up to kWait.
  std::shared_ptr<FakeSession> WaitSession(size_t index) {
    absl::MutexLock l(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return sessions_.size() > index; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), kWait)) return nullptr;
    return sessions_[index];
  }

 private:
  absl::Mutex mu_;
  std::vector<std::shared_ptr<FakeSession>> sessions_ ABSL_GUARDED_BY(mu_);
};

inline Pred IsHello() {
  return [](const v1::WorkerMessage& m) { return m.has_hello(); };
}
inline Pred IsHeartbeat() {
  return [](const v1::WorkerMessage& m) { return m.has_heartbeat(); };
}
inline Pred IsDraining() {
  return [](const v1::WorkerMessage& m) { return m.has_draining(); };
}
inline Pred IsAccept(const std::string& id) {
  return [id](const v1::WorkerMessage& m) { return m.has_accept() && m.accept().job_id() == id; };
}
inline Pred IsReject(const std::string& id) {
  return [id](const v1::WorkerMessage& m) { return m.has_reject() && m.reject().job_id() == id; };
}
inline Pred IsResult(const std::string& id) {
  return [id](const v1::WorkerMessage& m) { return m.has_result() && m.result().job_id() == id; };
}

inline Pred IsBatch() {
  return [](const v1::WorkerMessage& m) { return m.has_batch(); };
}

inline v1::DaemonMessage Welcome(absl::Duration heartbeat = absl::Seconds(10),
                                 const std::vector<std::string>& adopted = {},
                                 bool batching = false) {
  v1::DaemonMessage m;
  v1::Welcome* w = m.mutable_welcome();
  w->set_batching(batching);
  w->mutable_heartbeat_interval()->set_seconds(absl::ToInt64Seconds(heartbeat));
  w->mutable_heartbeat_interval()->set_nanos(
      static_cast<int32_t>(absl::ToInt64Nanoseconds(heartbeat % absl::Seconds(1))));
  w->set_session_id("s");
  for (const std::string& id : adopted) {
    v1::HeldJob* h = w->add_adopted_jobs();
    h->set_job_id(id);
    h->set_attempt(1);
  }
  return m;
}

inline v1::DaemonMessage Assign(const std::vector<std::pair<std::string, std::string>>& jobs) {
  v1::DaemonMessage m;
  for (const auto& [id, type] : jobs) {
    v1::Assignment* a = m.mutable_assign()->add_assignments();
    a->set_job_id(id);
    a->set_attempt(1);
    a->set_type(type);
    a->set_payload("payload-" + id);
  }
  return m;
}

inline v1::DaemonMessage Acks(const std::vector<std::string>& ids) {
  v1::DaemonMessage m;
  for (const std::string& id : ids) {
    v1::ResultAck* ack = m.mutable_result_acks()->add_acks();
    ack->set_job_id(id);
    ack->set_attempt(1);
  }
  return m;
}

inline v1::DaemonMessage Ack(const std::string& id) {
  v1::DaemonMessage m;
  m.mutable_result_ack()->set_job_id(id);
  m.mutable_result_ack()->set_attempt(1);
  return m;
}

}  // namespace dispatchd::client::fake
