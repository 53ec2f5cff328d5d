#include "server/util/executor.h"

#include <string>
#include <utility>

#include "server/util/thread_name.h"

namespace dispatchd::server {

Executor::Executor(absl::string_view name, int threads) {
  for (int i = 0; i < threads; ++i) {
    threads_.emplace_back([this, name = std::string(name)] {
      SetThreadName(name);
      Run();
    });
  }
}

Executor::~Executor() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) t.join();
}

void Executor::Schedule(std::function<void()> task) {
  absl::MutexLock l(&mu_);
  tasks_.push_back(std::move(task));
}

void Executor::Run() {
  while (true) {
    std::function<void()> task;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](Executor* e)
               ABSL_EXCLUSIVE_LOCKS_REQUIRED(e->mu_) { return e->stopping_ || !e->tasks_.empty(); },
          this));
      if (tasks_.empty()) return;  // stopping, and nothing left to run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace dispatchd::server
