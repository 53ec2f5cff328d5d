#pragma once

// The SQL of PgJobStore: every statement it prepares, the planner settings of the sessions it
// runs them in, and ExecScan. Internal to server/store (PgJobStore, pg_rows.cc, pg_session.cc).

#include <utility>

#include "pqxx/connection"
#include "pqxx/result"
#include "pqxx/transaction"

#include "lib/util/check.h"
#include "server/store/pg_job_columns.h"

namespace dispatchd::store {

// ---------------------------------------------------------------------------------------------
// SQL. Each statement is prepared once per connection under its name. Timestamps travel as
// microseconds since the Unix epoch (int8): written with `timestamptz 'epoch' + $n * 1us` and
// read with `(extract(epoch FROM col) * 1000000)::int8`, both exact (extract returns numeric).
// NULL timestamps mean "not yet" and read back as absl::InfinitePast().

// How the planner may reach a statement's rows. Each statement is planned once per session and
// its plan kept (a point statement's generic plan from its first run, kPinPointPlans; a scan's
// as PostgreSQL's plan cache chooses), until the table's statistics change. A plan made while
// jobs_active was small (a new daemon, a queue just drained) reads the whole table, by sequential
// scan or hash join, and autovacuum updates the statistics only a minute or more after the queue
// has grown by thousands: so a plan that cost nothing at its start costs the whole queue on every
// turn. Sessions are therefore pinned to point plans (kPinPointPlans), and the few statements that
// read a whole table say so.
enum class Access {
  // Rows named by key, or a bounded range of one index: planned with index and TID scans
  // through nested loops only, whatever the statistics say.
  kPoint,
  // Every row of a table or of a partial index: planned as PostgreSQL likes best (ExecScan).
  kScan,
};

struct Statement {
  const char* name;
  const char* sql;
  Access access = Access::kPoint;
};

#define DISPATCHD_PG_ACTIVE_STATES "('QUEUED', 'DISPATCHED', 'RUNNING')"

// Fencing. Each write the leader makes to a job names the leader epoch it holds in parameter $n
// and runs only while dispatchd_leader still has that epoch. The row is locked FOR KEY SHARE
// while it is checked, so a new leader's epoch bump (an UPDATE of a key column, migration 10,
// which locks the row FOR UPDATE) waits for the writes in flight, and a write that starts after
// the bump re-reads the row (READ COMMITTED rechecks a locked row's newest version) and changes
// nothing. A write that changes nothing reads the epoch again to tell "fenced" from "the row
// moved on" (FenceHolds). KEY SHARE, not SHARE: the leader's renewal (an UPDATE of renewed_at
// alone, which locks FOR NO KEY UPDATE) must never wait for writes. Under SHARE, writes that
// overlap one another kept the row locked without a gap, and each new share lock passed the
// waiting renewal: with eight writers of 3 ms each, a renewal waited up to 4.9 s.
#define DISPATCHD_PG_FENCE(n) \
  "fence AS (SELECT 1 FROM dispatchd_leader WHERE id = 1 AND epoch = $" #n "::int8 FOR KEY SHARE)"

// A test of a row's state (and what goes with it), as `CASE <prefix>state WHEN <cases> END`:
// true where a WHEN's condition holds, NULL (no match) for any other state. A plain
// `state = 'QUEUED'` would let the planner read rows through a whole partial index of that
// state (jobs_queued_by_queue, jobs_placed_by_arrival) instead of probing the primary key, and
// on statistics that call the index small it does, at a cost that grows with the queue. Used
// where a statement finds its rows by id.
#define DISPATCHD_PG_STATE_IS(prefix, cases) "CASE " prefix "state WHEN " cases " END"

// `j.id` is `key`, written so that the planner can use it only to probe jobs_pkey for each value
// of `key` (see the batch writes below).
#define DISPATCHD_PG_KEY_IS(key) "j.id = ANY(ARRAY[" key "])"

// Inserts jobs in one statement, in array order (so seq follows it): $1 ids, $2 types, $3
// payloads (hex), $4 resource ids, $5 fairness keys, $6 idempotency keys, $7 label keys and $8
// label values (each element a text-array literal), $9 max attempts, $10 timeouts (ms), $11
// dispatch deadlines (us, NULL: none), $12 not_before (us since the epoch, NULL: none), $14
// owners, $15 the worker each job is placed on ('' for none): parallel arrays, one element per
// job. $13: whether to NOTIFY the leader of each new row, in the same statement so that the
// notification goes out exactly when the rows commit.
//
// A job placed on a worker is written DISPATCHED to it (attempt 0, dispatched_at now(), as a
// claim leaves a row) while dispatchd_leader still holds epoch $16, the leader's fence (see
// "Fencing" above); else it is written QUEUED and announced, like a standby's row, to whichever
// daemon leads. $16 is NULL when no job is placed: the statement then takes no lock.
//
// Returns the ids inserted, their seq and whether each was written DISPATCHED; a row left out
// met an active job (or one earlier in the same array) holding its idempotency key. created_at,
// dispatched_at and dispatch_deadline_at all use now(), so their differences are exactly the
// spec's.
inline constexpr Statement kInsertJobs{"insert_jobs", R"sql(
WITH fence AS (
  SELECT 1 FROM dispatchd_leader WHERE id = 1 AND epoch = $16::int8 FOR KEY SHARE
), ins AS (
  INSERT INTO jobs_active (id, type, payload, resource_id, fairness_key, idempotency_key, labels,
                           state, attempt, max_attempts, timeout_ms, dispatch_deadline_at,
                           not_before, worker_id, created_at, dispatched_at, updated_at, owner)
  SELECT r.id, r.type, decode(r.payload_hex, 'hex'), r.resource_id, r.fairness_key,
         r.idempotency_key, jsonb_object(r.label_keys::text[], r.label_values::text[]), p.state,
         0, r.max_attempts, r.timeout_ms, now() + r.deadline_us * interval '1 microsecond',
         timestamptz 'epoch' + r.not_before_us * interval '1 microsecond',
         CASE p.state WHEN 'DISPATCHED' THEN r.worker_id ELSE '' END, now(),
         CASE p.state WHEN 'DISPATCHED' THEN now() END, now(), r.owner
  FROM unnest($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::text[],
              $8::text[], $9::int4[], $10::int8[], $11::int8[], $12::int8[], $14::text[],
              $15::text[])
    WITH ORDINALITY
    AS r(id, type, payload_hex, resource_id, fairness_key, idempotency_key, label_keys,
         label_values, max_attempts, timeout_ms, deadline_us, not_before_us, owner, worker_id, ord)
  CROSS JOIN LATERAL (
    SELECT CASE WHEN r.worker_id <> '' AND EXISTS (SELECT 1 FROM fence) THEN 'DISPATCHED'
                ELSE 'QUEUED' END AS state
  ) p
  ORDER BY r.ord
  ON CONFLICT (owner, fairness_key, idempotency_key) WHERE idempotency_key <> '' DO NOTHING
  RETURNING id, seq, state
)
SELECT ins.id, ins.seq, ins.state = 'DISPATCHED',
       CASE WHEN $13::bool OR ($16::int8 IS NOT NULL AND NOT EXISTS (SELECT 1 FROM fence))
            THEN pg_notify('dispatchd_jobs', ins.id) END
FROM ins)sql"};

// Idempotency keys, scoped to the principal that submits (the owner) and the fairness key. A
// job holds its (owner, fairness_key, idempotency_key) while it is active (the unique index
// jobs_idempotency on jobs_active) and for the idempotency window after it ended (a row of
// jobs_done that finished less than $4 microseconds ago).
//
// $1 owners, $2 fairness keys, $3 idempotency keys (parallel arrays), $4 the window in us: the
// job holding each key, if any: the active one, else the one that finished last.
inline constexpr Statement kSelectHolders{"select_holders", R"sql(
SELECT k.owner, k.fairness_key, k.idempotency_key, h.id
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(owner, fairness_key, idempotency_key)
CROSS JOIN LATERAL (
  (SELECT id, 0 AS pref FROM jobs_active
   WHERE owner = k.owner AND fairness_key = k.fairness_key
     AND idempotency_key = k.idempotency_key AND idempotency_key <> '')
  UNION ALL
  (SELECT id, 1 FROM jobs_done
   WHERE owner = k.owner AND fairness_key = k.fairness_key
     AND idempotency_key = k.idempotency_key AND idempotency_key <> ''
     AND finished_at > now() - $4::int8 * interval '1 microsecond'
   ORDER BY finished_at DESC LIMIT 1)
  ORDER BY pref LIMIT 1
) h)sql"};

// Same arguments: the keys held by a job that ended within the window ($4), and its id.
inline constexpr Statement kSelectDoneHolders{"select_done_holders", R"sql(
SELECT DISTINCT ON (k.owner, k.fairness_key, k.idempotency_key)
       k.owner, k.fairness_key, k.idempotency_key, d.id
FROM unnest($1::text[], $2::text[], $3::text[]) AS k(owner, fairness_key, idempotency_key)
JOIN jobs_done d ON d.owner = k.owner AND d.fairness_key = k.fairness_key
                AND d.idempotency_key = k.idempotency_key
WHERE d.idempotency_key <> '' AND d.finished_at > now() - $4::int8 * interval '1 microsecond'
ORDER BY k.owner, k.fairness_key, k.idempotency_key, d.finished_at DESC)sql"};

// $1 ids: rows just inserted that turned out to repeat a key (same transaction).
inline constexpr Statement kUndoInserts{"undo_inserts",
                                        "DELETE FROM jobs_active WHERE id = ANY($1::text[])"};

// Reads see both tables; a job is in exactly one of them (a move is one statement).
inline constexpr Statement kGetJob{"get_job", "SELECT " DISPATCHD_PG_JOB_COLUMNS
                                              " FROM jobs_active WHERE id = $1 "
                                              "UNION ALL SELECT " DISPATCHD_PG_JOB_COLUMNS
                                              " FROM jobs_done WHERE id = $1"};

// $1 ids.
inline constexpr Statement kGetJobs{"get_jobs", "SELECT " DISPATCHD_PG_JOB_COLUMNS
                                                " FROM jobs_active WHERE id = ANY($1::text[]) "
                                                "UNION ALL SELECT " DISPATCHD_PG_JOB_COLUMNS
                                                " FROM jobs_done WHERE id = ANY($1::text[])"};

// Jobs of both tables that match: $1 state, $2 type, $3 fairness key (each '' for any), $4 owner
// (NULL for any), $5 and $6 the created_at bounds [from, to) in us (NULL: none), $7 the limit.
// Newest first. No index serves it (a search is for people and tools): a scan of each table.
#define DISPATCHD_PG_SEARCH_WHERE                                                                \
  " WHERE ($1 = '' OR state = $1) AND ($2 = '' OR type = $2) AND ($3 = '' OR fairness_key = $3)" \
  " AND ($4::text IS NULL OR owner = $4)"                                                        \
  " AND ($5::int8 IS NULL OR created_at >= timestamptz 'epoch' + $5::int8 * interval '1 us')"    \
  " AND ($6::int8 IS NULL OR created_at < timestamptz 'epoch' + $6::int8 * interval '1 us')"
inline constexpr Statement kSearchJobs{
    "search_jobs",
    "SELECT * FROM (SELECT " DISPATCHD_PG_JOB_COLUMNS_LISTED
    ", created_at AS sort_at FROM jobs_active" DISPATCHD_PG_SEARCH_WHERE
    " UNION ALL SELECT " DISPATCHD_PG_JOB_COLUMNS_LISTED
    ", created_at AS sort_at FROM jobs_done" DISPATCHD_PG_SEARCH_WHERE
    ") found ORDER BY sort_at DESC, seq DESC LIMIT $7",
    Access::kScan};
#undef DISPATCHD_PG_SEARCH_WHERE

inline constexpr Statement kLoadActive{
    "load_active",
    "SELECT " DISPATCHD_PG_JOB_COLUMNS
    " FROM jobs_active WHERE state IN " DISPATCHD_PG_ACTIVE_STATES " ORDER BY seq",
    Access::kScan};

inline constexpr Statement kLoadPlaced{"load_placed",
                                       "SELECT " DISPATCHD_PG_JOB_COLUMNS_NO_PAYLOAD
                                       " FROM jobs_active WHERE state IN ('DISPATCHED', "
                                       "'RUNNING') ORDER BY seq",
                                       Access::kScan};

// $1 rows per queue. Each queue's QUEUED count, then its first rows: job columns, then the count
// (kColCount). A queue is found with an index-only scan of jobs_queued_by_queue (migration 4);
// its rows with one index range scan each.
inline constexpr Statement kLoadQueuedHeads{"load_queued_heads", R"sql(
WITH q AS (
  SELECT type, fairness_key, count(*) AS n FROM jobs_active WHERE state = 'QUEUED'
  GROUP BY type, fairness_key
)
SELECT j.*, q.n FROM q CROSS JOIN LATERAL (
  SELECT )sql" DISPATCHD_PG_JOB_COLUMNS_NO_PAYLOAD R"sql( FROM jobs_active
  WHERE state = 'QUEUED' AND type = q.type AND fairness_key = q.fairness_key
  ORDER BY seq LIMIT $1::int8
) j
ORDER BY j.seq)sql",
                                            Access::kScan};

