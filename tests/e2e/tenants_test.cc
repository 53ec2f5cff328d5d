// Tenants against a real daemon and worker: Status of a queued job names its tenant and its
// shares, Stats and `dispatchctl stats` list the tenants, and the fair-share accounts survive a
// restart of the daemon. Principals come from a tokens file on loopback.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "dispatchd/v1/job_service.grpc.pb.h"
#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

class TenantsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("e2e_tenants");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::make_unique<testing::TestDatabase>(*std::move(db));
    WriteTokensFile(dir_, {{"alice", "client", ""},
                           {"bob", "client", ""},
                           {"ops", "admin", ""},
                           {"gpu", "worker", "types=echo"}});
    DaemonOptions options{.postgres_url = db_->url()};
    options.extra_yaml = absl::StrCat("auth:\n  tokens_file: ", dir_.File("tokens"),
                                      "\ntenants:\n"
                                      "  - {name: research, principals: [alice], weight: 3}\n");
    absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(options, dir_);
    ASSERT_TRUE(d.ok()) << d.status();
    daemon_ = *std::move(d);
    Connect();
  }

  void Connect() {
    auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
    jobs_ = v1::JobService::NewStub(channel);
    admin_ = v1::AdminService::NewStub(channel);
  }

  std::unique_ptr<grpc::ClientContext> As(const std::string& who) {
    auto ctx = std::make_unique<grpc::ClientContext>();
    ctx->AddMetadata("authorization", BearerOf(dir_, who));
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ctx;
  }

  std::string Submit(const std::string& who, const std::string& payload) {
    v1::SubmitRequest req;
    *req.mutable_spec() = Spec("echo", payload);
    v1::SubmitResponse resp;
    grpc::Status s = jobs_->Submit(As(who).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job_id();
  }

  v1::Job StatusOf(const std::string& who, const std::string& id) {
    v1::StatusRequest req;
    req.set_job_id(id);
    v1::StatusResponse resp;
    grpc::Status s = jobs_->Status(As(who).get(), req, &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp.job();
  }

  v1::StatsResponse Stats() {
    v1::StatsResponse resp;
    grpc::Status s = admin_->Stats(As("ops").get(), v1::StatsRequest(), &resp);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return resp;
  }

  const v1::TenantStats* TenantIn(const v1::StatsResponse& stats, const std::string& name) {
    for (const v1::TenantStats& t : stats.tenants()) {
      if (t.tenant() == name) return &t;
    }
    return nullptr;
  }

  std::unique_ptr<Worker> StartWorker(int slots, std::vector<std::string> mode) {
    std::vector<std::string> args = {"--token-file", dir_.File("gpu.token")};
    args.insert(args.end(), mode.begin(), mode.end());
    absl::StatusOr<std::unique_ptr<Worker>> w =
        Worker::Start(daemon_->address(), {.id = "w1", .slots = slots, .mode = args}, dir_);
    EXPECT_TRUE(w.ok()) << w.status();
    return w.ok() ? *std::move(w) : nullptr;
  }

  TempDir dir_;
  std::unique_ptr<testing::TestDatabase> db_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(TenantsTest, StatusAndStatsNameTheTenantAndItsShares) {
  std::unique_ptr<Worker> w = StartWorker(1, {"--simulate", "100%:60s"});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(WaitFor([&] { return Stats().slots_total() == 1; }, absl::Seconds(30)));
  const std::string a1 = Submit("alice", "runs");
  ASSERT_TRUE(WaitFor([&] { return StatusOf("alice", a1).state() == v1::JOB_STATE_RUNNING; },
                      absl::Seconds(30)));
  const std::string b1 = Submit("bob", "waits");
  const std::string a2 = Submit("alice", "waits too");

  // bob is a tenant of his own, of weight 1 against research's 3, and runs nothing.
  v1::Job b = StatusOf("bob", b1);
  EXPECT_EQ(b.wait_reason(), "workers_busy");
  EXPECT_EQ(b.tenant(), "bob");
  EXPECT_DOUBLE_EQ(b.tenant_share(), 0);
  EXPECT_DOUBLE_EQ(b.tenant_fair_share(), 0.25);
  EXPECT_DOUBLE_EQ(b.key_fair_share(), 1);
  v1::Job a = StatusOf("alice", a2);
  EXPECT_EQ(a.tenant(), "research");
  EXPECT_DOUBLE_EQ(a.tenant_share(), 1);
  EXPECT_DOUBLE_EQ(a.tenant_fair_share(), 0.75);

  v1::StatsResponse stats = Stats();
  const v1::TenantStats* research = TenantIn(stats, "research");
  ASSERT_NE(research, nullptr);
  EXPECT_EQ(research->weight(), 3);
  EXPECT_EQ(research->running(), 1);
  EXPECT_EQ(research->queued(), 1);
  const v1::TenantStats* bob = TenantIn(stats, "bob");
  ASSERT_NE(bob, nullptr);
  EXPECT_EQ(bob->queued(), 1);
  for (const v1::KeyStats& k : stats.keys()) {
    if (k.fairness_key() == "alice") {
      EXPECT_EQ(k.tenant(), "research");
    }
  }

  CommandResult out = daemon_->Ctl({"--token-file", dir_.File("ops.token"), "stats"});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_THAT(out.out, HasSubstr("TENANT"));
  EXPECT_THAT(out.out, HasSubstr("research"));
  out = daemon_->Ctl({"--token-file", dir_.File("bob.token"), "status", b1});
  EXPECT_THAT(out.out, HasSubstr("bob: 0% of the running jobs, fair 25%"));
}

TEST_F(TenantsTest, AccountsSurviveARestart) {
  std::unique_ptr<Worker> w = StartWorker(2, {"--simulate", "100%:50ms"});
  ASSERT_NE(w, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) ids.push_back(Submit("alice", absl::StrCat("job ", i)));
  ASSERT_TRUE(WaitFor(
      [&] {
        for (const std::string& id : ids) {
          if (StatusOf("alice", id).state() != v1::JOB_STATE_SUCCEEDED) return false;
        }
        return true;
      },
      absl::Seconds(60)));
  // Research has been served about 20 x 50 ms / weight 3; the leader saves every second.
  const v1::TenantStats* before = TenantIn(Stats(), "research");
  ASSERT_NE(before, nullptr);
  const double cost = before->cost();
  EXPECT_GT(cost, 0.2);
  absl::SleepFor(absl::Milliseconds(2500));
  w.reset();
  ASSERT_TRUE(daemon_->Restart().ok());
  Connect();
  ASSERT_TRUE(WaitFor([&] { return TenantIn(Stats(), "research") != nullptr; }, absl::Seconds(30)));
  EXPECT_NEAR(TenantIn(Stats(), "research")->cost(), cost, 1e-6);
}

}  // namespace
}  // namespace dispatchd::e2e
