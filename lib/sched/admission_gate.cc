#include "lib/sched/admission_gate.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace dispatchd::sched {
namespace {

constexpr absl::Duration kBucket = absl::Seconds(1);
constexpr double kRateAlpha = 0.3;

}  // namespace

AdmissionGate::AdmissionGate(const config::Config& config) { UpdateConfig(config); }

void AdmissionGate::UpdateConfig(const config::Config& config) {
  absl::MutexLock l(&mu_);
  max_active_ = config.max_active;
  max_depth_.clear();
  for (const config::JobTypeConfig& t : config.types) max_depth_[t.name] = t.max_queue_depth;
  tenant_of_.clear();
  tenant_max_.clear();
  for (const config::TenantConfig& t : config.tenants) {
    if (t.max_active == std::numeric_limits<int64_t>::max()) continue;
    tenant_max_[t.name] = t.max_active;
    for (const std::string& p : t.principals) tenant_of_[p] = t.name;
  }
}

const std::string* AdmissionGate::LimitedTenantOf(const std::string& owner) const {
  auto it = tenant_of_.find(owner);
  return it == tenant_of_.end() ? nullptr : &it->second;
}

std::vector<std::string> AdmissionGate::LimitedTenants() const {
  absl::MutexLock l(&mu_);
  std::vector<std::string> out;
  for (const auto& [name, max] : tenant_max_) out.push_back(name);
  return out;
}

void AdmissionGate::PublishOwners(const absl::flat_hash_map<std::string, int64_t>& by_owner) {
  absl::MutexLock l(&mu_);
  tenant_active_.clear();
  for (const auto& [owner, n] : by_owner) {
    if (const std::string* tenant = LimitedTenantOf(owner)) tenant_active_[*tenant] += n;
  }
}

void AdmissionGate::PublishTenants(absl::flat_hash_map<std::string, int64_t> active_by_tenant) {
  absl::MutexLock l(&mu_);
  tenant_active_ = std::move(active_by_tenant);
}

void Reservation::Settle() {
  if (gate_ == nullptr) return;
  if (written_) {
    gate_->Counted(type_, owner_);
  } else {
    gate_->Release(type_, owner_);
  }
  gate_ = nullptr;
}

Reservation& Reservation::operator=(Reservation&& other) noexcept {
  if (this == &other) return *this;
  Settle();
  gate_ = std::exchange(other.gate_, nullptr);
  type_ = std::move(other.type_);
  owner_ = std::move(other.owner_);
  written_ = other.written_;
  return *this;
}

void AdmissionGate::Close(std::string why) {
  absl::MutexLock l(&mu_);
  closed_ = std::move(why);
}

absl::StatusOr<Reservation> AdmissionGate::TryAdmit(const std::string& type,
                                                    const std::string& owner,
                                                    absl::Duration* retry_after) {
  absl::MutexLock l(&mu_);
  if (!closed_.empty()) return absl::UnavailableError(closed_);
  const std::string* tenant = LimitedTenantOf(owner);
  if (tenant != nullptr) {
    int64_t active = 0;
    if (auto a = tenant_active_.find(*tenant); a != tenant_active_.end()) active += a->second;
    if (auto r = tenant_reserved_.find(*tenant); r != tenant_reserved_.end()) active += r->second;
    const int64_t limit = tenant_max_.at(*tenant);
    if (active >= limit) {
      *retry_after = RetryAfterLocked(active - limit + 1);
      return absl::ResourceExhaustedError(
          absl::StrCat("tenants[", *tenant, "].max_active: ", active, " jobs active (limit ", limit,
                       "); retry in ", absl::FormatDuration(*retry_after)));
    }
  }
  int64_t active = active_ + reserved_;
  if (active >= max_active_) {
    *retry_after = RetryAfterLocked(active - max_active_ + 1);
    return absl::ResourceExhaustedError(absl::StrCat("max_active: ", active, " jobs active (limit ",
                                                     max_active_, "); retry in ",
                                                     absl::FormatDuration(*retry_after)));
  }
  if (auto limit = max_depth_.find(type); limit != max_depth_.end()) {
    int64_t queued = 0;
    if (auto q = queued_.find(type); q != queued_.end()) queued += q->second;
    if (auto r = reserved_by_type_.find(type); r != reserved_by_type_.end()) queued += r->second;
    if (queued >= limit->second) {
      *retry_after = RetryAfterLocked(queued - limit->second + 1);
      return absl::ResourceExhaustedError(
          absl::StrCat("max_queue_depth: type \"", type, "\" has ", queued, " jobs queued (limit ",
                       limit->second, "); retry in ", absl::FormatDuration(*retry_after)));
    }
  }
  ++reserved_;
  ++reserved_by_type_[type];
  if (tenant != nullptr) ++tenant_reserved_[*tenant];
  return Reservation(this, type, owner);
}

void AdmissionGate::Release(const std::string& type, const std::string& owner) {
  absl::MutexLock l(&mu_);
  --reserved_;
  if (--reserved_by_type_[type] <= 0) reserved_by_type_.erase(type);
  if (const std::string* tenant = LimitedTenantOf(owner)) {
    if (--tenant_reserved_[*tenant] <= 0) tenant_reserved_.erase(*tenant);
  }
}

void AdmissionGate::Counted(const std::string& type, const std::string& owner) {
  absl::MutexLock l(&mu_);
  // The job moves from reserved to counted: count it now, before the next Publish does.
  --reserved_;
  if (--reserved_by_type_[type] <= 0) reserved_by_type_.erase(type);
  ++active_;
  ++queued_[type];
  if (const std::string* tenant = LimitedTenantOf(owner)) {
    if (--tenant_reserved_[*tenant] <= 0) tenant_reserved_.erase(*tenant);
    ++tenant_active_[*tenant];
  }
}

void AdmissionGate::Publish(int64_t active, absl::flat_hash_map<std::string, int64_t> queued) {
  absl::MutexLock l(&mu_);
  active_ = active;
  queued_ = std::move(queued);
}

void AdmissionGate::Drained(int64_t n, absl::Time now) {
  absl::MutexLock l(&mu_);
  if (bucket_start_ == absl::InfinitePast()) bucket_start_ = now;
  while (now - bucket_start_ >= kBucket) {
    double rate = static_cast<double>(drained_in_bucket_) / absl::ToDoubleSeconds(kBucket);
    drain_per_second_ = kRateAlpha * rate + (1 - kRateAlpha) * drain_per_second_;
    drained_in_bucket_ = 0;
    bucket_start_ += kBucket;
    if (now - bucket_start_ > 60 * kBucket) bucket_start_ = now;  // long idle: restart
  }
  drained_in_bucket_ += n;
}

absl::Duration AdmissionGate::RetryAfter(int64_t excess) const {
  absl::MutexLock l(&mu_);
  return RetryAfterLocked(excess);
}

absl::Duration AdmissionGate::RetryAfterLocked(int64_t excess) const {
  if (drain_per_second_ <= 0) return absl::Seconds(1);
  absl::Duration d =
      absl::Seconds(static_cast<double>(std::max<int64_t>(excess, 1)) / drain_per_second_);
  return std::clamp(d, absl::Milliseconds(100), absl::Seconds(60));
}

}  // namespace dispatchd::sched
