#include "client/cpp/worker_result_ledger.h"

namespace dispatchd::client::worker_internal {

void ResultLedger::Keep(const JobKey& key, v1::Result result) { results_[key] = std::move(result); }

void ResultLedger::Acknowledge(const JobKey& key) { results_.erase(key); }

const v1::Result* ResultLedger::Find(const JobKey& key) const {
  auto it = results_.find(key);
  return it == results_.end() ? nullptr : &it->second;
}

std::vector<v1::Result> ResultLedger::Readopt(const std::set<JobKey>& adopted,
                                              std::vector<JobKey>* dropped) {
  std::vector<v1::Result> resend;
  for (auto it = results_.begin(); it != results_.end();) {
    if (adopted.contains(it->first)) {
      resend.push_back(it->second);
      ++it;
    } else {
      dropped->push_back(it->first);
      it = results_.erase(it);
    }
  }
  return resend;
}

}  // namespace dispatchd::client::worker_internal
