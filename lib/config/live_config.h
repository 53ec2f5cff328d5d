#pragma once

#include <memory>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

#include "lib/config/config.h"

namespace dispatchd::config {

// The configuration in force, replaced whole by a reload. Readers take a snapshot and keep it for
// the length of their work, so a reload never changes a config under anyone's feet.
//
//   LiveConfig live(config);
//   std::shared_ptr<const Config> c = live.Get();   // then use *c
//   live.Set(next);                                  // on SIGHUP
//
// Thread-safe.
class LiveConfig {
 public:
  explicit LiveConfig(Config initial)
      : current_(std::make_shared<const Config>(std::move(initial))) {}

  std::shared_ptr<const Config> Get() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock l(&mu_);
    return current_;
  }
  void Set(Config next) ABSL_LOCKS_EXCLUDED(mu_) {
    auto c = std::make_shared<const Config>(std::move(next));
    absl::MutexLock l(&mu_);
    current_ = std::move(c);
  }

 private:
  mutable absl::Mutex mu_;
  std::shared_ptr<const Config> current_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dispatchd::config
