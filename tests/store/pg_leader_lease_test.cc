// Leader election and fencing against a real PostgreSQL: one session holds the lease at a time,
// each new leader starts a new epoch, a frozen leader's sessions can be ended, a deposed
// leader's job writes change nothing, and a write in flight holds off the next leader but never
// the leader's own renewal.

#include "server/store/pg_leader_lease.h"

#include <chrono>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pqxx/connection"
#include "pqxx/transaction"

#include "server/store/pg_job_store.h"
#include "server/store/pg_statements.h"
#include "tests/testing/pg_test_db.h"
#include "tests/testing/status_matchers.h"

namespace dispatchd::store {
namespace {

using ::dispatchd::testing::IsOk;
using ::dispatchd::testing::StatusIs;
using ::dispatchd::testing::TestDatabase;
using ::testing::ElementsAre;
using ::testing::IsEmpty;

class PgLeaderLeaseTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<TestDatabase> db = TestDatabase::Create("lease");
    ASSERT_TRUE(db.ok()) << db.status();
    db_ = std::make_unique<TestDatabase>(*std::move(db));
    // The store migrates the schema (the lease needs its table).
    absl::StatusOr<std::unique_ptr<PgJobStore>> store =
        PgJobStore::Connect({.url = db_->url(), .pool_size = 2, .application_name = "store-a"});
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }

  std::unique_ptr<PgLeaderLease> Lease(const std::string& name) {
    absl::StatusOr<std::unique_ptr<PgLeaderLease>> lease =
        PgLeaderLease::Connect(db_->url(), name, absl::Seconds(5), absl::Seconds(5));
    EXPECT_TRUE(lease.ok()) << lease.status();
    return lease.ok() ? *std::move(lease) : nullptr;
  }

  job::Job MakeJob(const std::string& id) {
    job::Job job;
    job.id = id;
    job.spec.type = "echo";
    job.spec.payload = "p";
    job.spec.max_attempts = 3;
    job.spec.timeout = absl::Seconds(30);
    return job;
  }

  std::unique_ptr<TestDatabase> db_;
  std::unique_ptr<PgJobStore> store_;
};

// Tries the lease until it is won (an ended session's lock is freed as the backend exits).
bool WaitForEpoch(PgLeaderLease& lease, absl::StatusOr<std::optional<int64_t>>* epoch) {
  for (int i = 0; i < 100; ++i) {
    *epoch = lease.TryAcquire("b", "y:1", absl::Seconds(2));
    if (epoch->ok() && epoch->value().has_value()) return true;
    absl::SleepFor(absl::Milliseconds(50));
  }
  return false;
}

TEST_F(PgLeaderLeaseTest, OneSessionLeadsAtATimeAndEachLeaderStartsANewEpoch) {
  auto a = Lease("lease-a");
  auto b = Lease("lease-b");
  absl::StatusOr<std::optional<int64_t>> ea = a->TryAcquire("a", "10.0.0.1:1", absl::Seconds(2));
  ASSERT_TRUE(ea.ok()) << ea.status();
  ASSERT_EQ(*ea, std::optional<int64_t>(1));
  absl::StatusOr<std::optional<int64_t>> eb = b->TryAcquire("b", "10.0.0.2:1", absl::Seconds(2));
  ASSERT_TRUE(eb.ok()) << eb.status();
  EXPECT_EQ(*eb, std::nullopt);
  absl::StatusOr<LeaderRecord> seen = b->Read();
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->epoch, 1);
  EXPECT_EQ(seen->holder, "a");
  EXPECT_EQ(seen->address, "10.0.0.1:1");
  EXPECT_THAT(a->Renew(1), IsOk());

  a.reset();  // the session ends: PostgreSQL frees the lock as its backend exits
  ASSERT_TRUE(WaitForEpoch(*b, &eb));
  EXPECT_EQ(*eb, std::optional<int64_t>(2));
}

TEST_F(PgLeaderLeaseTest, ReleaseFreesTheLockAtOnceAndWakesAListeningStandby) {
  auto a = Lease("lease-a");
  auto b = Lease("lease-b");
  ASSERT_THAT(b->ListenForRelease(), IsOk());
  absl::StatusOr<std::optional<int64_t>> ea = a->TryAcquire("a", "10.0.0.1:1", absl::Seconds(2));
  ASSERT_TRUE(ea.ok() && ea->has_value()) << ea.status();
  absl::StatusOr<bool> heard = b->AwaitRelease(absl::Milliseconds(50));
  ASSERT_TRUE(heard.ok()) << heard.status();
  EXPECT_FALSE(*heard) << "nothing was released yet";

  ASSERT_THAT(a->Release(**ea), IsOk());
  heard = b->AwaitRelease(absl::Seconds(5));
  ASSERT_TRUE(heard.ok()) << heard.status();
  EXPECT_TRUE(*heard);
  // Woken, the standby finds the lock free on its first try, while `a`'s session is still open.
  absl::StatusOr<LeaderRecord> seen = b->Read();
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->address, "") << "nobody is sent to the daemon that stepped down";
  absl::StatusOr<std::optional<int64_t>> eb = b->TryAcquire("b", "10.0.0.2:1", absl::Seconds(2));
  ASSERT_TRUE(eb.ok()) << eb.status();
  EXPECT_EQ(*eb, std::optional<int64_t>(**ea + 1));
  EXPECT_FALSE(a->Renew(**ea).ok()) << "its epoch is over";
}

