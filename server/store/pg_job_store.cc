#include "server/store/pg_job_store.h"

#include <algorithm>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "pqxx/array"
#include "pqxx/binarystring"
#include "pqxx/connection"
#include "pqxx/except"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include "pqxx/transaction"
#include <libpq-fe.h>

#include "lib/util/status_macros.h"
#include "server/store/migrations.h"
#include "server/store/pg_conninfo.h"
#include "server/store/pg_error.h"
#include "server/store/pg_pool.h"
#include "server/store/pg_rows.h"
#include "server/store/pg_session.h"
#include "server/store/pg_statements.h"

namespace dispatchd::store {
namespace {

// OK while the database still names `epoch` as the leader's; FailedPrecondition once another
// daemon has taken over (see "Fencing" above). Called after a write that changed nothing.
absl::Status FenceHolds(pqxx::transaction_base& txn, int64_t epoch) {
  pqxx::result rows = txn.exec_prepared(kLeaderEpoch.name);
  const int64_t now = rows.empty() ? -1 : rows[0][0].as<int64_t>();
  if (now == epoch) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("fenced: this daemon led at epoch ", epoch,
                                                    " but the leader is now at epoch ", now));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// PgJobStore.

PgJobStore::PgJobStore(std::unique_ptr<ConnectionPool> pool, const PgStoreOptions& options)
    : pool_(std::move(pool)),
      idempotency_window_(options.idempotency_window),
      retention_(options.retention) {}

PgJobStore::~PgJobStore() = default;

absl::StatusOr<std::unique_ptr<PgJobStore>> PgJobStore::Connect(const PgStoreOptions& options) {
  if (options.pool_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool_size: must be >= 1, got ", options.pool_size));
  }
  if (options.connect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("connect_timeout: must be > 0, got ",
                                                   absl::FormatDuration(options.connect_timeout)));
  }
  if (options.retention < absl::Seconds(1) || options.retention == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("retention: must be at least 1s and finite, got ",
                                                   absl::FormatDuration(options.retention)));
  }
  if (options.idempotency_window < absl::ZeroDuration() ||
      options.idempotency_window == absl::InfiniteDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("idempotency_window: must be finite and >= 0, got ",
                     absl::FormatDuration(options.idempotency_window)));
  }
  DISPATCHD_ASSIGN_OR_RETURN(
      Target target, ParseTarget(options.url, options.connect_timeout, options.application_name));

  std::vector<std::unique_ptr<pqxx::connection>> conns;
  DISPATCHD_ASSIGN_OR_RETURN(std::unique_ptr<pqxx::connection> first, OpenConnection(target));
  if (absl::Status migrated = ApplyMigrations(*first); !migrated.ok()) {
    return absl::Status(migrated.code(),
                        absl::StrCat("postgres ", target.endpoint, ": ", migrated.message()));
  }
  DISPATCHD_RETURN_IF_ERROR(PrepareStatements(*first, target));
  conns.push_back(std::move(first));
  while (static_cast<int>(conns.size()) < options.pool_size) {
    DISPATCHD_ASSIGN_OR_RETURN(std::unique_ptr<pqxx::connection> conn, OpenPrepared(target));
    conns.push_back(std::move(conn));
  }
  const int size = options.pool_size;
  std::unique_ptr<PgJobStore> store(new PgJobStore(
      std::make_unique<ConnectionPool>(std::move(target), size, std::move(conns)), options));
  // Ended jobs need a partition to land in before the store takes any write.
  DISPATCHD_RETURN_IF_ERROR(store->AddDonePartitions(store->DonePartitionsAhead()).status());
  return store;
}

absl::Duration PgJobStore::DonePartitionSpan(absl::Duration retention) {
  for (absl::Duration span : {absl::Hours(24), absl::Hours(1), absl::Minutes(1)}) {
    if (span <= retention / 4) return span;
  }
  return absl::Seconds(1);
}

