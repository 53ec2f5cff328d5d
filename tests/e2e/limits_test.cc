// The limits on what one request may carry and on what one principal may hold open or send
// (`limits.*`): at each limit the call works, one past it is refused with the status and the
// limit's name, other principals are not affected, and the daemon keeps serving. Principals come
// from a tokens file on loopback (gRPC's local credentials, no TLS).

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "dispatchd/v1/job_service.grpc.pb.h"
#include "dispatchd/v1/worker_service.grpc.pb.h"
#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

class LimitsTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure()) return;
    WriteTokensFile(dir_, {{"alice", "client", ""},
                           {"bob", "client", ""},
                           {"front", "gateway", ""},
                           {"check", "client", ""},
                           {"gpu", "worker", "types=echo"},
                           {"gpu2", "worker", "types=echo"}});
  }

  // Starts the daemon with `limits` (YAML lines under `limits:`).
  void Start(const std::string& limits) {
    DaemonOptions options;
    options.extra_yaml =
        absl::StrCat("auth:\n  tokens_file: ", dir_.File("tokens"), "\nlimits:\n", limits);
    daemon_ = E2eTest::StartDaemon(options);
    ASSERT_NE(daemon_, nullptr);
    channel_ = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel_);
    workers_ = v1::WorkerService::NewStub(channel_);
  }

  void TearDown() override {
    if (daemon_ == nullptr) return;
    // Whatever was refused, the daemon keeps serving.
    std::string id;
    grpc::Status s = Submit("check", Spec("echo", "still here"), &id);
    EXPECT_TRUE(s.ok()) << s.error_message();
  }

  // A context acting as `who`, with a deadline.
  std::unique_ptr<grpc::ClientContext> As(const std::string& who) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", BearerOf(dir_, who));
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  grpc::Status Submit(const std::string& who, const v1::JobSpec& spec, std::string* id = nullptr,
                      grpc::ClientContext* ctx = nullptr) {
    std::unique_ptr<grpc::ClientContext> own;
    if (ctx == nullptr) {
      own = As(who);
      ctx = own.get();
    }
    v1::SubmitRequest req;
    *req.mutable_spec() = spec;
    v1::SubmitResponse resp;
    grpc::Status s = jobs_->Submit(ctx, req, &resp);
    if (id != nullptr) *id = resp.job_id();
    return s;
  }

  grpc::Status StatusOf(const std::string& who, const std::string& job_id) {
    std::unique_ptr<grpc::ClientContext> ctx = As(who);
    v1::StatusRequest req;
    req.set_job_id(job_id);
    v1::StatusResponse resp;
    return jobs_->Status(ctx.get(), req, &resp);
  }

  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::WorkerService::Stub> workers_;
};

void ExpectRefused(const grpc::Status& s, grpc::StatusCode code, const std::string& limit) {
  EXPECT_EQ(s.error_code(), code) << s.error_message();
  EXPECT_THAT(s.error_message(), HasSubstr(limit));
}

TEST_F(LimitsTest, MessageSizeAtTheLimitPassesAndOneBytePastIsRefused) {
  Start("  max_message_bytes: 131072\n");
  // A batch of three payloads (each under max_payload_bytes, 65536) whose request is exactly the
  // limit; the last payload is trimmed until it is.
  v1::SubmitBatchRequest req;
  for (int i = 0; i < 3; ++i) *req.add_specs() = Spec("echo", std::string(43000, 'x'));
  for (int i = 0; i < 8 && req.ByteSizeLong() != 131072; ++i) {
    std::string* payload = req.mutable_specs(2)->mutable_payload();
    payload->resize(payload->size() + (131072 - static_cast<int64_t>(req.ByteSizeLong())), 'x');
  }
  ASSERT_EQ(req.ByteSizeLong(), 131072u);
  {
    std::unique_ptr<grpc::ClientContext> ctx = As("alice");
    v1::SubmitBatchResponse resp;
    grpc::Status s = jobs_->SubmitBatch(ctx.get(), req, &resp);
    ASSERT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(resp.results_size(), 3);
  }
  req.mutable_specs(2)->mutable_payload()->push_back('x');
  ASSERT_EQ(req.ByteSizeLong(), 131073u);
  std::unique_ptr<grpc::ClientContext> ctx = As("alice");
  v1::SubmitBatchResponse resp;
  ExpectRefused(jobs_->SubmitBatch(ctx.get(), req, &resp), grpc::StatusCode::RESOURCE_EXHAUSTED,
                "131072");
}

