#pragma once

#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "server/store/pg_job_store.h"

namespace dispatchd::store {

// Keeps the partitions of ended jobs (PgJobStore::AddDonePartitions, DropDonePartitions) on a
// thread of its own: partitions ahead of the clock so that a job can always end, and none past
// the store's retention. Every daemon runs one; the store lets one daemon at a time do the work.
//
//   RetentionKeeper keeper(*store);  // starts
//   ...
//   keeper.Stop();                   // or let the destructor stop it
//
// A failure is logged and tried again next time: partitions are made four spans ahead, so a
// database that is away for less than that loses nothing.
class RetentionKeeper {
 public:
  explicit RetentionKeeper(PgJobStore& store);
  ~RetentionKeeper();
  RetentionKeeper(const RetentionKeeper&) = delete;
  RetentionKeeper& operator=(const RetentionKeeper&) = delete;

  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // How often it looks: a quarter of a span, between 250 ms and one minute.
  static absl::Duration Period(absl::Duration span);

 private:
  void Run() ABSL_LOCKS_EXCLUDED(mu_);

  PgJobStore& store_;
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace dispatchd::store
