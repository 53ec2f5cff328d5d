-- claim_complete.sql: PostgreSQL's own ceiling for dispatchd's drain (bench.py ceiling).
--
-- One run of this script moves 100 queued jobs through the two writes every job needs on
-- dispatchd's schema (server/store/migrations.cc), in two transactions, as the daemon commits
-- them: a worker runs the job between its claim and its finish, so the two cannot share one.
--   1. claim: the first 100 QUEUED rows of the queue in seq order, through the partial index
--      jobs_queued_by_queue (type, fairness_key, seq), locked FOR UPDATE SKIP LOCKED so that
--      concurrent clients take disjoint rows, and set DISPATCHED with the worker and the time,
--      as the claims of kWriteTurn (server/store/pg_statements.h) set them. The ids claimed are
--      carried to the finish in :ids (\gset of array_agg).
--   2. finish: those rows deleted from jobs_active and inserted into jobs_done as SUCCEEDED with
--      a one-byte result (what an echo worker returns for the drain's one-byte payload), in one
--      statement, as the finishes of kWriteTurn move them.
-- That is the least work per job: one index walk and one update to claim it, one delete and one
-- insert (heap and the indexes of both tables) to end it, and a commit per 100 jobs for each.
-- What the daemon adds is left out: its leader fence (dispatchd_leader FOR SHARE in every
-- write), the per-id probes and state/attempt tests of its writes, and its RUNNING marks (none
-- for jobs as fast as the drain's). The daemon writes the finishes of one batch and the claims
-- of the next in one statement and one commit (a turn), so it commits once per ~100 jobs where
-- this script commits twice.
--
-- Needs: rows queued beforehand as bench.py's drain queues them (type 'noop', fairness key
-- 'ipv4:127.0.0.1'; harness.queue_noop_jobs), at least 100 per run of the script. Run with
-- -M prepared (the daemon prepares its statements, and :ids must travel as a parameter) and the
-- daemon's planner settings, PGOPTIONS='-c enable_seqscan=off -c enable_bitmapscan=off
-- -c enable_hashjoin=off -c enable_mergejoin=off -c enable_material=off -c jit=off' (kPinPointPlans,
-- less its plan_cache_mode: see bench/ceiling.py), e.g.
--   pgbench -n -M prepared -c 4 -j 2 -t 250 -f bench/ceiling/claim_complete.sql DB
-- drains 100,000 queued jobs; jobs/s = transactions x 100 / seconds.
WITH c AS (
  SELECT ctid AS tid FROM jobs_active
  WHERE state = 'QUEUED' AND type = 'noop' AND fairness_key = 'ipv4:127.0.0.1'
  ORDER BY seq
  LIMIT 100
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