TEST_F(LimitsTest, LabelCountAndLengthAtTheLimitPassAndOnePastIsRefused) {
  Start("  max_labels: 3\n  max_label_bytes: 16\n");
  v1::JobSpec spec = Spec("echo", "x");
  (*spec.mutable_labels())["a"] = std::string(16, 'v');
  (*spec.mutable_labels())["b"] = "2";
  (*spec.mutable_labels())[std::string(16, 'k')] = "3";
  EXPECT_TRUE(Submit("alice", spec).ok());

  v1::JobSpec four = spec;
  (*four.mutable_labels())["d"] = "4";
  ExpectRefused(Submit("alice", four), grpc::StatusCode::INVALID_ARGUMENT, "limits.max_labels");

  v1::JobSpec long_value = spec;
  (*long_value.mutable_labels())["a"] = std::string(17, 'v');
  grpc::Status s = Submit("alice", long_value);
  ExpectRefused(s, grpc::StatusCode::INVALID_ARGUMENT, "limits.max_label_bytes");
  EXPECT_THAT(s.error_message(), HasSubstr("spec.labels[a]"));

  v1::JobSpec long_key = Spec("echo", "x");
  (*long_key.mutable_labels())[std::string(17, 'k')] = "1";
  ExpectRefused(Submit("alice", long_key), grpc::StatusCode::INVALID_ARGUMENT,
                "limits.max_label_bytes");
}

TEST_F(LimitsTest, KeyAndIdLengthsAtTheLimitPassAndOnePastIsRefused) {
  Start("  max_key_bytes: 24\n  max_id_bytes: 40\n");
  for (const char* field : {"idempotency_key", "resource_id"}) {
    SCOPED_TRACE(field);
    auto set = [field](v1::JobSpec* spec, const std::string& value) {
      if (std::string(field) == "idempotency_key") {
        spec->set_idempotency_key(value);
      } else {
        spec->set_resource_id(value);
      }
    };
    v1::JobSpec at = Spec("echo", "x");
    set(&at, std::string(24, 'k'));
    EXPECT_TRUE(Submit("alice", at).ok());
    v1::JobSpec past = Spec("echo", "x");
    set(&past, std::string(25, 'k'));
    grpc::Status s = Submit("alice", past);
    ExpectRefused(s, grpc::StatusCode::INVALID_ARGUMENT, "limits.max_key_bytes");
    EXPECT_THAT(s.error_message(), HasSubstr(absl::StrCat("spec.", field)));
  }
  // Only a gateway chooses fairness keys, so only its keys meet the limit.
  v1::JobSpec gateway_at = Spec("echo", "x");
  gateway_at.set_fairness_key(std::string(24, 'u'));
  EXPECT_TRUE(Submit("front", gateway_at).ok());
  v1::JobSpec gateway_past = Spec("echo", "x");
  gateway_past.set_fairness_key(std::string(25, 'u'));
  ExpectRefused(Submit("front", gateway_past), grpc::StatusCode::INVALID_ARGUMENT,
                "limits.max_key_bytes");

  // A job id at the limit is looked up (and is no one's job); one past it is refused unread.
  EXPECT_EQ(StatusOf("alice", std::string(40, 'j')).error_code(), grpc::StatusCode::NOT_FOUND);
  ExpectRefused(StatusOf("alice", std::string(41, 'j')), grpc::StatusCode::INVALID_ARGUMENT,
                "limits.max_id_bytes");

  // A worker id likewise.
  for (int length : {40, 41}) {
    SCOPED_TRACE(length);
    std::unique_ptr<grpc::ClientContext> ctx = As("gpu");
    auto stream = workers_->Connect(ctx.get());
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(std::string(length, 'w'));
    hello.mutable_hello()->add_types("echo");
    hello.mutable_hello()->set_slots(1);
    ASSERT_TRUE(stream->Write(hello));
    v1::DaemonMessage reply;
    const bool welcomed = stream->Read(&reply) && reply.has_welcome();
    stream->WritesDone();
    grpc::Status s = stream->Finish();
    if (length == 40) {
      EXPECT_TRUE(welcomed) << s.error_message();
    } else {
      EXPECT_FALSE(welcomed);
      ExpectRefused(s, grpc::StatusCode::INVALID_ARGUMENT, "limits.max_id_bytes");
    }
  }
}