namespace {

// Partitions of jobs_done are named jobs_done_<from>_<to>, in seconds since the epoch, so that
// their ranges read back from the catalog by name alone.
struct DonePartition {
  std::string name;
  int64_t from = 0, to = 0;
  bool attached = false;
  bool detach_pending = false;  // a DETACH ... CONCURRENTLY that did not finish
};

constexpr char kListDonePartitions[] = R"sql(
SELECT c.relname, i.inhrelid IS NOT NULL, coalesce(i.inhdetachpending, false)
FROM pg_class c
LEFT JOIN pg_inherits i ON i.inhrelid = c.oid AND i.inhparent = 'jobs_done'::regclass
WHERE c.relkind = 'r' AND c.relname ~ '^jobs_done_[0-9]+_[0-9]+$'
  AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = 'jobs_done'::regclass))sql";

std::vector<DonePartition> ListDonePartitions(pqxx::transaction_base& txn) {
  std::vector<DonePartition> out;
  for (const pqxx::row& row : txn.exec(kListDonePartitions)) {
    DonePartition p{.name = TextFromField(row[0]),
                    .attached = row[1].as<bool>(),
                    .detach_pending = row[2].as<bool>()};
    std::vector<absl::string_view> parts = absl::StrSplit(p.name, '_');
    if (parts.size() != 4 || !absl::SimpleAtoi(parts[2], &p.from) ||
        !absl::SimpleAtoi(parts[3], &p.to)) {
      continue;
    }
    out.push_back(std::move(p));
  }
  return out;
}

int64_t DatabaseNowSeconds(pqxx::transaction_base& txn) {
  return txn.exec("SELECT floor(extract(epoch FROM now()))::int8")[0][0].as<int64_t>();
}

std::string TimestampLiteral(int64_t unix_seconds) {
  return absl::StrCat("'", absl::FormatTime("%Y-%m-%d %H:%M:%S+00", absl::FromUnixSeconds(unix_seconds), absl::UTCTimeZone()), "'");
}

// Session-level advisory lock key of partition upkeep (see migrations.h for the others).
constexpr int64_t kDonePartitionsLockKey = 0x64697370'61727431;  // "disppart"

}  // namespace

absl::StatusOr<int> PgJobStore::AddDonePartitions(absl::Duration ahead) {
  const int64_t span = absl::ToInt64Seconds(DonePartitionSpan(retention_));
  return WithConnection(*pool_, "add partitions for ended jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<int> {
    pqxx::work txn(conn);
    // One daemon at a time; another that holds the lock is doing the same work.
    if (!txn.exec_params("SELECT pg_try_advisory_xact_lock($1)", kDonePartitionsLockKey)[0][0]
             .as<bool>()) {
      return 0;
    }
    // ATTACH takes a lock that lets finishes go on; do not queue behind a long reader for it.
    txn.exec("SET LOCAL lock_timeout = '5s'");
    const int64_t now = DatabaseNowSeconds(txn);
    int64_t from = now / span * span;
    for (const DonePartition& p : ListDonePartitions(txn)) {
      if (p.attached && !p.detach_pending) from = std::max(from, p.to);
    }
    const int64_t through = now + absl::ToInt64Seconds(ahead);
    int added = 0;
    for (; from <= through; from += span) {
      const std::string name = absl::StrCat("jobs_done_", from, "_", from + span);
      txn.exec(absl::StrCat("CREATE TABLE ", name,
                            " (LIKE jobs_done INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"));
      txn.exec(absl::StrCat("ALTER TABLE jobs_done ATTACH PARTITION ", name, " FOR VALUES FROM (",
                            TimestampLiteral(from), ") TO (", TimestampLiteral(from + span), ")"));
      ++added;
    }
    txn.commit();
    return added;
  });
}

absl::StatusOr<int> PgJobStore::DropDonePartitions() {
  const int64_t keep = absl::ToInt64Seconds(retention_);
  return WithConnection(*pool_, "drop partitions of ended jobs past retention",
                        [&](pqxx::connection& conn) -> absl::StatusOr<int> {
    // DETACH ... CONCURRENTLY runs outside a transaction: each statement commits on its own.
    pqxx::nontransaction txn(conn);
    if (!txn.exec_params("SELECT pg_try_advisory_lock($1)", kDonePartitionsLockKey)[0][0]
             .as<bool>()) {
      return 0;
    }
    int dropped = 0;
    absl::Status status;
    try {
      const int64_t cutoff = DatabaseNowSeconds(txn) - keep;
      for (const DonePartition& p : ListDonePartitions(txn)) {
        if (p.to > cutoff) continue;
        if (p.attached) {
          txn.exec(absl::StrCat("ALTER TABLE jobs_done DETACH PARTITION ", p.name,
                                p.detach_pending ? " FINALIZE" : " CONCURRENTLY"));
        }
        txn.exec(absl::StrCat("DROP TABLE IF EXISTS ", p.name));
        ++dropped;
      }
    } catch (...) {
      txn.exec_params("SELECT pg_advisory_unlock($1)", kDonePartitionsLockKey);
      throw;
    }
    txn.exec_params("SELECT pg_advisory_unlock($1)", kDonePartitionsLockKey);
    return dropped;
  });
}

