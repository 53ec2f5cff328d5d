#include "server/store/migrations.h"

#include <exception>

#include "pqxx/except"
#include "pqxx/transaction"

#include "server/store/pg_error.h"

namespace dispatchd::store {
namespace {

constexpr char kLockMigrations[] = "SELECT pg_advisory_xact_lock($1)";

constexpr char kCreateSchemaMigrations[] = R"sql(
CREATE TABLE IF NOT EXISTS schema_migrations (
  version int PRIMARY KEY,
  applied_at timestamptz NOT NULL DEFAULT now()
))sql";

constexpr char kSelectSchemaVersion[] = "SELECT coalesce(max(version), 0) FROM schema_migrations";

constexpr char kRecordSchemaVersion[] =
    "INSERT INTO schema_migrations (version, applied_at) VALUES ($1, now())";

// Version 1: the jobs table.
//
// - seq is the arrival order: created_at ties within one transaction, and ids are opaque.
// - Timestamps are the database server's clock; NULL means "not yet" (absl::InfinitePast in Job).
// - dispatch_deadline_at is absolute (created_at + the spec's dispatch_deadline), so that the
//   expiry sweep is an index range scan; the spec's duration is recovered as the difference.
// - Indexes serve the hot paths only, because every index on `state` makes each transition a
//   non-HOT update: queued jobs in arrival order, active jobs in arrival order (recovery and
//   CountActive), queued jobs by deadline (expiry), and the idempotency key (deduplication, also
//   the ON CONFLICT arbiter of Insert).
constexpr char kMigration1Jobs[] = R"sql(
CREATE TABLE jobs (
  seq bigint GENERATED ALWAYS AS IDENTITY,
  id text PRIMARY KEY,
  type text NOT NULL,
  payload bytea NOT NULL,
  resource_id text NOT NULL DEFAULT '',
  fairness_key text NOT NULL DEFAULT '',
  idempotency_key text NOT NULL DEFAULT '',
  labels jsonb NOT NULL DEFAULT '{}' CHECK (jsonb_typeof(labels) = 'object'),
  state text NOT NULL CHECK (state IN ('QUEUED', 'DISPATCHED', 'RUNNING', 'SUCCEEDED', 'FAILED',
                                       'CANCELLED', 'EXPIRED')),
  attempt int NOT NULL DEFAULT 0 CHECK (attempt >= 0),
  max_attempts int NOT NULL CHECK (max_attempts >= 0),
  timeout_ms bigint NOT NULL CHECK (timeout_ms >= 0),
  dispatch_deadline_at timestamptz NULL,
  not_before timestamptz NULL,
  worker_id text NOT NULL DEFAULT '',
  result bytea NULL,
  error text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL DEFAULT now(),
  dispatched_at timestamptz NULL,
  started_at timestamptz NULL,
  finished_at timestamptz NULL,
  updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX jobs_queued_by_arrival ON jobs (seq) WHERE state = 'QUEUED';
CREATE INDEX jobs_active_by_arrival ON jobs (seq)
  WHERE state IN ('QUEUED', 'DISPATCHED', 'RUNNING');
CREATE INDEX jobs_queued_by_deadline ON jobs (dispatch_deadline_at)
  WHERE state = 'QUEUED' AND dispatch_deadline_at IS NOT NULL;
CREATE UNIQUE INDEX jobs_idempotency ON jobs (fairness_key, idempotency_key)
  WHERE idempotency_key <> '';
)sql";

constexpr Migration kMigrations[] = {
    {1, "jobs table", kMigration1Jobs},
};

}  // namespace

absl::Span<const Migration> AllMigrations() { return kMigrations; }

absl::Status ApplyMigrations(pqxx::connection& conn) {
  try {
    pqxx::work txn(conn, "migrate");
    txn.exec_params(kLockMigrations, kMigrationLockKey);
    txn.exec(kCreateSchemaMigrations);
    const int current = txn.exec(kSelectSchemaVersion)[0][0].as<int>();
    for (const Migration& m : kMigrations) {
      if (m.version <= current) continue;
      txn.exec(m.sql);
      txn.exec_params(kRecordSchemaVersion, m.version);
    }
    txn.commit();
    return absl::OkStatus();
  } catch (const std::exception& e) {
    return TranslatePgError(e, "apply schema migrations");
  }
}

}  // namespace dispatchd::store
