#include "server/dispatch/job_events.h"

#include <algorithm>
#include <utility>

namespace dispatchd::dispatch {

uint64_t JobEvents::Subscribe(const std::string& job_id, Callback callback) {
  absl::MutexLock l(&mu_);
  uint64_t token = next_token_++;
  by_job_[job_id].push_back(Subscription{token, std::move(callback)});
  job_of_token_[token] = job_id;
  return token;
}

void JobEvents::Unsubscribe(uint64_t token) {
  absl::MutexLock l(&mu_);
  auto it = job_of_token_.find(token);
  if (it == job_of_token_.end()) return;
  auto subs = by_job_.find(it->second);
  if (subs != by_job_.end()) {
    std::erase_if(subs->second, [token](const Subscription& s) { return s.token == token; });
    if (subs->second.empty()) by_job_.erase(subs);
  }
  job_of_token_.erase(it);
}

void JobEvents::Publish(const std::string& job_id, job::JobState state, const job::Job* ended) {
  absl::MutexLock l(&mu_);
  auto it = by_job_.find(job_id);
  if (it == by_job_.end()) return;
  for (const Subscription& s : it->second) s.callback(state, ended);
}

bool JobEvents::Watched(const std::string& job_id) {
  absl::MutexLock l(&mu_);
  return by_job_.contains(job_id);
}

std::vector<std::string> JobEvents::WatchedJobs() {
  absl::MutexLock l(&mu_);
  std::vector<std::string> ids;
  ids.reserve(by_job_.size());
  for (const auto& [id, subs] : by_job_) ids.push_back(id);
  return ids;
}

}  // namespace dispatchd::dispatch
