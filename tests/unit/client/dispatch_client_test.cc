// Client library against an in-test fake JobService/AdminService on 127.0.0.1:0.

#include "client/cpp/dispatch_client.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <grpcpp/grpcpp.h>

#include "tests/testing/status_matchers.h"
#include "tests/unit/client/subprocess.h"

namespace dispatchd::client {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::Optional;

class FakeJobService final : public v1::JobService::Service {
 public:
  std::atomic<int> unimplemented_calls = 0;

  grpc::Status Submit(grpc::ServerContext* context, const v1::SubmitRequest* request,
                      v1::SubmitResponse* response) override {
    if (request->spec().type() == "full") {
      context->AddTrailingMetadata("retry-after-ms", "1500");
      return {grpc::StatusCode::RESOURCE_EXHAUSTED, "admission ceiling reached"};
    }
    if (request->spec().type().empty()) {
      return {grpc::StatusCode::INVALID_ARGUMENT, "spec.type: required"};
    }
    // "unimplemented": answered UNIMPLEMENTED, `payload` times ("always": every time).
    if (request->spec().type() == "unimplemented") {
      const int n = ++unimplemented_calls;
      const std::string& times = request->spec().payload();
      if (times == "always" || n <= std::stoi(times)) return {grpc::StatusCode::UNIMPLEMENTED, ""};
    }
    response->set_job_id("job-" + request->spec().payload());
    response->set_deduplicated(!request->spec().idempotency_key().empty());
    return grpc::Status::OK;
  }
  grpc::Status RunSync(grpc::ServerContext*, const v1::RunSyncRequest* request,
                       v1::RunSyncResponse* response) override {
    v1::Job* job = response->mutable_job();
    job->set_id("job-" + request->spec().payload());
    if (request->spec().payload() == "fail") {
      job->set_state(v1::JOB_STATE_FAILED);
      job->set_error("it broke");
    } else {
      job->set_state(v1::JOB_STATE_SUCCEEDED);
      job->set_result(request->spec().payload());
    }
    return grpc::Status::OK;
  }
  grpc::Status Status(grpc::ServerContext* context, const v1::StatusRequest* request,
                      v1::StatusResponse* response) override {
    if (request->job_id() == "slow") {
      // Holds the call until the client's deadline cancels it (bounded).
      absl::Time give_up = absl::Now() + absl::Seconds(5);
      while (!context->IsCancelled() && absl::Now() < give_up)
        absl::SleepFor(absl::Milliseconds(2));
      return grpc::Status::CANCELLED;
    }
    if (request->job_id() != "j1") return {grpc::StatusCode::NOT_FOUND, "no job j1"};
    response->mutable_job()->set_id("j1");
    response->mutable_job()->set_state(v1::JOB_STATE_RUNNING);
    return grpc::Status::OK;
  }
  grpc::Status Cancel(grpc::ServerContext*, const v1::CancelRequest*,
                      v1::CancelResponse*) override {
    return {grpc::StatusCode::FAILED_PRECONDITION, "job already ended"};
  }
  grpc::Status Watch(grpc::ServerContext*, const v1::WatchRequest* request,
                     grpc::ServerWriter<v1::WatchEvent>* writer) override {
    for (v1::JobState s : {v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED}) {
      v1::WatchEvent e;
      e.mutable_job()->set_id(request->job_id());
      e.mutable_job()->set_state(s);
      writer->Write(e);
    }
    return grpc::Status::OK;
  }
};

class FakeAdminService final : public v1::AdminService::Service {
 public:
  grpc::Status Stats(grpc::ServerContext*, const v1::StatsRequest*,
                     v1::StatsResponse* response) override {
    response->set_workers(2);
    response->set_slots_total(5);
    return grpc::Status::OK;
  }
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&jobs_);
    builder.RegisterService(&admin_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    address_ = "127.0.0.1:" + std::to_string(port);
    absl::StatusOr<std::unique_ptr<Client>> client =
        Client::Connect(address_, {.default_deadline = absl::Milliseconds(500)});
    ASSERT_THAT(client, IsOk());
    client_ = *std::move(client);
  }
  void TearDown() override { server_->Shutdown(std::chrono::system_clock::now()); }

  FakeJobService jobs_;
  FakeAdminService admin_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<Client> client_;
  std::string address_;
};

