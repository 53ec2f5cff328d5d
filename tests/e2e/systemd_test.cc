// dispatchd under a service manager (deploy/dispatchd.service, Type=notify): it reports READY=1
// with its address once it serves, sends WATCHDOG=1 keep-alives while it runs when the manager
// asks for them ($WATCHDOG_USEC), and STOPPING=1 on SIGTERM. The test plays the manager: it binds
// the datagram socket that $NOTIFY_SOCKET names and reads what the daemon sends.

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "tests/e2e/e2e_test.h"
#include "tests/e2e/harness.h"

namespace dispatchd::e2e {
namespace {

using ::testing::HasSubstr;

// The service manager's end of $NOTIFY_SOCKET: an AF_UNIX datagram socket bound at `path`.
class NotifySocket {
 public:
  explicit NotifySocket(const std::string& path) : path_(path) {
    fd_ = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    bound_ = fd_ >= 0 && bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~NotifySocket() {
    if (fd_ >= 0) close(fd_);
    unlink(path_.c_str());
  }
  bool bound() const { return bound_; }

  // Reads messages until one contains `needle` (returned) or `timeout` passes (empty). Every
  // message read, matching or not, is appended to `seen`.
  std::string WaitFor(absl::string_view needle, absl::Duration timeout) {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      const absl::Duration left = deadline - absl::Now();
      if (left <= absl::ZeroDuration()) return "";
      pollfd p{.fd = fd_, .events = POLLIN, .revents = 0};
      if (poll(&p, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1) <= 0) continue;
      char buf[4096];
      const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) continue;
      std::string message(buf, static_cast<size_t>(n));
      seen.push_back(message);
      if (absl::StrContains(message, needle)) return message;
    }
  }

  std::vector<std::string> seen;

 private:
  std::string path_;
  int fd_ = -1;
  bool bound_ = false;
};

using SystemdTest = E2eTest;

TEST_F(SystemdTest, ReportsReadinessFeedsTheWatchdogAndReportsStopping) {
  NotifySocket manager(dir_.File("notify.sock"));
  ASSERT_TRUE(manager.bound()) << "cannot bind " << dir_.File("notify.sock");

  // The daemon inherits these; a 1 s watchdog means a keep-alive every 0.5 s.
  setenv("NOTIFY_SOCKET", dir_.File("notify.sock").c_str(), 1);
  setenv("WATCHDOG_USEC", "1000000", 1);
  unsetenv("WATCHDOG_PID");
  std::unique_ptr<Daemon> d = StartDaemon();
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  ASSERT_NE(d, nullptr);
  Daemon& daemon = *d;

  const std::string ready = manager.WaitFor("READY=1", absl::Seconds(30));
  ASSERT_FALSE(ready.empty()) << daemon.process().Log();
  EXPECT_THAT(ready, HasSubstr(absl::StrCat("STATUS=serving on ", daemon.address())));

  // Keep-alives keep coming while the daemon serves (and while it works).
  std::unique_ptr<Worker> w = StartWorker(daemon, {.id = "w"});
  ASSERT_NE(w, nullptr);
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    absl::StatusOr<std::string> id = daemon.Submit(Spec("echo", "under systemd"));
    ASSERT_TRUE(id.ok()) << id.status();
    ids.push_back(*id);
  }
  std::vector<v1::Job> jobs;
  ASSERT_TRUE(daemon.WaitForTerminal(ids, &jobs, absl::Seconds(60)));
  int keepalives = 0;
  for (int i = 0; i < 4; ++i) {
    if (!manager.WaitFor("WATCHDOG=1", absl::Seconds(10)).empty()) ++keepalives;
  }
  EXPECT_EQ(keepalives, 4) << "keep-alives every 0.5 s expected; the daemon's log:\n"
                           << daemon.process().Log();

  absl::StatusOr<int> rc = daemon.Terminate();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0) << daemon.process().Log();
  EXPECT_THAT(manager.WaitFor("STOPPING=1", absl::Seconds(5)), HasSubstr("STOPPING=1"));
}

TEST_F(SystemdTest, SendsNothingOutsideAServiceManager) {
  unsetenv("NOTIFY_SOCKET");
  unsetenv("WATCHDOG_USEC");
  std::unique_ptr<Daemon> d = StartDaemon();
  ASSERT_NE(d, nullptr);
  absl::StatusOr<int> rc = d->Terminate();
  ASSERT_TRUE(rc.ok()) << rc.status();
  EXPECT_EQ(*rc, 0);
  const std::string log = d->process().Log();
  EXPECT_THAT(log, ::testing::Not(HasSubstr("watchdog")));
  EXPECT_THAT(log, ::testing::Not(HasSubstr("cannot notify the service manager")));
}

}  // namespace
}  // namespace dispatchd::e2e
