#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/config/config.h"

namespace dispatchd::sched {

class AdmissionGate;

// Room one job holds in the AdmissionGate from its admission until the dispatcher counts it.
// Move-only, and settled exactly once, when it goes out of scope: given back if its row was never
// written (the insert failed, or it was a duplicate), counted as an active job if it was
// (Written()): the holder of a written job drops it once the dispatcher holds the job, or at once
// on a standby (whose counts come from the database).
//
//   absl::StatusOr<Reservation> r = gate.TryAdmit(type, owner, &retry_after);
//   ... insert the row ...
//   r->Written();
//   dispatcher.JobQueued(std::move(job), *std::move(r));  // counted when the loop takes it
class Reservation {
 public:
  Reservation() = default;  // holds no room
  Reservation(Reservation&& other) noexcept { *this = std::move(other); }
  Reservation& operator=(Reservation&& other) noexcept;
  Reservation(const Reservation&) = delete;
  Reservation& operator=(const Reservation&) = delete;
  ~Reservation() { Settle(); }

  // The job's row is committed: from here on, settling counts the job instead of giving the
  // room back.
  void Written() { written_ = true; }
  bool holds() const { return gate_ != nullptr; }

 private:
  friend class AdmissionGate;
  Reservation(AdmissionGate* gate, std::string type, std::string owner)
      : gate_(gate), type_(std::move(type)), owner_(std::move(owner)) {}
  void Settle();

  AdmissionGate* gate_ = nullptr;
  std::string type_;
  std::string owner_;
  bool written_ = false;
};

// Refuses work before anything is written: the `max_active` ceiling (jobs queued, dispatched or
// running), each tenant's `max_active` (`tenants[i]`) and each type's `max_queue_depth`. A Submit
// reserves room with TryAdmit before its row is inserted; the Reservation it gets is its only
// handle on that room (see Reservation). The dispatcher reports the jobs it holds with Publish,
// so concurrent Submits can never overshoot a limit.
//
// A refusal carries a retry hint: the time the fleet needs, at its recent drain rate, to finish
// the jobs above the ceiling.
//
// Thread-safe. Outlives every Reservation it hands out.
class AdmissionGate {
 public:
  explicit AdmissionGate(const config::Config& config);

  void UpdateConfig(const config::Config& config) ABSL_LOCKS_EXCLUDED(mu_);

  // Reserves room for one job of `type` (already validated), or RESOURCE_EXHAUSTED naming the
  // limit, e.g. "max_active: 1000 jobs active (limit 1000); retry in 2.5s". `retry_after` gets
  // the hint on refusal.
  // `owner` is the submitting principal (empty without authentication): its tenant's max_active
  // holds too, "tenants[research].max_active: ...".
  absl::StatusOr<Reservation> TryAdmit(const std::string& type, const std::string& owner,
                                       absl::Duration* retry_after) ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<Reservation> TryAdmit(const std::string& type, absl::Duration* retry_after)
      ABSL_LOCKS_EXCLUDED(mu_) {
    return TryAdmit(type, "", retry_after);
  }
  // Refuses every later TryAdmit UNAVAILABLE with `why`, which must not be empty and should
  // start with its reason and a colon, as the limits' messages do ("stopping: ..."). The daemon
  // closes its gate as it stops.
  void Close(std::string why) ABSL_LOCKS_EXCLUDED(mu_);
  // What the dispatcher holds: every active job, and the queued ones per type.
  void Publish(int64_t active, absl::flat_hash_map<std::string, int64_t> queued_by_type)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The active jobs of each tenant that has a max_active (others may be left out).
  void PublishTenants(absl::flat_hash_map<std::string, int64_t> active_by_tenant)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The same from active jobs per owner (a standby counts them in the database).
  void PublishOwners(const absl::flat_hash_map<std::string, int64_t>& active_by_owner)
      ABSL_LOCKS_EXCLUDED(mu_);
  // The tenants that have a max_active, for the caller to count.
  std::vector<std::string> LimitedTenants() const ABSL_LOCKS_EXCLUDED(mu_);
  // `n` jobs reached a terminal state: feeds the drain rate behind the retry hint.
  void Drained(int64_t n, absl::Time now) ABSL_LOCKS_EXCLUDED(mu_);

  // The hint for `excess` jobs above a limit at the current drain rate, within [100ms, 60s].
  absl::Duration RetryAfter(int64_t excess) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class Reservation;
  // A reservation's job was not written (the insert failed, or it was a duplicate).
  void Release(const std::string& type, const std::string& owner) ABSL_LOCKS_EXCLUDED(mu_);
  // A reservation's job was written and the dispatcher holds it (or will load it): counted as
  // active until the next Publish, which includes it.
  void Counted(const std::string& type, const std::string& owner) ABSL_LOCKS_EXCLUDED(mu_);
  absl::Duration RetryAfterLocked(int64_t excess) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The tenant of `owner` if it has a max_active, else null.
  const std::string* LimitedTenantOf(const std::string& owner) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::string closed_ ABSL_GUARDED_BY(mu_);  // why it refuses everything; empty while open
  int64_t max_active_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> max_depth_ ABSL_GUARDED_BY(mu_);
  int64_t active_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int64_t> queued_ ABSL_GUARDED_BY(mu_);
  int64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int64_t> reserved_by_type_ ABSL_GUARDED_BY(mu_);
  // Tenants with a max_active: the limit, the jobs published plus counted since, and reserved.
  absl::flat_hash_map<std::string, std::string> tenant_of_ ABSL_GUARDED_BY(mu_);  // principal
  absl::flat_hash_map<std::string, int64_t> tenant_max_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> tenant_active_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, int64_t> tenant_reserved_ ABSL_GUARDED_BY(mu_);
  // Drain rate: an exponential moving average of jobs finished per second, over 1 s buckets.
  double drain_per_second_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t drained_in_bucket_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Time bucket_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace dispatchd::sched
