#pragma once

// The results the worker SDK keeps until the daemon acknowledges them. Internal to the SDK
// (worker.h).

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "dispatchd/v1/worker_service.pb.h"

namespace dispatchd::client::worker_internal {

namespace v1 = ::dispatchd::v1;

using JobKey = std::pair<std::string, int32_t>;  // (job id, attempt)

// Results sent (or to send) and not yet acknowledged, in key order. A result stays until its
// ResultAck arrives, whatever happens to the stream: it is sent again after every reconnect for an
// attempt the daemon adopted, and its job counts as held meanwhile (Hello, heartbeats).
//
//   ledger.Keep(key, result);  // when the handler returns, before the result is sent
//   ledger.Acknowledge(key);   // on ResultAck
//   std::vector<v1::Result> again = ledger.Readopt(adopted, &dropped);  // after a Welcome
//
// Thread-compatible: the worker guards it with its mutex.
class ResultLedger {
 public:
  // Keeps `result` for `key`, replacing any result kept for it.
  void Keep(const JobKey& key, v1::Result result);
  // Forgets the result for `key`, if one is kept.
  void Acknowledge(const JobKey& key);
  // The result kept for `key`, or null.
  const v1::Result* Find(const JobKey& key) const;

  bool empty() const { return results_.empty(); }
  size_t size() const { return results_.size(); }

  // After a Welcome: returns the results of the attempts in `adopted`, to send again, and forgets
  // the others, appending their keys to `*dropped`. A result the daemon did not adopt is for an
  // attempt that is no longer current (or one it already recorded): sending it again would only
  // be discarded.
  std::vector<v1::Result> Readopt(const std::set<JobKey>& adopted, std::vector<JobKey>* dropped);

  // The results kept, as (key, result) pairs in key order.
  using const_iterator = std::map<JobKey, v1::Result>::const_iterator;
  const_iterator begin() const { return results_.begin(); }
  const_iterator end() const { return results_.end(); }

 private:
  std::map<JobKey, v1::Result> results_;
};

}  // namespace dispatchd::client::worker_internal
