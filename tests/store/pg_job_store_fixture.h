#pragma once

// What PgJobStore's tests against PostgreSQL share (pg_job_store_*_test.cc): a fixture that gives
// each test a database of its own and a store connected to it, and jobs to insert.

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "lib/job/job.h"
#include "server/store/job_store.h"
#include "server/store/pg_job_store.h"
#include "tests/testing/pg_test_db.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {

// A StatusOr that is OK and whose value matches `matcher`.
MATCHER_P(IsOkAndHolds, matcher, "is OK and holds a matching value") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status().ToString();
    return false;
  }
  return ::testing::ExplainMatchResult(matcher, *arg, result_listener);
}

// A job `id` of `type` with a payload, 3 attempts and a 30 s timeout.
inline job::Job MakeJob(const std::string& id, const std::string& type = "echo") {
  job::Job job;
  job.id = id;
  job.spec.type = type;
  job.spec.payload = "payload of " + id;
  job.spec.max_attempts = 3;
  job.spec.timeout = absl::Seconds(30);
  return job;
}

// Each test gets a database of its own (TestDatabase, on the server of the `pg` fixture) and a
// store connected to it.
class PgJobStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<::dispatchd::testing::TestDatabase> db =
        ::dispatchd::testing::TestDatabase::Create("store");
    ASSERT_THAT(db, ::dispatchd::testing::IsOk());
    db_.emplace(*std::move(db));
    absl::StatusOr<std::unique_ptr<PgJobStore>> store = Connect();
    ASSERT_THAT(store, ::dispatchd::testing::IsOk());
    store_ = *std::move(store);
  }

  absl::StatusOr<std::unique_ptr<PgJobStore>> Connect(
      int pool_size = 4, absl::Duration idempotency_window = absl::Hours(24)) {
    return PgJobStore::Connect(PgStoreOptions{
        .url = db_->url(), .pool_size = pool_size, .idempotency_window = idempotency_window});
  }

  void Insert(const job::Job& job) {
    absl::StatusOr<InsertOutcome> outcome = store_->Insert(job);
    ASSERT_THAT(outcome, ::dispatchd::testing::IsOk());
    ASSERT_FALSE(outcome->deduplicated);
  }

  job::Job Get(const std::string& id) {
    absl::StatusOr<job::Job> job = store_->Get(id);
    EXPECT_THAT(job, ::dispatchd::testing::IsOk());
    return job.ok() ? *job : job::Job{};
  }

  // Inserts `id` and takes it to RUNNING at attempt 1 on `worker`.
  void InsertRunning(const std::string& id, const std::string& worker = "w1") {
    Insert(MakeJob(id));
    ASSERT_THAT(store_->Claim({{.job_id = id, .attempt = 0, .worker_id = worker}}),
                IsOkAndHolds(::testing::ElementsAre(id)));
    ASSERT_THAT(store_->MarkRunning(id, 1, worker), IsOkAndHolds(true));
  }

  // Declared first: destroyed after the store.
  std::optional<::dispatchd::testing::TestDatabase> db_;
  std::unique_ptr<PgJobStore> store_;
};

// A job `id` of `fairness` with idempotency key `key`.
inline job::Job KeyedJob(const std::string& id, const std::string& key,
                         const std::string& fairness = "alice") {
  job::Job job = MakeJob(id);
  job.spec.fairness_key = fairness;
  job.spec.idempotency_key = key;
  return job;
}

}  // namespace dispatchd::store
