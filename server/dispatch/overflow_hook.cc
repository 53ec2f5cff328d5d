#include "server/dispatch/overflow_hook.h"

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "server/util/log.h"

extern char** environ;

namespace dispatchd::dispatch {

OverflowHook::OverflowHook(config::OverflowHookConfig config, std::string log_path)
    : config_(std::move(config)), log_path_(std::move(log_path)) {}

OverflowHook::~OverflowHook() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (waiter_.joinable()) waiter_.join();
}

bool OverflowHook::Due(absl::Time now) const {
  if (config_.command.empty() || now - last_start_ < config_.interval) return false;
  absl::MutexLock l(&mu_);
  return !running_;
}

bool OverflowHook::MaybeRun(absl::Time now,
                            const std::vector<std::pair<std::string, int64_t>>& backlog) {
  if (backlog.empty() || !Due(now)) return false;
  int64_t total = 0;
  std::vector<std::string> parts;
  for (const auto& [type, n] : backlog) {
    parts.push_back(absl::StrCat(type, "=", n));
    total += n;
  }
  // Everything the child needs is built before fork: after it, only async-signal-safe calls.
  std::vector<std::string> env_strings = {
      absl::StrCat("DISPATCHD_BACKLOG=", absl::StrJoin(parts, " ")),
      absl::StrCat("DISPATCHD_BACKLOG_TOTAL=", total)};
  for (char** e = environ; *e != nullptr; ++e) {
    if (strncmp(*e, "DISPATCHD_BACKLOG", 17) != 0) env_strings.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  const char* argv[] = {"/bin/sh", "-c", config_.command.c_str(), nullptr};
  int out = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
  if (out < 0) out = open("/dev/null", O_WRONLY | O_CLOEXEC);
  int in = open("/dev/null", O_RDONLY | O_CLOEXEC);

  if (waiter_.joinable()) waiter_.join();  // the previous run has ended (Due checked it)
  pid_t pid = fork();
  if (pid == 0) {
    setsid();  // its own process group, so that a timeout kills all of it
    // The daemon blocks SIGTERM and SIGINT (it waits for them) and ignores SIGPIPE: give the
    // command the defaults.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    struct sigaction dfl = {};
    dfl.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &dfl, nullptr);
    if (in >= 0) dup2(in, STDIN_FILENO);
    if (out >= 0) {
      dup2(out, STDOUT_FILENO);
      dup2(out, STDERR_FILENO);
    }
    execve(argv[0], const_cast<char* const*>(argv), envp.data());
    _exit(127);
  }
  if (in >= 0) close(in);
  if (out >= 0) close(out);
  last_start_ = now;
  if (pid < 0) {
    server::Log("dispatch")->warn("overflow hook: fork failed: {}", std::strerror(errno));
    return false;
  }
  server::Log("dispatch")
      ->info("overflow hook started pid={} backlog=\"{}\"", pid, absl::StrJoin(parts, " "));
  {
    absl::MutexLock l(&mu_);
    running_ = true;
  }
  waiter_ = std::thread([this, pid] { Wait(pid); });
  return true;
}

void OverflowHook::Wait(pid_t pid) {
  const absl::Time deadline = absl::Now() + config_.timeout;
  int status = 0;
  bool killed = false;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid || (r < 0 && errno != EINTR)) break;
    bool stopping;
    {
      absl::MutexLock l(&mu_);
      stopping = stopping_;
    }
    if (!killed && (stopping || absl::Now() >= deadline)) {
      kill(-pid, SIGKILL);
      killed = true;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  if (killed) {
    server::Log("dispatch")
        ->warn("overflow hook killed after {} pid={}", absl::FormatDuration(config_.timeout), pid);
  } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    server::Log("dispatch")
        ->warn("overflow hook failed pid={} status={}", pid,
               WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }
  absl::MutexLock l(&mu_);
  running_ = false;
}

}  // namespace dispatchd::dispatch
