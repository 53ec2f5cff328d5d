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

// Version 2: idempotency keys are held for a window, not forever.
//
// - A row holds its (fairness_key, idempotency_key) while idempotency_key is non-empty: the
//   unique index jobs_idempotency of version 1 covers exactly those rows, and stays the ON
//   CONFLICT arbiter of Insert. ReleaseIdempotencyKeys frees the key of a job that has been
//   terminal for `idempotency_window` by moving it to released_idempotency_key (reads show it
//   from there), so the row leaves the unique index and a repeat creates a new job.
// - Releasing by a change of the indexed value keeps the schema additive: a daemon of the
//   previous version runs unchanged on it (its ON CONFLICT still finds its index), and a release
//   racing an insert of the same key serializes on that index.
// - jobs_idempotency_held finds the ended rows still holding a key, oldest first (the release
//   sweep); only those rows are in it, so it stays small.
// - ADD COLUMN without a default is a catalog change only: no table rewrite.
constexpr char kMigration2IdempotencyWindow[] = R"sql(
ALTER TABLE jobs ADD COLUMN released_idempotency_key text NULL;
CREATE INDEX jobs_idempotency_held ON jobs (finished_at)
  WHERE idempotency_key <> '' AND finished_at IS NOT NULL;
)sql";

// Version 3: leadership among daemons that share the database.
//
// - One row. `epoch` grows by one each time a daemon becomes the leader (it holds the session
//   advisory lock kLeaderLockKey while it leads). Every write the leader makes to a job carries
//   its epoch and locks this row FOR KEY SHARE while checking it (pg_statements.h, "Fencing"), so
//   once a new leader's bump commits, a deposed leader's writes change nothing; the bump itself
//   waits for the old leader's writes in flight.
// - holder and address say who leads and where workers and clients find it; renewed_at is
//   moved on by the leader every lease/4, so a standby can tell a frozen leader from a live one.
// - The row starts at epoch 0, which is also the fence of a store that never had a leader (tests
//   of the store alone).
constexpr char kMigration3Leader[] = R"sql(
CREATE TABLE dispatchd_leader (
  id int PRIMARY KEY CHECK (id = 1),
  epoch bigint NOT NULL,
  holder text NOT NULL DEFAULT '',
  address text NOT NULL DEFAULT '',
  renewed_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO dispatchd_leader (id, epoch) VALUES (1, 0);
)sql";

// Version 4: the dispatcher pages queued jobs in by queue.
//
// - A queue is a job type and a fairness key. The daemon holds the first rows of each queue (by
//   seq) in memory and reads the next ones as it dispatches, so that its memory and start-up
//   time follow the queues' heads, not the whole backlog. This index serves that read (a range
//   scan per queue) and the counts per queue (an index-only scan).
// - Partial on QUEUED like jobs_queued_by_arrival: a claim moves the row out of it.
constexpr char kMigration4QueuedByQueue[] = R"sql(
CREATE INDEX jobs_queued_by_queue ON jobs (type, fairness_key, seq) WHERE state = 'QUEUED';
)sql";

