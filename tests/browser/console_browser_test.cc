// The web console in a real browser: headless Chromium, driven by puppeteer-core
// (console_e2e.js), against a real daemon with authentication, a reference worker and the `pg`
// fixture's PostgreSQL. The script's screenshots are kept under the build tree, and the test
// prints where.
//
// Needs node, chromium and the script's npm packages; without them the test fails saying how to
// install them, so that a machine lacking them cannot pass the suite without running it.

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include <unistd.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

constexpr char kInstallHint[] =
    "install them with `bash deploy/install-deps.sh` (node, npm, chromium) and "
    "`npm ci --prefix tests/browser` (the pinned puppeteer-core); tests/run-all.sh does both";

// The absolute path of `name` on PATH (RunCommand does not search it), or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    std::error_code ec;
    if (std::filesystem::is_regular_file(candidate, ec) && access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

class ConsoleBrowserTest : public E2eTest {};

TEST_F(ConsoleBrowserTest, JobsAppearRunFinishAndCancelOnTheLivePage) {
  const std::string script_dir = CONSOLE_BROWSER_DIR;
  const std::string node = FindOnPath("node");
  ASSERT_FALSE(node.empty()) << "node is not on PATH: " << kInstallHint;
  const std::string chromium = FindOnPath("chromium");
  ASSERT_FALSE(chromium.empty()) << "chromium is not on PATH: " << kInstallHint;
  ASSERT_TRUE(std::filesystem::exists(
      absl::StrCat(script_dir, "/node_modules/puppeteer-core/package.json")))
      << script_dir << "/node_modules has no puppeteer-core: " << kInstallHint;

  WriteTokensFile(dir_, {{"alice", "client", ""}, {"gpu", "worker", ""}, {"ops", "admin", ""}});
  DaemonOptions options;
  // No worker serves `held`; `flaky` fails its first attempt.
  options.types = {{.name = "echo"},
                   {.name = "held"},
                   {.name = "flaky", .max_attempts = 2, .retry_backoff = "100ms"}};
  options.extra_yaml = absl::StrCat("auth:\n  tokens_file: ", dir_.File("tokens"), "\n");
  std::unique_ptr<Daemon> daemon = StartDaemon(options);
  ASSERT_NE(daemon, nullptr);
  // One slot and two seconds a job: the page has time to show them queued and running.
  std::unique_ptr<Worker> worker = StartWorker(
      *daemon, {.id = "w1",
                .types = {"echo"},
                .mode = {"--token-file", dir_.File("gpu.token"), "--simulate", "100%:2s"}});
  ASSERT_NE(worker, nullptr);
  // Exit 75 is a retryable failure: the job's page shows the attempt that failed, then the one
  // that succeeded.
  std::unique_ptr<Worker> flaky_worker = StartWorker(
      *daemon, {.id = "w2",
                .types = {"flaky"},
                .mode = {"--token-file", dir_.File("gpu.token"), "--exec",
                         "if [ \"$DISPATCHD_ATTEMPT\" = 1 ]; then echo 'CUDA out of memory' >&2; "
                         "exit 75; fi; cat"}});
  ASSERT_NE(flaky_worker, nullptr);
  // The harness's own stubs carry no token: ask as the admin.
  ASSERT_TRUE(WaitFor(
      [&] {
        CommandResult w = RunCommand({DispatchctlBin(), "--server", daemon->address(),
                                      "--token-file", dir_.File("ops.token"), "workers"});
        return w.exit_code == 0 && w.out.find("w1") != std::string::npos &&
               w.out.find("w2") != std::string::npos;
      },
      absl::Seconds(30)));
  const std::string http = daemon->MetricsAddress();
  ASSERT_FALSE(http.empty()) << daemon->process().Log();

  const std::string out = CONSOLE_ARTIFACTS_DIR;
  std::error_code ec;
  std::filesystem::create_directories(out, ec);
  CommandResult r = RunCommand(
      {node, script_dir + "/console_e2e.js", "--url", absl::StrCat("http://", http), "--token-file",
       dir_.File("ops.token"), "--dispatchctl", DispatchctlBin(), "--server", daemon->address(),
       "--ctl-token-file", dir_.File("alice.token"), "--chromium", chromium, "--out", out},
      absl::Minutes(3));
  std::printf("%s%s", r.out.c_str(), r.err.c_str());
  EXPECT_EQ(r.exit_code, 0) << "console_e2e.js:\n" << r.out << r.err;
  EXPECT_TRUE(std::filesystem::exists(out + "/console-jobs.png"));
  std::printf(
      "console screenshots kept in %s (console-jobs.png, console-job.png, "
      "console-job-retried.png, console-workers.png, console-queues.png)\n",
      out.c_str());
}

}  // namespace
}  // namespace dispatchd::e2e
