#pragma once

// Starts a child process for tests, with stdout and stderr sent to files; bounded waits.

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

extern char** environ;

namespace dispatchd::client::fake {

class Subprocess {
 public:
  // Starts argv[0] with stdout/stderr to `<prefix>.out` / `<prefix>.err` (prefix: a temp path).
  Subprocess(const std::vector<std::string>& argv, const std::string& prefix)
      : out_path_(prefix + ".out"), err_path_(prefix + ".err") {
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&actions, 1, out_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    posix_spawn_file_actions_addopen(&actions, 2, err_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                     0644);
    std::vector<char*> args;
    std::vector<std::string> copy = argv;
    for (std::string& a : copy) args.push_back(a.data());
    args.push_back(nullptr);
    if (posix_spawn(&pid_, args[0], &actions, nullptr, args.data(), environ) != 0) pid_ = -1;
    posix_spawn_file_actions_destroy(&actions);
  }
  ~Subprocess() {
    if (pid_ > 0 && !exit_code_.has_value()) {
      kill(pid_, SIGKILL);
      int status = 0;
      waitpid(pid_, &status, 0);
    }
  }

  bool started() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  void Signal(int sig) const { kill(pid_, sig); }

  // The exit code (128+N if killed by signal N), or nullopt if it still runs after `timeout`.
  std::optional<int> Wait(absl::Duration timeout) {
    absl::Time deadline = absl::Now() + timeout;
    while (!exit_code_.has_value()) {
      int status = 0;
      pid_t r = waitpid(pid_, &status, WNOHANG);
      if (r == pid_) {
        exit_code_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      } else if (absl::Now() >= deadline) {
        return std::nullopt;
      } else {
        absl::SleepFor(absl::Milliseconds(2));
      }
    }
    return exit_code_;
  }
  std::string out() const { return Read(out_path_); }
  std::string err() const { return Read(err_path_); }

 private:
  static std::string Read(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }

  std::string out_path_, err_path_;
  pid_t pid_ = -1;
  std::optional<int> exit_code_;
};

// A fresh temporary directory, removed with everything in it when this goes out of scope.
class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/dispatchd-client-test.XXXXXX";
    char* p = mkdtemp(tmpl);
    if (p != nullptr) path_ = p;
  }
  ~TempDir() {
    std::error_code ignored;
    if (!path_.empty()) std::filesystem::remove_all(path_, ignored);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

}  // namespace dispatchd::client::fake
