// FakeJobStore: calls, fencing, inserts and the writes. The reads are in fake_job_store_reads.cc.

#include "tests/testing/fake_job_store.h"

#include <algorithm>
#include <utility>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

#include "lib/util/status_macros.h"

namespace dispatchd::testing {
namespace {

using job::JobState;

// As PgJobStore refuses what libpq cannot carry or the table's constraints forbid.
absl::Status ValidateForInsert(const job::Job& job) {
  const job::JobSpec& spec = job.spec;
  if (job.id.empty()) return absl::InvalidArgumentError("id: must not be empty");
  const absl::string_view nul("\0", 1);
  for (const auto& [field, value] : {std::pair<const char*, const std::string*>{"id", &job.id},
                                     {"type", &spec.type},
                                     {"resource_id", &spec.resource_id},
                                     {"fairness_key", &spec.fairness_key},
                                     {"idempotency_key", &spec.idempotency_key}}) {
    if (absl::StrContains(*value, nul)) {
      return absl::InvalidArgumentError(absl::StrCat(field, ": contains a NUL byte"));
    }
  }
  for (const auto& [key, value] : spec.labels) {
    if (absl::StrContains(key, nul) || absl::StrContains(value, nul)) {
      return absl::InvalidArgumentError("labels: contains a NUL byte");
    }
  }
  if (spec.max_attempts < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_attempts: must be >= 0, got ", spec.max_attempts));
  }
  if (spec.timeout < absl::ZeroDuration() || spec.timeout == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError("timeout: must be finite and >= 0");
  }
  if (spec.dispatch_deadline < absl::ZeroDuration()) {
    return absl::InvalidArgumentError("dispatch_deadline: must be >= 0");
  }
  if (spec.not_before == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("not_before: must not be infinite-future");
  }
  return absl::OkStatus();
}

absl::Status CheckFinishState(const store::FinishRequest& req) {
  if (!job::IsTerminal(req.state) || req.state == JobState::kExpired) {
    return absl::InvalidArgumentError(absl::StrCat("state: must be SUCCEEDED, FAILED or ",
                                                   "CANCELLED, got ", job::ToString(req.state),
                                                   " for job ", req.job_id));
  }
  return absl::OkStatus();
}

// A finish or retry applies to the attempt that ran: RUNNING at `attempt`, or still DISPATCHED
// at the attempt before (a failure or result that overtook its accept).
bool AttemptRuns(const job::Job& job, int32_t attempt) {
  return (job.state == JobState::kRunning && job.attempt == attempt) ||
         (job.state == JobState::kDispatched && job.attempt == attempt - 1);
}

}  // namespace

FakeJobStore::FakeJobStore(Clock* clock, absl::Duration idempotency_window)
    : clock_(clock), idempotency_window_(idempotency_window) {}

absl::Status FakeJobStore::BeginCall(absl::string_view method) {
  ++calls_;
  if (stalls_left_ > 0 && stall_method_ == method) {
    --stalls_left_;
    ++stalled_;
    const int64_t release = releases_;
    auto released = [this, release]()
                        ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return releases_ != release; };
    mu_.Await(absl::Condition(&released));
    --stalled_;
  }
  if (auto m = method_failures_.find(method); m != method_failures_.end()) {
    absl::Status status = std::move(m->second.front());
    m->second.pop_front();
    if (m->second.empty()) method_failures_.erase(m);
    return status;
  }
  auto it = failures_.find(calls_);
  if (it == failures_.end()) return absl::OkStatus();
  absl::Status status = std::move(it->second);
  failures_.erase(it);
  return status;
}

void FakeJobStore::FailNext(absl::string_view method, absl::Status status) {
  absl::MutexLock l(&mu_);
  method_failures_[std::string(method)].push_back(std::move(status));
}

void FakeJobStore::StallNext(absl::string_view method, int n) {
  absl::MutexLock l(&mu_);
  stall_method_ = std::string(method);
  stalls_left_ = n;
}

bool FakeJobStore::AwaitStalled(absl::Duration timeout, int n) {
  absl::MutexLock l(&mu_);
  auto waiting = [this, n]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stalled_ >= n; };
  return mu_.AwaitWithTimeout(absl::Condition(&waiting), timeout);
}

void FakeJobStore::Release() {
  absl::MutexLock l(&mu_);
  stalls_left_ = 0;
  ++releases_;
}

