#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "lib/job/job.h"
#include "server/store/job_store.h"

namespace dispatchd::store {

struct PgStoreOptions {
  // libpq connection URL or keyword/value string, e.g. "postgresql://dispatchd@127.0.0.1:5432/db".
  std::string url;
  // Connections kept open; at most this many calls run at once, others wait for a free one.
  int pool_size = 4;
  // Bound on establishing each connection (libpq connect_timeout, whole seconds, at least 1).
  absl::Duration connect_timeout = absl::Seconds(5);
  // PostgreSQL application_name of the store's sessions (shown in pg_stat_activity). Daemons
  // sharing a database name theirs after their daemon id, so that a new leader can end every
  // session of a frozen one. Empty: "dispatchd".
  std::string application_name;
  // How long an ended job still holds its idempotency key (the config's idempotency_window).
  absl::Duration idempotency_window = absl::Hours(24);
  // How long ended jobs are kept (the config's retention): jobs_done is partitioned by finish
  // time in spans of DonePartitionSpan(retention), and a partition is dropped once all of it
  // is older than this.
  absl::Duration retention = absl::Hours(24 * 7);
};

class ConnectionPool;

// JobStore on PostgreSQL (see job_store.h for the contract of each call).
//
//   absl::StatusOr<std::unique_ptr<PgJobStore>> store = PgJobStore::Connect({.url = url});
//
// Every call checks a connection out of a pool for its duration, so a connection is never used
// by two threads at once; each call is one transaction, committed (durable) before it returns.
// A connection that breaks fails its call with Unavailable and is replaced on a later checkout.
// Thread-safe.
class PgJobStore final : public JobStore {
 public:
  // Opens `options.pool_size` connections, brings the schema up to date (migrations.h) and
  // prepares the statements on each connection. Unavailable if the server cannot be reached (the
  // message names host, port and database, never a password); InvalidArgument for bad options.
  static absl::StatusOr<std::unique_ptr<PgJobStore>> Connect(const PgStoreOptions& options);

  // Retention of ended jobs. They live in jobs_done, partitioned by finish time (migrations.cc,
  // version 5), so that the hot table holds active jobs only and old jobs go with a DROP of
  // their partition instead of row by row. Every call is safe from several daemons at once.
  //
  // The span of one partition for `retention`: the largest of 1 s, 1 min, 1 h and 1 day that is
  // at most a quarter of it (at least 1 s). An ended job is kept between `retention` and
  // `retention` plus one span.
  static absl::Duration DonePartitionSpan(absl::Duration retention);
  // Adds partitions so that every finish time up to `ahead` past the database's clock has one
  // (Connect does this once; call it again well within `ahead`). Returns how many it added.
  absl::StatusOr<int> AddDonePartitions(absl::Duration ahead);
  // Drops the partitions whose every job ended more than `retention` ago by the database's
  // clock (detached concurrently first, so that finishes never wait); how many.
  absl::StatusOr<int> DropDonePartitions();
  absl::Duration retention() const { return retention_; }
  // How far ahead of the clock partitions are kept: four spans.
  absl::Duration DonePartitionsAhead() const { return 4 * DonePartitionSpan(retention_); }

  ~PgJobStore() override;
  PgJobStore(const PgJobStore&) = delete;
  PgJobStore& operator=(const PgJobStore&) = delete;

  // Besides the JobStore contract: InvalidArgument for a negative or infinite timeout, a negative
  // dispatch deadline, a negative max_attempts or an infinite-future not_before. The spec's
  // timeout is kept in whole milliseconds.
  absl::StatusOr<InsertOutcome> Insert(const job::Job& job) override;
  absl::StatusOr<std::vector<InsertOutcome>> InsertMany(const std::vector<job::Job>& jobs,
                                                        bool notify_leader) override;
  absl::StatusOr<job::Job> Get(const std::string& job_id) override;
  absl::StatusOr<std::vector<job::Job>> GetMany(const std::vector<std::string>& job_ids) override;
  absl::StatusOr<std::vector<job::Job>> SearchJobs(const JobSearch& search) override;
  absl::StatusOr<std::vector<job::Job>> LoadActive() override;
  absl::StatusOr<std::vector<job::Job>> LoadPlaced() override;
  absl::StatusOr<QueuedHeads> LoadQueuedHeads(int64_t per_queue) override;
  absl::StatusOr<std::vector<job::Job>> LoadQueuedPage(const std::string& type,
                                                       const std::string& fairness_key,
                                                       int64_t after_seq, int64_t limit) override;
  absl::StatusOr<int64_t> CountQueuedBefore(const std::string& type,
                                            const std::string& fairness_key, int64_t seq) override;
  absl::StatusOr<std::vector<QueueCount>> CountQueued(
      const std::vector<QueueBound>& bounds) override;
  using JobStore::Claim;
  absl::StatusOr<std::vector<std::string>> Claim(const std::vector<ClaimRequest>& claims,
                                                 std::vector<std::string>* payloads) override;
  absl::StatusOr<bool> MarkRunning(const std::string& job_id, int32_t attempt,
                                   const std::string& worker_id) override;
  absl::StatusOr<bool> ReturnToQueue(const std::string& job_id, int32_t attempt) override;
  absl::StatusOr<bool> Retry(const std::string& job_id, int32_t attempt, absl::Time not_before,
                             const std::string& error) override;
  // Besides the JobStore contract: a DISPATCHED row at attempt-1 (a result that overtook its
  // accept) also finishes, and takes `req.attempt`. InvalidArgument unless `req.state` is
  // SUCCEEDED, FAILED or CANCELLED.
  absl::StatusOr<bool> Finish(const FinishRequest& req) override;
  absl::StatusOr<std::vector<std::string>> MarkRunningMany(
      const std::vector<MarkRequest>& marks) override;
  absl::StatusOr<std::vector<std::string>> FinishMany(
      const std::vector<FinishRequest>& reqs) override;
  absl::StatusOr<TurnOutcome> WriteTurn(const TurnWrites& writes) override;
  absl::StatusOr<CancelOutcome> Cancel(const std::string& job_id,
                                       const std::string& reason) override;
  absl::StatusOr<std::vector<std::string>> ExpireOverdue(absl::Time now,
                                                         const std::string& error) override;
  // Besides the JobStore contract: at most 10000 keys per call.
  absl::StatusOr<std::vector<TypeStateCount>> CountByTypeAndState() override;
  absl::StatusOr<int64_t> CountActive() override;
  absl::StatusOr<std::vector<TypeStateCount>> CountActiveByTypeAndState() override;
  absl::StatusOr<std::vector<JobRef>> GetRefs(const std::vector<std::string>& job_ids) override;
  absl::StatusOr<std::vector<JobRef>> LoadPlacedRefs() override;
  absl::Status NotifyChanged(const std::string& job_id) override;
  absl::Status SaveAccounts(const std::vector<AccountRow>& rows, absl::Duration ttl) override;
  absl::StatusOr<std::vector<AccountRow>> LoadAccounts() override;
  void SetFence(int64_t epoch) override { fence_.store(epoch); }

 private:
  PgJobStore(std::unique_ptr<ConnectionPool> pool, const PgStoreOptions& options);

  std::unique_ptr<ConnectionPool> pool_;
  const absl::Duration idempotency_window_;
  const absl::Duration retention_;
  std::atomic<int64_t> fence_{0};
};

}  // namespace dispatchd::store
