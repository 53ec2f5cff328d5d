#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

#include "lib/job/job.h"
#include "lib/util/clock.h"
#include "server/store/job_store.h"

namespace dispatchd::testing {

// An in-memory store::JobStore for tests that need the store's rules but not PostgreSQL: each
// transition is the same compare-and-set on (id, state, attempt) that PgJobStore's statements
// make (server/store/pg_statements.h), so a stale write changes nothing and returns false (or
// is left out of a batch's ids). Writes of several rows are all or nothing, as one statement is.
//
// Differences from PgJobStore, on purpose: ended jobs are kept for ever (no retention); there is
// no row locking, so a claim never skips a row another session holds; NotifyChanged only records
// the id; timestamps come from the Clock given (the wall clock if none), in whole microseconds as
// PostgreSQL keeps them.
//
// Fencing: the fenced writes (see store::JobStore) fail FailedPrecondition while the epoch set by
// SetFence differs from the leader's (SetLeaderEpoch; both start at 0).
//
// Failures: FailCall(n, status) makes the n-th call from now (n = 1: the next) fail with
// `status`, changing nothing. Every method that returns a status counts as a call.
//
// Thread-safe.
class FakeJobStore final : public store::JobStore {
 public:
  explicit FakeJobStore(Clock* clock = nullptr,
                        absl::Duration idempotency_window = absl::Hours(24));

  absl::StatusOr<store::InsertOutcome> Insert(const job::Job& job) override;
  absl::StatusOr<std::vector<store::InsertOutcome>> InsertMany(const std::vector<job::Job>& jobs,
                                                               bool notify_leader) override;
  absl::StatusOr<job::Job> Get(const std::string& job_id) override;
  absl::StatusOr<std::vector<job::Job>> GetMany(const std::vector<std::string>& job_ids) override;
  absl::StatusOr<std::vector<job::Job>> SearchJobs(const store::JobSearch& search) override;
  absl::StatusOr<std::vector<job::Job>> LoadActive() override;
  absl::StatusOr<std::vector<job::Job>> LoadPlaced() override;
  absl::StatusOr<store::QueuedHeads> LoadQueuedHeads(int64_t per_queue) override;
  absl::StatusOr<std::vector<job::Job>> LoadQueuedPage(const std::string& type,
                                                       const std::string& fairness_key,
                                                       int64_t after_seq, int64_t limit) override;
  absl::StatusOr<int64_t> CountQueuedBefore(const std::string& type,
                                            const std::string& fairness_key, int64_t seq) override;
  absl::StatusOr<std::vector<store::QueueCount>> CountQueued(
      const std::vector<store::QueueBound>& bounds) override;
  using store::JobStore::Claim;
  absl::StatusOr<std::vector<std::string>> Claim(const std::vector<store::ClaimRequest>& claims,
                                                 std::vector<std::string>* payloads) override;
  absl::StatusOr<bool> MarkRunning(const std::string& job_id, int32_t attempt,
                                   const std::string& worker_id) override;
  absl::StatusOr<bool> ReturnToQueue(const std::string& job_id, int32_t attempt) override;
  absl::StatusOr<bool> Retry(const std::string& job_id, int32_t attempt, absl::Time not_before,
                             const std::string& error) override;
  absl::StatusOr<bool> Finish(const store::FinishRequest& req) override;
  absl::StatusOr<std::vector<std::string>> MarkRunningMany(
      const std::vector<store::MarkRequest>& marks) override;
  absl::StatusOr<std::vector<std::string>> FinishMany(
      const std::vector<store::FinishRequest>& reqs) override;
  absl::StatusOr<store::TurnOutcome> WriteTurn(const store::TurnWrites& writes) override;
  absl::StatusOr<store::CancelOutcome> Cancel(const std::string& job_id,
                                              const std::string& reason) override;
  absl::StatusOr<std::vector<std::string>> ExpireOverdue(absl::Time now,
                                                         const std::string& error) override;
  absl::StatusOr<std::vector<store::TypeStateCount>> CountByTypeAndState() override;
  absl::StatusOr<int64_t> CountActive() override;
  absl::StatusOr<std::vector<store::TypeStateCount>> CountActiveByTypeAndState() override;
  absl::StatusOr<std::vector<store::JobRef>> GetRefs(
      const std::vector<std::string>& job_ids) override;
  absl::StatusOr<std::vector<store::JobRef>> LoadPlacedRefs() override;
  absl::Status NotifyChanged(const std::string& job_id) override;
  void SetFence(int64_t epoch) override;
  // Keeps the rows and when each was written; forgets those older than `ttl` by the Clock.
  absl::Status SaveAccounts(const std::vector<store::AccountRow>& rows,
                            absl::Duration ttl) override;
  absl::StatusOr<std::vector<store::AccountRow>> LoadAccounts() override;

