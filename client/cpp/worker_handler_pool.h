#pragma once

// The threads the worker SDK runs handlers on. Internal to the SDK (worker.h).

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace dispatchd::client::worker_internal {

// Handler threads, started as jobs need them (at most one per job running at once) and kept for
// the next jobs: starting a thread per job would cost more than a short job itself.
//
//   HandlerPool pool;
//   if (!pool.Start([job] { Run(job); })) { /* no thread: report the job failed */ }
//
// Thread-safe. A worker calls Start() with its own mutex held: the pool's lock is taken after the
// worker's, never before it, and no task runs under it.
class HandlerPool {
 public:
  HandlerPool() = default;
  // Runs the tasks handed over and not yet started, waits for every task, and joins the threads.
  ~HandlerPool();
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Hands `task` to an idle thread, starting one if none is idle. False (and `task` is not run)
  // if no thread exists and none could be started.
  bool Start(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

 private:
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);

  absl::Mutex mu_;
  std::deque<std::function<void()>> ready_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  int idle_ ABSL_GUARDED_BY(mu_) = 0;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dispatchd::client::worker_internal