absl::Status FakeJobStore::FenceHolds() const {
  if (fence_ == leader_epoch_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("fenced: this daemon led at epoch ", fence_,
                                                    "; the leader's epoch is now ", leader_epoch_));
}

absl::Time FakeJobStore::Now() {
  const absl::Time now = clock_ != nullptr ? clock_->TimeNow() : absl::Now();
  return absl::FromUnixMicros(absl::ToUnixMicros(now));
}

job::Job* FakeJobStore::Find(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : &it->second;
}

std::string FakeJobStore::HolderOf(const IdemKey& key, absl::Time now) const {
  // The active holder, else the one that ended last within the window.
  const job::Job* ended = nullptr;
  for (const auto& [id, job] : jobs_) {
    if (IdemKey(job.owner, job.spec.fairness_key, job.spec.idempotency_key) != key) continue;
    if (!job::IsTerminal(job.state)) return id;
    if (job.finished_at > now - idempotency_window_ &&
        (ended == nullptr || job.finished_at > ended->finished_at)) {
      ended = &job;
    }
  }
  return ended == nullptr ? "" : ended->id;
}

void FakeJobStore::FailCall(int64_t n, absl::Status status) {
  absl::MutexLock l(&mu_);
  failures_[calls_ + n] = std::move(status);
}

void FakeJobStore::SetLeaderEpoch(int64_t epoch) {
  absl::MutexLock l(&mu_);
  leader_epoch_ = epoch;
}

void FakeJobStore::SetFence(int64_t epoch) {
  absl::MutexLock l(&mu_);
  fence_ = epoch;
}

int64_t FakeJobStore::calls() const {
  absl::MutexLock l(&mu_);
  return calls_;
}

int64_t FakeJobStore::misuses() const {
  absl::MutexLock l(&mu_);
  return misuses_;
}

std::vector<std::string> FakeJobStore::notified() const {
  absl::MutexLock l(&mu_);
  return notified_;
}

absl::Status FakeJobStore::NotifyChanged(const std::string& job_id) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  notified_.push_back(job_id);
  return absl::OkStatus();
}

absl::Status FakeJobStore::SaveAccounts(const std::vector<store::AccountRow>& rows,
                                        absl::Duration ttl) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  if (rows.empty()) return absl::OkStatus();
  if (absl::Status s = FenceHolds(); !s.ok()) return s;
  const absl::Time now = Now();
  for (const store::AccountRow& r : rows) accounts_[{r.kind, r.a, r.b}] = {r.value, now};
  std::erase_if(accounts_, [&](const auto& kv) { return kv.second.second < now - ttl; });
  return absl::OkStatus();
}

absl::StatusOr<std::vector<store::AccountRow>> FakeJobStore::LoadAccounts() {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  std::vector<store::AccountRow> out;
  for (const auto& [key, value] : accounts_) {
    out.push_back({std::get<0>(key), std::get<1>(key), std::get<2>(key), value.first});
  }
  return out;
}

absl::StatusOr<store::InsertOutcome> FakeJobStore::Insert(const job::Job& job) {
  absl::StatusOr<std::vector<store::InsertOutcome>> outcomes = InsertMany({job}, false);
  if (!outcomes.ok()) {
    // A lone job's field is named without the batch's "jobs[0].", as PgJobStore does.
    absl::string_view message = outcomes.status().message();
    absl::ConsumePrefix(&message, "jobs[0].");
    return absl::Status(outcomes.status().code(), message);
  }
  return std::move((*outcomes)[0]);
}