absl::StatusOr<InsertOutcome> PgJobStore::Insert(const job::Job& job) {
  absl::StatusOr<std::vector<InsertOutcome>> outcomes = InsertMany({job}, false);
  if (!outcomes.ok()) {
    // A lone job's field is named without the batch's "jobs[0].".
    absl::string_view message = outcomes.status().message();
    absl::ConsumePrefix(&message, "jobs[0].");
    return absl::Status(outcomes.status().code(), message);
  }
  return std::move((*outcomes)[0]);
}

namespace {

// Inserts `jobs`, returning the ids written with their seq.
absl::flat_hash_map<std::string, int64_t> ExecInsert(pqxx::transaction_base& txn,
                                            const std::vector<const job::Job*>& jobs,
                                            bool notify_leader) {
  const InsertColumns c(jobs);
  pqxx::result rows = txn.exec_prepared(
      kInsertJobs.name, TextArrayLiteral(c.ids), TextArrayLiteral(c.types),
      TextArrayLiteral(c.payloads_hex), TextArrayLiteral(c.resource_ids),
      TextArrayLiteral(c.fairness_keys), TextArrayLiteral(c.idempotency_keys),
      TextArrayLiteral(c.label_keys), TextArrayLiteral(c.label_values),
      IntArrayLiteral(c.max_attempts), IntArrayLiteral(c.timeouts_ms),
      OptionalIntArrayLiteral(c.deadlines_us), OptionalIntArrayLiteral(c.not_befores_us),
      notify_leader, TextArrayLiteral(c.owners));
  absl::flat_hash_map<std::string, int64_t> inserted;
  for (const pqxx::row& row : rows) inserted[TextFromField(row[0])] = row[1].as<int64_t>();
  return inserted;
}

}  // namespace