// Version 5: ended jobs in a table of their own, partitioned by finish time.
//
// - jobs (renamed jobs_active) keeps the active jobs only, so its heap and indexes stay the size
//   of the work in flight, however many ended jobs are kept for Status. A job's end moves its row
//   to jobs_done in the same statement (pg_job_store.cc, DISPATCHD_PG_INSERT_DONE).
// - jobs_done is partitioned by finished_at in spans of PgJobStore::DonePartitionSpan(retention)
//   named jobs_done_<from>_<to> (seconds since the epoch). Retention drops whole partitions:
//   no row is deleted one by one, no dead tuple is left for VACUUM. The daemon adds partitions
//   ahead of the clock.
// - An ended job holds its idempotency key while it finished less than idempotency_window ago,
//   read from finished_at (jobs_done_by_idempotency_key), so nothing needs releasing; the unique
//   index jobs_idempotency on jobs_active still serializes inserts against active holders.
//   released_idempotency_key and its index go.
// - The view `jobs` shows both tables as one, for operators and tools that read rows with SQL.
// - Rows that ended before this version move into one partition covering their finish times.
// - A daemon of an earlier version cannot run on this schema: stop them all before the upgrade.
constexpr char kMigration5JobsDone[] = R"sql(
ALTER TABLE jobs RENAME TO jobs_active;
DROP INDEX jobs_idempotency_held;
CREATE TABLE jobs_done (
  seq bigint NOT NULL,
  id text NOT NULL,
  type text NOT NULL,
  payload bytea NOT NULL,
  resource_id text NOT NULL DEFAULT '',
  fairness_key text NOT NULL DEFAULT '',
  idempotency_key text NOT NULL DEFAULT '',
  labels jsonb NOT NULL DEFAULT '{}',
  state text NOT NULL CHECK (state IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'EXPIRED')),
  attempt int NOT NULL,
  max_attempts int NOT NULL,
  timeout_ms bigint NOT NULL,
  dispatch_deadline_at timestamptz NULL,
  not_before timestamptz NULL,
  worker_id text NOT NULL DEFAULT '',
  result bytea NULL,
  error text NOT NULL DEFAULT '',
  created_at timestamptz NOT NULL,
  dispatched_at timestamptz NULL,
  started_at timestamptz NULL,
  finished_at timestamptz NOT NULL,
  updated_at timestamptz NOT NULL
) PARTITION BY RANGE (finished_at);
CREATE INDEX jobs_done_by_id ON jobs_done (id);
CREATE INDEX jobs_done_by_idempotency_key ON jobs_done (fairness_key, idempotency_key, finished_at)
  WHERE idempotency_key <> '';
DO $$
DECLARE
  lo int8;
  hi int8 := floor(extract(epoch FROM now()))::int8 + 1;
BEGIN
  SELECT floor(extract(epoch FROM min(coalesce(finished_at, updated_at))))::int8 INTO lo
  FROM jobs_active WHERE state NOT IN ('QUEUED', 'DISPATCHED', 'RUNNING');
  IF lo IS NOT NULL THEN
    EXECUTE format('CREATE TABLE %I PARTITION OF jobs_done FOR VALUES FROM (%L) TO (%L)',
                   'jobs_done_' || lo || '_' || hi, to_timestamp(lo), to_timestamp(hi));
  END IF;
END $$;
INSERT INTO jobs_done (seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels,
                       state, attempt, max_attempts, timeout_ms, dispatch_deadline_at,
                       not_before, worker_id, result, error, created_at, dispatched_at,
                       started_at, finished_at, updated_at)
SELECT seq, id, type, payload, resource_id, fairness_key,
       coalesce(released_idempotency_key, idempotency_key), labels, state, attempt, max_attempts,
       timeout_ms, dispatch_deadline_at, not_before, worker_id, result, error, created_at,
       dispatched_at, started_at, coalesce(finished_at, updated_at), updated_at
FROM jobs_active WHERE state NOT IN ('QUEUED', 'DISPATCHED', 'RUNNING');
DELETE FROM jobs_active WHERE state NOT IN ('QUEUED', 'DISPATCHED', 'RUNNING');
ALTER TABLE jobs_active DROP COLUMN released_idempotency_key;
ALTER TABLE jobs_active ADD CONSTRAINT jobs_active_state_is_active
  CHECK (state IN ('QUEUED', 'DISPATCHED', 'RUNNING'));
CREATE VIEW jobs AS
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at
  FROM jobs_active
  UNION ALL
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at
  FROM jobs_done;
)sql";

