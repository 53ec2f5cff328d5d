// Spawn on overflow: when jobs wait for capacity the daemon runs the configured command, at most
// once per interval, with the backlog per type in its environment.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

std::vector<std::string> Lines(const std::string& path) {
  std::vector<std::string> out;
  for (absl::string_view line : absl::StrSplit(ReadFile(path), '\n', absl::SkipEmpty())) {
    out.emplace_back(line);
  }
  return out;
}

using OverflowHookTest = E2eTest;

TEST_F(OverflowHookTest, RunsWithTheBacklogWhileJobsWaitForCapacityAtMostOncePerInterval) {
  const std::string calls = dir_.File("calls");
  DaemonOptions options;
  options.types = {{.name = "echo"}, {.name = "embed"}};
  options.extra_yaml =
      "overflow_hook:\n  command: 'echo \"$DISPATCHD_BACKLOG_TOTAL $DISPATCHD_BACKLOG\" >> " +
      calls + "'\n  interval: 1s\n";
  std::unique_ptr<Daemon> daemon = StartDaemon(options);
  ASSERT_NE(daemon, nullptr);
  Daemon& d = *daemon;
  // The leader's checks of the hook, by outcome (0 before the first).
  auto checks = [&](absl::string_view outcome) {
    return std::max(0.0, d.Metric(absl::StrCat("dispatchd_overflow_hook_checks_total{outcome=\"",
                                               outcome, "\"}")));
  };

  // No backlog: the hook is checked at each sweep and stays quiet.
  ASSERT_TRUE(WaitFor([&] { return checks("quiet") >= 3; }, absl::Seconds(10)));
  EXPECT_EQ(checks("started"), 0);
  EXPECT_TRUE(Lines(calls).empty());

  // Three echo jobs and one embed job, and no worker: capacity is short. The hook may run before
  // the last of them is in; its later runs report the whole backlog.
  const absl::Time start = absl::Now();
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) ids.push_back(*d.Submit(Spec("echo", "x")));
  ids.push_back(*d.Submit(Spec("embed", "x")));
  std::vector<std::string> lines;
  ASSERT_TRUE(WaitFor(
      [&] {
        lines = Lines(calls);
        return lines.size() >= 2 && lines.back() == "4 echo=3 embed=1";
      },
      absl::Seconds(10)))
      << absl::StrJoin(lines, "; ");
  // At most one run per interval (1 s): over the time waited, no more runs than seconds + 1.
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EXPECT_LE(static_cast<double>(Lines(calls).size()), seconds + 1.0);

  // A worker takes the jobs: the overflow ends and the hook stops being called.
  std::unique_ptr<Worker> worker =
      StartWorker(d, {.id = "w", .types = {"echo", "embed"}, .slots = 4});
  ASSERT_NE(worker, nullptr);
  std::vector<v1::Job> done;
  ASSERT_TRUE(d.WaitForTerminal(ids, &done, absl::Seconds(15)));
  // Nothing waits for capacity any more: the next checks are quiet, no run starts after the
  // ones counted by now, and each of those appended its line.
  const double started = checks("started");
  const double quiet = checks("quiet");
  EXPECT_GE(started, 2);
  ASSERT_TRUE(WaitFor([&] { return checks("quiet") >= quiet + 3; }, absl::Seconds(10)));
  EXPECT_EQ(checks("started"), started);
  EXPECT_EQ(checks("failed"), 0);
  EXPECT_TRUE(WaitFor([&] { return static_cast<double>(Lines(calls).size()) == started; },
                      absl::Seconds(5)))
      << Lines(calls).size() << " lines for " << started << " runs";
}

}  // namespace
}  // namespace dispatchd::e2e
