// The dispatch-worker binary against the in-test fake WorkerService: modes, journal, signals.

#include <cstdint>
#include <fstream>
#include <iterator>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include "tests/unit/client/fake_worker_service.h"
#include "tests/unit/client/subprocess.h"

namespace dispatchd::client {
namespace {

using ::dispatchd::client::fake::Ack;
using ::dispatchd::client::fake::Assign;
using ::dispatchd::client::fake::FakeSession;
using ::dispatchd::client::fake::FakeWorkerService;
using ::dispatchd::client::fake::IsAccept;
using ::dispatchd::client::fake::IsDraining;
using ::dispatchd::client::fake::IsHello;
using ::dispatchd::client::fake::IsResult;
using ::dispatchd::client::fake::kWait;
using ::dispatchd::client::fake::Subprocess;
using ::dispatchd::client::fake::Welcome;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class DispatchWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    dir_ = tmp_.path();
  }
  void TearDown() override {
    worker_.reset();  // SIGKILL if still running
    server_->Shutdown(std::chrono::system_clock::now());
  }

  // Starts the binary and returns its welcomed session.
  std::shared_ptr<FakeSession> Start(std::vector<std::string> extra) {
    std::vector<std::string> argv = {DISPATCH_WORKER_BIN,
                                     "--server",
                                     "127.0.0.1:" + std::to_string(port_),
                                     "--id",
                                     "bin-1",
                                     "--journal",
                                     dir_ + "/journal"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    worker_ = std::make_unique<Subprocess>(argv, dir_ + "/worker");
    if (!worker_->started()) return nullptr;
    std::shared_ptr<FakeSession> s = service_.WaitSession(0);
    if (s == nullptr || !s->WaitFor(IsHello()).has_value() || !s->Send(Welcome())) {
      ADD_FAILURE() << "no session; stderr: " << worker_->err();
      return nullptr;
    }
    return s;
  }

  std::vector<std::string> Journal() {
    std::ifstream in(dir_ + "/journal");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    return absl::StrSplit(all, '\n', absl::SkipEmpty());
  }

  FakeWorkerService service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  fake::TempDir tmp_;
  std::string dir_;
  std::unique_ptr<Subprocess> worker_;
};

TEST_F(DispatchWorkerTest, ExecPipesThePayloadAndJournalsTheJob) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--exec", "tr a-z A-Z"});
  ASSERT_NE(s, nullptr);
  std::optional<v1::WorkerMessage> hello = s->WaitFor(IsHello());
  EXPECT_EQ(hello->hello().worker_id(), "bin-1");
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}})));
  std::optional<v1::WorkerMessage> result = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(result.has_value()) << worker_->err();
  EXPECT_EQ(result->result().output(), "PAYLOAD-J1");
  std::vector<std::string> journal = Journal();
  ASSERT_EQ(journal.size(), 2u);
  EXPECT_THAT(journal[0], StartsWith("start job=j1 attempt=1 ms="));
  EXPECT_THAT(journal[1], StartsWith("end job=j1 attempt=1 ok=1 ms="));
}

TEST_F(DispatchWorkerTest, ExecExitCodeDecidesRetryable) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--slots", "2", "--exec",
                                          "cat >/dev/null; echo \"no luck $DISPATCHD_JOB_ID\" >&2; "
                                          "[ \"$DISPATCHD_JOB_ID\" = j1 ] && exit 75; exit 3"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}, {"j2", "a"}})));
  std::optional<v1::WorkerMessage> r1 = s->WaitFor(IsResult("j1"));
  std::optional<v1::WorkerMessage> r2 = s->WaitFor(IsResult("j2"));
  ASSERT_TRUE(r1.has_value() && r2.has_value()) << worker_->err();
  EXPECT_THAT(r1->result().failure().message(), HasSubstr("no luck j1"));
  EXPECT_TRUE(r1->result().failure().retryable());
  EXPECT_THAT(r2->result().failure().message(), HasSubstr("no luck j2"));
  EXPECT_FALSE(r2->result().failure().retryable());
}

TEST_F(DispatchWorkerTest, CancelKillsTheChild) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--exec", "sleep 30; sleep 30"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}})));
  ASSERT_TRUE(s->WaitFor(IsAccept("j1")).has_value());
  v1::DaemonMessage cancel;
  cancel.mutable_cancel()->set_job_id("j1");
  cancel.mutable_cancel()->set_attempt(1);
  ASSERT_TRUE(s->Send(cancel));
  std::optional<v1::WorkerMessage> r = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(r.has_value()) << worker_->err();
  EXPECT_THAT(r->result().failure().message(), HasSubstr("cancelled"));
}

TEST_F(DispatchWorkerTest, SigtermDrainsThenExitsZero) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--simulate", "100%:300ms"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}})));
  ASSERT_TRUE(s->WaitFor(IsAccept("j1")).has_value());
  worker_->Signal(SIGTERM);
  ASSERT_TRUE(s->WaitFor(IsDraining()).has_value()) << worker_->err();
  std::optional<v1::WorkerMessage> r = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(r.has_value()) << worker_->err();
  EXPECT_EQ(r->result().output(), "simulated 300ms");
  ASSERT_TRUE(s->Send(Ack("j1")));
  EXPECT_EQ(worker_->Wait(kWait), 0) << worker_->err();
}

