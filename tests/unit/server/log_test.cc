// server::Log creates a component's logger on first use, from whichever thread asks first.
#include "server/util/log.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace dispatchd::server {
namespace {

// Many threads asking for a new component at once all get the one logger, and none throws
// (spdlog refuses a second registration of a name by throwing; under a gRPC handler that throw
// reached clients as UNIMPLEMENTED).
TEST(LogTest, ConcurrentFirstUseOfAComponentYieldsOneLogger) {
  constexpr int kThreads = 16;
  constexpr int kRounds = 200;
  int throws = 0;
  for (int round = 0; round < kRounds; ++round) {
    const std::string name = absl::StrCat("log_test_", round);
    std::atomic<bool> go{false};
    std::atomic<int> thrown{0};
    std::vector<std::shared_ptr<spdlog::logger>> got(kThreads);
    std::vector<std::thread> threads;
    for (int i = 0; i < kThreads; ++i) {
      threads.emplace_back([&, i] {
        while (!go.load()) std::this_thread::yield();
        try {
          got[i] = Log(name);
        } catch (...) {
          thrown.fetch_add(1);
        }
      });
    }
    go.store(true);
    for (std::thread& t : threads) t.join();
    throws += thrown.load();
    for (int i = 0; i < kThreads; ++i) {
      ASSERT_NE(got[i], nullptr) << name;
      EXPECT_EQ(got[i], got[0]) << name;
    }
  }
  EXPECT_EQ(throws, 0);
}

}  // namespace
}  // namespace dispatchd::server