// $1 type, $2 fairness key, $3 after seq, $4 limit.
inline constexpr Statement kLoadQueuedPage{
    "load_queued_page", "SELECT " DISPATCHD_PG_JOB_COLUMNS_NO_PAYLOAD R"sql( FROM jobs_active
WHERE state = 'QUEUED' AND type = $1 AND fairness_key = $2 AND seq > $3::int8
ORDER BY seq LIMIT $4::int8)sql"};

// $1 type, $2 fairness key, $3 seq.
inline constexpr Statement kCountQueuedBefore{"count_queued_before", R"sql(
SELECT count(*) FROM jobs_active
WHERE state = 'QUEUED' AND type = $1 AND fairness_key = $2 AND seq < $3::int8)sql"};

// $1 types, $2 fairness keys, $3 bounds (parallel arrays); a queue not named has no bound.
inline constexpr Statement kCountQueued{"count_queued", R"sql(
SELECT j.type, j.fairness_key, count(*),
       count(*) FILTER (WHERE j.seq <= coalesce(b.bound, 9223372036854775807))
FROM jobs_active j LEFT JOIN unnest($1::text[], $2::text[], $3::int8[]) AS b(type, fairness_key, bound)
  ON j.type = b.type AND j.fairness_key = b.fairness_key
WHERE j.state = 'QUEUED'
GROUP BY j.type, j.fairness_key)sql",
                                        Access::kScan};