absl::StatusOr<std::vector<InsertOutcome>> PgJobStore::InsertMany(
    const std::vector<job::Job>& jobs, bool notify_leader) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (absl::Status valid = ValidateForInsert(jobs[i]); !valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("jobs[", i, "].", valid.message()));
    }
  }
  std::vector<InsertOutcome> outcomes(jobs.size());
  if (jobs.empty()) return outcomes;
  const bool any_key = absl::c_any_of(
      jobs, [](const job::Job& job) { return !job.spec.idempotency_key.empty(); });
  return WithConnection(
      *pool_, absl::StrCat("insert ", jobs.size(), " jobs"),
      [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<InsertOutcome>> {
        std::vector<const job::Job*> pending;
        for (const job::Job& job : jobs) pending.push_back(&job);
        if (!any_key) {
          // Without idempotency keys every row is written, by one statement: atomic and durable
          // when it returns, with no BEGIN and COMMIT round trips.
          pqxx::nontransaction txn(conn);
          absl::flat_hash_map<std::string, int64_t> inserted =
              ExecInsert(txn, pending, notify_leader);
          for (size_t i = 0; i < jobs.size(); ++i) {
            outcomes[i].job_id = jobs[i].id;
            outcomes[i].seq = inserted[jobs[i].id];
          }
          return outcomes;
        }
        // With keys, in one transaction (so the call stays all or nothing): a new row whose key
        // a job that ended within the window still holds is taken back, and the rows left out
        // (their key held by an active job) get the holder. A holder can end or let go of its
        // key between two statements; those rows are tried again.
        //
        // Why no repeat slips through: the unique index serializes inserts against the active
        // holder. An active holder that ends commits its move to jobs_done before a concurrent
        // insert of its key can pass the index, so the check of jobs_done, a later statement,
        // sees it there.
        pqxx::work txn(conn);
        const int64_t window_us = absl::ToInt64Microseconds(idempotency_window_);
        absl::flat_hash_map<const job::Job*, size_t> index;
        for (size_t i = 0; i < jobs.size(); ++i) index[&jobs[i]] = i;
        // (owner, fairness key, idempotency key): the scope of a key.
        using Key = std::tuple<std::string, std::string, std::string>;
        auto key_of = [](const job::Job* job) {
          return Key(job->owner, job->spec.fairness_key, job->spec.idempotency_key);
        };
        // The holders of the keys of `of`, by key (`statement`: kSelectHolders or
        // kSelectDoneHolders).
        auto holders_of = [&](const std::vector<const job::Job*>& of, const Statement& statement) {
          std::vector<std::string> owners, fairness_keys, idempotency_keys;
          for (const job::Job* job : of) {
            owners.push_back(job->owner);
            fairness_keys.push_back(job->spec.fairness_key);
            idempotency_keys.push_back(job->spec.idempotency_key);
          }
          absl::flat_hash_map<Key, std::string> holders;
          for (const pqxx::row& row : txn.exec_prepared(
                   statement.name, TextArrayLiteral(owners), TextArrayLiteral(fairness_keys),
                   TextArrayLiteral(idempotency_keys), window_us)) {
            holders[Key(TextFromField(row[0]), TextFromField(row[1]), TextFromField(row[2]))] =
                TextFromField(row[3]);
          }
          return holders;
        };
        constexpr int kTries = 5;
        for (int attempt = 0; attempt < kTries && !pending.empty(); ++attempt) {
          absl::flat_hash_map<std::string, int64_t> inserted =
              ExecInsert(txn, pending, notify_leader);
          std::vector<const job::Job*> written, left_out;
          for (const job::Job* job : pending) {
            (inserted.contains(job->id) ? written : left_out).push_back(job);
          }
          std::vector<const job::Job*> keyed;
          for (const job::Job* job : written) {
            if (!job->spec.idempotency_key.empty()) keyed.push_back(job);
          }
          if (!keyed.empty()) {
            absl::flat_hash_map<Key, std::string> ended = holders_of(keyed, kSelectDoneHolders);
            std::vector<std::string> undo;
            for (const job::Job* job : keyed) {
              auto it = ended.find(key_of(job));
              if (it == ended.end()) continue;
              undo.push_back(job->id);
              outcomes[index[job]] = InsertOutcome{.job_id = it->second, .deduplicated = true};
            }
            if (!undo.empty()) txn.exec_prepared(kUndoInserts.name, TextArrayLiteral(undo));
            for (const job::Job* job : written) {
              if (outcomes[index[job]].deduplicated) continue;
              outcomes[index[job]] = InsertOutcome{
                  .job_id = job->id, .deduplicated = false, .seq = inserted[job->id]};
            }
          } else {
            for (const job::Job* job : written) {
              outcomes[index[job]] = InsertOutcome{
                  .job_id = job->id, .deduplicated = false, .seq = inserted[job->id]};
            }
          }
          pending.clear();
          if (left_out.empty()) break;
          absl::flat_hash_map<Key, std::string> holders = holders_of(left_out, kSelectHolders);
          for (const job::Job* job : left_out) {
            auto it = holders.find(key_of(job));
            if (it == holders.end()) {
              pending.push_back(job);
            } else {
              outcomes[index[job]] = InsertOutcome{.job_id = it->second, .deduplicated = true};
            }
          }
        }
        if (!pending.empty()) {
          return absl::AbortedError(absl::StrCat("insert ", jobs.size(),
                                                 " jobs: idempotency key conflict vanished; retry"));
        }
        txn.commit();
        return outcomes;
      });
}

absl::StatusOr<job::Job> PgJobStore::Get(const std::string& job_id) {
  return WithConnection(*pool_, absl::StrCat("get job ", job_id),
                        [&](pqxx::connection& conn) -> absl::StatusOr<job::Job> {
                          pqxx::nontransaction txn(conn);
                          pqxx::result rows = txn.exec_prepared(kGetJob.name, job_id);
                          if (rows.empty()) {
                            return absl::NotFoundError(absl::StrCat("job ", job_id, " not found"));
                          }
                          return RowToJob(rows[0]);
                        });
}

