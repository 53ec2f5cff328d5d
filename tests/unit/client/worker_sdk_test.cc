// Worker SDK against an in-test fake WorkerService on 127.0.0.1:0. Every wait has a deadline.

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <grpcpp/grpcpp.h>

#include "client/cpp/worker.h"
#include "tests/testing/status_matchers.h"
#include "tests/unit/client/fake_worker_service.h"

namespace dispatchd::client {
namespace {

using ::dispatchd::client::fake::Ack;
using ::dispatchd::client::fake::Acks;
using ::dispatchd::client::fake::Assign;
using ::dispatchd::client::fake::FakeSession;
using ::dispatchd::client::fake::FakeWorkerService;
using ::dispatchd::client::fake::IsAccept;
using ::dispatchd::client::fake::IsBatch;
using ::dispatchd::client::fake::IsDraining;
using ::dispatchd::client::fake::IsHeartbeat;
using ::dispatchd::client::fake::IsHello;
using ::dispatchd::client::fake::IsReject;
using ::dispatchd::client::fake::IsResult;
using ::dispatchd::client::fake::kWait;
using ::dispatchd::client::fake::Pred;
using ::dispatchd::client::fake::Welcome;
using ::dispatchd::testing::IsOk;
using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

// Handlers that hold their jobs until released or cancelled, and record what they saw.
class Gate {
 public:
  Handler MakeHandler() {
    return [this](JobContext& job) {
      {
        absl::MutexLock l(&mu_);
        started_.push_back(job.job_id());
      }
      while (true) {
        if (job.cancelled()) {
          absl::MutexLock l(&mu_);
          cancelled_.insert(job.job_id());
          return JobOutcome::Failure("cancelled", false);
        }
        {
          absl::MutexLock l(&mu_);
          if (released_) return JobOutcome::Success("out-" + job.job_id());
        }
        job.WaitForCancellation(absl::Milliseconds(5));
      }
    };
  }
  void Release() {
    absl::MutexLock l(&mu_);
    released_ = true;
  }
  bool WaitStarted(size_t n) {
    absl::MutexLock l(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return started_.size() >= n; };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), kWait);
  }
  bool WaitCancelled(const std::string& id) {
    absl::MutexLock l(&mu_);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return cancelled_.contains(id); };
    return mu_.AwaitWithTimeout(absl::Condition(&ready), kWait);
  }
  std::vector<std::string> started() {
    absl::MutexLock l(&mu_);
    return started_;
  }

 private:
  absl::Mutex mu_;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> started_ ABSL_GUARDED_BY(mu_);
  std::set<std::string> cancelled_ ABSL_GUARDED_BY(mu_);
};

class WorkerSdkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port_, 0);
  }

  void TearDown() override {
    gate_.Release();
    if (worker_ != nullptr) {
      worker_->Shutdown();
      EXPECT_TRUE(run_done_.WaitForNotificationWithTimeout(kWait));
      if (run_thread_.joinable()) run_thread_.join();
      worker_.reset();
    }
    server_->Shutdown(std::chrono::system_clock::now());
  }

  void StartWorker(WorkerOptions options, Handler handler) {
    options.server = "127.0.0.1:" + std::to_string(port_);
    if (options.worker_id.empty()) options.worker_id = "w1";
    if (options.types.empty()) options.types = {"a"};
    options.reconnect_min = absl::Milliseconds(5);
    options.reconnect_max = absl::Milliseconds(50);
    absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Create(options, std::move(handler));
    ASSERT_THAT(w, IsOk());
    worker_ = *std::move(w);
    run_thread_ = std::thread([this] {
      run_status_ = worker_->Run();
      run_done_.Notify();
    });
  }

  // Waits for the `index`-th session's Hello and welcomes it.
  std::shared_ptr<FakeSession> Welcomed(size_t index, absl::Duration heartbeat = absl::Seconds(10),
                                        const std::vector<std::string>& adopted = {}) {
    std::shared_ptr<FakeSession> s = service_.WaitSession(index);
    if (s == nullptr || !s->WaitFor(IsHello()).has_value()) return nullptr;
    if (!s->Send(Welcome(heartbeat, adopted))) return nullptr;
    return s;
  }

  FakeWorkerService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  Gate gate_;
  std::unique_ptr<Worker> worker_;
  std::thread run_thread_;
  absl::Notification run_done_;
  absl::Status run_status_;
};

