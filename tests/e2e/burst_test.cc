// Bursts of calls from many fresh channels at a daemon that has just started, from the C++ client
// with its default channel arguments and no retry policy: every valid call reaches its handler.
// (gRPC's callback handlers answer UNIMPLEMENTED, with no message, when a method throws or its
// request does not parse; a daemon's first concurrent calls once threw that way.)

#include <atomic>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gtest/gtest.h"

#include "client/cpp/dispatch_client.h"
#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

TEST(BurstTest, NoValidCallIsAnsweredUnimplementedByAFreshDaemon) {
  constexpr int kDaemons = 5;
  constexpr int kThreads = 20;
  constexpr int kCallsPerThread = 1000;  // 5 x 20 x 1000 = 100,000 calls
  absl::Mutex mu;
  std::map<absl::StatusCode, int64_t> codes;
  for (int d = 0; d < kDaemons; ++d) {
    absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("e2e_burst");
    ASSERT_TRUE(db.ok()) << db.status();
    TempDir dir;
    // max_active 5: most Submits of the first burst are refused, the path that threw.
    DaemonOptions options{.postgres_url = db->url()};
    options.extra_yaml = "max_active: 5\n";
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options, dir);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    const std::string address = (*daemon)->address();
    std::atomic<bool> go{false};
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t) {
      threads.emplace_back([&, t] {
        // A channel of its own, opened in the burst.
        absl::StatusOr<std::unique_ptr<client::Client>> c = client::Client::Connect(address);
        std::map<absl::StatusCode, int64_t> mine;
        while (!go.load()) std::this_thread::yield();
        for (int i = 0; i < kCallsPerThread && c.ok(); ++i) {
          absl::Status s;
          if (i < 5) {
            s = (*c)->Submit(Spec("echo", absl::StrCat(t, ".", i))).status();
          } else {
            s = (*c)->Status(absl::StrCat("j_burst_", t, "_", i)).status();
          }
          ++mine[s.code()];
        }
        absl::MutexLock l(&mu);
        for (auto [code, n] : mine) codes[code] += n;
      });
    }
    go.store(true);
    for (std::thread& t : threads) t.join();
  }
  int64_t total = 0;
  std::string summary;
  for (auto [code, n] : codes) {
    total += n;
    absl::StrAppend(&summary, " ", absl::StatusCodeToString(code), "=", n);
  }
  std::printf("burst: %lld calls from %d fresh daemons x %d fresh channels:%s\n",
              static_cast<long long>(total), kDaemons, kThreads, summary.c_str());
  EXPECT_EQ(total, int64_t{kDaemons} * kThreads * kCallsPerThread);
  EXPECT_FALSE(codes.contains(absl::StatusCode::kUnimplemented)) << summary;
  // Every call got an answer a client can act on: a job, a refusal with a hint, or NOT_FOUND.
  for (auto [code, n] : codes) {
    EXPECT_TRUE(code == absl::StatusCode::kOk || code == absl::StatusCode::kResourceExhausted ||
                code == absl::StatusCode::kNotFound)
        << summary;
  }
}

}  // namespace
}  // namespace dispatchd::e2e
