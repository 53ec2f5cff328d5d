#pragma once

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace dispatchd::server {

// A fixed pool of threads for work that blocks (database calls made on behalf of RPCs), so that
// gRPC's callback threads never wait on I/O. Tasks run in submission order per thread, with no
// ordering across threads. The destructor runs the tasks already queued, then joins. Its threads
// are named `name` (server::SetThreadName).
// Thread-safe.
class Executor {
 public:
  Executor(absl::string_view name, int threads);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  void Schedule(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace dispatchd::server
