-- insert_one.sql: PostgreSQL's own floor for dispatchd's light-load latency (bench.py latency).
--
-- One run of this script inserts one job and commits, in a transaction of its own, as the daemon
-- commits a lone Submit at light load: the one durable commit that must lie between a Submit and
-- its worker ("One commit to a worker" in docs/architecture.md). The row is written as
-- kInsertJobs (server/store/pg_statements.h) writes it: the daemon's id format (j_ + 12 hex
-- digits of milliseconds + 16 random ones), type 'noop', a one-byte payload, the caller's
-- address as the fairness key, no labels, deadline or not_before, ON CONFLICT on the
-- idempotency index DO NOTHING, RETURNING id and seq. It is written QUEUED: the daemon's row goes
-- DISPATCHED to its worker in the same statement, which writes the same heap tuple and index
-- entries. What the daemon adds is left out: its leader fence and the notification.
--
-- bench.py latency runs it from one pgbench client at the probes' rate (-R), so that PostgreSQL
-- waits between transactions as it does between probes, on a fresh database with dispatchd's
-- schema, and reports each transaction's time from its start (pgbench's per-transaction log:
-- the time less the schedule lag), e.g.
--   pgbench -n -M prepared -c 1 -j 1 -R 100 -t 1020 -l -f bench/ceiling/insert_one.sql DB
INSERT INTO jobs_active (id, type, payload, resource_id, fairness_key, idempotency_key, labels,
                         state, attempt, max_attempts, timeout_ms, dispatch_deadline_at,
                         not_before, created_at, updated_at, owner)
VALUES ('j_' || lpad(to_hex((extract(epoch FROM clock_timestamp()) * 1000)::int8), 12, '0') ||
          lpad(to_hex((random() * 2147483647)::int8 * 4294967296 +
                      (random() * 4294967295)::int8), 16, '0'),
        'noop', decode('78', 'hex'), '', 'ipv4:127.0.0.1', '',
        jsonb_object('{}'::text[], '{}'::text[]), 'QUEUED', 0, 3, 60000, NULL, NULL, now(),
        now(), '')
ON CONFLICT (owner, fairness_key, idempotency_key) WHERE idempotency_key <> '' DO NOTHING
RETURNING id, seq;