// Version 6: fewer indexes on the hot table.
//
// - Since version 5, jobs_active holds active jobs only, and since version 4 queued jobs are
//   found by queue: jobs_queued_by_arrival has no reader left, and jobs_active_by_arrival
//   indexes every row. Every new job paid an entry in both.
// - What still reads the placed jobs in arrival order (a restart, the reconcile) gets an index of
//   those alone, so a queued job costs one index entry fewer when it arrives and none of these
//   when it is claimed.
constexpr char kMigration6PlacedByArrival[] = R"sql(
DROP INDEX jobs_queued_by_arrival;
DROP INDEX jobs_active_by_arrival;
CREATE INDEX jobs_placed_by_arrival ON jobs_active (seq) WHERE state IN ('DISPATCHED', 'RUNNING');
)sql";

// Version 7: jobs have owners.
//
// - `owner` is the principal that submitted the job ('' when the daemon has no authentication,
//   as for every row written before this version). Adding a column with a constant default
//   rewrites nothing.
// - Idempotency keys are scoped to the owner: the unique index that serializes inserts, and the
//   index that finds ended holders, lead with it. A daemon of an earlier version cannot run on
//   this schema (its inserts name the old unique index): stop them all before the upgrade.
constexpr char kMigration7Owner[] = R"sql(
ALTER TABLE jobs_active ADD COLUMN owner text NOT NULL DEFAULT '';
ALTER TABLE jobs_done ADD COLUMN owner text NOT NULL DEFAULT '';
DROP INDEX jobs_idempotency;
CREATE UNIQUE INDEX jobs_idempotency ON jobs_active (owner, fairness_key, idempotency_key)
  WHERE idempotency_key <> '';
DROP INDEX jobs_done_by_idempotency_key;
CREATE INDEX jobs_done_by_idempotency_key
  ON jobs_done (owner, fairness_key, idempotency_key, finished_at) WHERE idempotency_key <> '';
CREATE OR REPLACE VIEW jobs AS
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at, owner
  FROM jobs_active
  UNION ALL
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at, owner
  FROM jobs_done;
)sql";

// Version 8: the scheduler's fair-share accounts, saved by the leader every second so that a
// restart or a failover keeps each tenant's and key's share (sched::FairAccounts). Small: one row
// per tenant, fairness key and cost estimate seen within scheduler.key_ttl.
constexpr char kMigration8FairAccounts[] = R"sql(
CREATE TABLE fair_accounts (
  kind text NOT NULL,
  a text NOT NULL,
  b text NOT NULL,
  value double precision NOT NULL,
  updated_at timestamptz NOT NULL,
  PRIMARY KEY (kind, a, b)
);
)sql";

// Version 9: a job keeps its earlier attempts.
//
// - `attempts` is a JSON array with one object per attempt that ended without ending the job
//   (kRetry appends it): {"attempt", "worker", "dispatched_us", "started_us", "ended_us",
//   "error"}, times in microseconds since the epoch; started_us is the accept, or for a failure
//   that overtook it the end less the reported run time, null when neither is known. NULL until a
//   job is first retried, so adding it rewrites nothing and a job that succeeds at once never
//   writes it.
// - A daemon of an earlier version runs on this schema unchanged (it never names the column), so
//   a rolling upgrade and a rollback work; only an attempt it retries goes unrecorded, and a job
//   it ends loses its attempts.
constexpr char kMigration9Attempts[] = R"sql(
ALTER TABLE jobs_active ADD COLUMN attempts jsonb;
ALTER TABLE jobs_done ADD COLUMN attempts jsonb;
CREATE OR REPLACE VIEW jobs AS
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at, owner, attempts
  FROM jobs_active
  UNION ALL
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at, owner, attempts
  FROM jobs_done;
)sql";