absl::StatusOr<std::vector<store::InsertOutcome>> FakeJobStore::InsertMany(
    const std::vector<job::Job>& jobs, bool notify_leader) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  absl::flat_hash_set<std::string> ids;
  for (size_t i = 0; i < jobs.size(); ++i) {
    absl::Status valid = ValidateForInsert(jobs[i]);
    // The primary key: PostgreSQL refuses the statement (a unique violation, so all of it).
    if (valid.ok() && (jobs_.contains(jobs[i].id) || !ids.insert(jobs[i].id).second)) {
      valid = absl::AlreadyExistsError(absl::StrCat("id: job ", jobs[i].id, " exists"));
    }
    if (!valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("jobs[", i, "].", valid.message()));
    }
  }
  const absl::Time now = Now();
  std::vector<store::InsertOutcome> outcomes(jobs.size());
  // A call that places jobs while the fence fails announces every row it writes, as the
  // statement's NOTIFY does.
  const bool places = absl::c_any_of(jobs, [](const job::Job& j) { return !j.worker_id.empty(); });
  const bool announce = notify_leader || (places && !FenceHolds().ok());
  // Keys taken by earlier jobs of this call: the later ones get the earlier one's id.
  std::map<IdemKey, std::string> taken;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const job::Job& in = jobs[i];
    if (!in.spec.idempotency_key.empty()) {
      const IdemKey key(in.owner, in.spec.fairness_key, in.spec.idempotency_key);
      std::string holder = HolderOf(key, now);
      if (holder.empty()) {
        if (auto it = taken.find(key); it != taken.end()) holder = it->second;
      }
      if (!holder.empty()) {
        outcomes[i] = store::InsertOutcome{.job_id = holder, .deduplicated = true};
        continue;
      }
      taken[key] = in.id;
    }
    // The columns the insert writes; the rest of the row starts empty, as the table's defaults.
    job::Job row;
    row.id = in.id;
    row.spec = in.spec;
    row.owner = in.owner;
    row.seq = next_seq_++;
    row.state = JobState::kQueued;
    row.created_at = now;
    row.updated_at = now;
    row.spec = job::AsStored(std::move(row.spec));  // as the insert converts it
    // A job placed on a worker is written DISPATCHED there while the fence holds, as the
    // leader's insert writes it; else QUEUED and announced.
    const bool placed = !in.worker_id.empty();
    const bool dispatched = placed && FenceHolds().ok();
    if (dispatched) {
      row.state = JobState::kDispatched;
      row.worker_id = in.worker_id;
      row.dispatched_at = now;
    }
    outcomes[i] = store::InsertOutcome{
        .job_id = row.id, .deduplicated = false, .seq = row.seq, .dispatched = dispatched};
    if (announce) notified_.push_back(row.id);
    jobs_.emplace(row.id, std::move(row));
  }
  return outcomes;
}

bool FakeJobStore::ClaimOne(const store::ClaimRequest& req, absl::Time now, std::string* payload) {
  job::Job* job = Find(req.job_id);
  if (job == nullptr || job->state != JobState::kQueued || job->attempt != req.attempt) {
    return false;
  }
  job->state = JobState::kDispatched;
  job->worker_id = req.worker_id;
  job->dispatched_at = now;
  job->started_at = absl::InfinitePast();  // an earlier attempt's; this one has not started
  job->updated_at = now;
  if (payload != nullptr) *payload = job->spec.payload;
  return true;
}

bool FakeJobStore::MarkOne(const store::MarkRequest& req, absl::Time now) {
  job::Job* job = Find(req.job_id);
  if (job == nullptr) return false;
  if (job->state == JobState::kDispatched && job->attempt == req.attempt - 1) {
    job->started_at = now;  // an accept; a re-attach keeps the attempt's start
  } else if (!(job->state == JobState::kRunning && job->attempt == req.attempt)) {
    return false;
  }
  job->state = JobState::kRunning;
  job->attempt = req.attempt;
  job->worker_id = req.worker_id;
  job->updated_at = now;
  return true;
}

bool FakeJobStore::FinishOne(const store::FinishRequest& req, absl::Time now) {
  job::Job* job = Find(req.job_id);
  if (job == nullptr || !AttemptRuns(*job, req.attempt)) return false;
  // An outcome that overtook its RUNNING mark: started its run time before now.
  if (job->state == JobState::kDispatched && req.ran != absl::InfiniteDuration() &&
      req.ran >= absl::ZeroDuration()) {
    job->started_at = absl::FromUnixMicros(absl::ToUnixMicros(now - req.ran));
  }
  job->state = req.state;
  job->attempt = req.attempt;
  job->result = req.result;
  job->error = req.error;
  job->finished_at = now;
  job->updated_at = now;
  return true;
}

absl::StatusOr<std::vector<std::string>> FakeJobStore::Claim(
    const std::vector<store::ClaimRequest>& claims, std::vector<std::string>* payloads) {
  if (payloads != nullptr) payloads->clear();
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  if (claims.empty()) return std::vector<std::string>{};
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  const absl::Time now = Now();
  std::vector<std::string> claimed;
  for (const store::ClaimRequest& req : claims) {
    std::string payload;
    if (!ClaimOne(req, now, &payload)) continue;
    claimed.push_back(req.job_id);
    if (payloads != nullptr) payloads->push_back(std::move(payload));
  }
  return claimed;
}