TEST_F(ClientTest, SubmitReturnsTheJobId) {
  v1::JobSpec spec;
  spec.set_type("echo");
  spec.set_payload("x");
  absl::StatusOr<v1::SubmitResponse> r = client_->Submit(spec);
  ASSERT_THAT(r, IsOk());
  EXPECT_EQ(r->job_id(), "job-x");
  EXPECT_FALSE(r->deduplicated());
}

// The client sends each call once: a status, UNIMPLEMENTED included, is the caller's to see.
TEST_F(ClientTest, CallAnsweredUnimplementedIsNotSentAgain) {
  v1::JobSpec spec;
  spec.set_type("unimplemented");
  spec.set_payload("always");
  EXPECT_THAT(client_->Submit(spec), StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_EQ(jobs_.unimplemented_calls, 1);
}

TEST_F(ClientTest, ResourceExhaustedCarriesRetryAfter) {
  v1::JobSpec spec;
  spec.set_type("full");
  absl::StatusOr<v1::SubmitResponse> r = client_->Submit(spec);
  EXPECT_THAT(r, StatusIs(absl::StatusCode::kResourceExhausted, "retry after 1500ms"));
  EXPECT_THAT(RetryAfter(r.status()), Optional(absl::Milliseconds(1500)));
}

TEST_F(ClientTest, StatusCodesMapOneToOne) {
  EXPECT_THAT(client_->Submit(v1::JobSpec()),
              StatusIs(absl::StatusCode::kInvalidArgument, "spec.type"));
  EXPECT_THAT(client_->Status("nope"), StatusIs(absl::StatusCode::kNotFound, "no job"));
  EXPECT_THAT(client_->Cancel("j1"), StatusIs(absl::StatusCode::kFailedPrecondition));
  absl::StatusOr<v1::Job> job = client_->Status("j1");
  ASSERT_THAT(job, IsOk());
  EXPECT_EQ(job->state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(RetryAfter(absl::NotFoundError("x")), std::nullopt);
}

TEST_F(ClientTest, EveryCallHasADeadline) {
  EXPECT_THAT(client_->Status("slow"), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(ClientTest, WatchDeliversEveryEventThenEnds) {
  std::vector<v1::JobState> states;
  EXPECT_THAT(
      client_->Watch(
          "j1", [&](const v1::Job& job) { states.push_back(job.state()); }, absl::Seconds(5)),
      IsOk());
  EXPECT_THAT(states,
              ElementsAre(v1::JOB_STATE_QUEUED, v1::JOB_STATE_RUNNING, v1::JOB_STATE_SUCCEEDED));
}

TEST_F(ClientTest, AdminCallsWork) {
  absl::StatusOr<v1::StatsResponse> stats = client_->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->slots_total(), 5);
  // Not implemented by the fake: UNIMPLEMENTED passes through.
  EXPECT_THAT(client_->ListWorkers(), StatusIs(absl::StatusCode::kUnimplemented));
}

TEST_F(ClientTest, ListOfDaemonsFallsThroughToOneThatAnswers) {
  // Port 1 on loopback has nothing listening: calls go to the next daemon in the list.
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect("127.0.0.1:1," + address_, {.default_deadline = absl::Seconds(10)});
  ASSERT_THAT(client, IsOk());
  absl::StatusOr<v1::StatsResponse> stats = (*client)->Stats();
  ASSERT_THAT(stats, IsOk());
  EXPECT_EQ(stats->slots_total(), 5);
}

TEST(ClientConnectTest, ListsOfDaemonsTakeNumericAddresses) {
  absl::StatusOr<std::string> target = ChannelTarget("127.0.0.1:7411, 10.0.0.2:7411");
  ASSERT_THAT(target, IsOk());
  EXPECT_EQ(*target, "ipv4:127.0.0.1:7411,10.0.0.2:7411");
  EXPECT_EQ(*ChannelTarget("daemon.example:7411"), "daemon.example:7411");
  EXPECT_THAT(ChannelTarget("a.example:1,b.example:1"),
              StatusIs(absl::StatusCode::kInvalidArgument, "numeric IPv4"));
  EXPECT_THAT(ChannelTarget("127.0.0.1:1,"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ClientConnectTest, RejectsAnEmptyAddress) {
  EXPECT_THAT(Client::Connect(""), StatusIs(absl::StatusCode::kInvalidArgument, "address"));
}

TEST(ClientConnectTest, UnreachableDaemonIsUnavailable) {
  // Port 1 on loopback: nothing listens there.
  absl::StatusOr<std::unique_ptr<Client>> client =
      Client::Connect("127.0.0.1:1", {.default_deadline = absl::Seconds(2)});
  ASSERT_THAT(client, IsOk());
  absl::StatusOr<v1::Job> job = (*client)->Status("j1");
  EXPECT_TRUE(job.status().code() == absl::StatusCode::kUnavailable ||
              job.status().code() == absl::StatusCode::kDeadlineExceeded)
      << job.status();
}

// dispatchctl, run as a child process against the same fakes.
class DispatchctlTest : public ClientTest {
 protected:
  struct Outcome {
    int code = -1;
    std::string out, err;
  };
  Outcome Ctl(std::vector<std::string> args) {
    args.insert(args.begin(), {DISPATCHCTL_BIN, "--server", address_});
    fake::Subprocess p(args, dir_ + "/ctl" + std::to_string(++n_));
    Outcome o;
    o.code = p.Wait(absl::Seconds(10)).value_or(-1);
    o.out = p.out();
    o.err = p.err();
    return o;
  }
  fake::TempDir tmp_;
  std::string dir_ = tmp_.path();
  int n_ = 0;
};

TEST_F(DispatchctlTest, SubmitAndRun) {
  Outcome submit = Ctl({"submit", "--type", "echo", "--payload", "hi"});
  EXPECT_EQ(submit.code, 0) << submit.err;
  EXPECT_EQ(submit.out, "job-hi\n");
  Outcome run = Ctl({"run", "--type", "echo", "--payload", "hello"});
  EXPECT_EQ(run.code, 0) << run.err;
  EXPECT_EQ(run.out, "hello");  // exactly the result bytes when stdout is not a TTY
  Outcome failed = Ctl({"run", "--type", "echo", "--payload", "fail"});
  EXPECT_EQ(failed.code, 1);
  EXPECT_THAT(failed.err, ::testing::HasSubstr("it broke"));
  Outcome json = Ctl({"--json", "run", "--type", "echo", "--payload", "x"});
  EXPECT_EQ(json.code, 0);
  EXPECT_THAT(json.out, ::testing::HasSubstr("\"state\":\"JOB_STATE_SUCCEEDED\""));
  EXPECT_THAT(json.out, ::testing::HasSubstr("\"id\":\"job-x\""));
}

TEST_F(DispatchctlTest, StatusHumanAndJson) {
  Outcome human = Ctl({"status", "j1"});
  EXPECT_EQ(human.code, 4) << human.err;  // still active
  EXPECT_THAT(human.out, ::testing::HasSubstr("state:"));
  EXPECT_THAT(human.out, ::testing::HasSubstr("RUNNING"));
  EXPECT_THAT(human.out, ::testing::HasSubstr("created"));
  Outcome json = Ctl({"--json", "status", "j1"});
  EXPECT_EQ(json.code, 4);
  EXPECT_THAT(json.out, ::testing::StartsWith("{"));
  EXPECT_THAT(json.out, ::testing::HasSubstr("\"max_attempts\":0"));  // primitives printed
}

TEST_F(DispatchctlTest, ErrorsMapToExitCodes) {
  Outcome missing = Ctl({"status", "nope"});
  EXPECT_EQ(missing.code, 5);
  EXPECT_EQ(missing.err, "dispatchctl: NOT_FOUND: no job j1\n");
  Outcome full = Ctl({"submit", "--type", "full", "--payload", "x"});
  EXPECT_EQ(full.code, 6);
  EXPECT_THAT(full.err, ::testing::HasSubstr("retry after 1.5s"));
  EXPECT_EQ(Ctl({"cancel", "j1"}).code, 7);
  EXPECT_EQ(Ctl({"submit", "--type", "", "--payload", "x"}).code, 2);  // INVALID_ARGUMENT
  Outcome deadline = Ctl({"--timeout", "200ms", "status", "slow"});
  EXPECT_EQ(deadline.code, 8);
  EXPECT_THAT(deadline.err, ::testing::HasSubstr("DEADLINE_EXCEEDED"));
}

TEST_F(DispatchctlTest, UsageErrorsNameTheFlag) {
  Outcome timeout = Ctl({"--timeout", "soon", "status", "j1"});
  EXPECT_EQ(timeout.code, 2);
  EXPECT_THAT(timeout.err, ::testing::HasSubstr("--timeout"));
  Outcome label = Ctl({"submit", "--type", "a", "--payload", "x", "--label", "gpu"});
  EXPECT_EQ(label.code, 2);
  EXPECT_THAT(label.err, ::testing::HasSubstr("--label"));
  Outcome deadline = Ctl({"submit", "--type", "a", "--payload", "x", "--job-timeout", "1x"});
  EXPECT_EQ(deadline.code, 2);
  EXPECT_THAT(deadline.err, ::testing::HasSubstr("--job-timeout"));
  EXPECT_EQ(Ctl({"frobnicate"}).code, 2);
  EXPECT_EQ(Ctl({"submit", "--type", "a"}).code, 2);  // no payload
}

TEST_F(DispatchctlTest, WatchPrintsEachStateAndExitsOnTheLast) {
  Outcome watch = Ctl({"watch", "j1"});
  EXPECT_EQ(watch.code, 0) << watch.err;
  std::vector<std::string> lines = absl::StrSplit(watch.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(lines.size(), 3u) << watch.out;
  EXPECT_THAT(lines[0], ::testing::HasSubstr(" QUEUED attempt=0 worker=-"));
  EXPECT_THAT(lines[2], ::testing::HasSubstr(" SUCCEEDED "));
}

TEST(DispatchctlNoDaemonTest, UnreachableDaemonExitsEight) {
  fake::TempDir tmp;
  fake::Subprocess p({DISPATCHCTL_BIN, "--server", "127.0.0.1:1", "--timeout", "2s", "stats"},
                     tmp.path() + "/ctl");
  EXPECT_EQ(p.Wait(absl::Seconds(10)), 8);
  EXPECT_THAT(p.err(), ::testing::StartsWith("dispatchctl: UNAVAILABLE: "));
}

// Every subcommand's help carries a runnable example of itself, and the top-level help lists
// every subcommand with its example.
TEST(DispatchctlNoDaemonTest, EverySubcommandsHelpShowsAnExample) {
  fake::TempDir tmp;
  fake::Subprocess top({DISPATCHCTL_BIN, "--help"}, tmp.path() + "/help");
  ASSERT_EQ(top.Wait(absl::Seconds(10)), 0);
  const std::string top_help = top.out();
  for (const char* sub : {"submit", "run", "status", "cancel", "watch", "workers", "stats",
                          "health", "set-rate-limit", "drain", "reload", "top", "completion"}) {
    EXPECT_THAT(top_help, ::testing::HasSubstr(absl::StrCat("\n  ", sub, " "))) << sub;
    fake::Subprocess help({DISPATCHCTL_BIN, sub, "--help"}, tmp.path() + "/help-" + sub);
    ASSERT_EQ(help.Wait(absl::Seconds(10)), 0) << sub;
    EXPECT_THAT(help.out(),
                ::testing::ContainsRegex(absl::StrCat("Example: .*dispatchctl .*", sub)))
        << sub << ":\n"
        << help.out();
    EXPECT_THAT(help.out(), ::testing::HasSubstr("Exit codes:")) << sub;
  }
}

// `source <(dispatchctl completion bash)` completes subcommands, flags and file names in bash.
TEST(DispatchctlNoDaemonTest, BashCompletionCompletesSubcommandsAndFlags) {
  fake::TempDir tmp;
  const std::string script = tmp.path() + "/complete.sh";
  std::ofstream(script) << "source <(\"$1\" completion bash)\n"
                           "complete_line() { COMP_WORDS=($1); COMP_CWORD=$2; _dispatchctl;"
                           " echo \"${COMPREPLY[*]}\"; }\n"
                           "complete_line 'dispatchctl st' 1\n"
                           "complete_line 'dispatchctl --json s' 2\n"
                           "complete_line 'dispatchctl set-rate-limit m --r' 3\n"
                           "complete_line 'dispatchctl top --i' 2\n";
  fake::Subprocess p({"/bin/bash", script, DISPATCHCTL_BIN}, tmp.path() + "/bash");
  ASSERT_EQ(p.Wait(absl::Seconds(10)), 0) << p.err();
  EXPECT_EQ(p.out(),
            "status stats\n"
            "submit status stats set-rate-limit set-weight\n"
            "--rpm --rps\n"
            "--interval --iterations\n");
}

}  // namespace
}  // namespace dispatchd::client
