#pragma once

// How a job row reads out of PostgreSQL: the columns every job-reading statement of
// pg_statements.h selects, as macros, and their order (enum Col), which JobFromRow (pg_rows.h)
// follows. Internal to server/store. pg_statements.h undefines the macros after its statements.

namespace dispatchd::store {

// Columns of a job, in the order JobFromRow reads them (see enum Col), with `payload`, `result` and
// `attempts` the expressions read as those columns. Labels read as text[][] ({{key,value},...});
// most jobs have none, and for those the CASE skips the subquery, which otherwise cost about 40 %
// of a page of queued rows (load_queued_page: 3.4 of 8 us a row).
#define DISPATCHD_PG_JOB_COLUMNS_OF(payload, result, attempts)                \
  "id, type, " payload                                                        \
  ", resource_id, fairness_key, "                                             \
  "idempotency_key, max_attempts, timeout_ms, "                               \
  "(extract(epoch FROM dispatch_deadline_at - created_at) * 1000000)::int8, " \
  "(extract(epoch FROM not_before) * 1000000)::int8, "                        \
  "CASE WHEN labels = '{}'::jsonb THEN '{}'::text[] ELSE "                    \
  "ARRAY(SELECT ARRAY[key, value] FROM jsonb_each_text(labels)) END, "        \
  "state, attempt, worker_id, " result                                        \
  ", error, "                                                                 \
  "(extract(epoch FROM created_at) * 1000000)::int8, "                        \
  "(extract(epoch FROM dispatched_at) * 1000000)::int8, "                     \
  "(extract(epoch FROM started_at) * 1000000)::int8, "                        \
  "(extract(epoch FROM finished_at) * 1000000)::int8, "                       \
  "(extract(epoch FROM updated_at) * 1000000)::int8, owner, seq, " attempts
// The earlier attempts (migration 9) as a flat text array, six elements an attempt: attempt,
// worker, dispatched_us, started_us, ended_us, error ('' for none); NULL for none.
#define DISPATCHD_PG_ATTEMPTS_ARRAY                                                           \
  "CASE WHEN attempts IS NULL THEN NULL ELSE ARRAY(SELECT ARRAY[a->>'attempt', "              \
  "coalesce(a->>'worker', ''), coalesce(a->>'dispatched_us', ''), "                           \
  "coalesce(a->>'started_us', ''), coalesce(a->>'ended_us', ''), coalesce(a->>'error', '')] " \
  "FROM jsonb_array_elements(attempts) WITH ORDINALITY AS e(a, n) ORDER BY n) END"
#define DISPATCHD_PG_JOB_COLUMNS \
  DISPATCHD_PG_JOB_COLUMNS_OF("payload", "result", DISPATCHD_PG_ATTEMPTS_ARRAY)
// A search lists jobs: neither payloads, results nor attempts leave the database.
#define DISPATCHD_PG_JOB_COLUMNS_LISTED \
  DISPATCHD_PG_JOB_COLUMNS_OF("''::bytea", "NULL::bytea", "NULL::text[]")
// The dispatcher's loads leave payloads and attempts in the database: a claim returns the
// payload, and the dispatcher has no use for the attempts.
#define DISPATCHD_PG_JOB_COLUMNS_NO_PAYLOAD \
  DISPATCHD_PG_JOB_COLUMNS_OF("''::bytea", "result", "NULL::text[]")

enum Col {
  kColId,
  kColType,
  kColPayload,
  kColResourceId,
  kColFairnessKey,
  kColIdempotencyKey,
  kColMaxAttempts,
  kColTimeoutMs,
  kColDispatchDeadlineUs,
  kColNotBeforeUs,
  kColLabels,  // text[][]: {{key,value},...}
  kColState,
  kColAttempt,
  kColWorkerId,
  kColResult,
  kColError,
  kColCreatedUs,
  kColDispatchedUs,
  kColStartedUs,
  kColFinishedUs,
  kColUpdatedUs,
  kColOwner,
  kColSeq,
  kColAttempts,  // text[], DISPATCHD_PG_ATTEMPTS_ARRAY
  kColCount,     // the first column after a job's
};

}  // namespace dispatchd::store
