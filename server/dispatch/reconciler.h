#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/time/time.h"

#include "lib/job/job.h"
#include "server/dispatch/queue_pager.h"
#include "server/store/job_store.h"

namespace dispatchd::dispatch {

// The reconcile compares the jobs the leader holds with the active rows in the database and
// repairs the differences: a placed row it does not know (held for the re-attach grace, as after
// a restart), a job it holds that ended in the database (dropped), a queue whose held rows are
// not the rows its window covers (the missing ones held, the ended ones dropped).
//
// It runs in two halves so that the loop never waits on the database: the loop takes a
// HeldSnapshot (with no turn in flight, and none until the reconcile is applied, so the rows the
// leader writes cannot move under it), ReadForReconcile reads what differs on the writer's thread,
// and the loop applies the ReconcileReads (Dispatcher::ApplyReconcile), checking each difference
// again against what it holds by then.

// A row that changed this recently may simply not have reached the loop yet (a Submit or Cancel
// in flight, a standby's NOTIFY): the reconcile still settles it, but counts and logs it as
// drift only when the change is older.
inline constexpr absl::Duration kReconcileSettle = absl::Seconds(5);

// What the loop holds, as the reconcile compares it.
struct HeldSnapshot {
  absl::Time now;
  int64_t window = 0;
  absl::flat_hash_set<std::string> held;  // every job held
  // DISPATCHED and RUNNING jobs held: state and attempt as committed.
  absl::flat_hash_map<std::string, std::pair<job::JobState, int32_t>> placed;
  absl::flat_hash_map<QueueId, std::vector<std::string>> queued;  // QUEUED jobs held, by queue
  std::vector<store::QueueBound> bounds;                          // the windows
};

// What the database says where it differs.
struct ReconcileReads {
  absl::Status status;  // the placed rows could not be read: nothing to apply
  // Placed in the database, not held, and not changed in kReconcileSettle: the rows.
  std::vector<job::Job> strays;
  // Held as placed, and placed otherwise (or not at all) in the database: where they stand.
  std::vector<store::JobRef> suspects;
  absl::Status count_status;
  std::vector<store::QueueCount> counts;  // every queue with QUEUED rows
  // A queue whose held rows differ from its rows.
  struct Queue {
    QueueId queue;
    int64_t queued = 0;               // its QUEUED rows
    std::vector<store::JobRef> held;  // where its held jobs stand
    absl::Status rows_status;
    std::vector<job::Job> rows;  // its first `window` QUEUED rows
  };
  std::vector<Queue> queues;
};

// Reads what differs between `held` and the database. Runs on the writer's thread.
ReconcileReads ReadForReconcile(store::JobStore& store, const HeldSnapshot& held);

}  // namespace dispatchd::dispatch
