// The standard gRPC health service, read with `dispatchctl health`: SERVING while the daemon
// reaches its database, NOT_SERVING while it cannot, SERVING again once it can, with no job
// lost across the outage.

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <pqxx/pqxx>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// dispatchctl's exit status for a daemon that answers but is NOT_SERVING.
constexpr int kNotServing = 9;

// Runs SQL on the server's maintenance database, outside the daemon's own.
void ServerSql(const testing::TestDatabase& db, const std::string& sql) {
  pqxx::connection conn(db.server_url());
  pqxx::nontransaction txn(conn);
  txn.exec(sql);
}

using HealthTest = E2eTest;

TEST_F(HealthTest, ServingFollowsTheDatabase) {
  std::unique_ptr<Daemon> d = StartDaemon();
  ASSERT_NE(d, nullptr);
  Daemon& daemon = *d;

  CommandResult r = daemon.Ctl({"health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "SERVING\n");
  for (const char* service :
       {"dispatchd.v1.JobService", "dispatchd.v1.WorkerService", "dispatchd.v1.AdminService"}) {
    r = daemon.Ctl({"health", service});
    EXPECT_EQ(r.exit_code, 0) << service << ": " << r.err;
  }
  r = daemon.Ctl({"--json", "health"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr(R"("status":"SERVING")"));
  r = daemon.Ctl({"health", "no.such.Service"});
  EXPECT_EQ(r.exit_code, 5) << r.out << r.err;
  EXPECT_THAT(r.err, HasSubstr("NOT_FOUND"));

  // The database refuses the daemon: new sessions are not allowed and the open ones are ended.
  ServerSql(db(), absl::StrCat("ALTER DATABASE ", db().name(), " WITH ALLOW_CONNECTIONS false"));
  ServerSql(db(),
            absl::StrCat("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '",
                         db().name(), "'"));
  EXPECT_TRUE(WaitFor(
      [&] {
        r = daemon.Ctl({"health"});
        return r.exit_code == kNotServing && r.out == "NOT_SERVING\n";
      },
      absl::Seconds(30)))
      << r.exit_code << " " << r.out << r.err << daemon.process().Log();

  // Back: the daemon serves again (it leads again) and runs what is submitted.
  ServerSql(db(), absl::StrCat("ALTER DATABASE ", db().name(), " WITH ALLOW_CONNECTIONS true"));
  EXPECT_TRUE(WaitFor([&] { return daemon.Ctl({"health"}).exit_code == 0; }, absl::Seconds(60)))
      << daemon.process().Log();
  std::unique_ptr<Worker> w = StartWorker(daemon, {.id = "w"});
  ASSERT_NE(w, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 5; ++i) {
    absl::StatusOr<std::string> id = daemon.Submit(Spec("echo", "after the outage"));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon.WaitForTerminal(ids, &jobs, absl::Seconds(60))) << daemon.process().Log();
  for (const v1::Job& j : jobs) EXPECT_EQ(j.state(), v1::JOB_STATE_SUCCEEDED);

  absl::StatusOr<int> rc = daemon.Terminate();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << daemon.process().Log();
}

}  // namespace
}  // namespace dispatchd::e2e