TEST_F(WorkerSdkTest, HelloCarriesIdentityCapacityAndHeartbeatsFollow) {
  StartWorker({.worker_id = "gpu-7",
               .types = {"a", "b"},
               .slots = 3,
               .labels = {{"gpu", "h100"}},
               .models_resident = {"llama"}},
              gate_.MakeHandler());
  std::shared_ptr<FakeSession> s = service_.WaitSession(0);
  ASSERT_NE(s, nullptr);
  std::optional<v1::WorkerMessage> hello = s->WaitFor(IsHello());
  ASSERT_TRUE(hello.has_value());
  EXPECT_EQ(s->Received().front().msg_case(), v1::WorkerMessage::kHello);  // first message
  const v1::Hello& h = hello->hello();
  EXPECT_EQ(h.worker_id(), "gpu-7");
  EXPECT_THAT(h.types(), ElementsAre("a", "b"));
  EXPECT_EQ(h.slots(), 3);
  EXPECT_EQ(h.labels().at("gpu"), "h100");
  EXPECT_THAT(h.models_resident(), ElementsAre("llama"));
  EXPECT_EQ(h.running_jobs_size(), 0);

  ASSERT_TRUE(s->Send(Welcome(absl::Milliseconds(20))));
  std::optional<v1::WorkerMessage> hb = s->WaitFor(IsHeartbeat());
  ASSERT_TRUE(hb.has_value());
  EXPECT_GT(hb->heartbeat().ram_total_bytes(), 0);
  EXPECT_GT(hb->heartbeat().ram_used_bytes(), 0);
  EXPECT_LE(hb->heartbeat().ram_used_bytes(), hb->heartbeat().ram_total_bytes());
  EXPECT_THAT(hb->heartbeat().models_resident(), ElementsAre("llama"));
}

TEST_F(WorkerSdkTest, WorkerIsTheAuthorityOnItsConcurrency) {
  // Advertises 4 slots but runs at most 1 job: of 3 assignments only the first is accepted.
  StartWorker({.slots = 4, .max_concurrent = 1}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s = Welcomed(0);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}, {"j2", "a"}, {"j3", "a"}})));
  ASSERT_TRUE(s->WaitFor(IsReject("j3")).has_value());

  std::vector<v1::WorkerMessage> answers;
  for (const v1::WorkerMessage& m : s->Received()) {
    if (m.has_accept() || m.has_reject()) answers.push_back(m);
  }
  ASSERT_EQ(answers.size(), 3u);
  EXPECT_TRUE(answers[0].has_accept());
  EXPECT_EQ(answers[0].accept().job_id(), "j1");
  EXPECT_EQ(answers[0].accept().attempt(), 1);
  for (int i : {1, 2}) {
    ASSERT_TRUE(answers[i].has_reject());
    EXPECT_EQ(answers[i].reject().job_id(), i == 1 ? "j2" : "j3");
    EXPECT_EQ(answers[i].reject().reason(), v1::Reject::REASON_RESOURCE_EXHAUSTED);
  }
  ASSERT_TRUE(gate_.WaitStarted(1));

  // An unsupported type is refused as such; a repeat of j1 is accepted again but not rerun.
  size_t mark = s->Received().size();
  ASSERT_TRUE(s->Send(Assign({{"j4", "zzz"}, {"j1", "a"}})));
  std::optional<v1::WorkerMessage> unsupported = s->WaitFor(IsReject("j4"), mark);
  ASSERT_TRUE(unsupported.has_value());
  EXPECT_EQ(unsupported->reject().reason(), v1::Reject::REASON_UNSUPPORTED);
  ASSERT_TRUE(s->WaitFor(IsAccept("j1"), mark).has_value());

  gate_.Release();
  std::optional<v1::WorkerMessage> result = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->result().output(), "out-j1");
  EXPECT_TRUE(result->result().has_run_time());
  EXPECT_THAT(gate_.started(), ElementsAre("j1"));
}

