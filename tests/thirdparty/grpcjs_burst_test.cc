// Bursts of calls at fresh daemons from grpc-js (tests/thirdparty/grpcjs/burst.js), a gRPC
// implementation that shares no code with the daemon's: what tests/e2e/burst_test.cc proves for
// the C++ client, for a client whose framing, flow control and connection set-up differ. Every
// valid call reaches its handler (no UNIMPLEMENTED, no retry policy to hide one), and malformed
// bodies are INVALID_ARGUMENT with a message.
//
// Needs node and the script's npm packages; without them the test fails saying how to install
// them, so that a machine lacking them cannot pass the suite without running it.

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

#include "tests/e2e/harness.h"
#include "tests/testing/pg_test_db.h"

namespace dispatchd::e2e {
namespace {

constexpr char kInstallHint[] =
    "install them with `bash deploy/install-deps.sh` (node, npm) and "
    "`npm ci --prefix tests/thirdparty/grpcjs` (the pinned grpc-js); tests/run-all.sh does both";

// The absolute path of `name` on PATH (RunCommand does not search it), or "".
std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  for (absl::string_view dir : absl::StrSplit(path != nullptr ? path : "", ':')) {
    if (dir.empty()) continue;
    std::string candidate = absl::StrCat(dir, "/", name);
    std::error_code ec;
    const std::filesystem::file_status st = std::filesystem::status(candidate, ec);
    constexpr std::filesystem::perms kExec = std::filesystem::perms::owner_exec |
                                             std::filesystem::perms::group_exec |
                                             std::filesystem::perms::others_exec;
    if (std::filesystem::is_regular_file(st) &&
        (st.permissions() & kExec) != std::filesystem::perms::none) {
      return candidate;
    }
  }
  return "";
}

TEST(GrpcJsBurstTest, NoValidCallFromGrpcJsIsAnsweredUnimplementedByAFreshDaemon) {
  constexpr int kDaemons = 5;
  constexpr int kChannels = 20;
  constexpr int kCallsPerChannel = 1000;  // 5 x 20 x 1000 = 100,000 calls
  const std::string script_dir = GRPCJS_BURST_DIR;
  const std::string node = FindOnPath("node");
  ASSERT_FALSE(node.empty()) << "node is not on PATH: " << kInstallHint;
  for (const char* package : {"@grpc/grpc-js", "@grpc/proto-loader"}) {
    ASSERT_TRUE(std::filesystem::exists(
        absl::StrCat(script_dir, "/node_modules/", package, "/package.json")))
        << script_dir << "/node_modules has no " << package << ": " << kInstallHint;
  }

  for (int d = 0; d < kDaemons; ++d) {
    absl::StatusOr<testing::TestDatabase> db = testing::TestDatabase::Create("e2e_grpcjs_burst");
    ASSERT_TRUE(db.ok()) << db.status();
    TempDir dir;
    // max_active 5: most Submits of the first burst are refused, the path that threw.
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(
        DaemonOptions{.postgres_url = db->url(), .extra_yaml = "max_active: 5\n"}, dir);
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    CommandResult r =
        RunCommand({node, script_dir + "/burst.js", "--address", (*daemon)->address(), "--channels",
                    absl::StrCat(kChannels), "--calls", absl::StrCat(kCallsPerChannel)},
                   absl::Minutes(3));
    std::printf("daemon %d: %s", d, r.out.c_str());
    EXPECT_EQ(r.exit_code, 0) << "burst.js against daemon " << d << " (" << (*daemon)->address()
                              << "):\n"
                              << r.out << r.err;
  }
}

}  // namespace
}  // namespace dispatchd::e2e
