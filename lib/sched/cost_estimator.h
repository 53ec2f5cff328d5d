#pragma once

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

namespace dispatchd::sched {

// Learns what a job costs: an exponential moving average of the observed wall time (seconds) of
// each (type, resource_id), `alpha * observed + (1 - alpha) * estimate`. Before the first
// observation the caller's default applies. Estimates unused for a TTL are forgotten.
//
// Not thread-safe.
class CostEstimator {
 public:
  explicit CostEstimator(double alpha = 0.3) : alpha_(alpha) {}

  void set_alpha(double alpha) { alpha_ = alpha; }

  // The estimate for (type, resource), or `default_cost` if none.
  double Estimate(const std::string& type, const std::string& resource, double default_cost,
                  absl::Time now);
  // Folds one observed wall time in; the first observation moves the estimate from
  // `default_cost`, as if the default had been the previous estimate.
  void Observe(const std::string& type, const std::string& resource, absl::Duration wall,
               double default_cost, absl::Time now);
  // Replaces the estimate (seeding from persisted values, tests).
  void Set(const std::string& type, const std::string& resource, double cost, absl::Time now);
  // Forgets estimates not used since `now - ttl`.
  void Expire(absl::Time now, absl::Duration ttl);
  // Calls `fn(type, resource, cost)` for each estimate changed by Observe since the last call
  // (every estimate with `all`), and forgets which changed.
  template <typename Fn>
  void TakeChanged(bool all, Fn fn) {
    for (auto& [key, e] : estimates_) {
      if (e.changed || all) fn(key.first, key.second, e.cost);
      e.changed = false;
    }
  }

  size_t size() const { return estimates_.size(); }

 private:
  struct Entry {
    double cost;
    absl::Time last_used;
    bool changed = false;
  };
  double alpha_;
  absl::flat_hash_map<std::pair<std::string, std::string>, Entry> estimates_;
};

}  // namespace dispatchd::sched
