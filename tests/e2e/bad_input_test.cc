// Bad input gets a clear error naming what is wrong, and the daemon keeps serving.

#include <fstream>
#include <future>
#include <string>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "dispatchd/v1/worker_service.grpc.pb.h"
#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

class BadInputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("e2e_bad");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = new testing::TestDatabase(*std::move(db));
    dir_ = new TempDir();
    absl::StatusOr<std::unique_ptr<Daemon>> d =
        Daemon::Start({.postgres_url = db_->url(), .max_payload_bytes = 1024}, *dir_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = d->release();
    absl::StatusOr<std::unique_ptr<Worker>> w =
        Worker::Start(daemon_->address(), {.id = "w"}, *dir_);
    ASSERT_TRUE(w.ok()) << w.status();
    worker_ = w->release();
    ASSERT_TRUE(daemon_->WaitForWorkers(1));
  }
  static void TearDownTestSuite() {
    delete worker_;
    delete daemon_;
    delete dir_;
    delete db_;
  }

  // Submits `spec` and returns the gRPC status; afterwards the daemon must still run a job.
  static grpc::Status Submit(const v1::JobSpec& spec) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::SubmitRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitResponse resp;
    return daemon_->jobs().Submit(&ctx, req, &resp);
  }

  void TearDown() override {
    // Whatever was refused, the daemon keeps serving.
    CommandResult run = daemon_->Ctl({"run", "--type", "echo", "--payload", "still here"});
    EXPECT_EQ(run.exit_code, 0) << run.err;
  }

  static testing::TestDatabase* db_;
  static TempDir* dir_;
  static Daemon* daemon_;
  static Worker* worker_;
};

testing::TestDatabase* BadInputTest::db_ = nullptr;
TempDir* BadInputTest::dir_ = nullptr;
Daemon* BadInputTest::daemon_ = nullptr;
Worker* BadInputTest::worker_ = nullptr;

TEST_F(BadInputTest, UnknownTypeIsNamed) {
  grpc::Status s = Submit(Spec("gold", "x"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.type"));
  EXPECT_THAT(s.error_message(), HasSubstr("gold"));
  EXPECT_THAT(s.error_message(), HasSubstr("echo"));  // lists what is configured
}

TEST_F(BadInputTest, MissingTypeIsNamed) {
  grpc::Status s = Submit(Spec("", "x"));
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.type: required"));
}

TEST_F(BadInputTest, EmptyAndOversizedPayloadsAreNamed) {
  grpc::Status empty = Submit(Spec("echo", ""));
  EXPECT_EQ(empty.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(empty.error_message(), HasSubstr("spec.payload"));
  grpc::Status big = Submit(Spec("echo", std::string(1025, 'x')));
  EXPECT_EQ(big.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(big.error_message(), HasSubstr("spec.payload"));
  EXPECT_THAT(big.error_message(), HasSubstr("max_payload_bytes"));
}

TEST_F(BadInputTest, InvalidDurationIsNamed) {
  v1::JobSpec spec = Spec("echo", "x");
  spec.mutable_timeout()->set_seconds(-5);
  grpc::Status s = Submit(spec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.timeout"));

  v1::JobSpec deadline = Spec("echo", "x");
  deadline.mutable_dispatch_deadline()->set_nanos(2'000'000'000);
  grpc::Status s2 = Submit(deadline);
  EXPECT_EQ(s2.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s2.error_message(), HasSubstr("spec.dispatch_deadline"));
}

TEST_F(BadInputTest, BadLabelIsNamed) {
  v1::JobSpec spec = Spec("echo", "x");
  (*spec.mutable_labels())["gpu=h100"] = "yes";
  grpc::Status s = Submit(spec);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("spec.labels"));
}

TEST_F(BadInputTest, CtlRejectsBadDurationFlagBeforeCallingTheDaemon) {
  CommandResult r =
      daemon_->Ctl({"submit", "--type", "echo", "--payload", "x", "--job-timeout", "ten"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("--job-timeout"));
}

TEST_F(BadInputTest, CtlReportsUnknownTypeWithExitTwo) {
  CommandResult r = daemon_->Ctl({"submit", "--type", "gold", "--payload", "x"});
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("INVALID_ARGUMENT"));
  EXPECT_THAT(r.err, HasSubstr("spec.type"));
}

TEST_F(BadInputTest, UnknownJobIdIsNotFound) {
  CommandResult r = daemon_->Ctl({"status", "j_doesnotexist"});
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));
}

// A raw unary call of `method` with `body` as the request bytes.
grpc::Status RawCall(const std::string& address, const std::string& method,
                     const std::string& body) {
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  grpc::Slice slice(body);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  std::promise<grpc::Status> done;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &request, &response,
                 [&done](grpc::Status s) { done.set_value(std::move(s)); });
  return done.get_future().get();
}

// A body that is not protobuf, or a string field that is not UTF-8, reaches the daemon's handler
// and is named: never UNIMPLEMENTED, for unary, server-streaming and bidi methods alike.
TEST_F(BadInputTest, MalformedBodiesAndInvalidUtf8AreInvalidArgumentNamingTheProblem) {
  for (const std::string& garbage : {std::string("\xff\xff\xff\xff"),
                                     std::string("\x0a\x05"
                                                 "ab"),
                                     std::string(64, '\x07')}) {
    for (const char* method :
         {"/dispatchd.v1.JobService/Submit", "/dispatchd.v1.JobService/SubmitBatch",
          "/dispatchd.v1.JobService/RunSync", "/dispatchd.v1.JobService/Status",
          "/dispatchd.v1.JobService/Cancel", "/dispatchd.v1.AdminService/Stats",
          "/dispatchd.v1.AdminService/Reload"}) {
      grpc::Status s = RawCall(daemon_->address(), method, garbage);
      EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
          << method << " " << s.error_message();
      EXPECT_THAT(s.error_message(), HasSubstr("malformed protobuf")) << method;
    }
  }
  // A Submit whose spec.type is not UTF-8 (field 1 of field 1).
  grpc::Status utf8 =
      RawCall(daemon_->address(), "/dispatchd.v1.JobService/Submit", "\x0a\x04\x0a\x02\xc3\x28");
  EXPECT_EQ(utf8.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(utf8.error_message(), HasSubstr("spec.type: not valid UTF-8"));
  // Watch, server-streaming: the job id is not UTF-8.
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    v1::WatchRequest req;
    req.set_job_id("j_\xff\xfe");
    auto reader = daemon_->jobs().Watch(&ctx, req);
    v1::WatchEvent event;
    EXPECT_FALSE(reader->Read(&event));
    grpc::Status s = reader->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("job_id: not valid UTF-8"));
  }
  // Connect, bidi: a Hello whose worker id is not UTF-8 ends the stream naming it.
  {
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    auto stub = v1::WorkerService::NewStub(channel);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto stream = stub->Connect(&ctx);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id("w\xc0\xaf");
    hello.mutable_hello()->add_types("echo");
    hello.mutable_hello()->set_slots(1);
    stream->Write(hello);
    v1::DaemonMessage msg;
    EXPECT_FALSE(stream->Read(&msg));
    grpc::Status s = stream->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("hello.worker_id: not valid UTF-8"));
  }
}

