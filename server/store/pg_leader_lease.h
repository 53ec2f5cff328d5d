#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace dispatchd::store {

// Who leads, as the database records it (table dispatchd_leader, migrations.cc version 3).
struct LeaderRecord {
  int64_t epoch = 0;
  std::string holder;   // daemon id of the leader of `epoch`; empty before the first leader
  std::string address;  // where workers and clients reach it
  // Since the leader last renewed its lease, by the database server's clock.
  absl::Duration since_renewal = absl::ZeroDuration();
};

// One daemon's side of leader election: a PostgreSQL session of its own (apart from the store's
// pool) that holds the session advisory lock kLeaderLockKey while the daemon leads. PostgreSQL
// frees the lock the moment the session ends, so a dead leader is replaced at once; a frozen one
// stops renewing and a standby ends its sessions (Evict). While leading, the session also
// LISTENs for rows that standbys changed (JobStore::NotifyChanged). A leader that stops on purpose
// gives the lock back and says so (Release), and standbys waiting in AwaitRelease try at once.
//
//   auto lease = PgLeaderLease::Connect(url, "dispatchd d-1", absl::Seconds(5), absl::Seconds(2));
//   if (auto epoch = (*lease)->TryAcquire("d-1", "10.0.0.5:7411"); epoch.ok() && *epoch) ...
//
// Any error leaves the session unusable: drop the object (which ends the session and so gives up
// the lock) and connect again. Not thread-safe: owned by one thread.
class PgLeaderLease {
 public:
  // Opens the session (the schema must exist: PgJobStore::Connect migrates it first). Every
  // statement on it is cut off after `statement_timeout`. Unavailable names the endpoint;
  // InvalidArgument for a bad URL.
  static absl::StatusOr<std::unique_ptr<PgLeaderLease>> Connect(const std::string& url,
                                                                const std::string& application_name,
                                                                absl::Duration connect_timeout,
                                                                absl::Duration statement_timeout);
  ~PgLeaderLease();
  PgLeaderLease(const PgLeaderLease&) = delete;
  PgLeaderLease& operator=(const PgLeaderLease&) = delete;

  // Takes the leader lock if no session holds it, then starts a new epoch in one transaction
  // (recording `holder` and `address`) and returns it; nullopt if another session holds the
  // lock. The epoch bump waits at most `bump_timeout` for the previous leader's writes in
  // flight; past it the lock is given back and the call fails (Aborted).
  absl::StatusOr<std::optional<int64_t>> TryAcquire(const std::string& holder,
                                                    const std::string& address,
                                                    absl::Duration bump_timeout);
  // Moves the lease of `epoch` on. FailedPrecondition if another epoch has begun.
  absl::Status Renew(int64_t epoch);
  // The current record.
  absl::StatusOr<LeaderRecord> Read();
  // Ends every other session whose application_name is `application_name` (a frozen leader's):
  // its lock and row locks go with them. Returns how many sessions were ended.
  absl::StatusOr<int> Evict(const std::string& application_name);

  // Steps down on purpose: frees the lock at once, clears the record's address, and announces
  // it to every session listening for it (ListenForRelease), so that a standby takes over
  // without waiting for its next try. The caller must have stopped writing as `epoch`.
  absl::Status Release(int64_t epoch);
  // Starts listening for Release announcements (a standby does).
  absl::Status ListenForRelease();
  // Waits up to `timeout` for a Release announcement; whether one came. A standby waits here
  // between its rounds.
  absl::StatusOr<bool> AwaitRelease(absl::Duration timeout);

  // Starts listening for JobStore::NotifyChanged.
  absl::Status Listen();
  // Waits up to `timeout` for notifications; the job ids they named, in arrival order.
  absl::StatusOr<std::vector<std::string>> AwaitNotifications(absl::Duration timeout);

 private:
  class Impl;
  explicit PgLeaderLease(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace dispatchd::store
