#pragma once

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace dispatchd::server {

// Runs `tick` on a thread of its own: at once, then every `period` until Stop. A zero or negative
// period starts no thread. Stop (or the destructor) waits for a running tick and joins.
//
//   Ticker ticker(absl::Seconds(1), [&] { PublishHealth(); });
//
// Thread-safe.
class Ticker {
 public:
  Ticker(absl::Duration period, std::function<void()> tick);
  ~Ticker();
  Ticker(const Ticker&) = delete;
  Ticker& operator=(const Ticker&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const absl::Duration period_;
  std::function<void()> tick_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dispatchd::server
