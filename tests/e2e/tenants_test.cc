// Tenants against a real daemon and worker: Status of a queued job names its tenant and its
// shares, Stats and `dispatchctl stats` list the tenants, and the fair-share accounts survive a
// restart of the daemon. Principals come from a tokens file on loopback.

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"

#include "dispatchd/v1/admin_service.grpc.pb.h"
#include "dispatchd/v1/job_service.grpc.pb.h"
#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

class TenantsTest : public E2eTest {
 protected:
  void SetUp() override {
    E2eTest::SetUp();
    if (HasFatalFailure()) return;
    WriteTokensFile(dir_, {{"alice", "client", ""},
                           {"bob", "client", ""},
                           {"ops", "admin", ""},
                           {"gpu", "worker", "types=echo"}});
  }

  // Starts the daemon with tenant research = {alice}, weight 3, and `more` of its keys.
  void Start(const std::string& more = "") {
    DaemonOptions options;
    options.extra_yaml = absl::StrCat(
        "auth:\n  tokens_file: ", dir_.File("tokens"),
        "\ntenants:\n  - {name: research, principals: [alice], weight: 3", more, "}\n");
    daemon_ = E2eTest::StartDaemon(options);
    ASSERT_NE(daemon_, nullptr);
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
    std::string id;
    grpc::Status s = TrySubmit(who, payload, &id);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return id;
  }

  grpc::Status TrySubmit(const std::string& who, const std::string& payload, std::string* id,
                         std::string* retry_after_ms = nullptr) {
    v1::SubmitRequest req;
    *req.mutable_spec() = Spec("echo", payload);
    v1::SubmitResponse resp;
    std::unique_ptr<grpc::ClientContext> ctx = As(who);
    grpc::Status s = jobs_->Submit(ctx.get(), req, &resp);
    *id = resp.job_id();
    if (retry_after_ms != nullptr) {
      auto it = ctx->GetServerTrailingMetadata().find("retry-after-ms");
      if (it != ctx->GetServerTrailingMetadata().end()) {
        *retry_after_ms = std::string(it->second.data(), it->second.size());
      }
    }
    return s;
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
    return E2eTest::StartWorker(*daemon_, {.id = "w1", .slots = slots, .mode = args});
  }

  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::JobService::Stub> jobs_;
  std::unique_ptr<v1::AdminService::Stub> admin_;
};

TEST_F(TenantsTest, StatusAndStatsNameTheTenantAndItsShares) {
  Start();
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
  Start();
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
  // Research has been served about 20 x 50 ms / weight 3; the leader saves its accounts every
  // second, so the figure reaches the database within a few.
  const v1::TenantStats* before = TenantIn(Stats(), "research");
  ASSERT_NE(before, nullptr);
  const double cost = before->cost();
  EXPECT_GT(cost, 0.2);
  ASSERT_TRUE(WaitFor(
      [&] {
        return QueryInt(absl::StrFormat("SELECT count(*) FROM fair_accounts WHERE kind = 'tenant' "
                                        "AND a = 'research' AND abs(value - %.17g) < 1e-9",
                                        cost)) == 1;
      },
      absl::Seconds(10)));
  w.reset();
  ASSERT_TRUE(daemon_->Restart().ok());
  Connect();
  ASSERT_TRUE(WaitFor([&] { return TenantIn(Stats(), "research") != nullptr; }, absl::Seconds(30)));
  EXPECT_NEAR(TenantIn(Stats(), "research")->cost(), cost, 1e-6);
}

TEST_F(TenantsTest, TenantMaxActiveRefusesBeforeWritingAndHoldsNoOtherTenant) {
  Start(", max_active: 3");
  // No worker yet: the jobs stay queued, and active.
  for (int i = 0; i < 3; ++i) Submit("alice", absl::StrCat("job ", i));
  std::string id, retry_after;
  grpc::Status refused = TrySubmit("alice", "one too many", &id, &retry_after);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("tenants[research].max_active: 3 jobs active (limit 3)"));
  EXPECT_FALSE(retry_after.empty());
  EXPECT_TRUE(id.empty());
  EXPECT_EQ(Stats().types(0).queued(), 3);  // nothing was written
  // bob is another tenant.
  Submit("bob", "not held back");
  // Once alice's jobs have run, she has room again.
  std::unique_ptr<Worker> w = StartWorker(2, {"--echo"});
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(WaitFor(
      [&] {
        std::string again;
        return TrySubmit("alice", "room again", &again).ok();
      },
      absl::Seconds(30)));
}

TEST_F(TenantsTest, AnAdminSetsATenantsWeightAtOnce) {
  Start();
  Submit("bob", "so that bob's tenant exists");
  auto set = [&](const std::string& who, const std::string& tenant, double weight,
                 v1::SetTenantWeightResponse* resp) {
    v1::SetTenantWeightRequest req;
    req.set_tenant(tenant);
    req.set_weight(weight);
    return admin_->SetTenantWeight(As(who).get(), req, resp);
  };
  v1::SetTenantWeightResponse resp;
  grpc::Status s = set("ops", "bob", 5, &resp);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(resp.weight(), 5);
  const v1::TenantStats* bob = TenantIn(Stats(), "bob");
  ASSERT_NE(bob, nullptr);
  EXPECT_EQ(bob->weight(), 5);
  EXPECT_EQ(set("alice", "research", 100, &resp).error_code(), grpc::StatusCode::PERMISSION_DENIED);
  s = set("ops", "bob", 0, &resp);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(s.error_message(), HasSubstr("weight: must be in [0.001, 1000000]"));
  EXPECT_THAT(set("ops", "", 1, &resp).error_message(), HasSubstr("tenant: required"));
  CommandResult out =
      daemon_->Ctl({"--token-file", dir_.File("ops.token"), "set-weight", "research", "2"});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_THAT(out.out, HasSubstr("research: weight 2"));
  EXPECT_EQ(TenantIn(Stats(), "research"), nullptr);  // known to the scheduler once it has jobs
  Submit("alice", "now research exists");
  ASSERT_NE(TenantIn(Stats(), "research"), nullptr);
  EXPECT_EQ(TenantIn(Stats(), "research")->weight(), 2);
}

}  // namespace
}  // namespace dispatchd::e2e
