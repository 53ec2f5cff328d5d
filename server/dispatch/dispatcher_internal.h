#pragma once

#include <cstddef>

#include "absl/time/time.h"

// The dispatcher's timings and limits, shared by its source files (dispatcher*.cc).
namespace dispatchd::dispatch {

inline constexpr absl::Duration kSweepInterval = absl::Milliseconds(200);
inline constexpr absl::Duration kExpiryInterval = absl::Seconds(1);
// How long writes and dispatching pause after the store failed a turn.
inline constexpr absl::Duration kStoreErrorPause = absl::Seconds(1);
inline constexpr size_t kMaxDispatchesPerRound = 512;
// How often the scheduler's derived counts are recounted (Scheduler::Audit).
inline constexpr absl::Duration kAuditInterval = absl::Seconds(10);
// How often the jobs held here are compared with the database (reconciler.h).
inline constexpr absl::Duration kReconcileInterval = absl::Seconds(10);
// How long a due reconcile waits for placements in flight (their inserts) before it is put off
// to the next round: turns wait while it is due.
inline constexpr absl::Duration kReconcileWait = absl::Seconds(1);
// How often the leader saves the scheduler's fair-share accounts: what a crash can lose.
inline constexpr absl::Duration kAccountsInterval = absl::Seconds(1);
// Heartbeats in a row that may leave out a job the daemon believes runs on the worker before the
// job counts as lost there. Stream order already makes one miss conclusive for the SDK; two
// tolerate a worker that builds its heartbeat before it writes a result.
inline constexpr int kHeartbeatMissesToLose = 2;
// An accept's RUNNING mark waits this long before it is written: a job whose result comes first
// (most short jobs) needs no mark at all, since the finish accepts the row still DISPATCHED.
// Status shows such a job DISPATCHED for at most this long after its worker started it.
inline constexpr absl::Duration kRunningMarkDelay = absl::Milliseconds(50);
// How long a Place waits for the loop before its jobs go in QUEUED, to be claimed as usual.
inline constexpr absl::Duration kPlaceWait = absl::Milliseconds(10);
// A placement whose row was written but whose job has not come to the loop after this is
// forgotten (ExpirePlacements).
inline constexpr absl::Duration kPlacementTimeout = absl::Seconds(10);
// A claim the store did not grant (another session holds the row) is tried again after this.
inline constexpr absl::Duration kClaimRetryDelay = absl::Milliseconds(100);

inline constexpr char kExpiredError[] =
    "capacity: no worker took the job before its dispatch deadline";

}  // namespace dispatchd::dispatch