absl::StatusOr<std::vector<job::Job>> PgJobStore::GetMany(const std::vector<std::string>& job_ids) {
  if (job_ids.empty()) return std::vector<job::Job>{};
  return WithConnection(*pool_, absl::StrCat("get ", job_ids.size(), " jobs"),
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<job::Job>> {
                          pqxx::nontransaction txn(conn);
                          return RowsToJobs(
                              txn.exec_prepared(kGetJobs.name, TextArrayLiteral(job_ids)));
                        });
}

absl::StatusOr<std::vector<job::Job>> PgJobStore::LoadActive() {
  return WithConnection(*pool_, "load active jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<job::Job>> {
                          return RowsToJobs(ExecScan(conn, kLoadActive));
                        });
}

absl::StatusOr<std::vector<job::Job>> PgJobStore::LoadPlaced() {
  return WithConnection(*pool_, "load placed jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<job::Job>> {
                          return RowsToJobs(ExecScan(conn, kLoadPlaced));
                        });
}

absl::StatusOr<QueuedHeads> PgJobStore::LoadQueuedHeads(int64_t per_queue) {
  return WithConnection(
      *pool_, "load the heads of the queues",
      [&](pqxx::connection& conn) -> absl::StatusOr<QueuedHeads> {
        pqxx::result rows = ExecScan(conn, kLoadQueuedHeads, per_queue);
        QueuedHeads out;
        out.jobs.reserve(rows.size());
        absl::flat_hash_set<std::pair<std::string, std::string>> seen;
        TextRow cells;  // reused across rows
        for (const pqxx::row& row : rows) {
          ToTextRow(row, &cells);
          DISPATCHD_ASSIGN_OR_RETURN(job::Job job, JobFromRow(cells));
          if (seen.insert({job.spec.type, job.spec.fairness_key}).second) {
            out.queues.push_back(QueueCount{.type = job.spec.type,
                                            .fairness_key = job.spec.fairness_key,
                                            .queued = row[kColSeq + 1].as<int64_t>()});
          }
          out.jobs.push_back(std::move(job));
        }
        return out;
      });
}

absl::StatusOr<std::vector<job::Job>> PgJobStore::LoadQueuedPage(const std::string& type,
                                                                 const std::string& fairness_key,
                                                                 int64_t after_seq,
                                                                 int64_t limit) {
  return WithConnection(*pool_, absl::StrCat("load queued jobs of ", type),
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<job::Job>> {
                          pqxx::nontransaction txn(conn);
                          return RowsToJobs(txn.exec_prepared(kLoadQueuedPage.name, type,
                                                              fairness_key, after_seq, limit));
                        });
}

absl::StatusOr<int64_t> PgJobStore::CountQueuedBefore(const std::string& type,
                                                      const std::string& fairness_key,
                                                      int64_t seq) {
  return WithConnection(*pool_, "count queued jobs ahead",
                        [&](pqxx::connection& conn) -> absl::StatusOr<int64_t> {
                          pqxx::nontransaction txn(conn);
                          return txn.exec_prepared(kCountQueuedBefore.name, type, fairness_key,
                                                   seq)[0][0]
                              .as<int64_t>();
                        });
}

absl::StatusOr<std::vector<QueueCount>> PgJobStore::CountQueued(
    const std::vector<QueueBound>& bounds) {
  std::vector<std::string> types, keys;
  std::vector<int64_t> limits;
  for (const QueueBound& b : bounds) {
    types.push_back(b.type);
    keys.push_back(b.fairness_key);
    limits.push_back(b.bound);
  }
  return WithConnection(*pool_, "count queued jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<QueueCount>> {
                          pqxx::result rows =
                              ExecScan(conn, kCountQueued, TextArrayLiteral(types),
                                       TextArrayLiteral(keys), IntArrayLiteral(limits));
                          std::vector<QueueCount> out;
                          out.reserve(rows.size());
                          for (const pqxx::row& r : rows) {
                            out.push_back(QueueCount{.type = TextFromField(r[0]),
                                                     .fairness_key = TextFromField(r[1]),
                                                     .queued = r[2].as<int64_t>(),
                                                     .up_to_bound = r[3].as<int64_t>()});
                          }
                          return out;
                        });
}

