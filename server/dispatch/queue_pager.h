#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/time/time.h"

#include "lib/job/job.h"
#include "server/store/job_store.h"

namespace dispatchd::dispatch {

// A queue: a job type and a fairness key.
using QueueId = std::pair<std::string, std::string>;
inline QueueId QueueOf(const job::Job& job) { return {job.spec.type, job.spec.fairness_key}; }

// Which QUEUED rows the dispatcher holds in memory. It holds the first rows of each queue, by
// seq, up to `window` (scheduler.queue_window), and reads the next ones in as it drains: a queue
// of a million rows costs the loop a window's worth. A queue whose rows are not all held has a
// Window: every row with seq <= bound is held (or on its way: a Submit, a standby's insert, a
// reconcile), and the `unheld` ones above wait in the database. A queue with no window is
// complete: all its rows are held, or on their way.
//
//   QueuePager pager(window);
//   if (pager.Hold(row, held_of_its_queue)) Keep(row);
//   for (const QueuePager::Page& p : pager.DuePages(held_of, now)) ... read it ...
//   pager.Paged(p, rows);   // then hold the rows it returns that are not held yet
//
// Loop-confined, like the dispatcher that owns it.
class QueuePager {
 public:
  explicit QueuePager(int64_t window) : window_(window) {}

  int64_t window() const { return window_; }

  // Windows for the queues loaded at start: `loaded` rows each (the last at seq `last`) out of
  // `queued`.
  void Loaded(const QueueId& queue, int64_t loaded, int64_t last, int64_t queued);

  // Whether a QUEUED row that arrives is held; if not it waits in the database, counted in its
  // window's `unheld`. `held` is the number of its queue's jobs held now.
  bool Hold(const job::Job& row, int64_t held);

  // A read of a queue's next rows.
  struct Page {
    QueueId queue;
    int64_t after_seq = 0;
    int64_t limit = 0;
  };
  // The queues whose held rows ran below half a window, and are not being read already. Each is
  // being read from now until Paged or PageFailed.
  std::vector<Page> DuePages(const std::function<int64_t(const QueueId&)>& held, absl::Time now);
  // The page's read returned `rows` (by seq): its bound moves past them. A page short of its
  // limit completes the queue.
  void Paged(const Page& page, const std::vector<job::Job>& rows);
  // The read failed: no page is read for a second.
  void PageFailed(const Page& page, absl::Time now);

  // Whether a QUEUED row of `queue` at `seq` waits in the database (beyond its window).
  bool PagedOut(const QueueId& queue, int64_t seq) const;

  // For the reconcile: every window's bound; a queue's bound (INT64_MAX for a complete queue);
  // its count of rows beyond the bound; a window for a complete queue found to have more rows
  // than a window.
  std::vector<store::QueueBound> Bounds() const;
  int64_t BoundOf(const QueueId& queue) const;
  void SetUnheld(const QueueId& queue, int64_t unheld);
  void Open(const QueueId& queue, int64_t bound, int64_t unheld);

  // Rows waiting in the database beyond the windows, in all and per queue.
  int64_t unheld() const;
  void ForEachUnheld(const std::function<void(const QueueId&, int64_t)>& f) const;
  size_t windows() const { return windows_.size(); }

 private:
  struct Window {
    int64_t bound = 0;
    int64_t unheld = 0;    // as last counted, give or take rows that ended in the database since
    bool reading = false;  // a page read is in flight
  };

  const int64_t window_;
  absl::flat_hash_map<QueueId, Window> windows_;
  absl::Time paused_until_ = absl::InfinitePast();
};

}  // namespace dispatchd::dispatch