TEST_F(BadInputTest, WorkerWithoutTypesIsRefusedByName) {
  CommandResult r =
      RunCommand({WorkerBin(), "--server", daemon_->address(), "--types", ""}, absl::Seconds(20));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_THAT(r.out + r.err, HasSubstr("types"));
}

// Daemon start-up failures: exit non-zero with a message naming what is wrong.
class StartupErrorTest : public ::testing::Test {
 protected:
  CommandResult StartWithConfig(const std::string& yaml) {
    std::string path = dir_.File("bad.yaml");
    std::ofstream(path) << yaml;
    return RunCommand({DispatchdBin(), "--config", path}, absl::Seconds(60));
  }
  TempDir dir_;
};

TEST_F(StartupErrorTest, MalformedConfigNamesFileLineAndKey) {
  CommandResult r = StartWithConfig(
      "listen: 127.0.0.1:0\n"
      "types:\n"
      "  - name: echo\n"
      "    timeout: ten\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(absl::StrCat(dir_.File("bad.yaml"), ":4:")));
  EXPECT_THAT(r.err, HasSubstr("types[0].timeout"));
}

TEST_F(StartupErrorTest, UnknownKeyIsAnError) {
  CommandResult r = StartWithConfig("listen: 127.0.0.1:0\nlisten_addr: x\ntypes: [{name: echo}]\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr(":2:"));
  EXPECT_THAT(r.err, HasSubstr("listen_addr"));
}

TEST_F(StartupErrorTest, BrokenYamlNamesThePosition) {
  CommandResult r = StartWithConfig("types: [ {name: echo\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("bad.yaml:"));
}

TEST_F(StartupErrorTest, InvalidValueNamesTheKey) {
  CommandResult r =
      StartWithConfig("types:\n  - name: echo\n  - name: embed\n    max_concurrency: 0\n");
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("types[1].max_concurrency: must be >= 1, got 0"));
}

TEST_F(StartupErrorTest, MissingConfigFileIsNamed) {
  CommandResult r = RunCommand({DispatchdBin(), "--config", dir_.File("nope.yaml")});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("nope.yaml"));
}

TEST_F(StartupErrorTest, UnreachableDatabaseExitsNamingTheUrlKey) {
  CommandResult r = StartWithConfig(
      "listen: 127.0.0.1:0\n"
      "postgres:\n"
      "  url: postgresql://nobody@127.0.0.1:1/none\n"
      "  connect_wait: 1s\n"
      "types: [{name: echo}]\n");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("postgres.url"));
  EXPECT_THAT(r.err, HasSubstr("127.0.0.1:1"));
}

TEST(VersionTest, PrintsVersion) {
  CommandResult r = RunCommand({DispatchdBin(), "--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_THAT(r.out, HasSubstr("dispatchd "));
}

}  // namespace
}  // namespace dispatchd::e2e