// $1 id, $2 attempt, $3 epoch.
inline constexpr Statement kReturnToQueue{"return_to_queue", "WITH " DISPATCHD_PG_FENCE(3) R"sql(
UPDATE jobs_active SET state = 'QUEUED', worker_id = '', updated_at = now()
WHERE id = $1 AND )sql" DISPATCHD_PG_STATE_IS("", "'DISPATCHED' THEN attempt = $2::int4") R"sql(
  AND EXISTS (SELECT 1 FROM fence))sql"};

// $1 id, $2 attempt, $3 not_before in us (NULL: at once), $4 error, $5 epoch, $6 how long the
// attempt ran in us (-1: unknown). Like kFinish, a failure that overtook its accept (the row
// still DISPATCHED at the attempt before) counts. The attempt that ended is appended to
// `attempts` (migration 9), from the row as it was: its worker and times; for a row never marked
// RUNNING, started_us is now less the run time, or null when that is unknown.
inline constexpr Statement kRetry{"retry", "WITH " DISPATCHD_PG_FENCE(5) R"sql(
UPDATE jobs_active SET state = 'QUEUED', attempt = $2::int4, worker_id = '',
                not_before = timestamptz 'epoch' + $3::int8 * interval '1 microsecond',
                error = $4, updated_at = now(),
                attempts = coalesce(attempts, '[]'::jsonb) || jsonb_build_array(jsonb_build_object(
                  'attempt', $2::int4, 'worker', worker_id,
                  'dispatched_us', (extract(epoch FROM dispatched_at) * 1000000)::int8,
                  'started_us', CASE WHEN state = 'RUNNING'
                                     THEN (extract(epoch FROM started_at) * 1000000)::int8
                                     WHEN $6::int8 >= 0
                                     THEN (extract(epoch FROM now()) * 1000000)::int8 - $6::int8
                                     END,
                  'ended_us', (extract(epoch FROM now()) * 1000000)::int8,
                  'error', $4::text))
WHERE id = $1 AND )sql" DISPATCHD_PG_STATE_IS("",
                                              "'RUNNING' THEN attempt = $2::int4 WHEN "
                                              "'DISPATCHED' THEN attempt = $2::int4 - 1") R"sql(
  AND EXISTS (SELECT 1 FROM fence))sql"};