TEST_F(PgLeaderLeaseTest, RenewOfAnEndedEpochFailsAndEvictEndsAFrozenLeadersSessions) {
  auto a = Lease("dispatchd a");
  auto b = Lease("dispatchd b");
  ASSERT_TRUE(a->TryAcquire("a", "x:1", absl::Seconds(2)).ok());
  absl::SleepFor(absl::Milliseconds(300));
  absl::StatusOr<LeaderRecord> seen = b->Read();
  ASSERT_TRUE(seen.ok());
  EXPECT_GE(seen->since_renewal, absl::Milliseconds(250));
  // `a` is "frozen": b ends its sessions, then takes over.
  absl::StatusOr<int> ended = b->Evict("dispatchd a");
  ASSERT_TRUE(ended.ok()) << ended.status();
  EXPECT_EQ(*ended, 1);
  absl::StatusOr<std::optional<int64_t>> eb;
  ASSERT_TRUE(WaitForEpoch(*b, &eb));
  EXPECT_EQ(*eb, std::optional<int64_t>(2));
  EXPECT_FALSE(a->Renew(1).ok()) << "the frozen leader's session is gone";
}

TEST_F(PgLeaderLeaseTest, FairAccountsRoundTripAndADeposedLeaderCannotOverwriteThem) {
  auto a = Lease("lease-a");
  ASSERT_EQ(*a->TryAcquire("a", "x:1", absl::Seconds(2)), std::optional<int64_t>(1));
  store_->SetFence(1);
  // Any text, the empty tenant included, and values kept to the last bit.
  const std::vector<AccountRow> rows = {{"clock", "", "", 12.5},
                                        {"tenant", "", "", 0.1 + 0.2},
                                        {"key", "research", "user,\"1\"", 1e-300},
                                        {"estimate", "llm.chat", "doc-7", 3.25}};
  ASSERT_THAT(store_->SaveAccounts(rows, absl::Hours(1)), IsOk());
  ASSERT_THAT(store_->SaveAccounts({{"clock", "", "", 13}}, absl::Hours(1)), IsOk());
  absl::StatusOr<std::vector<AccountRow>> loaded = store_->LoadAccounts();
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::vector<AccountRow> want = rows;
  want[0].value = 13;  // written over
  EXPECT_THAT(*loaded, ::testing::UnorderedElementsAreArray(want));

  a.reset();
  auto b = Lease("lease-b");
  absl::StatusOr<std::optional<int64_t>> eb;
  ASSERT_TRUE(WaitForEpoch(*b, &eb));
  EXPECT_THAT(store_->SaveAccounts({{"clock", "", "", 99}}, absl::Hours(1)),
              StatusIs(absl::StatusCode::kFailedPrecondition, "fenced"));
  loaded = store_->LoadAccounts();
  ASSERT_TRUE(loaded.ok());
  EXPECT_THAT(*loaded, ::testing::Contains(AccountRow{"clock", "", "", 13}));

  // The new leader's save forgets rows not written within the ttl.
  store_->SetFence(*eb.value());
  absl::SleepFor(absl::Milliseconds(50));
  ASSERT_THAT(store_->SaveAccounts({{"clock", "", "", 14}}, absl::Milliseconds(20)), IsOk());
  loaded = store_->LoadAccounts();
  ASSERT_TRUE(loaded.ok());
  EXPECT_THAT(*loaded, ::testing::ElementsAre(AccountRow{"clock", "", "", 14}));
}