TEST_F(WorkerSdkTest, ResultsAreResentAfterReconnectUntilAcknowledged) {
  gate_.Release();  // jobs finish at once
  StartWorker({}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s1 = Welcomed(0);
  ASSERT_NE(s1, nullptr);
  ASSERT_TRUE(s1->Send(Assign({{"j1", "a"}})));
  ASSERT_TRUE(s1->WaitFor(IsResult("j1")).has_value());
  s1->Close();  // no ack: the daemon "crashed" between the result and its ack

  // The finished but unacknowledged job is still held: the Hello reports it, the daemon adopts it.
  std::shared_ptr<FakeSession> s2 = Welcomed(1, absl::Seconds(10), {"j1"});
  ASSERT_NE(s2, nullptr);
  std::optional<v1::WorkerMessage> hello = s2->WaitFor(IsHello());
  ASSERT_TRUE(hello.has_value());
  ASSERT_EQ(hello->hello().running_jobs_size(), 1);
  EXPECT_EQ(hello->hello().running_jobs(0).job_id(), "j1");
  std::optional<v1::WorkerMessage> resent = s2->WaitFor(IsResult("j1"));
  ASSERT_TRUE(resent.has_value());
  EXPECT_EQ(resent->result().output(), "out-j1");
  ASSERT_TRUE(s2->Send(Ack("j1")));
  // Let the ack land before the next break: a new job's result proves the stream got this far.
  ASSERT_TRUE(s2->Send(Assign({{"j2", "a"}})));
  ASSERT_TRUE(s2->WaitFor(IsResult("j2")).has_value());
  ASSERT_TRUE(s2->Send(Ack("j2")));
  ASSERT_TRUE(s2->Send(Assign({{"j3", "a"}})));
  ASSERT_TRUE(s2->WaitFor(IsResult("j3")).has_value());
  s2->Close();

  // Only j3 was unacknowledged. Results are resent right after Welcome, before any Assign is read,
  // so everything the worker would resend comes before its Accept of j4.
  std::shared_ptr<FakeSession> s3 = Welcomed(2, absl::Seconds(10), {"j3"});
  ASSERT_NE(s3, nullptr);
  ASSERT_TRUE(s3->Send(Assign({{"j4", "a"}})));
  ASSERT_TRUE(s3->WaitFor(IsAccept("j4")).has_value());
  std::vector<std::string> resent_ids;
  for (const v1::WorkerMessage& m : s3->Received()) {
    if (m.has_accept()) break;
    if (m.has_result()) resent_ids.push_back(m.result().job_id());
  }
  EXPECT_THAT(resent_ids, ElementsAre("j3"));
}

TEST_F(WorkerSdkTest, WithBatchingAnswersAndResultsShareMessagesAndAcksComeTogether) {
  StartWorker({.slots = 4, .max_concurrent = 3}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s = service_.WaitSession(0);
  ASSERT_NE(s, nullptr);
  std::optional<v1::WorkerMessage> hello = s->WaitFor(IsHello());
  ASSERT_TRUE(hello.has_value());
  EXPECT_TRUE(hello->hello().batching());
  ASSERT_TRUE(s->Send(Welcome(absl::Seconds(10), {}, /*batching=*/true)));

  // One Assign of four: one Batch answers all of it.
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}, {"j2", "a"}, {"j3", "a"}, {"j4", "a"}})));
  std::optional<v1::WorkerMessage> answers = s->WaitFor(IsBatch());
  ASSERT_TRUE(answers.has_value());
  std::vector<std::string> accepted, rejected;
  for (const v1::Accept& a : answers->batch().accepts()) accepted.push_back(a.job_id());
  for (const v1::Reject& r : answers->batch().rejects()) {
    rejected.push_back(r.job_id());
    EXPECT_EQ(r.reason(), v1::Reject::REASON_RESOURCE_EXHAUSTED);
  }
  EXPECT_THAT(accepted, ElementsAre("j1", "j2", "j3"));
  EXPECT_THAT(rejected, ElementsAre("j4"));
  ASSERT_TRUE(gate_.WaitStarted(3));

  // Released together, the three results arrive in Batch messages only.
  gate_.Release();
  std::set<std::string> results;
  for (absl::Time end = absl::Now() + kWait; results.size() < 3 && absl::Now() < end;
       absl::SleepFor(absl::Milliseconds(5))) {
    for (const v1::WorkerMessage& m : s->Received()) {
      for (const v1::Result& r : m.batch().results()) results.insert(r.job_id());
    }
  }
  EXPECT_THAT(results, UnorderedElementsAre("j1", "j2", "j3"));
  for (const v1::WorkerMessage& m : s->Received()) {
    EXPECT_FALSE(m.has_result() || m.has_accept() || m.has_reject()) << m.ShortDebugString();
  }

  // One ResultAcks settles two of them: after a reconnect only the third is still held.
  ASSERT_TRUE(s->Send(Acks({"j1", "j3"})));
  ASSERT_TRUE(s->Send(Assign({{"j5", "a"}})));  // answered after the acks were read
  ASSERT_TRUE(s->WaitFor(IsAccept("j5")).has_value());
  s->Close();
  std::shared_ptr<FakeSession> s2 = service_.WaitSession(1);
  ASSERT_NE(s2, nullptr);
  std::optional<v1::WorkerMessage> again = s2->WaitFor(IsHello());
  ASSERT_TRUE(again.has_value());
  std::set<std::string> held;
  for (const v1::HeldJob& h : again->hello().running_jobs()) held.insert(h.job_id());
  EXPECT_THAT(held, UnorderedElementsAre("j2", "j5"));
}

