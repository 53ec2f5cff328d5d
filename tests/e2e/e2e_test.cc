#include "tests/e2e/e2e_test.h"

#include <exception>
#include <utility>

#include "absl/status/statusor.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include <stdlib.h>

namespace dispatchd::e2e {

void E2eTest::SetUp() {
  // Workers read GPUs from the NVML stand-in, which reports none until a test names a file for
  // it (NVML_STANDIN_FILE): a test's workers see no GPU of the host they run on.
  setenv("DISPATCHD_NVML_LIBRARY", NVML_STANDIN_LIB, 1);
  unsetenv("NVML_STANDIN_FILE");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  absl::StatusOr<testing::TestDatabase> db =
      testing::TestDatabase::Create(info != nullptr ? info->test_suite_name() : "e2e");
  ASSERT_TRUE(db.ok()) << db.status();
  db_ = std::make_unique<testing::TestDatabase>(*std::move(db));
}

std::unique_ptr<Daemon> E2eTest::StartDaemon(DaemonOptions options, const TempDir* dir) {
  options.postgres_url = db_->url();
  absl::StatusOr<std::unique_ptr<Daemon>> d = Daemon::Start(options, dir ? *dir : dir_);
  EXPECT_TRUE(d.ok()) << d.status();
  return d.ok() ? *std::move(d) : nullptr;
}

std::unique_ptr<Worker> E2eTest::StartWorker(const Daemon& daemon, const WorkerOptions& options,
                                             const TempDir* dir) {
  return StartWorkerAt(daemon.address(), options, dir);
}

std::unique_ptr<Worker> E2eTest::StartWorkerAt(const std::string& addresses,
                                               const WorkerOptions& options, const TempDir* dir) {
  absl::StatusOr<std::unique_ptr<Worker>> w = Worker::Start(addresses, options, dir ? *dir : dir_);
  EXPECT_TRUE(w.ok()) << w.status();
  return w.ok() ? *std::move(w) : nullptr;
}

int64_t E2eTest::QueryInt(const std::string& sql) const {
  try {
    pqxx::connection conn(db_->url());
    pqxx::nontransaction txn(conn);
    pqxx::result r = txn.exec(sql);
    if (r.empty()) {
      ADD_FAILURE() << "no row: " << sql;
      return -1;
    }
    return r[0][0].as<int64_t>();
  } catch (const std::exception& e) {
    ADD_FAILURE() << sql << ": " << e.what();
    return -1;
  }
}

void E2eTest::Exec(const std::string& sql) const {
  try {
    pqxx::connection conn(db_->url());
    pqxx::nontransaction txn(conn);
    txn.exec(sql);
  } catch (const std::exception& e) {
    ADD_FAILURE() << sql << ": " << e.what();
  }
}

}  // namespace dispatchd::e2e