namespace {

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
                               f.ran_us, epoch));
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
  return WithConnection(*pool_, absl::StrCat("retry job ", job_id),
                        [&](pqxx::connection& conn) -> absl::StatusOr<bool> {
                          pqxx::nontransaction txn(conn);
                          const int64_t epoch = fence_.load();
                          if (txn.exec_prepared(kRetry.name, job_id, attempt,
                                                OptionalMicros(not_before), error, epoch)
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
                                            f.errors, f.ran_us, m.ids, m.attempts, m.workers, c.ids,
                                            c.attempts, c.workers, epoch);
      for (const pqxx::row& row : rows) {
        const std::string kind = TextFromField(row[0]);
        if (kind == "f") {
          out.finished.push_back(TextFromField(row[1]));
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
                            epoch)
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
        const std::string state = TextFromField(rows[0][kColSeq + 1]);
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

absl::StatusOr<std::vector<TypeStateCount>> PgJobStore::CountByTypeAndState() {
  return WithConnection(
      *pool_, "count jobs by type and state",
      [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<TypeStateCount>> {
        pqxx::result rows = ExecScan(conn, kCountByTypeAndState);
        std::vector<TypeStateCount> counts;
        counts.reserve(rows.size());
        for (const pqxx::row& row : rows) {
          const std::string state = TextFromField(row[1]);
          std::optional<job::JobState> parsed = job::ParseJobState(state);
          if (!parsed.has_value()) {
            return absl::InternalError(absl::StrCat("unknown job state \"", state, "\""));
          }
          counts.push_back(TypeStateCount{
              .type = TextFromField(row[0]), .state = *parsed, .count = row[2].as<int64_t>()});
        }
        return counts;
      });
}

absl::StatusOr<int64_t> PgJobStore::CountActive() {
  return WithConnection(*pool_, "count active jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<int64_t> {
                          return ExecScan(conn, kCountActive)[0][0].as<int64_t>();
                        });
}

absl::StatusOr<std::vector<TypeStateCount>> PgJobStore::CountActiveByTypeAndState() {
  return WithConnection(
      *pool_, "count active jobs by type and state",
      [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<TypeStateCount>> {
        pqxx::result rows = ExecScan(conn, kCountActiveByTypeAndState);
        std::vector<TypeStateCount> counts;
        counts.reserve(rows.size());
        for (const pqxx::row& row : rows) {
          std::optional<job::JobState> parsed = job::ParseJobState(TextFromField(row[1]));
          if (!parsed.has_value()) return absl::InternalError("unknown job state");
          counts.push_back(TypeStateCount{.type = TextFromField(row[0]),
                                          .state = *parsed,
                                          .count = row[2].as<int64_t>(),
                                          .owner = TextFromField(row[3])});
        }
        return counts;
      });
}

absl::StatusOr<std::vector<JobRef>> PgJobStore::GetRefs(const std::vector<std::string>& job_ids) {
  if (job_ids.empty()) return std::vector<JobRef>{};
  return WithConnection(
      *pool_, absl::StrCat("read ", job_ids.size(), " job states"),
      [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<JobRef>> {
        pqxx::nontransaction txn(conn);
        return RowsToRefs(txn.exec_prepared(kGetRefs.name, TextArrayLiteral(job_ids)));
      });
}

absl::StatusOr<std::vector<JobRef>> PgJobStore::LoadPlacedRefs() {
  return WithConnection(*pool_, "load dispatched and running jobs",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<JobRef>> {
                          return RowsToRefs(ExecScan(conn, kLoadPlacedRefs));
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

absl::StatusOr<std::vector<AccountRow>> PgJobStore::LoadAccounts() {
  return WithConnection(*pool_, "load the fair-share accounts",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<AccountRow>> {
                          pqxx::nontransaction txn(conn);
                          std::vector<AccountRow> out;
                          for (const pqxx::row& r : txn.exec_prepared(kLoadAccounts.name)) {
                            out.push_back({TextFromField(r[0]), TextFromField(r[1]),
                                           TextFromField(r[2]), r[3].as<double>()});
                          }
                          return out;
                        });
}

absl::Status PgJobStore::NotifyChanged(const std::string& job_id) {
  return WithConnection(*pool_, absl::StrCat("notify the leader of job ", job_id),
                        [&](pqxx::connection& conn) -> absl::Status {
                          pqxx::nontransaction txn(conn);
                          txn.exec_prepared(kNotifyChanged.name, job_id);
                          return absl::OkStatus();
                        });
}

}  // namespace dispatchd::store
