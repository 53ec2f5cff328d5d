#pragma once

// The set-up every end-to-end test shares: a database of the test's own on the `pg` CTest
// fixture's server and a temporary directory, with daemons and workers started against them.
//
//   class DrainTest : public E2eTest {};
//
//   TEST_F(DrainTest, DrainedWorkerExits) {
//     std::unique_ptr<Daemon> d = StartDaemon();
//     ASSERT_NE(d, nullptr);
//     std::unique_ptr<Worker> w = StartWorker(*d, {.id = "a"});
//     ...
//   }
//
// A suite with more set-up of its own overrides SetUp() and calls E2eTest::SetUp() first.

#include <cstdint>
#include <memory>
#include <string>

#include "gtest/gtest.h"

#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {

class E2eTest : public ::testing::Test {
 protected:
  // Creates the test's database, named after its suite, and points the workers it starts at the
  // NVML stand-in (tests/testing/nvml_standin.cc) with no GPU: a test that wants GPUs sets
  // NVML_STANDIN_FILE before it starts a worker.
  void SetUp() override;

  // Starts a daemon on the test's database (options.postgres_url is filled in) with its config
  // and state under `dir` (the test's directory when null). Null, with a test failure, when it
  // does not come up.
  std::unique_ptr<Daemon> StartDaemon(DaemonOptions options = {}, const TempDir* dir = nullptr);

  // Starts a worker connected to `daemon`, its files under `dir` (the test's directory when
  // null). Null, with a test failure, when it cannot be started.
  std::unique_ptr<Worker> StartWorker(const Daemon& daemon, const WorkerOptions& options,
                                      const TempDir* dir = nullptr);
  // The same, connected to `addresses` (one host:port, or several separated by commas).
  std::unique_ptr<Worker> StartWorkerAt(const std::string& addresses, const WorkerOptions& options,
                                        const TempDir* dir = nullptr);

  // Runs `sql` on the test's database; the first column of its first row as an integer (-1, with
  // a test failure, when it fails or returns no row).
  int64_t QueryInt(const std::string& sql) const;
  // Runs `sql` on the test's database (a test failure when it fails).
  void Exec(const std::string& sql) const;

  const testing::TestDatabase& db() const { return *db_; }

  TempDir dir_;

 private:
  std::unique_ptr<testing::TestDatabase> db_;
};

}  // namespace dispatchd::e2e