absl::StatusOr<bool> FakeJobStore::MarkRunning(const std::string& job_id, int32_t attempt,
                                               const std::string& worker_id) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  return MarkOne({.job_id = job_id, .attempt = attempt, .worker_id = worker_id}, Now());
}

absl::StatusOr<bool> FakeJobStore::ReturnToQueue(const std::string& job_id, int32_t attempt) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  return ReturnOne(store::ReturnRequest{.job_id = job_id, .attempt = attempt}, Now());
}

bool FakeJobStore::ReturnOne(const store::ReturnRequest& req, absl::Time now) {
  job::Job* job = Find(req.job_id);
  if (job == nullptr || job->state != JobState::kDispatched || job->attempt != req.attempt) {
    return false;
  }
  job->state = JobState::kQueued;
  job->worker_id.clear();
  job->updated_at = now;
  return true;
}

absl::StatusOr<bool> FakeJobStore::Retry(const std::string& job_id, int32_t attempt,
                                         absl::Time not_before, const std::string& error) {
  if (not_before == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("not_before: must not be infinite-future");
  }
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  return RetryOne(
      store::RetryRequest{
          .job_id = job_id, .attempt = attempt, .not_before = not_before, .error = error},
      Now());
}

bool FakeJobStore::RetryOne(const store::RetryRequest& req, absl::Time now) {
  job::Job* job = Find(req.job_id);
  if (job == nullptr || !AttemptRuns(*job, req.attempt)) return false;
  job->earlier_attempts.push_back(job::EndedAttempt{
      .attempt = req.attempt,
      .worker_id = job->worker_id,
      .dispatched_at = job->dispatched_at,
      .started_at = job->state == JobState::kRunning ? job->started_at
                    : req.ran != absl::InfiniteDuration() && req.ran >= absl::ZeroDuration()
                        ? absl::FromUnixMicros(absl::ToUnixMicros(now - req.ran))
                        : absl::InfinitePast(),
      .ended_at = now,
      .error = req.error});
  job->state = JobState::kQueued;
  job->attempt = req.attempt;
  job->worker_id.clear();
  // InfinitePast is NULL in the table: at once.
  job->spec.not_before = req.not_before == absl::InfinitePast()
                             ? req.not_before
                             : absl::FromUnixMicros(absl::ToUnixMicros(req.not_before));
  job->error = req.error;
  job->updated_at = now;
  return true;
}

absl::StatusOr<bool> FakeJobStore::Finish(const store::FinishRequest& req) {
  DISPATCHD_RETURN_IF_ERROR(CheckFinishState(req));
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  return FinishOne(req, Now());
}

absl::StatusOr<std::vector<std::string>> FakeJobStore::MarkRunningMany(
    const std::vector<store::MarkRequest>& marks) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  if (marks.empty()) return std::vector<std::string>{};
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  const absl::Time now = Now();
  std::vector<std::string> marked;
  for (const store::MarkRequest& m : marks) {
    if (MarkOne(m, now)) marked.push_back(m.job_id);
  }
  return marked;
}

absl::StatusOr<std::vector<std::string>> FakeJobStore::FinishMany(
    const std::vector<store::FinishRequest>& reqs) {
  for (const store::FinishRequest& r : reqs) DISPATCHD_RETURN_IF_ERROR(CheckFinishState(r));
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  if (reqs.empty()) return std::vector<std::string>{};
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  const absl::Time now = Now();
  std::vector<std::string> finished;
  for (const store::FinishRequest& r : reqs) {
    if (FinishOne(r, now)) finished.push_back(r.job_id);
  }
  return finished;
}

