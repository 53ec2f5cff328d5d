// Upkeep of jobs_done's partitions (PgJobStore::AddDonePartitions and DropDonePartitions): ended
// jobs go with a DROP of the partition they ended in, not row by row.

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "pqxx/connection"
#include "pqxx/nontransaction"
#include "pqxx/result"
#include "pqxx/transaction"

#include "server/store/pg_job_store.h"
#include "server/store/pg_pool.h"
#include "server/store/pg_rows.h"

namespace dispatchd::store {

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
  return absl::StrCat("'",
                      absl::FormatTime("%Y-%m-%d %H:%M:%S+00", absl::FromUnixSeconds(unix_seconds),
                                       absl::UTCTimeZone()),
                      "'");
}

// Session-level advisory lock key of partition upkeep (see migrations.h for the others).
constexpr int64_t kDonePartitionsLockKey = 0x64697370'61727431;  // "disppart"

}  // namespace

absl::StatusOr<int> PgJobStore::AddDonePartitions(absl::Duration ahead) {
  const int64_t span = absl::ToInt64Seconds(DonePartitionSpan(retention_));
  return WithConnection(
      *pool_, "add partitions for ended jobs", [&](pqxx::connection& conn) -> absl::StatusOr<int> {
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
          txn.exec(absl::StrCat("ALTER TABLE jobs_done ATTACH PARTITION ", name,
                                " FOR VALUES FROM (", TimestampLiteral(from), ") TO (",
                                TimestampLiteral(from + span), ")"));
          ++added;
        }
        txn.commit();
        return added;
      });
}

absl::StatusOr<int> PgJobStore::DropDonePartitions() {
  const int64_t keep = absl::ToInt64Seconds(retention_);
  return WithConnection(
      *pool_, "drop partitions of ended jobs past retention",
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

}  // namespace dispatchd::store