TEST_F(WorkerSdkTest, InlineHandlersRunOneAtATimeOnTheStreamsThreadAndReportTogether) {
  absl::Mutex mu;
  std::set<std::thread::id> threads;
  int running = 0, most_running = 0;
  StartWorker({.slots = 8, .run_inline = true}, [&](JobContext& job) {
    {
      absl::MutexLock l(&mu);
      threads.insert(std::this_thread::get_id());
      most_running = std::max(most_running, ++running);
    }
    absl::SleepFor(absl::Milliseconds(2));  // long enough for a second thread to overlap
    absl::MutexLock l(&mu);
    --running;
    return JobOutcome::Success("out-" + job.job_id());
  });
  std::shared_ptr<FakeSession> s = service_.WaitSession(0);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->WaitFor(IsHello()).has_value());
  ASSERT_TRUE(s->Send(Welcome(absl::Seconds(10), {}, /*batching=*/true)));

  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}, {"j2", "a"}, {"j3", "a"}, {"j4", "b"}})));
  auto has_results = [](const v1::WorkerMessage& m) { return m.batch().results_size() > 0; };
  std::optional<v1::WorkerMessage> results = s->WaitFor(has_results);
  ASSERT_TRUE(results.has_value());
  // The answers went first, in a Batch of their own: a job runs only once its Accept is written.
  std::vector<v1::WorkerMessage> received = s->Received();
  ASSERT_GE(received.size(), 3u);
  EXPECT_TRUE(received[0].has_hello());
  ASSERT_TRUE(received[1].has_batch()) << received[1].ShortDebugString();
  std::vector<std::string> accepted;
  for (const v1::Accept& a : received[1].batch().accepts()) accepted.push_back(a.job_id());
  EXPECT_THAT(accepted, ElementsAre("j1", "j2", "j3"));
  ASSERT_EQ(received[1].batch().rejects_size(), 1);
  EXPECT_EQ(received[1].batch().rejects(0).reason(), v1::Reject::REASON_UNSUPPORTED);
  EXPECT_EQ(received[1].batch().results_size(), 0);
  // The three results came in one message, in the order of the Assign.
  std::vector<std::string> outputs;
  for (const v1::Result& r : results->batch().results()) outputs.push_back(r.output());
  EXPECT_THAT(outputs, ElementsAre("out-j1", "out-j2", "out-j3"));
  absl::MutexLock l(&mu);
  EXPECT_EQ(most_running, 1);
  EXPECT_EQ(threads.size(), 1u);
}

TEST_F(WorkerSdkTest, HeldResultTheDaemonDoesNotAdoptIsDropped) {
  gate_.Release();
  StartWorker({}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s1 = Welcomed(0);
  ASSERT_NE(s1, nullptr);
  ASSERT_TRUE(s1->Send(Assign({{"j1", "a"}})));
  ASSERT_TRUE(s1->WaitFor(IsResult("j1")).has_value());
  s1->Close();
  // The daemon no longer counts j1's attempt as current: it adopts nothing.
  std::shared_ptr<FakeSession> s2 = Welcomed(1);
  ASSERT_NE(s2, nullptr);
  ASSERT_TRUE(s2->Send(Assign({{"j2", "a"}})));
  ASSERT_TRUE(s2->WaitFor(IsResult("j2")).has_value());
  for (const v1::WorkerMessage& m : s2->Received()) {
    EXPECT_FALSE(m.has_result() && m.result().job_id() == "j1") << "dropped result was resent";
  }
}

TEST_F(WorkerSdkTest, CancelJobReachesTheHandlerAndItsOutcomeIsReported) {
  StartWorker({}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s = Welcomed(0);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}})));
  ASSERT_TRUE(s->WaitFor(IsAccept("j1")).has_value());
  v1::DaemonMessage cancel;
  cancel.mutable_cancel()->set_job_id("j1");
  cancel.mutable_cancel()->set_attempt(1);
  cancel.mutable_cancel()->set_reason("client cancelled");
  ASSERT_TRUE(s->Send(cancel));
  ASSERT_TRUE(gate_.WaitCancelled("j1"));
  std::optional<v1::WorkerMessage> result = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(result.has_value());
  EXPECT_EQ(result->result().failure().message(), "cancelled");
}