// A worker stream of `who` that has been welcomed, or the status that ended it.
struct OpenStream {
  std::unique_ptr<grpc::ClientContext> ctx;
  std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage, v1::DaemonMessage>> stream;
  grpc::Status refused;

  bool open() const { return stream != nullptr; }
  void Close() {
    stream->WritesDone();
    (void)stream->Finish();
    stream.reset();
  }
};

TEST_F(LimitsTest, WorkerStreamsPerPrincipalAtTheLimitPassAndOnePastIsRefused) {
  Start("  worker_streams_per_principal: 2\n");
  auto connect = [this](const std::string& who, const std::string& id) {
    OpenStream out;
    out.ctx = As(who);
    out.ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto stream = workers_->Connect(out.ctx.get());
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(id);
    hello.mutable_hello()->add_types("echo");
    hello.mutable_hello()->set_slots(1);
    v1::DaemonMessage reply;
    if (stream->Write(hello) && stream->Read(&reply) && reply.has_welcome()) {
      out.stream = std::move(stream);
    } else {
      stream->WritesDone();
      out.refused = stream->Finish();
    }
    return out;
  };
  OpenStream first = connect("gpu", "w1");
  OpenStream second = connect("gpu", "w2");
  ASSERT_TRUE(first.open()) << first.refused.error_message();
  ASSERT_TRUE(second.open()) << second.refused.error_message();
  OpenStream third = connect("gpu", "w3");
  ASSERT_FALSE(third.open());
  ExpectRefused(third.refused, grpc::StatusCode::RESOURCE_EXHAUSTED,
                "limits.worker_streams_per_principal");
  // Another principal has its own count.
  OpenStream other = connect("gpu2", "w1");
  EXPECT_TRUE(other.open()) << other.refused.error_message();
  // Closing a stream frees its place (once the daemon has seen the stream end).
  first.Close();
  OpenStream again;
  EXPECT_TRUE(WaitFor(
      [&] {
        again = connect("gpu", "w3");
        return again.open();
      },
      absl::Seconds(10)))
      << again.refused.error_message();
  for (OpenStream* s : {&second, &other, &again}) {
    if (s->open()) s->Close();
  }
}

