#include "server/store/pg_job_store.h"

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include "pqxx/transaction"

#include "lib/util/status_macros.h"
#include "server/store/migrations.h"
#include "server/store/pg_conninfo.h"
#include "server/store/pg_pool.h"
#include "server/store/pg_rows.h"
#include "server/store/pg_statements.h"

namespace dispatchd::store {

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
    return absl::InvalidArgumentError(
        absl::StrCat("retention: must be at least 1s and finite, got ",
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

// A row kInsertJobs wrote.
struct Inserted {
  int64_t seq = 0;
  bool dispatched = false;  // written DISPATCHED to the worker its job named
};

// Inserts `jobs`, returning the rows written by id. `epoch`: the fence a job placed on a worker
// is written DISPATCHED under (nullopt when none is placed).
absl::flat_hash_map<std::string, Inserted> ExecInsert(pqxx::transaction_base& txn,
                                                      const std::vector<const job::Job*>& jobs,
                                                      bool notify_leader,
                                                      std::optional<int64_t> epoch) {
  const InsertColumns c(jobs);
  pqxx::result rows = txn.exec_prepared(
      kInsertJobs.name, TextArrayLiteral(c.ids), TextArrayLiteral(c.types),
      TextArrayLiteral(c.payloads_hex), TextArrayLiteral(c.resource_ids),
      TextArrayLiteral(c.fairness_keys), TextArrayLiteral(c.idempotency_keys),
      TextArrayLiteral(c.label_keys), TextArrayLiteral(c.label_values),
      IntArrayLiteral(c.max_attempts), IntArrayLiteral(c.timeouts_ms),
      OptionalIntArrayLiteral(c.deadlines_us), OptionalIntArrayLiteral(c.not_befores_us),
      notify_leader, TextArrayLiteral(c.owners), TextArrayLiteral(c.workers), epoch);
  absl::flat_hash_map<std::string, Inserted> inserted;
  for (const pqxx::row& row : rows) {
    inserted[TextFromField(row[0])] = {.seq = row[1].as<int64_t>(),
                                       .dispatched = row[2].as<bool>()};
  }
  return inserted;
}

// The outcome of a job `inserted` wrote.
InsertOutcome WrittenOutcome(const std::string& id, const Inserted& inserted) {
  return InsertOutcome{
      .job_id = id, .deduplicated = false, .seq = inserted.seq, .dispatched = inserted.dispatched};
}

}  // namespace

absl::StatusOr<std::vector<InsertOutcome>> PgJobStore::InsertMany(const std::vector<job::Job>& jobs,
                                                                  bool notify_leader) {
  for (size_t i = 0; i < jobs.size(); ++i) {
    if (absl::Status valid = ValidateForInsert(jobs[i]); !valid.ok()) {
      return absl::Status(valid.code(), absl::StrCat("jobs[", i, "].", valid.message()));
    }
  }
  std::vector<InsertOutcome> outcomes(jobs.size());
  if (jobs.empty()) return outcomes;
  const bool any_key =
      absl::c_any_of(jobs, [](const job::Job& job) { return !job.spec.idempotency_key.empty(); });
  const std::optional<int64_t> epoch =
      absl::c_any_of(jobs, [](const job::Job& job) { return !job.worker_id.empty(); })
          ? std::optional(fence_.load())
          : std::nullopt;
  return WithConnection(
      *pool_, absl::StrCat("insert ", jobs.size(), " jobs"),
      [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<InsertOutcome>> {
        std::vector<const job::Job*> pending;
        for (const job::Job& job : jobs) pending.push_back(&job);
        if (!any_key) {
          // Without idempotency keys every row is written, by one statement: atomic and durable
          // when it returns, with no BEGIN and COMMIT round trips.
          pqxx::nontransaction txn(conn);
          absl::flat_hash_map<std::string, Inserted> inserted =
              ExecInsert(txn, pending, notify_leader, epoch);
          for (size_t i = 0; i < jobs.size(); ++i) {
            outcomes[i] = WrittenOutcome(jobs[i].id, inserted[jobs[i].id]);
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
          absl::flat_hash_map<std::string, Inserted> inserted =
              ExecInsert(txn, pending, notify_leader, epoch);
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
              outcomes[index[job]] = WrittenOutcome(job->id, inserted[job->id]);
            }
          } else {
            for (const job::Job* job : written) {
              outcomes[index[job]] = WrittenOutcome(job->id, inserted[job->id]);
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
          return absl::AbortedError(absl::StrCat(
              "insert ", jobs.size(), " jobs: idempotency key conflict vanished; retry"));
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
  return WithConnection(
      *pool_, absl::StrCat("get ", job_ids.size(), " jobs"),
      [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<job::Job>> {
        pqxx::nontransaction txn(conn);
        return RowsToJobs(txn.exec_prepared(kGetJobs.name, TextArrayLiteral(job_ids)));
      });
}

absl::StatusOr<std::vector<job::Job>> PgJobStore::SearchJobs(const JobSearch& search) {
  const std::string state =
      search.state.has_value() ? std::string(job::ToString(*search.state)) : std::string();
  const std::optional<int64_t> after =
      search.created_after == absl::InfinitePast()
          ? std::nullopt
          : std::optional(absl::ToUnixMicros(search.created_after));
  const std::optional<int64_t> before =
      search.created_before == absl::InfiniteFuture()
          ? std::nullopt
          : std::optional(absl::ToUnixMicros(search.created_before));
  return WithConnection(
      *pool_, "search jobs", [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<job::Job>> {
        return RowsToJobs(ExecScan(conn, kSearchJobs, state, search.type, search.fairness_key,
                                   search.owner, after, before, search.limit));
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
                                            .queued = row[kColCount].as<int64_t>()});
          }
          out.jobs.push_back(std::move(job));
        }
        return out;
      });
}

absl::StatusOr<std::vector<job::Job>> PgJobStore::LoadQueuedPage(const std::string& type,
                                                                 const std::string& fairness_key,
                                                                 int64_t after_seq, int64_t limit) {
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
  return WithConnection(
      *pool_, "count queued jobs ahead", [&](pqxx::connection& conn) -> absl::StatusOr<int64_t> {
        pqxx::nontransaction txn(conn);
        return txn.exec_prepared(kCountQueuedBefore.name, type, fairness_key, seq)[0][0]
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
  return WithConnection(*pool_, "count active jobs by type and state",
                        [&](pqxx::connection& conn) -> absl::StatusOr<std::vector<TypeStateCount>> {
                          pqxx::result rows = ExecScan(conn, kCountActiveByTypeAndState);
                          std::vector<TypeStateCount> counts;
                          counts.reserve(rows.size());
                          for (const pqxx::row& row : rows) {
                            std::optional<job::JobState> parsed =
                                job::ParseJobState(TextFromField(row[1]));
                            if (!parsed.has_value())
                              return absl::InternalError("unknown job state");
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