TEST_F(DispatchWorkerTest, StartLogHasEachHandlerStartInMicrosecondsAfterExit) {
  const int64_t before_us = absl::ToUnixMicros(absl::Now());
  std::shared_ptr<FakeSession> s =
      Start({"--types", "a", "--slots", "2", "--echo", "--start-log", dir_ + "/starts"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(Assign({{"j1", "a"}, {"j2", "a"}})));
  for (const char* id : {"j1", "j2"}) {
    ASSERT_TRUE(s->WaitFor(IsResult(id)).has_value()) << worker_->err();
    ASSERT_TRUE(s->Send(Ack(id)));
  }
  worker_->Signal(SIGTERM);
  ASSERT_TRUE(s->WaitFor(IsDraining()).has_value()) << worker_->err();
  ASSERT_EQ(worker_->Wait(kWait), 0) << worker_->err();
  const int64_t after_us = absl::ToUnixMicros(absl::Now());

  std::ifstream in(dir_ + "/starts");
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> lines = absl::StrSplit(all, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 2u) << all;
  std::vector<std::string> ids;
  for (const std::string& line : lines) {
    std::vector<std::string> f = absl::StrSplit(line, ' ');
    ASSERT_EQ(f.size(), 3u) << line;
    ids.push_back(f[0]);
    EXPECT_EQ(f[1], "1") << line;
    int64_t us = 0;
    ASSERT_TRUE(absl::SimpleAtoi(f[2], &us)) << line;
    EXPECT_GE(us, before_us) << line;
    EXPECT_LE(us, after_us) << line;
  }
  EXPECT_THAT(ids, ::testing::UnorderedElementsAre("j1", "j2"));
  EXPECT_THAT(Journal(), ::testing::SizeIs(4));  // --journal is unchanged alongside it
}

// One assignment of type "a" whose payload is `payload`.
v1::DaemonMessage AssignPayload(const std::string& id, const std::string& payload) {
  v1::DaemonMessage m = Assign({{id, "a"}});
  m.mutable_assign()->mutable_assignments(0)->set_payload(payload);
  return m;
}

// Journal lines are `start job=J attempt=N ms=T` / `end job=J attempt=N ok=B ms=T`: T of `line`.
int64_t JournalMillis(const std::string& line) {
  size_t at = line.rfind(" ms=");
  return at == std::string::npos ? -1 : std::stoll(line.substr(at + 4));
}

TEST_F(DispatchWorkerTest, SleepPayloadSleepsThePayloadsDuration) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--sleep-payload"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(AssignPayload("j1", " 300ms\n")));
  std::optional<v1::WorkerMessage> r = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(r.has_value()) << worker_->err();
  EXPECT_EQ(r->result().output(), "slept 300ms");
  std::vector<std::string> journal = Journal();
  ASSERT_EQ(journal.size(), 2u);
  // A lower bound only: the sleep never ends early, however slow the machine.
  EXPECT_GE(JournalMillis(journal[1]) - JournalMillis(journal[0]), 300);
}

TEST_F(DispatchWorkerTest, SleepPayloadFailsAPayloadThatIsNoDuration) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--slots", "2", "--sleep-payload"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(AssignPayload("j1", "soon")));
  ASSERT_TRUE(s->Send(AssignPayload("j2", "-1s")));
  std::optional<v1::WorkerMessage> r1 = s->WaitFor(IsResult("j1"));
  std::optional<v1::WorkerMessage> r2 = s->WaitFor(IsResult("j2"));
  ASSERT_TRUE(r1.has_value() && r2.has_value()) << worker_->err();
  EXPECT_THAT(r1->result().failure().message(), HasSubstr("\"soon\" is not a duration"));
  EXPECT_FALSE(r1->result().failure().retryable());
  EXPECT_THAT(r2->result().failure().message(), HasSubstr("\"-1s\" is not a duration"));
}

TEST_F(DispatchWorkerTest, SleepPayloadStopsOnCancel) {
  std::shared_ptr<FakeSession> s = Start({"--types", "a", "--sleep-payload"});
  ASSERT_NE(s, nullptr);
  ASSERT_TRUE(s->Send(AssignPayload("j1", "10m")));
  ASSERT_TRUE(s->WaitFor(IsAccept("j1")).has_value());
  v1::DaemonMessage cancel;
  cancel.mutable_cancel()->set_job_id("j1");
  cancel.mutable_cancel()->set_attempt(1);
  ASSERT_TRUE(s->Send(cancel));
  std::optional<v1::WorkerMessage> r = s->WaitFor(IsResult("j1"));
  ASSERT_TRUE(r.has_value()) << worker_->err();
  EXPECT_THAT(r->result().failure().message(), HasSubstr("cancelled"));
}

TEST_F(DispatchWorkerTest, UsageErrorsExitTwoNamingTheFlag) {
  Subprocess bad_mix({DISPATCH_WORKER_BIN, "--types", "a", "--simulate", "90%:1s"},
                     dir_ + "/bad-mix");
  EXPECT_EQ(bad_mix.Wait(kWait), 2);
  EXPECT_THAT(bad_mix.err(), HasSubstr("--simulate"));
  Subprocess no_types({DISPATCH_WORKER_BIN, "--echo"}, dir_ + "/no-types");
  EXPECT_EQ(no_types.Wait(kWait), 2);
  EXPECT_THAT(no_types.err(), HasSubstr("--types"));
  Subprocess bad_labels({DISPATCH_WORKER_BIN, "--types", "a", "--labels", "gpu"},
                        dir_ + "/bad-labels");
  EXPECT_EQ(bad_labels.Wait(kWait), 2);
  EXPECT_THAT(bad_labels.err(), HasSubstr("--labels"));
  Subprocess two_modes({DISPATCH_WORKER_BIN, "--types", "a", "--sleep-payload", "--echo"},
                       dir_ + "/two-modes");
  EXPECT_EQ(two_modes.Wait(kWait), 2);
  EXPECT_THAT(two_modes.err(), HasSubstr("--sleep-payload"));
}

}  // namespace
}  // namespace dispatchd::client