// Terminal transitions move the row from jobs_active to jobs_done (migration 5) in one
// statement: `moved` is the DELETE's RETURNING, and DISPATCHD_PG_INSERT_DONE(state, attempt,
// result, error) writes it to jobs_done with those four values, finished and updated now.
#define DISPATCHD_PG_INSERT_DONE(state, attempt, result, error) \
  DISPATCHD_PG_INSERT_DONE_STARTED(state, attempt, result, error, "m.started_at")
// The same, with `started` for started_at.
#define DISPATCHD_PG_INSERT_DONE_STARTED(state, attempt, result, error, started)                \
  "INSERT INTO jobs_done (seq, id, type, payload, resource_id, fairness_key, idempotency_key, " \
  "labels, state, attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before, "        \
  "worker_id, result, error, created_at, dispatched_at, started_at, finished_at, updated_at, "  \
  "owner, attempts) "                                                                           \
  "SELECT m.seq, m.id, m.type, m.payload, m.resource_id, m.fairness_key, m.idempotency_key, "   \
  "m.labels, " state ", " attempt                                                               \
  ", m.max_attempts, m.timeout_ms, m.dispatch_deadline_at, "                                    \
  "m.not_before, m.worker_id, " result ", " error ", m.created_at, m.dispatched_at, " started   \
  ", now(), now(), m.owner, m.attempts FROM moved m"

// $1 id, $2 attempt, $3 terminal state, $4 result (binary), $5 error, $6 epoch.
inline constexpr Statement kFinish{"finish", "WITH " DISPATCHD_PG_FENCE(6) R"sql(, moved AS (
  DELETE FROM jobs_active
  WHERE id = $1 AND )sql" DISPATCHD_PG_STATE_IS("",
                                                "'RUNNING' THEN attempt = $2::int4 WHEN "
                                                "'DISPATCHED' THEN attempt = $2::int4 - 1")
                                                 R"sql(
    AND EXISTS (SELECT 1 FROM fence)
  RETURNING *
)
)sql" DISPATCHD_PG_INSERT_DONE("$3", "$2::int4", "$4::bytea", "$5")};