TEST_F(PgLeaderLeaseTest, DeposedLeadersJobWritesAreFenced) {
  ASSERT_THAT(store_->Insert(MakeJob("j1")).status(), IsOk());
  ASSERT_THAT(store_->Insert(MakeJob("j2")).status(), IsOk());
  auto a = Lease("lease-a");
  ASSERT_EQ(*a->TryAcquire("a", "x:1", absl::Seconds(2)), std::optional<int64_t>(1));
  store_->SetFence(1);
  absl::StatusOr<std::vector<std::string>> claimed = store_->Claim({{"j1", 0, "w1"}});
  ASSERT_TRUE(claimed.ok()) << claimed.status();
  EXPECT_THAT(*claimed, ElementsAre("j1"));
  ASSERT_TRUE(*store_->MarkRunning("j1", 1, "w1"));

  // Another daemon takes over (epoch 2). The old leader's writes now change nothing.
  a.reset();
  auto b = Lease("lease-b");
  absl::StatusOr<std::optional<int64_t>> eb;
  ASSERT_TRUE(WaitForEpoch(*b, &eb));
  ASSERT_EQ(*eb, std::optional<int64_t>(2));
  EXPECT_THAT(store_->Claim({{"j2", 0, "w1"}}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "fenced"));
  EXPECT_THAT(
      store_->Finish({.job_id = "j1", .attempt = 1, .state = job::JobState::kSucceeded}).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "fenced"));
  EXPECT_THAT(store_->Retry("j1", 1, absl::InfinitePast(), "x").status(),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(store_->MarkRunningMany({{.job_id = "j1", .attempt = 1, .worker_id = "w1"}}).status(),
              StatusIs(absl::StatusCode::kFailedPrecondition, "fenced"));
  EXPECT_THAT(
      store_->FinishMany({{.job_id = "j1", .attempt = 1, .state = job::JobState::kSucceeded}})
          .status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "fenced"));
  absl::StatusOr<std::vector<std::string>> expired = store_->ExpireOverdue(absl::Now(), "late");
  ASSERT_TRUE(expired.ok());
  EXPECT_THAT(*expired, IsEmpty());
  absl::StatusOr<job::Job> j1 = store_->Get("j1");
  ASSERT_TRUE(j1.ok());
  EXPECT_EQ(j1->state, job::JobState::kRunning) << "nothing the deposed leader wrote landed";
  absl::StatusOr<job::Job> j2 = store_->Get("j2");
  ASSERT_TRUE(j2.ok());
  EXPECT_EQ(j2->state, job::JobState::kQueued);

  // With the new term's fence the same writes go through.
  store_->SetFence(2);
  EXPECT_TRUE(*store_->Finish({.job_id = "j1", .attempt = 1, .state = job::JobState::kSucceeded}));
}

TEST_F(PgLeaderLeaseTest, AWriteInFlightHoldsOffTheNextLeaderButNotTheRenewal) {
  ASSERT_THAT(store_->Insert(MakeJob("j1")).status(), IsOk());
  auto a = Lease("lease-a");
  ASSERT_EQ(*a->TryAcquire("a", "x:1", absl::Seconds(2)), std::optional<int64_t>(1));

  // A write of leader 1 in flight: the store's fenced claim of j1, its transaction left open.
  pqxx::connection conn(db_->url());
  pqxx::work write(conn);
  EXPECT_EQ(write.exec_params(kClaim.sql, "{j1}", "{0}", "{w1}", 1).size(), 1u);

  // The leader renews its lease meanwhile, however long the write takes.
  std::future<absl::Status> renew = std::async(std::launch::async, [&] { return a->Renew(1); });
  ASSERT_EQ(renew.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_THAT(renew.get(), IsOk()) << "the renewal waited for a write in flight";

  // Another daemon cannot take over while the write is open: once it holds the advisory lock
  // (freed as the old session ends), its bump times out.
  a.reset();
  int bumps_timed_out = 0;
  for (int i = 0; i < 20 && bumps_timed_out < 2; ++i) {
    auto b = Lease("lease-b");
    absl::StatusOr<std::optional<int64_t>> eb = b->TryAcquire("b", "y:1", absl::Seconds(1));
    ASSERT_FALSE(eb.ok() && eb->has_value()) << "epoch " << **eb << " began under a write";
    if (!eb.ok()) {
      ++bumps_timed_out;
    } else {
      absl::SleepFor(absl::Milliseconds(50));  // the old session still holds the lock
    }
  }
  EXPECT_EQ(bumps_timed_out, 2);
  write.commit();

  // Once the write has landed, it does; the old epoch's writes are fenced from then on.
  auto b = Lease("lease-b");
  absl::StatusOr<std::optional<int64_t>> eb;
  ASSERT_TRUE(WaitForEpoch(*b, &eb));
  EXPECT_EQ(*eb, std::optional<int64_t>(2));
  absl::StatusOr<job::Job> j1 = store_->Get("j1");
  ASSERT_TRUE(j1.ok());
  EXPECT_EQ(j1->state, job::JobState::kDispatched);
  store_->SetFence(1);
  EXPECT_THAT(
      store_->Finish({.job_id = "j1", .attempt = 1, .state = job::JobState::kSucceeded}).status(),
      StatusIs(absl::StatusCode::kFailedPrecondition, "fenced"));
}

}  // namespace
}  // namespace dispatchd::store