TEST_F(LimitsTest, WatchesPerPrincipalAtTheLimitPassAndOnePastIsRefused) {
  Start("  watches_per_principal: 2\n");
  // No worker serves echo, so the jobs stay queued and their watches stay open.
  std::string alice_job, bob_job;
  ASSERT_TRUE(Submit("alice", Spec("echo", "a"), &alice_job).ok());
  ASSERT_TRUE(Submit("bob", Spec("echo", "b"), &bob_job).ok());
  struct OpenWatch {
    std::unique_ptr<grpc::ClientContext> ctx;
    std::unique_ptr<grpc::ClientReader<v1::WatchEvent>> reader;
    grpc::Status refused;
  };
  auto watch = [this](const std::string& who, const std::string& job) {
    OpenWatch w;
    w.ctx = As(who);
    v1::WatchRequest req;
    req.set_job_id(job);
    w.reader = jobs_->Watch(w.ctx.get(), req);
    v1::WatchEvent first;
    if (!w.reader->Read(&first)) {
      w.refused = w.reader->Finish();
      w.reader.reset();
    }
    return w;
  };
  OpenWatch one = watch("alice", alice_job);
  OpenWatch two = watch("alice", alice_job);
  ASSERT_NE(one.reader, nullptr) << one.refused.error_message();
  ASSERT_NE(two.reader, nullptr) << two.refused.error_message();
  OpenWatch three = watch("alice", alice_job);
  ASSERT_EQ(three.reader, nullptr);
  ExpectRefused(three.refused, grpc::StatusCode::RESOURCE_EXHAUSTED,
                "limits.watches_per_principal");
  OpenWatch bobs = watch("bob", bob_job);
  EXPECT_NE(bobs.reader, nullptr) << bobs.refused.error_message();
  // Cancelling a watch frees its place.
  one.ctx->TryCancel();
  (void)one.reader->Finish();
  OpenWatch again;
  EXPECT_TRUE(WaitFor(
      [&] {
        again = watch("alice", alice_job);
        return again.reader != nullptr;
      },
      absl::Seconds(10)))
      << again.refused.error_message();
  for (OpenWatch* w : {&two, &bobs, &again}) {
    if (w->reader == nullptr) continue;
    w->ctx->TryCancel();
    (void)w->reader->Finish();
  }
}

TEST_F(LimitsTest, SubmitRatePerPrincipalRefusesWithRetryAfterAndSparesOthers) {
  Start("  submit_rate: 1\n  submit_burst: 4\n");
  // The bucket holds 4 jobs and refills one a second: alice gets the 4, plus at most one per
  // second that passes while she submits, then a refusal with a hint.
  const absl::Time start = absl::Now();
  int accepted = 0;
  grpc::Status refused;
  std::string retry_after;
  for (int i = 0; i < 20; ++i) {
    std::unique_ptr<grpc::ClientContext> ctx = As("alice");
    grpc::Status s = Submit("alice", Spec("echo", "x"), nullptr, ctx.get());
    if (s.ok()) {
      ++accepted;
      continue;
    }
    refused = s;
    auto it = ctx->GetServerTrailingMetadata().find("retry-after-ms");
    if (it != ctx->GetServerTrailingMetadata().end()) {
      retry_after = std::string(it->second.data(), it->second.size());
    }
    break;
  }
  const double elapsed_s = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_GE(accepted, 4);
  EXPECT_LE(accepted, 4 + static_cast<int>(elapsed_s) + 1);
  ExpectRefused(refused, grpc::StatusCode::RESOURCE_EXHAUSTED, "limits.submit_rate");
  int retry_ms = 0;
  ASSERT_TRUE(absl::SimpleAtoi(retry_after, &retry_ms)) << "retry-after-ms: " << retry_after;
  EXPECT_GT(retry_ms, 0);
  EXPECT_LE(retry_ms, 1000);

  // Bob has his own bucket.
  EXPECT_TRUE(Submit("bob", Spec("echo", "b")).ok());
  // A batch larger than the burst could never pass: refused as such, not with a retry hint.
  v1::SubmitBatchRequest batch;
  for (int i = 0; i < 5; ++i) *batch.add_specs() = Spec("echo", "x");
  std::unique_ptr<grpc::ClientContext> ctx = As("bob");
  v1::SubmitBatchResponse resp;
  ExpectRefused(jobs_->SubmitBatch(ctx.get(), batch, &resp), grpc::StatusCode::INVALID_ARGUMENT,
                "limits.submit_burst");
  // After the hint, alice may submit again.
  absl::SleepFor(absl::Milliseconds(retry_ms));
  EXPECT_TRUE(Submit("alice", Spec("echo", "again")).ok());
}

}  // namespace
}  // namespace dispatchd::e2e