  // Test controls.
  //
  // The n-th call from now (n >= 1) fails with `status` (not OK) and changes nothing.
  void FailCall(int64_t n, absl::Status status);
  // The next call of `method` (the interface's name for it, e.g. "WriteTurn") fails with
  // `status` and changes nothing. Planned failures of one method come in the order planned.
  void FailNext(absl::string_view method, absl::Status status);
  // The next `n` calls of `method` wait, before they read or change anything, until Release():
  // a database that stalls in the middle of a write. AwaitStalled waits (at most `timeout`)
  // until `n` calls wait at once. Release lets every waiting call go on and cancels the stalls
  // not yet reached.
  void StallNext(absl::string_view method, int n = 1);
  bool AwaitStalled(absl::Duration timeout, int n = 1);
  void Release();
  // The epoch the fenced writes must carry (another daemon winning the lease bumps it).
  void SetLeaderEpoch(int64_t epoch);
  // Every job, active or ended, in seq order, with payloads.
  std::vector<job::Job> AllJobs() const;
  // Calls made so far (each method that returns a status counts once).
  int64_t calls() const;
  // Calls that broke a precondition of the interface (WriteTurn naming one job twice) and were
  // refused InvalidArgument: a test of the caller checks there are none.
  int64_t misuses() const;
  // The ids NotifyChanged (or InsertMany with notify_leader) announced, in order.
  std::vector<std::string> notified() const;

 private:
  // The key a job holds while active, and for the idempotency window after it ended.
  using IdemKey = std::tuple<std::string, std::string, std::string>;  // owner, fairness, idem

  // Counts a call and returns the failure FailCall planned for it, if any.
  // `method` is the interface method's name. A call planned to stall waits here, with mu_
  // released, until Release().
  absl::Status BeginCall(absl::string_view method) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK while the fence is the leader's epoch, else FailedPrecondition ("fenced: ...").
  absl::Status FenceHolds() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Time Now() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  job::Job* Find(const std::string& job_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs in seq order, optionally only the active ones; pointers into jobs_.
  std::vector<const job::Job*> BySeq(bool active_only) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The id of the job holding `key` now (active, or ended within the window), or empty.
  std::string HolderOf(const IdemKey& key, absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The compare-and-sets, each true if it changed the row (shared by the single and batch forms).
  bool ClaimOne(const store::ClaimRequest& req, absl::Time now, std::string* payload)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool MarkOne(const store::MarkRequest& req, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool FinishOne(const store::FinishRequest& req, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool RetryOne(const store::RetryRequest& req, absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  bool ReturnOne(const store::ReturnRequest& req, absl::Time now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Clock* const clock_;
  const absl::Duration idempotency_window_;

  mutable absl::Mutex mu_;
  std::map<std::string, job::Job> jobs_ ABSL_GUARDED_BY(mu_);
  int64_t next_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // Saved accounts by (kind, a, b): the value and when it was written.
  std::map<std::tuple<std::string, std::string, std::string>, std::pair<double, absl::Time>>
      accounts_ ABSL_GUARDED_BY(mu_);
  int64_t calls_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t misuses_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<int64_t, absl::Status> failures_ ABSL_GUARDED_BY(mu_);  // by call number
  absl::flat_hash_map<std::string, std::deque<absl::Status>> method_failures_ ABSL_GUARDED_BY(mu_);
  std::string stall_method_ ABSL_GUARDED_BY(mu_);  // its next stalls_left_ calls stall
  int stalls_left_ ABSL_GUARDED_BY(mu_) = 0;
  int stalled_ ABSL_GUARDED_BY(mu_) = 0;       // calls waiting for Release
  int64_t releases_ ABSL_GUARDED_BY(mu_) = 0;  // Release() calls so far
  int64_t fence_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t leader_epoch_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<std::string> notified_ ABSL_GUARDED_BY(mu_);
};

}  // namespace dispatchd::testing