// $1 id, $2 attempt, $3 worker id. DISPATCHED at attempt-1 (accept) or RUNNING at attempt
// (re-attach); started_at is set on accept only. $4 epoch.
inline constexpr Statement kMarkRunning{"mark_running", "WITH " DISPATCHD_PG_FENCE(4) R"sql(
UPDATE jobs_active SET state = 'RUNNING', attempt = $2::int4, worker_id = $3,
                started_at = CASE WHEN state = 'DISPATCHED' THEN now() ELSE started_at END,
                updated_at = now()
WHERE id = $1 AND )sql" DISPATCHD_PG_STATE_IS("", "'DISPATCHED' THEN attempt = $2::int4 - 1 "
                                                  "WHEN 'RUNNING' THEN attempt = $2::int4") R"sql(
  AND EXISTS (SELECT 1 FROM fence))sql"};

// Batch writes join their requests (parallel arrays, unnested) to jobs_active by id, each request
// one primary-key probe, whatever the planner believes about the table's size: sessions are
// pinned to point plans (kPinPointPlans), and the key is compared as `j.id = ANY(ARRAY[r.id])`
// (DISPATCHD_PG_KEY_IS). A plain `j.id = r.id` would also offer the planner a walk of the whole
// primary key, once per request, and on statistics that call the table empty it takes it; an ANY
// over the request's own id can only be a probe. The write tests the row's state and attempt
// (DISPATCHD_PG_STATE_IS), and PostgreSQL tests both again against a row that a concurrent
// transaction changed, following it to its newest version, so a row that moved on in between is
// left alone.
//
// The three batch writes of a dispatcher turn, as CTEs over parallel arrays (`$a`... name the
// parameters), each after `fence` (DISPATCHD_PG_FENCE): FinishMany, MarkRunningMany and Claim
// run one alone, WriteTurn all three in one statement.
//
// Finishes: ids $a, attempts $b, terminal states $c, results $d (hex, so that a text array
// carries any bytes), errors $e, run times in us $f (-1: unknown), and $g whether the caller
// reads the row's times back (FinishRequest::row_times). `moved` holds the rows finished, with
// their new started_at. An outcome that overtook its RUNNING mark (the row still DISPATCHED at
// the attempt before) counts, and records started_at as its finish less its run time.
#define DISPATCHD_PG_FINISHES(a, b, c, d, e, f, g) \
  "f_req AS (SELECT * FROM unnest($" #a "::text[], $" #b "::int4[], $" #c "::text[], $" #d   \
  "::text[], $" #e "::text[], $" #f "::int8[], $" #g "::bool[]) AS r(id, attempt, state, "    \
  "result_hex, error, ran_us, row_times)), "                                                  \
  "moved AS (DELETE FROM jobs_active j USING f_req r WHERE " DISPATCHD_PG_KEY_IS("r.id")      \
  " AND "                                                                                     \
  DISPATCHD_PG_STATE_IS("j.", "'RUNNING' THEN j.attempt = r.attempt WHEN 'DISPATCHED' THEN "  \
                              "j.attempt = r.attempt - 1")                                    \
  " AND EXISTS (SELECT 1 FROM fence) "                                                        \
  "RETURNING j.*, r.state AS new_state, r.attempt AS new_attempt, r.result_hex, "             \
  "r.error AS new_error, CASE WHEN j.state = 'DISPATCHED' AND r.ran_us >= 0 "                 \
  "THEN now() - r.ran_us * interval '1 microsecond' ELSE j.started_at END AS new_started_at, " \
  "r.row_times), "                                                                            \
  "done AS (" DISPATCHD_PG_INSERT_DONE_STARTED("m.new_state", "m.new_attempt",                \
                                               "decode(m.result_hex, 'hex')", "m.new_error",  \
                                               "m.new_started_at") ")"
// RUNNING marks (kMarkRunning for each): ids $a, attempts $b, worker ids $c. `marked` holds the
// ids marked.
#define DISPATCHD_PG_MARKS(a, b, c) \
  "m_req AS (SELECT * FROM unnest($" #a "::text[], $" #b "::int4[], $" #c "::text[]) "        \
  "AS r(id, attempt, worker_id)), "                                                           \
  "marked AS (UPDATE jobs_active j SET state = 'RUNNING', attempt = r.attempt, "              \
  "worker_id = r.worker_id, started_at = CASE WHEN j.state = 'DISPATCHED' THEN now() "        \
  "ELSE j.started_at END, updated_at = now() FROM m_req r WHERE " DISPATCHD_PG_KEY_IS("r.id") \
  " AND "                                                                                     \
  DISPATCHD_PG_STATE_IS("j.", "'DISPATCHED' THEN j.attempt = r.attempt - 1 WHEN 'RUNNING' "   \
                              "THEN j.attempt = r.attempt")                                   \
  " AND EXISTS (SELECT 1 FROM fence) RETURNING j.id)"
