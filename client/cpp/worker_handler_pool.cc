#include "client/cpp/worker_handler_pool.h"

#include <system_error>
#include <utility>

namespace dispatchd::client::worker_internal {

HandlerPool::~HandlerPool() {
  std::vector<std::thread> threads;
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
    threads.swap(threads_);
  }
  for (std::thread& t : threads) t.join();
}

bool HandlerPool::Start(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  ready_.push_back(std::move(task));
  if (idle_ >= static_cast<int>(ready_.size())) return true;
  try {
    threads_.emplace_back(&HandlerPool::Loop, this);
    ++idle_;
  } catch (const std::system_error&) {
    if (threads_.empty()) {
      ready_.pop_back();
      return false;
    }
    // A thread that exists takes the job when its current one ends.
  }
  return true;
}

void HandlerPool::Loop() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      auto work = [this]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_ || !ready_.empty(); };
      mu_.Await(absl::Condition(&work));
      if (ready_.empty()) return;  // stopping
      task = std::move(ready_.front());
      ready_.pop_front();
      --idle_;
    }
    task();
    absl::MutexLock l(&mu_);
    ++idle_;
  }
}

}  // namespace dispatchd::client::worker_internal
