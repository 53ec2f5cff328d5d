// PgJobStore's writes to jobs the leader owns: claims, accepts, retries, returns, finishes, a
// dispatcher turn, cancels and expiry, and the fair-share accounts. Each is fenced by the leader
// epoch it holds (see "Fencing" in pg_statements.h).

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/time.h"
#include "pqxx/binarystring"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include "pqxx/transaction"

#include "lib/job/job.h"
#include "lib/util/status_macros.h"
#include "server/store/pg_job_store.h"
#include "server/store/pg_pool.h"
#include "server/store/pg_rows.h"
#include "server/store/pg_statements.h"

namespace dispatchd::store {
namespace {

// OK while the database still names `epoch` as the leader's; FailedPrecondition once another
// daemon has taken over (see "Fencing" in pg_statements.h). Called after a write that changed
// nothing.
absl::Status FenceHolds(pqxx::transaction_base& txn, int64_t epoch) {
  pqxx::result rows = txn.exec_prepared(kLeaderEpoch.name);
  const int64_t now = rows.empty() ? -1 : rows[0][0].as<int64_t>();
  if (now == epoch) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("fenced: this daemon led at epoch ", epoch,
                                                    " but the leader is now at epoch ", now));
}

// A time column read as microseconds since the epoch; NULL is InfinitePast ("not yet").
absl::Time MicrosField(const pqxx::field& field) {
  return field.is_null() ? absl::InfinitePast() : absl::FromUnixMicros(field.as<int64_t>());
}

// Runs kClaim in `txn`: the ids claimed (and, if `payloads` is not null, their payloads).
std::vector<std::string> ExecClaims(pqxx::transaction_base& txn,
                                    const std::vector<ClaimRequest>& claims, int64_t epoch,
                                    std::vector<std::string>* payloads) {
  const BatchColumns c(claims);
  pqxx::result rows = txn.exec_prepared(kClaim.name, c.ids, c.attempts, c.workers, epoch);
  if (payloads != nullptr) {
    payloads->clear();
    payloads->reserve(rows.size());
    for (const pqxx::row& row : rows) payloads->push_back(BytesFromField(row[1]));
  }
  return Ids(rows);
}

std::vector<std::string> ExecMarks(pqxx::transaction_base& txn,
                                   const std::vector<MarkRequest>& marks, int64_t epoch) {
  const BatchColumns m(marks);
  return Ids(txn.exec_prepared(kMarkRunningMany.name, m.ids, m.attempts, m.workers, epoch));
}

absl::Status CheckFinishStates(const std::vector<FinishRequest>& reqs) {
  for (const FinishRequest& r : reqs) {
    if (!job::IsTerminal(r.state) || r.state == job::JobState::kExpired) {
      return absl::InvalidArgumentError(absl::StrCat("state: must be SUCCEEDED, FAILED or ",
                                                     "CANCELLED, got ", job::ToString(r.state),
                                                     " for job ", r.job_id));
    }
  }
  return absl::OkStatus();
}

std::vector<std::string> ExecFinishes(pqxx::transaction_base& txn,
                                      const std::vector<FinishRequest>& reqs, int64_t epoch) {
  const FinishColumns f(reqs);
  return Ids(txn.exec_prepared(kFinishMany.name, f.ids, f.attempts, f.states, f.results, f.errors,
                               f.ran_us, f.row_times, epoch));
}

// Runs `exec(txn, epoch)`, a fenced batch write returning the ids it changed, in a statement of
// its own; when it changed nothing, tells "fenced" from "every request was stale".
template <typename Exec>
absl::StatusOr<std::vector<std::string>> FencedBatch(ConnectionPool& pool,
                                                     const std::atomic<int64_t>& fence,
                                                     std::string what, Exec exec) {
  return WithConnection(pool, what,
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<std::string>> {
                          pqxx::nontransaction txn(conn);
                          const int64_t epoch = fence.load();
                          std::vector<std::string> changed = exec(txn, epoch);
                          if (changed.empty()) DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
                          return changed;
                        });
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PgJobStore::Claim(const std::vector<ClaimRequest>& claims,
                                                           std::vector<std::string>* payloads) {
  if (payloads != nullptr) payloads->clear();
  if (claims.empty()) return std::vector<std::string>{};
  return FencedBatch(*pool_, fence_, absl::StrCat("claim ", claims.size(), " jobs"),
                     [&](pqxx::transaction_base& txn, int64_t epoch) {
                       return ExecClaims(txn, claims, epoch, payloads);
                     });
}

absl::StatusOr<bool> PgJobStore::MarkRunning(const std::string& job_id, int32_t attempt,
                                             const std::string& worker_id) {
  return WithConnection(
      *pool_, absl::StrCat("mark job ", job_id, " running"),
      [&](pqxx::connection& conn) -> absl::StatusOr<bool> {
        pqxx::nontransaction txn(conn);
        const int64_t epoch = fence_.load();
        if (txn.exec_prepared(kMarkRunning.name, job_id, attempt, worker_id, epoch)
                .affected_rows() == 1) {
          return true;
        }
        DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
        return false;
      });
}

absl::StatusOr<bool> PgJobStore::ReturnToQueue(const std::string& job_id, int32_t attempt) {
  return WithConnection(
      *pool_, absl::StrCat("return job ", job_id, " to the queue"),
      [&](pqxx::connection& conn) -> absl::StatusOr<bool> {
        pqxx::nontransaction txn(conn);
        const int64_t epoch = fence_.load();
        if (txn.exec_prepared(kReturnToQueue.name, job_id, attempt, epoch).affected_rows() == 1) {
          return true;
        }
        DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
        return false;
      });
}

absl::StatusOr<bool> PgJobStore::Retry(const std::string& job_id, int32_t attempt,
                                       absl::Time not_before, const std::string& error) {
  if (not_before == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("not_before: must not be infinite-future");
  }
  return WithConnection(
      *pool_, absl::StrCat("retry job ", job_id),
      [&](pqxx::connection& conn) -> absl::StatusOr<bool> {
        pqxx::nontransaction txn(conn);
        const int64_t epoch = fence_.load();
        if (txn.exec_prepared(kRetry.name, job_id, attempt, OptionalMicros(not_before), error,
                              epoch, RanMicros(absl::InfiniteDuration()))
                .affected_rows() == 1) {
          return true;
        }
        DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
        return false;
      });
}

absl::StatusOr<bool> PgJobStore::Finish(const FinishRequest& req) {
  if (!job::IsTerminal(req.state) || req.state == job::JobState::kExpired) {
    return absl::InvalidArgumentError(absl::StrCat(
        "state: must be SUCCEEDED, FAILED or CANCELLED, got ", job::ToString(req.state)));
  }
  const std::string state(job::ToString(req.state));
  return WithConnection(*pool_, absl::StrCat("finish job ", req.job_id),
                        [&](pqxx::connection& conn) -> absl::StatusOr<bool> {
                          pqxx::nontransaction txn(conn);
                          const int64_t epoch = fence_.load();
                          if (txn.exec_prepared(kFinish.name, req.job_id, req.attempt, state,
                                                pqxx::binarystring(req.result), req.error, epoch)
                                  .affected_rows() == 1) {
                            return true;
                          }
                          DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
                          return false;
                        });
}

absl::StatusOr<std::vector<std::string>> PgJobStore::MarkRunningMany(
    const std::vector<MarkRequest>& marks) {
  if (marks.empty()) return std::vector<std::string>{};
  return FencedBatch(
      *pool_, fence_, absl::StrCat("mark ", marks.size(), " jobs running"),
      [&](pqxx::transaction_base& txn, int64_t epoch) { return ExecMarks(txn, marks, epoch); });
}

absl::StatusOr<std::vector<std::string>> PgJobStore::FinishMany(
    const std::vector<FinishRequest>& reqs) {
  if (reqs.empty()) return std::vector<std::string>{};
  DISPATCHD_RETURN_IF_ERROR(CheckFinishStates(reqs));
  return FencedBatch(
      *pool_, fence_, absl::StrCat("finish ", reqs.size(), " jobs"),
      [&](pqxx::transaction_base& txn, int64_t epoch) { return ExecFinishes(txn, reqs, epoch); });
}

absl::StatusOr<TurnOutcome> PgJobStore::WriteTurn(const TurnWrites& writes) {
  if (writes.empty()) return TurnOutcome{};
  DISPATCHD_RETURN_IF_ERROR(CheckFinishStates(writes.finishes));
  for (const RetryRequest& r : writes.retries) {
    if (r.not_before == absl::InfiniteFuture()) {
      return absl::InvalidArgumentError(
          absl::StrCat("retry of job ", r.job_id, ": not_before must not be infinite-future"));
    }
  }
  const FinishColumns f(writes.finishes);
  const BatchColumns m(writes.marks), c(writes.claims);
  const bool batch = !writes.finishes.empty() || !writes.marks.empty() || !writes.claims.empty();
  // The three batch kinds in one statement; retries and returns (failures, refusals: the rare
  // path) one statement each beside it, in the same transaction.
  auto write = [&](pqxx::transaction_base& txn, int64_t epoch) {
    TurnOutcome out;
    if (batch) {
      pqxx::result rows = txn.exec_prepared(kWriteTurn.name, f.ids, f.attempts, f.states, f.results,
                                            f.errors, f.ran_us, f.row_times, m.ids, m.attempts,
                                            m.workers, c.ids, c.attempts, c.workers, epoch);
      for (const pqxx::row& row : rows) {
        const std::string kind = TextFromField(row[0]);
        if (kind == "f") {
          out.finished.push_back(TextFromField(row[1]));
          if (row[6].is_null()) {  // not asked for: finished_at is never NULL when it is
            out.finished_times.emplace_back();
          } else {
            out.finished_times.push_back(TurnOutcome::Times{.created_at = MicrosField(row[3]),
                                                            .dispatched_at = MicrosField(row[4]),
                                                            .started_at = MicrosField(row[5]),
                                                            .finished_at = MicrosField(row[6]),
                                                            .not_before = MicrosField(row[7])});
          }
        } else if (kind == "m") {
          out.marked.push_back(TextFromField(row[1]));
        } else {
          out.claimed.push_back(TextFromField(row[1]));
          out.claimed_payloads.push_back(BytesFromField(row[2]));
        }
      }
    }
    for (const RetryRequest& r : writes.retries) {
      if (txn.exec_prepared(kRetry.name, r.job_id, r.attempt, OptionalMicros(r.not_before), r.error,
                            epoch, RanMicros(r.ran))
              .affected_rows() == 1) {
        out.retried.push_back(r.job_id);
      }
    }
    for (const ReturnRequest& r : writes.returns) {
      if (txn.exec_prepared(kReturnToQueue.name, r.job_id, r.attempt, epoch).affected_rows() == 1) {
        out.returned.push_back(r.job_id);
      }
    }
    return out;
  };
  auto changed = [](const TurnOutcome& out) {
    return !out.finished.empty() || !out.marked.empty() || !out.claimed.empty() ||
           !out.retried.empty() || !out.returned.empty();
  };
  return WithConnection(
      *pool_,
      absl::StrCat("write a turn (finish ", writes.finishes.size(), ", mark ", writes.marks.size(),
                   ", claim ", writes.claims.size(), ", retry ", writes.retries.size(), ", return ",
                   writes.returns.size(), ")"),
      [&](pqxx::connection& conn) -> absl::StatusOr<TurnOutcome> {
        const int64_t epoch = fence_.load();
        if (writes.retries.empty() && writes.returns.empty()) {
          // One statement: atomic and durable when it returns, in one round trip.
          pqxx::nontransaction txn(conn);
          TurnOutcome out = write(txn, epoch);
          if (!changed(out)) DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
          return out;
        }
        pqxx::work txn(conn);
        TurnOutcome out = write(txn, epoch);
        if (!changed(out)) DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
        txn.commit();
        return out;
      });
}

absl::StatusOr<CancelOutcome> PgJobStore::Cancel(const std::string& job_id,
                                                 const std::string& reason) {
  return WithConnection(
      *pool_, absl::StrCat("cancel job ", job_id),
      [&](pqxx::connection& conn) -> absl::StatusOr<CancelOutcome> {
        pqxx::nontransaction txn(conn);
        pqxx::result rows = txn.exec_prepared(kCancel.name, job_id, reason);
        if (rows.empty()) {
          pqxx::result done = txn.exec_prepared(kDoneState.name, job_id);
          if (done.empty()) return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
          return absl::FailedPreconditionError(
              absl::StrCat("job ", job_id, " already ", TextFromField(done[0][0])));
        }
        DISPATCHD_ASSIGN_OR_RETURN(job::Job job, RowToJob(rows[0]));
        const std::string state = TextFromField(rows[0][kColCount]);
        std::optional<job::JobState> previous = job::ParseJobState(state);
        if (!previous.has_value()) {
          return absl::InternalError(absl::StrCat("job ", job_id, ": unknown state ", state));
        }
        return CancelOutcome{.job = std::move(job), .previous = *previous};
      });
}

namespace {

// Rows one expire_overdue statement moves at most, and statements per ExpireOverdue call; what
// is left waits for the next sweep.
constexpr int64_t kExpiryBatch = 10000;
constexpr int kExpiryBatchesPerCall = 100;

}  // namespace

absl::StatusOr<std::vector<std::string>> PgJobStore::ExpireOverdue(absl::Time now,
                                                                   const std::string& error) {
  if (now == absl::InfinitePast()) return std::vector<std::string>{};
  if (now == absl::InfiniteFuture()) {
    return absl::InvalidArgumentError("now: must not be infinite-future");
  }
  return WithConnection(*pool_, "expire overdue jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<std::string>> {
                          // One transaction: every id expired is returned, or none is.
                          pqxx::work txn(conn);
                          std::vector<std::string> expired;
                          for (int i = 0; i < kExpiryBatchesPerCall; ++i) {
                            std::vector<std::string> batch =
                                Ids(txn.exec_prepared(kExpireOverdue.name, absl::ToUnixMicros(now),
                                                      error, fence_.load(), kExpiryBatch));
                            expired.insert(expired.end(), batch.begin(), batch.end());
                            if (static_cast<int64_t>(batch.size()) < kExpiryBatch) break;
                          }
                          txn.commit();
                          return expired;
                        });
}

absl::Status PgJobStore::SaveAccounts(const std::vector<AccountRow>& rows, absl::Duration ttl) {
  if (rows.empty()) return absl::OkStatus();
  std::vector<std::string> kinds, as, bs, values;
  for (const AccountRow& r : rows) {
    kinds.push_back(r.kind);
    as.push_back(r.a);
    bs.push_back(r.b);
    values.push_back(absl::StrFormat("%.17g", r.value));
  }
  return WithConnection(
      *pool_, absl::StrCat("save ", rows.size(), " fair-share accounts"),
      [&](pqxx::connection& conn) -> absl::Status {
        // Two short statements of their own: nothing is held between them.
        pqxx::nontransaction txn(conn);
        txn.exec_prepared(kForgetAccounts.name, absl::ToDoubleSeconds(ttl));
        const int64_t epoch = fence_.load();
        if (txn.exec_prepared(kSaveAccounts.name, TextArrayLiteral(kinds), TextArrayLiteral(as),
                              TextArrayLiteral(bs), TextArrayLiteral(values), epoch)
                .affected_rows() == 0) {
          DISPATCHD_RETURN_IF_ERROR(FenceHolds(txn, epoch));
        }
        return absl::OkStatus();
      });
}

}  // namespace dispatchd::store