// Claims: ids $a, attempts $b (attempts started so far, as the caller last saw them), worker ids
// $c. Each row is found and locked in a LATERAL subquery, which the planner must run once per
// request (FOR UPDATE keeps it from being merged into a join), skipping rows that other sessions
// hold; a row whose state or attempt moved on does not match. A row this statement has locked
// cannot move, so the update finds it by its tuple id. started_at is cleared: it was an earlier
// attempt's (kept in `attempts`), and the new one has not started. `claimed` holds the ids
// claimed and their payloads.
#define DISPATCHD_PG_CLAIMS(a, b, c) \
  "c_req AS (SELECT * FROM unnest($" #a "::text[], $" #b "::int4[], $" #c "::text[]) "        \
  "AS r(id, attempt, worker_id)), "                                                           \
  "c_hit AS (SELECT j.tid, r.worker_id FROM c_req r CROSS JOIN LATERAL ("                     \
  "SELECT ctid AS tid FROM jobs_active WHERE id = r.id AND "                                  \
  DISPATCHD_PG_STATE_IS("", "'QUEUED' THEN attempt = r.attempt")                             \
  " FOR UPDATE SKIP LOCKED) j WHERE EXISTS (SELECT 1 FROM fence)), "                          \
  "claimed AS (UPDATE jobs_active j SET state = 'DISPATCHED', worker_id = h.worker_id, "      \
  "dispatched_at = now(), started_at = NULL, updated_at = now() FROM c_hit h "                \
  "WHERE j.ctid = h.tid "                                                                     \
  "RETURNING j.id, j.payload)"

// $1..$7 the finishes, $8 epoch. Returns the ids finished.
inline constexpr Statement kFinishMany{"finish_many",
                                       "WITH " DISPATCHD_PG_FENCE(8) ", " DISPATCHD_PG_FINISHES(
                                           1, 2, 3, 4, 5, 6, 7) " SELECT id FROM moved"};

// $1..$3 the marks, $4 epoch. Returns the ids marked.
inline constexpr Statement kMarkRunningMany{
    "mark_running_many",
    "WITH " DISPATCHD_PG_FENCE(4) ", " DISPATCHD_PG_MARKS(1, 2, 3) " SELECT id FROM marked"};

// $1..$3 the claims, $4 epoch. Returns the ids claimed and their payloads.
inline constexpr Statement kClaim{"claim", "WITH " DISPATCHD_PG_FENCE(4) ", " DISPATCHD_PG_CLAIMS(
                                               1, 2, 3) " SELECT id, payload FROM claimed"};

// A whole turn in one statement, so one round trip and one commit (the rows of the three kinds
// are disjoint, which data-modifying CTEs of one statement need): $1..$7 the finishes, $8..$10
// the marks, $11..$13 the claims, $14 epoch. Returns (kind, id, payload, created, dispatched,
// started, finished, not_before): 'f' finished (with its row's times as the finish committed
// them, us since the epoch, where the finish asked for them: the dispatcher then tells RunSync
// the row without a read; a retry moved not_before), 'm' marked, 'c' claimed (with its payload).
// Each time costs PostgreSQL a numeric conversion, about half a microsecond, so a job nobody
// waits on gets none. finished_at is the transaction's now(), as `done` writes it.
inline constexpr Statement kWriteTurn{
    "write_turn",
    "WITH " DISPATCHD_PG_FENCE(14) ", " DISPATCHD_PG_FINISHES(1, 2, 3, 4, 5, 6, 7) ", "
        DISPATCHD_PG_MARKS(8, 9, 10) ", " DISPATCHD_PG_CLAIMS(11, 12, 13)
        " SELECT 'f', id, NULL::bytea, "
        "CASE WHEN row_times THEN (extract(epoch FROM created_at) * 1000000)::int8 END, "
        "CASE WHEN row_times THEN (extract(epoch FROM dispatched_at) * 1000000)::int8 END, "
        "CASE WHEN row_times THEN (extract(epoch FROM new_started_at) * 1000000)::int8 END, "
        "CASE WHEN row_times THEN (extract(epoch FROM now()) * 1000000)::int8 END, "
        "CASE WHEN row_times THEN (extract(epoch FROM not_before) * 1000000)::int8 END FROM moved "
        "UNION ALL SELECT 'm', id, NULL, NULL, NULL, NULL, NULL, NULL FROM marked "
        "UNION ALL SELECT 'c', id, payload, NULL, NULL, NULL, NULL, NULL FROM claimed"};