absl::StatusOr<store::TurnOutcome> FakeJobStore::WriteTurn(const store::TurnWrites& writes) {
  for (const store::FinishRequest& r : writes.finishes) {
    DISPATCHD_RETURN_IF_ERROR(CheckFinishState(r));
  }
  for (const store::RetryRequest& r : writes.retries) {
    if (r.not_before == absl::InfiniteFuture()) {
      return absl::InvalidArgumentError("not_before: must not be infinite-future");
    }
  }
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  if (writes.empty()) return store::TurnOutcome{};
  // One statement's data-modifying CTEs cannot change one row twice: the interface asks for
  // disjoint jobs. PostgreSQL would apply one of the writes unpredictably; refuse instead, and
  // count it, so that a test of the caller notices.
  absl::flat_hash_set<std::string> named;
  auto name = [&](const std::string& id) { return named.insert(id).second; };
  bool disjoint = true;
  for (const auto& r : writes.finishes) disjoint &= name(r.job_id);
  for (const auto& r : writes.marks) disjoint &= name(r.job_id);
  for (const auto& r : writes.claims) disjoint &= name(r.job_id);
  for (const auto& r : writes.retries) disjoint &= name(r.job_id);
  for (const auto& r : writes.returns) disjoint &= name(r.job_id);
  if (!disjoint) {
    ++misuses_;
    return absl::InvalidArgumentError("write turn: a job is named twice");
  }
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  const absl::Time now = Now();
  store::TurnOutcome out;
  for (const store::FinishRequest& r : writes.finishes) {
    if (!FinishOne(r, now)) continue;
    out.finished.push_back(r.job_id);
    if (!r.row_times) {
      out.finished_times.emplace_back();
      continue;
    }
    const job::Job* row = Find(r.job_id);
    out.finished_times.push_back(store::TurnOutcome::Times{.created_at = row->created_at,
                                                           .dispatched_at = row->dispatched_at,
                                                           .started_at = row->started_at,
                                                           .finished_at = row->finished_at,
                                                           .not_before = row->spec.not_before});
  }
  for (const store::MarkRequest& m : writes.marks) {
    if (MarkOne(m, now)) out.marked.push_back(m.job_id);
  }
  for (const store::ClaimRequest& c : writes.claims) {
    std::string payload;
    if (!ClaimOne(c, now, &payload)) continue;
    out.claimed.push_back(c.job_id);
    out.claimed_payloads.push_back(std::move(payload));
  }
  for (const store::RetryRequest& r : writes.retries) {
    if (RetryOne(r, now)) out.retried.push_back(r.job_id);
  }
  for (const store::ReturnRequest& r : writes.returns) {
    if (ReturnOne(r, now)) out.returned.push_back(r.job_id);
  }
  return out;
}

absl::StatusOr<store::CancelOutcome> FakeJobStore::Cancel(const std::string& job_id,
                                                          const std::string& reason) {
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  job::Job* job = Find(job_id);
  if (job == nullptr) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
  if (job::IsTerminal(job->state)) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", job_id, " already ", job::ToString(job->state)));
  }
  // Not fenced: a standby cancels too. Attempt, worker and result stay as they were.
  const JobState previous = job->state;
  const absl::Time now = Now();
  job->state = JobState::kCancelled;
  job->error = reason;
  job->finished_at = now;
  job->updated_at = now;
  return store::CancelOutcome{.job = *job, .previous = previous};
}

absl::StatusOr<std::vector<std::string>> FakeJobStore::ExpireOverdue(absl::Time now,
                                                                     const std::string& error) {
  if (now == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("now: must not be infinite-future");
  }
  absl::MutexLock l(&mu_);
  if (absl::Status s = BeginCall(__func__); !s.ok()) return s;
  if (now == absl::InfinitePast()) return std::vector<std::string>{};
  DISPATCHD_RETURN_IF_ERROR(FenceHolds());
  // In deadline order, as the statement reads them (no limit: a test never has a million).
  std::vector<std::pair<absl::Time, job::Job*>> overdue;
  for (auto& [id, job] : jobs_) {
    if (job.state != JobState::kQueued || job.spec.dispatch_deadline == absl::InfiniteDuration()) {
      continue;
    }
    const absl::Time deadline = job.created_at + job.spec.dispatch_deadline;
    if (deadline < now) overdue.emplace_back(deadline, &job);
  }
  std::stable_sort(overdue.begin(), overdue.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  const absl::Time at = Now();
  std::vector<std::string> expired;
  for (auto& [deadline, job] : overdue) {
    job->state = JobState::kExpired;
    job->error = error;
    job->finished_at = at;
    job->updated_at = at;
    expired.push_back(job->id);
  }
  return expired;
}

}  // namespace dispatchd::testing
