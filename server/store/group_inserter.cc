#include "server/store/group_inserter.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <utility>

#include "absl/status/status.h"
#include "absl/time/clock.h"

#include "server/metrics/daemon_metrics.h"
#include "server/util/thread_name.h"

namespace dispatchd::store {

GroupInserter::GroupInserter(JobStore& store, Options options) : store_(store), options_(options) {
  const int n = std::max(1, options_.flushers);
  threads_.reserve(n);
  for (int i = 0; i < n; ++i)
    threads_.emplace_back([this] {
      server::SetThreadName("insert-flush");
      Run();
    });
}

GroupInserter::~GroupInserter() { Stop(); }

void GroupInserter::Insert(std::vector<job::Job> jobs, bool notify_leader, Done done,
                           std::shared_ptr<Placer> placer) {
  {
    absl::MutexLock l(&mu_);
    if (!stopping_) {
      queue_.push_back(Unit{.jobs = std::move(jobs),
                            .notify_leader = notify_leader,
                            .done = std::move(done),
                            .placer = std::move(placer),
                            .queued_at = absl::Now()});
      return;
    }
  }
  std::move(done)(std::move(jobs), absl::UnavailableError("the daemon is stopping"));
}

void GroupInserter::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

GroupInserter::Counts GroupInserter::counts() const {
  absl::MutexLock l(&mu_);
  return counts_;
}

void GroupInserter::Run() {
  while (true) {
    std::vector<Unit> batch;
    {
      absl::MutexLock l(&mu_);
      mu_.Await(absl::Condition(
          +[](GroupInserter* self) ABSL_EXCLUSIVE_LOCKS_REQUIRED(self->mu_) {
            return !self->queue_.empty() || self->stopping_;
          },
          this));
      if (queue_.empty()) return;  // stopping, and nothing left to commit
      batch = TakeBatch();
    }
    Commit(std::move(batch));
  }
}

std::vector<GroupInserter::Unit> GroupInserter::TakeBatch() {
  std::vector<Unit> batch;
  size_t rows = 0;
  const bool notify = queue_.front().notify_leader;
  const Placer* placer = queue_.front().placer.get();
  while (!queue_.empty() && queue_.front().notify_leader == notify &&
         queue_.front().placer.get() == placer) {
    const size_t n = queue_.front().jobs.size();
    if (!batch.empty() && rows + n > options_.max_rows) break;
    rows += n;
    batch.push_back(std::move(queue_.front()));
    queue_.pop_front();
  }
  return batch;
}

void GroupInserter::Commit(std::vector<Unit> batch) {
  absl::Status status = InsertTogether(batch);
  if (status.ok()) return;
  if (batch.size() == 1 || absl::IsUnavailable(status)) {
    // Nothing was written (InsertMany is all or none); the database's answer is every unit's.
    for (Unit& unit : batch) std::move(unit.done)(std::move(unit.jobs), status);
    return;
  }
  // One unit may be at fault (a row PostgreSQL refuses): each is tried alone and gets its own
  // answer.
  for (Unit& unit : batch) {
    std::vector<Unit> alone;
    alone.push_back(std::move(unit));
    if (absl::Status s = InsertTogether(alone); !s.ok()) {
      std::move(alone[0].done)(std::move(alone[0].jobs), s);
    }
  }
}

absl::Status GroupInserter::InsertTogether(std::vector<Unit>& units) {
  // The units' jobs move into one vector for the statement and back out after it.
  size_t rows = 0;
  for (const Unit& unit : units) rows += unit.jobs.size();
  std::vector<job::Job> jobs;
  if (units.size() == 1) {
    jobs = std::move(units[0].jobs);
  } else {
    jobs.reserve(rows);
    for (Unit& unit : units) {
      std::move(unit.jobs.begin(), unit.jobs.end(), std::back_inserter(jobs));
    }
  }
  Placer* placer = units[0].placer.get();
  if (placer != nullptr) placer->Place(jobs);
  const absl::Time start = absl::Now();
  {
    // Once per unit: a unit tried again alone (Commit) waited once.
    auto& wait = metrics::Metrics().insert_wait.With({});
    for (Unit& unit : units) {
      if (unit.queued_at == absl::InfinitePast()) continue;
      wait.Observe(absl::ToDoubleSeconds(start - unit.queued_at));
      unit.queued_at = absl::InfinitePast();
    }
  }
  absl::StatusOr<std::vector<InsertOutcome>> outcomes =
      store_.InsertMany(jobs, units[0].notify_leader);
  if (placer != nullptr) {
    placer->Placed(jobs, outcomes);
    // Jobs come back as their rows were written: a worker only where the row went to it.
    for (size_t i = 0; i < jobs.size(); ++i) {
      if (!outcomes.ok() || !(*outcomes)[i].dispatched) jobs[i].worker_id.clear();
    }
  }
  if (outcomes.ok()) {
    metrics::DaemonMetrics& m = metrics::Metrics();
    m.store_rows.With({"insert"}).Observe(static_cast<double>(rows));
    m.store_commit.With({"insert"}).Observe(absl::ToDoubleSeconds(absl::Now() - start));
  }
  if (units.size() == 1) {
    units[0].jobs = std::move(jobs);
  } else {
    auto from = jobs.begin();
    for (Unit& unit : units) {
      std::move(from, from + static_cast<std::ptrdiff_t>(unit.jobs.size()), unit.jobs.begin());
      from += static_cast<std::ptrdiff_t>(unit.jobs.size());
    }
  }
  if (!outcomes.ok()) return outcomes.status();
  {
    absl::MutexLock l(&mu_);
    ++counts_.statements;
    counts_.rows += static_cast<int64_t>(rows);
  }
  auto next = outcomes->begin();
  for (Unit& unit : units) {
    const auto n = static_cast<std::ptrdiff_t>(unit.jobs.size());
    std::vector<InsertOutcome> mine(std::make_move_iterator(next),
                                    std::make_move_iterator(next + n));
    next += n;
    std::move(unit.done)(std::move(unit.jobs), std::move(mine));
  }
  return absl::OkStatus();
}

}  // namespace dispatchd::store
