#include "server/store/retention_keeper.h"

#include <algorithm>

#include "absl/status/statusor.h"

#include "server/metrics/daemon_metrics.h"
#include "server/util/log.h"
#include "server/util/thread_name.h"

namespace dispatchd::store {

RetentionKeeper::RetentionKeeper(PgJobStore& store) : store_(store) {
  thread_ = std::thread([this] {
    server::SetThreadName("retention");
    Run();
  });
}

RetentionKeeper::~RetentionKeeper() { Stop(); }

void RetentionKeeper::Stop() {
  {
    absl::MutexLock l(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

absl::Duration RetentionKeeper::Period(absl::Duration span) {
  return std::clamp(span / 4, absl::Milliseconds(250), absl::Minutes(1));
}

void RetentionKeeper::Run() {
  const absl::Duration span = PgJobStore::DonePartitionSpan(store_.retention());
  const absl::Duration period = Period(span);
  server::Log("store")->info("keeping ended jobs for {} in partitions of {}",
                             absl::FormatDuration(store_.retention()), absl::FormatDuration(span));
  while (true) {
    {
      absl::MutexLock l(&mu_);
      if (mu_.AwaitWithTimeout(absl::Condition(&stopping_), period)) return;
    }
    absl::StatusOr<int> added = store_.AddDonePartitions(store_.DonePartitionsAhead());
    if (!added.ok()) {
      server::Log("store")->warn("cannot add partitions for ended jobs: {}",
                                 added.status().ToString());
    } else if (*added > 0) {
      server::Log("store")->debug("added {} partitions for ended jobs", *added);
    }
    absl::StatusOr<int> dropped = store_.DropDonePartitions();
    if (!dropped.ok()) {
      server::Log("store")->warn("cannot drop partitions of ended jobs past retention: {}",
                                 dropped.status().ToString());
    } else if (*dropped > 0) {
      server::Log("store")->info("dropped {} partitions of jobs that ended more than {} ago",
                                 *dropped, absl::FormatDuration(store_.retention()));
      metrics::Metrics().partitions_dropped.With({}).Inc(*dropped);
    }
  }
}

}  // namespace dispatchd::store
