#include "lib/sched/cost_estimator.h"

#include <cmath>

namespace dispatchd::sched {

double CostEstimator::Estimate(const std::string& type, const std::string& resource,
                               double default_cost, absl::Time now) {
  auto it = estimates_.find(std::make_pair(type, resource));
  if (it == estimates_.end()) return default_cost;
  it->second.last_used = now;
  return it->second.cost;
}

void CostEstimator::Observe(const std::string& type, const std::string& resource,
                            absl::Duration wall, double default_cost, absl::Time now) {
  double observed = absl::ToDoubleSeconds(wall);
  if (!std::isfinite(observed)) return;  // an unknown start: nothing learned
  if (observed < 0) observed = 0;
  auto [it, fresh] =
      estimates_.try_emplace(std::make_pair(type, resource), Entry{default_cost, now});
  Entry& e = it->second;
  e.cost = alpha_ * observed + (1 - alpha_) * e.cost;
  e.last_used = now;
  e.changed = true;
}

void CostEstimator::Set(const std::string& type, const std::string& resource, double cost,
                        absl::Time now) {
  estimates_[std::make_pair(type, resource)] = Entry{cost, now};
}

void CostEstimator::Expire(absl::Time now, absl::Duration ttl) {
  absl::erase_if(estimates_, [&](const auto& kv) { return kv.second.last_used + ttl < now; });
}

}  // namespace dispatchd::sched
