#pragma once

#include <cstdint>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/config/config.h"

namespace dispatchd::dispatch {

// Spawn on overflow: runs the configured `overflow_hook.command` when jobs wait for capacity, at
// most once per `overflow_hook.interval`, so that a fleet manager can start workers. Best effort:
// the command runs in the background (`/bin/sh -c`, in its own session, stdin from /dev/null,
// output appended to `log_path`), is killed after `overflow_hook.timeout`, and a failure is only
// logged. Its environment adds DISPATCHD_BACKLOG ("type=count ..." for each type with jobs waiting
// for capacity) and DISPATCHD_BACKLOG_TOTAL.
//
// Thread-compatible: called from the dispatcher loop only; the run itself waits on a thread.
class OverflowHook {
 public:
  OverflowHook(config::OverflowHookConfig config, std::string log_path);
  ~OverflowHook();  // kills a run still going
  OverflowHook(const OverflowHook&) = delete;
  OverflowHook& operator=(const OverflowHook&) = delete;

  // True if a run would start now: a command is configured, none runs, and the interval since
  // the last start has passed. Lets the caller skip computing the backlog.
  bool Due(absl::Time now) const;
  // Starts the command if Due(now) and `backlog` (jobs waiting for capacity, per type) is not
  // empty. True if it started.
  bool MaybeRun(absl::Time now, const std::vector<std::pair<std::string, int64_t>>& backlog);

 private:
  void Wait(pid_t pid);

  const config::OverflowHookConfig config_;
  const std::string log_path_;
  absl::Time last_start_ = absl::InfinitePast();
  std::thread waiter_;
  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace dispatchd::dispatch
