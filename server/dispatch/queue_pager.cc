#include "server/dispatch/queue_pager.h"

#include <algorithm>
#include <climits>

namespace dispatchd::dispatch {
namespace {

// How long paging pauses after a read failed.
constexpr absl::Duration kReadErrorPause = absl::Seconds(1);

}  // namespace

void QueuePager::Loaded(const QueueId& queue, int64_t loaded, int64_t last, int64_t queued) {
  if (queued <= loaded) return;
  windows_[queue] = Window{.bound = last, .unheld = queued - loaded};
}

bool QueuePager::Hold(const job::Job& row, int64_t held) {
  const QueueId queue = QueueOf(row);
  auto w = windows_.find(queue);
  if (w == windows_.end()) {
    if (row.seq <= 0 || held < window_) return true;
    // The window is full. Every older row of the queue is held or on its way (the queue was
    // complete): from this row on, newer ones wait in the database.
    w = windows_.emplace(queue, Window{.bound = row.seq - 1}).first;
  }
  if (row.seq <= w->second.bound) return true;  // a late arrival inside the window
  ++w->second.unheld;
  return false;
}

std::vector<QueuePager::Page> QueuePager::DuePages(
    const std::function<int64_t(const QueueId&)>& held, absl::Time now) {
  std::vector<Page> pages;
  if (now < paused_until_) return pages;
  for (auto& [queue, w] : windows_) {
    if (w.reading) continue;
    const int64_t n = held(queue);
    if (n >= window_ / 2) continue;
    w.reading = true;
    pages.push_back(Page{.queue = queue, .after_seq = w.bound, .limit = window_ - n});
  }
  return pages;
}

void QueuePager::Paged(const Page& page, const std::vector<job::Job>& rows) {
  auto w = windows_.find(page.queue);
  if (w == windows_.end()) return;  // completed meanwhile (a reconcile)
  w->second.reading = false;
  for (const job::Job& row : rows) w->second.bound = std::max(w->second.bound, row.seq);
  const int64_t n = static_cast<int64_t>(rows.size());
  w->second.unheld = std::max<int64_t>(0, w->second.unheld - n);
  // Every row the page could see is held now; the rows still to come are on their way.
  if (n < page.limit) windows_.erase(w);
}

void QueuePager::PageFailed(const Page& page, absl::Time now) {
  if (auto w = windows_.find(page.queue); w != windows_.end()) w->second.reading = false;
  paused_until_ = now + kReadErrorPause;
}

bool QueuePager::PagedOut(const QueueId& queue, int64_t seq) const {
  auto w = windows_.find(queue);
  return w != windows_.end() && seq > w->second.bound;
}

std::vector<store::QueueBound> QueuePager::Bounds() const {
  std::vector<store::QueueBound> bounds;
  bounds.reserve(windows_.size());
  for (const auto& [queue, w] : windows_) {
    bounds.push_back({.type = queue.first, .fairness_key = queue.second, .bound = w.bound});
  }
  return bounds;
}

int64_t QueuePager::BoundOf(const QueueId& queue) const {
  auto w = windows_.find(queue);
  return w == windows_.end() ? INT64_MAX : w->second.bound;
}

void QueuePager::SetUnheld(const QueueId& queue, int64_t unheld) {
  if (auto w = windows_.find(queue); w != windows_.end()) w->second.unheld = unheld;
}

void QueuePager::Open(const QueueId& queue, int64_t bound, int64_t unheld) {
  windows_[queue] = Window{.bound = bound, .unheld = unheld};
}

int64_t QueuePager::unheld() const {
  int64_t n = 0;
  for (const auto& [queue, w] : windows_) n += w.unheld;
  return n;
}

void QueuePager::ForEachUnheld(const std::function<void(const QueueId&, int64_t)>& f) const {
  for (const auto& [queue, w] : windows_) {
    if (w.unheld > 0) f(queue, w.unheld);
  }
}

}  // namespace dispatchd::dispatch
