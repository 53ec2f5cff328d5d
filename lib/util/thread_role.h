#pragma once

// A thread's role as a capability that clang's thread-safety analysis checks, for state that is
// confined to one thread rather than guarded by a lock (an event loop's tables, say). As with a
// mutex, members name it in ABSL_GUARDED_BY and functions in ABSL_EXCLUSIVE_LOCKS_REQUIRED; what
// holds it is not a lock but the thread that runs the code:
//
//   class Loop {
//     void Start() {
//       role_.Take();                  // the caller plays the role until the thread starts
//       ...set up state...
//       thread_ = std::thread([this] { role_.Take(); Run(); });
//     }
//     void Post(Task t) { ...queue t for the loop thread... }
//     void Touch() { Post([this] { role_.Assert(); ++count_; }); }
//     util::ThreadRole role_;
//     int count_ ABSL_GUARDED_BY(role_) = 0;
//   };
//
// The analysis sees each lambda as a function of its own that holds nothing, so a task that runs
// on the thread says so first with Assert(), which also checks it at run time (a task run on the
// wrong thread aborts). Only one thread at a time plays a role; Take() hands it over, and the
// caller orders the handover (a thread's start, a join).

#include <atomic>
#include <thread>

#include "absl/base/thread_annotations.h"

#include "lib/util/check.h"

namespace dispatchd::util {

class ABSL_LOCKABLE ThreadRole {
 public:
  ThreadRole() = default;
  ThreadRole(const ThreadRole&) = delete;
  ThreadRole& operator=(const ThreadRole&) = delete;

  // From now on the calling thread plays the role, and no other thread does.
  void Take() ABSL_ASSERT_EXCLUSIVE_LOCK() {
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }

  // The calling thread plays the role: aborts if it does not.
  void Assert() const ABSL_ASSERT_EXCLUSIVE_LOCK() {
    DISPATCHD_CHECK(owner_.load(std::memory_order_relaxed) == std::this_thread::get_id(),
                    "called off the thread that plays this role");
  }

 private:
  std::atomic<std::thread::id> owner_{};
};

}  // namespace dispatchd::util
