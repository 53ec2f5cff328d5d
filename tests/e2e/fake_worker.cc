#include "tests/e2e/fake_worker.h"

#include <utility>

namespace dispatchd::e2e {

FakeWorker::FakeWorker(const std::string& address, const v1::Hello& hello)
    : stub_(v1::WorkerService::NewStub(
          grpc::CreateChannel(address, grpc::InsecureChannelCredentials()))) {
  ctx_.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(5));
  stream_ = stub_->Connect(&ctx_);
  v1::WorkerMessage msg;
  *msg.mutable_hello() = hello;
  Send(msg);
  reader_ = std::thread([this] {
    v1::DaemonMessage in;
    while (stream_->Read(&in)) {
      absl::MutexLock l(&mu_);
      if (in.has_assign()) {
        for (const v1::Assignment& a : in.assign().assignments()) assignments_.push_back(a);
      }
      inbox_.push_back(std::move(in));
      in.Clear();
    }
    absl::MutexLock l(&mu_);
    ended_ = true;
  });
}

FakeWorker::~FakeWorker() {
  Close();
  ctx_.TryCancel();
  if (reader_.joinable()) reader_.join();
  stream_->Finish().IgnoreError();
}

bool FakeWorker::Send(const v1::WorkerMessage& msg) {
  absl::MutexLock l(&write_mu_);
  return stream_->Write(msg);
}

void FakeWorker::SendAccept(const std::string& job_id, int attempt) {
  v1::WorkerMessage m;
  m.mutable_accept()->set_job_id(job_id);
  m.mutable_accept()->set_attempt(attempt);
  Send(m);
}

void FakeWorker::SendHeartbeat(const std::vector<std::pair<std::string, int>>& held) {
  v1::WorkerMessage m;
  v1::Heartbeat* hb = m.mutable_heartbeat();
  for (const auto& [id, attempt] : held) {
    v1::HeldJob* h = hb->add_running_jobs();
    h->set_job_id(id);
    h->set_attempt(attempt);
  }
  Send(m);
}

void FakeWorker::SendResult(const std::string& job_id, int attempt, const std::string& output) {
  v1::WorkerMessage m;
  m.mutable_result()->set_job_id(job_id);
  m.mutable_result()->set_attempt(attempt);
  m.mutable_result()->set_output(output);
  Send(m);
}

std::optional<v1::DaemonMessage> FakeWorker::Next(
    const std::function<bool(const v1::DaemonMessage&)>& match, absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  const absl::Time give_up = absl::Now() + timeout;
  while (true) {
    while (!inbox_.empty()) {
      v1::DaemonMessage m = std::move(inbox_.front());
      inbox_.pop_front();
      if (match(m)) return m;
    }
    if (ended_ || absl::Now() >= give_up) return std::nullopt;
    mu_.AwaitWithDeadline(absl::Condition(
                              +[](FakeWorker* w) ABSL_EXCLUSIVE_LOCKS_REQUIRED(w->mu_) {
                                return !w->inbox_.empty() || w->ended_;
                              },
                              this),
                          give_up);
  }
}

std::optional<v1::Assignment> FakeWorker::NextAssignment(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  auto ready = [this]()
                   ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !assignments_.empty() || ended_; };
  mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
  if (assignments_.empty()) return std::nullopt;
  v1::Assignment a = std::move(assignments_.front());
  assignments_.pop_front();
  return a;
}

bool FakeWorker::Ended(absl::Duration timeout) {
  absl::MutexLock l(&mu_);
  mu_.AwaitWithTimeout(absl::Condition(&ended_), timeout);
  return ended_;
}

void FakeWorker::Close() {
  absl::MutexLock l(&write_mu_);
  if (closed_) return;
  closed_ = true;
  stream_->WritesDone();
}

}  // namespace dispatchd::e2e
