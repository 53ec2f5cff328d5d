-- insert_claim_complete.sql: PostgreSQL's own ceiling for dispatchd's e2e (bench.py ceiling).
--
-- One run of this script takes 100 new jobs through the three writes every submitted job needs
-- on dispatchd's schema (server/store/migrations.cc), each in a transaction of its own, as the
-- daemon commits them: a job is acknowledged to its client once its insert commits, before any
-- worker may claim it, and a worker runs it between its claim and its finish.
--   1. insert: 100 QUEUED rows in one statement, as kInsertJobs (server/store/pg_statements.h)
--      writes them: the daemon's id format (j_ + 12 hex digits of milliseconds + 16 random
--      ones), type 'noop', a one-byte payload, the caller's address as the fairness key, no
--      labels, deadline or not_before, in order (seq follows it), ON CONFLICT on the
--      idempotency index DO NOTHING, RETURNING id and seq. The daemon sends the 100 specs as
--      parallel arrays; here the rows are made on the server (generate_series), which spares
--      PostgreSQL parsing the arrays and nothing else.
--   2. claim: those 100 rows, found by id (the insert's ids, carried in :ids by \gset of
--      array_agg), locked in seq order FOR UPDATE SKIP LOCKED and set DISPATCHED, as
--      claim_complete.sql sets them. The daemon too claims rows it names by id (those it holds
--      in memory). A walk of the queue's index in seq order, as claim_complete.sql does, would
--      come up short here: a client's snapshot does not see rows inserted after it was taken,
--      while another client's claim may already have taken rows it does see.
--   3. finish: those rows moved from jobs_active to jobs_done as SUCCEEDED with a one-byte
--      result, in one statement, as claim_complete.sql finishes them.
-- So per job: one insert (heap, primary key, jobs_queued_by_queue), one claim and one move, and
-- a commit per 100 jobs for each. What the daemon adds is left out: its leader fence, the
-- per-id probes and state/attempt tests, and the finishes and claims that share a turn's commit
-- (see claim_complete.sql). bench.py checks that jobs_done holds transactions x 100 rows at the
-- end and jobs_active none.
--
-- Needs: dispatchd's schema, with no queued rows of its own. Run with -M prepared and the
-- daemon's planner settings (PGOPTIONS, as claim_complete.sql says), e.g.
--   pgbench -n -M prepared -c 4 -j 2 -t 250 -f bench/ceiling/insert_claim_complete.sql DB
-- submits and completes 100,000 jobs; jobs/s = transactions x 100 / seconds.
WITH ins AS (
  INSERT INTO jobs_active (id, type, payload, resource_id, fairness_key, idempotency_key, labels,
                           state, attempt, max_attempts, timeout_ms, dispatch_deadline_at,
                           not_before, created_at, updated_at, owner)
  SELECT 'j_' || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::int8), 12, '0') ||
           lpad(to_hex((random() * 2147483647)::int8 * 4294967296 +
                       (random() * 4294967295)::int8), 16, '0'),
         'noop', decode('78', 'hex'), '', 'ipv4:127.0.0.1', '',
         jsonb_object('{}'::text[], '{}'::text[]), 'QUEUED', 0, 3, 60000, NULL, NULL, now(),
         now(), ''
  FROM generate_series(1, 100) AS r(ord)
  ORDER BY r.ord
  ON CONFLICT (owner, fairness_key, idempotency_key) WHERE idempotency_key <> '' DO NOTHING
  RETURNING id, seq
)
SELECT coalesce(array_agg(id ORDER BY seq), '{}') AS ids FROM ins
\gset
WITH c AS (
  SELECT ctid AS tid FROM jobs_active
  WHERE id = ANY(:ids::text[]) AND state = 'QUEUED'
  ORDER BY seq
  FOR UPDATE SKIP LOCKED
), claimed AS (
  UPDATE jobs_active j
  SET state = 'DISPATCHED', worker_id = 'w' || :client_id, dispatched_at = now(),
      updated_at = now()
  WHERE j.ctid = ANY(ARRAY(SELECT tid FROM c))
  RETURNING j.id, j.payload
)
SELECT coalesce(array_agg(id), '{}') AS ids FROM claimed
\gset
WITH moved AS (
  DELETE FROM jobs_active WHERE id = ANY(:ids::text[]) RETURNING *
)
INSERT INTO jobs_done (seq, id, type, payload, resource_id, fairness_key, idempotency_key, labels,
                       state, attempt, max_attempts, timeout_ms, dispatch_deadline_at, not_before,
                       worker_id, result, error, created_at, dispatched_at, started_at,
                       finished_at, updated_at, owner)
SELECT m.seq, m.id, m.type, m.payload, m.resource_id, m.fairness_key, m.idempotency_key,
       m.labels, 'SUCCEEDED', m.attempt + 1, m.max_attempts, m.timeout_ms,
       m.dispatch_deadline_at, m.not_before, m.worker_id, 'x'::bytea, '', m.created_at,
       m.dispatched_at, now(), now(), now(), m.owner
FROM moved m;