TEST_F(WorkerSdkTest, ReconnectReportsRunningJobsAndCancelsThoseNotAdopted) {
  StartWorker({.slots = 2}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s1 = Welcomed(0);
  ASSERT_NE(s1, nullptr);
  ASSERT_TRUE(s1->Send(Assign({{"j1", "a"}, {"j2", "a"}})));
  ASSERT_TRUE(gate_.WaitStarted(2));
  s1->Close();

  std::shared_ptr<FakeSession> s2 = service_.WaitSession(1);
  ASSERT_NE(s2, nullptr);
  std::optional<v1::WorkerMessage> hello = s2->WaitFor(IsHello());
  ASSERT_TRUE(hello.has_value());
  std::vector<std::string> held;
  for (const v1::HeldJob& j : hello->hello().running_jobs()) {
    held.push_back(j.job_id());
    EXPECT_EQ(j.attempt(), 1);
  }
  EXPECT_THAT(held, UnorderedElementsAre("j1", "j2"));

  ASSERT_TRUE(s2->Send(Welcome(absl::Seconds(10), {"j1"})));  // j2's attempt is no longer current
  ASSERT_TRUE(gate_.WaitCancelled("j2"));
  absl::Time deadline = absl::Now() + kWait;
  while (worker_->RunningJobsForTest() != 1 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_EQ(worker_->RunningJobsForTest(), 1);

  gate_.Release();
  ASSERT_TRUE(s2->WaitFor(IsResult("j1")).has_value());
  for (const v1::WorkerMessage& m : s2->Received()) {
    EXPECT_FALSE(m.has_result() && m.result().job_id() == "j2") << "dropped result was sent";
  }
}

TEST_F(WorkerSdkTest, DrainRefusesNewWorkFinishesRunningJobsThenReturns) {
  StartWorker({.slots = 2}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s = Welcomed(0);
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}})));
  ASSERT_TRUE(s->WaitFor(IsAccept("j1")).has_value());

  worker_->Drain();
  ASSERT_TRUE(s->WaitFor(IsDraining()).has_value());
  ASSERT_TRUE(s->Send(Assign({{"j2", "a"}})));
  std::optional<v1::WorkerMessage> reject = s->WaitFor(IsReject("j2"));
  ASSERT_TRUE(reject.has_value());
  EXPECT_EQ(reject->reject().reason(), v1::Reject::REASON_DRAINING);
  EXPECT_FALSE(run_done_.HasBeenNotified());

  gate_.Release();
  ASSERT_TRUE(s->WaitFor(IsResult("j1")).has_value());
  ASSERT_TRUE(s->Send(Ack("j1")));
  ASSERT_TRUE(run_done_.WaitForNotificationWithTimeout(kWait));
  EXPECT_THAT(run_status_, IsOk());
  EXPECT_TRUE(s->WaitDone());
}

TEST_F(WorkerSdkTest, DaemonDrainStopsAnIdleWorker) {
  StartWorker({}, gate_.MakeHandler());
  std::shared_ptr<FakeSession> s = Welcomed(0);
  ASSERT_NE(s, nullptr);
  v1::DaemonMessage drain;
  drain.mutable_drain();
  ASSERT_TRUE(s->Send(drain));
  ASSERT_TRUE(s->WaitFor(IsDraining()).has_value());
  ASSERT_TRUE(run_done_.WaitForNotificationWithTimeout(kWait));
  EXPECT_THAT(run_status_, IsOk());
}

TEST(WorkerCreateTest, RejectsBadOptionsNamingTheField) {
  auto echo = [](JobContext& job) { return JobOutcome::Success(job.payload()); };
  EXPECT_THAT(Worker::Create({.server = "x", .worker_id = "w", .types = {}}, echo),
              ::dispatchd::testing::StatusIs(absl::StatusCode::kInvalidArgument, "types"));
  EXPECT_THAT(Worker::Create({.server = "x", .worker_id = "w", .types = {"a"}, .slots = 0}, echo),
              ::dispatchd::testing::StatusIs(absl::StatusCode::kInvalidArgument, "slots"));
  EXPECT_THAT(Worker::Create({.server = "", .worker_id = "w", .types = {"a"}}, echo),
              ::dispatchd::testing::StatusIs(absl::StatusCode::kInvalidArgument, "server"));
}

}  // namespace
}  // namespace dispatchd::client