// Version 10: the leader epoch is a key column.
//
// - A unique index on dispatchd_leader.epoch makes an UPDATE that changes the epoch (a new
//   leader's bump) lock the row FOR UPDATE, as PostgreSQL does for an UPDATE of a column of a
//   unique index, while an UPDATE of renewed_at or address alone locks FOR NO KEY UPDATE. The
//   leader's job writes lock the row FOR KEY SHARE while they check its epoch (pg_statements.h,
//   "Fencing"): the bump waits for them, and the renewal does not. The schema, not the binary,
//   decides which UPDATE waits, so a daemon of an earlier version (whose writes lock FOR SHARE)
//   bumping the epoch beside daemons of this one still waits for their writes in flight.
constexpr char kMigration10LeaderEpochKey[] = R"sql(
CREATE UNIQUE INDEX dispatchd_leader_epoch ON dispatchd_leader (epoch);
)sql";

// Version 11: the key columns sort by bytes, whatever the database's locale.
//
// - A text column sorts by its collation, by default the database's (LC_COLLATE). Under a
//   locale such as en_US.UTF-8 every comparison in a B-tree descent, an insert into an index
//   or a sort of these columns is a strcoll() call; under "C" it is a memcmp(). The hot path
//   walks the primary key and the queue index for every job it claims, finishes or inserts: on
//   an en_US.UTF-8 database PostgreSQL spent about 1.5 times the CPU per drained job that it
//   spent on a "C" one (docs/benchmarks-history.md). Ids, types, fairness keys, idempotency keys
//   and owners are identifiers, not prose: byte order is the order they need.
// - Equality does not change (it was already byte for byte), so no key that was unique stops
//   being so, and no lookup finds another row.
// - Changing a column's collation rewrites no table, but rebuilds every index on the column:
//   the migration holds both job tables locked while it rebuilds their indexes, for a time that
//   grows with the jobs kept (5 s for a million ended jobs on a two-core machine).
// - The view `jobs` names the columns, so it is dropped and made again around the change.
// - A daemon of an earlier version runs on this schema unchanged: its statements take their
//   collation from the columns.
constexpr char kMigration11ByteOrderKeys[] = R"sql(
DROP VIEW jobs;
ALTER TABLE jobs_active
  ALTER COLUMN id TYPE text COLLATE "C",
  ALTER COLUMN type TYPE text COLLATE "C",
  ALTER COLUMN fairness_key TYPE text COLLATE "C",
  ALTER COLUMN idempotency_key TYPE text COLLATE "C",
  ALTER COLUMN owner TYPE text COLLATE "C";
ALTER TABLE jobs_done
  ALTER COLUMN id TYPE text COLLATE "C",
  ALTER COLUMN type TYPE text COLLATE "C",
  ALTER COLUMN fairness_key TYPE text COLLATE "C",
  ALTER COLUMN idempotency_key TYPE text COLLATE "C",
  ALTER COLUMN owner TYPE text COLLATE "C";
ALTER TABLE fair_accounts
  ALTER COLUMN kind TYPE text COLLATE "C",
  ALTER COLUMN a TYPE text COLLATE "C",
  ALTER COLUMN b TYPE text COLLATE "C";
CREATE VIEW jobs AS
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at, owner, attempts
  FROM jobs_active
  UNION ALL
  SELECT seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels, state,
         attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, worker_id, result,
         error, created_at, dispatched_at, started_at, finished_at, updated_at, owner, attempts
  FROM jobs_done;
)sql";

constexpr Migration kMigrations[] = {
    {1, "jobs table", kMigration1Jobs},
    {2, "idempotency window", kMigration2IdempotencyWindow},
    {3, "leader", kMigration3Leader},
    {4, "queued jobs by queue", kMigration4QueuedByQueue},
    {5, "ended jobs apart, partitioned by finish time", kMigration5JobsDone},
    {6, "an index of placed jobs instead of two of every job", kMigration6PlacedByArrival},
    {7, "job owners, and idempotency keys scoped to them", kMigration7Owner},
    {8, "fair-share accounts", kMigration8FairAccounts},
    {9, "earlier attempts of a job", kMigration9Attempts},
    {10, "the leader epoch as a key column", kMigration10LeaderEpochKey},
    {11, "key columns in byte order", kMigration11ByteOrderKeys},
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