#undef DISPATCHD_PG_FINISHES
#undef DISPATCHD_PG_MARKS
#undef DISPATCHD_PG_CLAIMS

// $1 id, $2 reason. The job as cancelled, and the state it was cancelled from (kColCount).
inline constexpr Statement kCancel{"cancel", R"sql(
WITH moved AS (DELETE FROM jobs_active WHERE id = $1 RETURNING *), done AS (
)sql" DISPATCHD_PG_INSERT_DONE("'CANCELLED'", "m.attempt", "m.result", "$2") R"sql( RETURNING *
)
SELECT )sql" DISPATCHD_PG_JOB_COLUMNS R"sql(, (SELECT state FROM moved) FROM done)sql"};

// $1 id: the state of an ended job (to tell "already ended" from "not found").
inline constexpr Statement kDoneState{"done_state", "SELECT state FROM jobs_done WHERE id = $1"};

// $1 now in us, $2 error, $3 epoch, $4 the most rows to expire. Rows locked by a concurrent claim
// are left for the next sweep. The overdue rows are read in deadline order through
// jobs_queued_by_deadline, up to the limit, so that the plan is that index's range whatever the
// statistics say (a whole scan of jobs_queued_by_queue would look as cheap on a small table);
// PgJobStore::ExpireOverdue repeats it in one transaction until a call comes back short.
inline constexpr Statement kExpireOverdue{"expire_overdue",
                                          "WITH " DISPATCHD_PG_FENCE(3) R"sql(, c AS (
  SELECT id FROM jobs_active
  WHERE state = 'QUEUED' AND EXISTS (SELECT 1 FROM fence)
    AND dispatch_deadline_at < timestamptz 'epoch' + $1::int8 * interval '1 microsecond'
  ORDER BY dispatch_deadline_at LIMIT $4::int8
  FOR UPDATE SKIP LOCKED
), moved AS (
  DELETE FROM jobs_active j WHERE j.id = ANY(ARRAY(SELECT id FROM c)) RETURNING j.*
)
)sql" DISPATCHD_PG_INSERT_DONE("'EXPIRED'", "m.attempt", "m.result", "$2") " RETURNING id"};

inline constexpr Statement kCountByTypeAndState{
    "count_by_type_and_state",
    "SELECT type, state, sum(n)::int8 FROM (SELECT type, state, count(*) AS n FROM jobs_active "
    "GROUP BY type, state UNION ALL SELECT type, state, count(*) FROM jobs_done GROUP BY type, "
    "state) c GROUP BY type, state ORDER BY type, state",
    Access::kScan};

inline constexpr Statement kCountActive{
    "count_active", "SELECT count(*) FROM jobs_active WHERE state IN " DISPATCHD_PG_ACTIVE_STATES,
    Access::kScan};

inline constexpr Statement kCountActiveByTypeAndState{
    "count_active_by_type_and_state",
    "SELECT type, state, count(*), owner FROM jobs_active WHERE state "
    "IN " DISPATCHD_PG_ACTIVE_STATES " GROUP BY type, state, owner ORDER BY type, state, owner",
    Access::kScan};

// $1 ids.
inline constexpr Statement kGetRefs{
    "get_refs",
    "SELECT id, state, attempt, worker_id, (extract(epoch FROM updated_at) * 1000000)::int8 "
    "FROM jobs_active WHERE id = ANY($1::text[]) UNION ALL "
    "SELECT id, state, attempt, worker_id, (extract(epoch FROM updated_at) * 1000000)::int8 "
    "FROM jobs_done WHERE id = ANY($1::text[])"};

inline constexpr Statement kLoadPlacedRefs{
    "load_placed_refs",
    "SELECT id, state, attempt, worker_id, (extract(epoch FROM updated_at) * 1000000)::int8 "
    "FROM jobs_active WHERE state IN ('DISPATCHED', 'RUNNING')",
    Access::kScan};

// $1 job id: tells the leader (LISTEN dispatchd_jobs, pg_leader_lease.h) to look at the row.
inline constexpr Statement kNotifyChanged{"notify_changed",
                                          "SELECT pg_notify('dispatchd_jobs', $1)"};

inline constexpr Statement kLeaderEpoch{"leader_epoch",
                                        "SELECT epoch FROM dispatchd_leader WHERE id = 1"};

// $1..$4 kinds, a, b, values (text and float8 arrays), $5 epoch: writes the fair-share accounts
// over the saved ones. Inserts nothing once another daemon leads. Unlike the job writes it takes
// no lock on the leader row: the lease's renewal must never wait on it, and a save that races a
// takeover writes values the new leader has already loaded or will overwrite within a second.
inline constexpr Statement kSaveAccounts{"save_accounts", R"sql(
INSERT INTO fair_accounts (kind, a, b, value, updated_at)
SELECT u.kind, u.a, u.b, u.value, now()
FROM unnest($1::text[], $2::text[], $3::text[], $4::float8[]) AS u(kind, a, b, value)
WHERE EXISTS (SELECT 1 FROM dispatchd_leader WHERE id = 1 AND epoch = $5::int8)
ON CONFLICT (kind, a, b) DO UPDATE SET value = excluded.value, updated_at = excluded.updated_at
)sql"};

