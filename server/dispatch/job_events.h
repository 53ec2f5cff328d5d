#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"

#include "lib/job/job.h"

namespace dispatchd::dispatch {

// Fan-out of job state changes to RunSync and Watch calls. The dispatcher publishes each change
// it commits; subscribers re-read the job from the store for the full record, except where a
// terminal change carries the row as committed (`ended`) and the subscriber knows the rest.
// Callbacks run on the publishing thread (the dispatcher loop) under this object's lock, so they
// must only hand work off and must not call back into JobEvents. Once Unsubscribe returns, the
// callback is neither running nor will run. Thread-safe.
class JobEvents {
 public:
  // `ended`: for a terminal change whose row the publisher has, that row as committed but for
  // its spec (left empty, but for not_before, which a retry moves); null otherwise. Valid
  // during the call only.
  using Callback = std::function<void(job::JobState state, const job::Job* ended)>;

  uint64_t Subscribe(const std::string& job_id, Callback callback) ABSL_LOCKS_EXCLUDED(mu_);
  void Unsubscribe(uint64_t token) ABSL_LOCKS_EXCLUDED(mu_);
  void Publish(const std::string& job_id, job::JobState state, const job::Job* ended = nullptr)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Whether the job has a subscriber now (a publisher builds `ended` only then).
  bool Watched(const std::string& job_id) ABSL_LOCKS_EXCLUDED(mu_);
  // Jobs that have at least one subscriber now (a standby polls their rows).
  std::vector<std::string> WatchedJobs() ABSL_LOCKS_EXCLUDED(mu_);

 private:
  struct Subscription {
    uint64_t token;
    Callback callback;
  };
  absl::Mutex mu_;
  uint64_t next_token_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<std::string, std::vector<Subscription>> by_job_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> job_of_token_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dispatchd::dispatch