// $1 ttl in seconds: forgets accounts not written for that long.
inline constexpr Statement kForgetAccounts{
    "forget_accounts",
    "DELETE FROM fair_accounts WHERE updated_at < now() - make_interval(secs => $1::float8)"};

inline constexpr Statement kLoadAccounts{"load_accounts",
                                         "SELECT kind, a, b, value FROM fair_accounts"};

#undef DISPATCHD_PG_INSERT_DONE
#undef DISPATCHD_PG_INSERT_DONE_STARTED
#undef DISPATCHD_PG_JOB_COLUMNS
#undef DISPATCHD_PG_JOB_COLUMNS_NO_PAYLOAD
#undef DISPATCHD_PG_ATTEMPTS_ARRAY
#undef DISPATCHD_PG_JOB_COLUMNS_LISTED
#undef DISPATCHD_PG_JOB_COLUMNS_OF
#undef DISPATCHD_PG_ACTIVE_STATES
#undef DISPATCHD_PG_FENCE
#undef DISPATCHD_PG_STATE_IS
#undef DISPATCHD_PG_KEY_IS

inline constexpr Statement kAllStatements[] = {
    kInsertJobs,
    kSelectHolders,
    kSelectDoneHolders,
    kUndoInserts,
    kGetJob,
    kGetJobs,
    kSearchJobs,
    kLoadActive,
    kLoadPlaced,
    kLoadQueuedHeads,
    kLoadQueuedPage,
    kCountQueued,
    kCountQueuedBefore,
    kClaim,
    kMarkRunning,
    kMarkRunningMany,
    kReturnToQueue,
    kRetry,
    kFinish,
    kFinishMany,
    kWriteTurn,
    kCancel,
    kDoneState,
    kExpireOverdue,
    kCountByTypeAndState,
    kCountActive,
    kCountActiveByTypeAndState,
    kGetRefs,
    kLoadPlacedRefs,
    kNotifyChanged,
    kLeaderEpoch,
    kSaveAccounts,
    kForgetAccounts,
    kLoadAccounts,
};

// Pins a session's planner to point plans (Access::kPoint): index and TID scans joined by nested
// loops. Each setting adds a cost penalty rather than a ban, so a statement that has no other
// way still runs. That penalty (1e10) would also lift such a plan far above jit_above_cost, and
// PostgreSQL would compile it, inlined and optimized, on every run: some 200 ms of CPU for a
// statement of microseconds (forget_accounts, once a second). The daemon's statements are all
// short, so its sessions compile none (jit off), scans (kUnpinForScan) included.
//
// Pinned, a statement's plan no longer depends on its parameters' values, so each is planned once
// per session (force_generic_plan). Left to choose, PostgreSQL plans a statement again on every
// run while a plan for the values at hand looks cheaper than the generic one, which it does for
// the arrays of a single job: at light load each turn that finished one job spent about 1 ms
// planning write_turn, for 0.2 ms of execution (docs/benchmarks-history.md).
inline constexpr char kPinPointPlans[] =
    "SET enable_seqscan = off; SET enable_bitmapscan = off; SET enable_hashjoin = off; "
    "SET enable_mergejoin = off; SET enable_material = off; SET jit = off; "
    "SET plan_cache_mode = force_generic_plan";

// Gives the planner back what kPinPointPlans took, for the transaction it runs in (JIT stays off).
inline constexpr char kUnpinForScan[] =
    "SET LOCAL enable_seqscan TO DEFAULT; SET LOCAL enable_bitmapscan TO DEFAULT; "
    "SET LOCAL enable_hashjoin TO DEFAULT; SET LOCAL enable_mergejoin TO DEFAULT; "
    "SET LOCAL enable_material TO DEFAULT; SET LOCAL plan_cache_mode TO DEFAULT";

// Runs an Access::kScan statement in a read-only transaction of its own, planned with every plan
// PostgreSQL has. Each such statement is always run this way, so the plan a session keeps for it
// was made under the same settings.
template <typename... Args>
pqxx::result ExecScan(pqxx::connection& conn, const Statement& statement, Args&&... args) {
  DISPATCHD_CHECK(statement.access == Access::kScan, statement.name);
  pqxx::read_transaction txn(conn);
  txn.exec(kUnpinForScan);
  pqxx::result rows = txn.exec_prepared(statement.name, std::forward<Args>(args)...);
  txn.commit();
  return rows;
}

}  // namespace dispatchd::store
