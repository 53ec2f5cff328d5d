"""Where each microsecond of a job goes, for bench.py: the `profile` scenario.

A throughput figure says how fast; this says what it cost and who paid. `profile` runs the ways
jobs reach the workers, each on a fresh daemon and database, and measures a window around each:

- `drain`: --jobs no-op jobs queued before the daemon starts (as the `drain` scenario);
- `submit`: --jobs queued by `Submit` calls while the workers drain (as `e2e`'s single variant);
- `batch`: the same by `SubmitBatch` calls of --batch specs (as `e2e`'s batch variant);
- `runsync`: --jobs / 5 `RunSync` calls, --clients x --inflight in flight (each waits for its
  job's result, so that is the most jobs in the system at once).

For each window, per job:

- CPU by process: the daemon, by thread (its threads are named: `dispatch-loop`, `turn-writer`,
  `insert-flush`, `store-reads`; gRPC's own threads count as `grpc`), the workers, the load
  generator, PostgreSQL's server processes (its backends apart from its WAL writer, checkpointer
  and background writer, and autovacuum), and the rest of the machine (`other`: the bench's own
  polls, the kernel's share no process is charged with, and any other work on the machine);
- WAL: bytes (the distance the WAL's insert position moved, exact), records and full-page
  images (pg_stat_wal), and transactions committed in the daemon's database (pg_stat_database's
  xact_commit: read-only ones, such as a RunSync's read of its job, count too). PostgreSQL 15
  adds a backend's counts to those two views at most once a second, and an idle backend's within
  10 s, so over a window of a few seconds records, images and transactions may fall short;
- the statements: calls, execution time, rows, WAL records and bytes, and buffers dirtied, per
  job, from pg_stat_statements, which the bench's own server loads (`shared_preload_libraries`).
  Against a server of --pg-url that does not load it, the statement table is left out.

Execution time counts what a statement's executor did, not the commit: the time a commit waits
for its WAL flush is in no statement's row, only in the backends' CPU and the wall clock.

Python 3 standard library only.
"""

import argparse
import os
import time

from sched_e2e_bench import BenchError, log, psql
from harness import (
    Daemon, check_ran_once, cpu_seconds, machine_busy, queue_noop_jobs, read_records,
    read_start_logs, run_loadgen, wait_drained)

# The server options the bench's PostgreSQL gets for this scenario (tests/pg/pg_fixture.sh
# appends DISPATCHD_PG_OPTIONS to its own).
# track_planning: a prepared statement PostgreSQL plans again on every run spends the time in
# planning, which pg_stat_statements leaves out of its execution time unless told.
PG_OPTIONS = ("-c shared_preload_libraries=pg_stat_statements -c pg_stat_statements.max=1000 "
              "-c pg_stat_statements.track_planning=on -c track_wal_io_timing=on")

# The daemon's named threads; any other thread (gRPC's completion queues, executors, resolvers and
# timers) counts as `grpc`, the main thread as `main`.
DAEMON_THREADS = ("dispatch-loop", "turn-writer", "insert-flush", "store-reads")
DAEMON_GROUPS = DAEMON_THREADS + ("grpc", "main")
PG_GROUPS = ("backends", "walwriter", "checkpoint", "autovacuum", "pg_other")
STATEMENT_ROWS = 10  # statements shown per variant


def ticks():
    return os.sysconf("SC_CLK_TCK")


def read_stat(path):
    """(comm, utime + stime, cutime + cstime) in seconds from a /proc stat file; None if gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    comm = text[text.index("(") + 1:text.rindex(")")]
    fields = text[text.rindex(")") + 2:].split()
    hz = ticks()
    return comm, (int(fields[11]) + int(fields[12])) / hz, (int(fields[13]) + int(fields[14])) / hz


def daemon_threads(pid):
    """The daemon's CPU seconds so far, by DAEMON_GROUPS."""
    out = dict.fromkeys(DAEMON_GROUPS, 0.0)
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        s = read_stat(f"/proc/{pid}/task/{tid}/stat")
        if s is None:
            continue
        comm, cpu, _ = s
        group = comm if comm in DAEMON_THREADS else "main" if tid == str(pid) else "grpc"
        out[group] += cpu
    return out


def postmaster_pid(b):
    """The pid of the bench's own PostgreSQL server, or None (a server of --pg-url)."""
    if not b.pg.own:
        return None
    try:
        with open(os.path.join(b.pg.state, "datadir")) as f:
            datadir = f.read().strip()
        with open(os.path.join(datadir, "postmaster.pid")) as f:
            return int(f.readline())
    except (OSError, ValueError):
        return None


def postgres_cpu(pm):
    """PostgreSQL's CPU seconds so far, by PG_GROUPS: its live processes by what their command
    line says they are, and those that exited (the postmaster's children's time) as pg_other.
    None without a server of our own."""
    if pm is None:
        return None
    out = dict.fromkeys(PG_GROUPS, 0.0)
    s = read_stat(f"/proc/{pm}/stat")
    if s is None:
        return None
    out["pg_other"] += s[1] + s[2]
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid != pm:
                continue
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                title = f.read().decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        st = read_stat(f"/proc/{entry}/stat")
        if st is None:
            continue
        if "walwriter" in title:
            group = "walwriter"
        elif "checkpointer" in title or "background writer" in title:
            group = "checkpoint"
        elif "autovacuum" in title:
            group = "autovacuum"
        elif "postgres: " in title and ("127.0.0.1" in title or "[local]" in title):
            group = "backends"
        else:
            group = "pg_other"
        out[group] += st[1]
    return out


def has_statements(url):
    """Whether the server loads pg_stat_statements; creates the extension in url's database."""
    try:
        psql(url, "CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        psql(url, "SELECT count(*) FROM pg_stat_statements")
        return True
    except BenchError:
        return False


class Window:
    """A measured stretch of a daemon's life: start(), then stop(jobs) for the figures."""

    def __init__(self, b, d):
        self.b, self.d = b, d
        self.pm = postmaster_pid(b)
        self.statements = has_statements(d.url)

    def snapshot(self):
        d = self.d
        row = psql(d.url, "SELECT w.wal_records, w.wal_fpi, "
                          "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0'), d.xact_commit "
                          "FROM pg_stat_wal w, pg_stat_database d "
                          "WHERE d.datname = current_database()")[0]
        return {"busy": machine_busy()[0], "daemon": daemon_threads(d.proc.pid),
                "workers": {w.pid: cpu_seconds(w.pid) or 0.0 for w in d.workers},
                "postgres": postgres_cpu(self.pm), "wal": [float(x) for x in row],
                "at": time.time()}

    def start(self):
        # Counters as they stand; pg_stat_wal and pg_stat_database are cumulative, read twice.
        if self.statements:
            psql(self.d.url, "SELECT pg_stat_statements_reset()")
        self.s0 = self.snapshot()

    def stop(self, jobs, loadgen_cpu=0.0):
        """Figures per job over the window (a flat dict) and the statement table (a list)."""
        s0, s1 = self.s0, self.snapshot()
        us = lambda sec: round(sec / jobs * 1e6, 1)  # noqa: E731
        daemon = {g: s1["daemon"][g] - s0["daemon"][g] for g in DAEMON_GROUPS}
        workers = sum(cpu - s0["workers"].get(pid, 0.0) for pid, cpu in s1["workers"].items())
        out = {"machine_cpu_us_per_job": us(s1["busy"] - s0["busy"]),
               "daemon_cpu_us_per_job": us(sum(daemon.values()))}
        out.update({f"daemon_{g.replace('-', '_')}_us_per_job": us(v) for g, v in daemon.items()})
        out["workers_cpu_us_per_job"] = us(workers)
        out["loadgen_cpu_us_per_job"] = us(loadgen_cpu)
        named = sum(daemon.values()) + workers + loadgen_cpu
        if s0["postgres"] is not None and s1["postgres"] is not None:
            pg = {g: s1["postgres"][g] - s0["postgres"][g] for g in PG_GROUPS}
            out["postgres_cpu_us_per_job"] = us(sum(pg.values()))
            out.update({f"postgres_{g}_us_per_job": us(v) for g, v in pg.items()})
            named += sum(pg.values())
        out["other_cpu_us_per_job"] = us(s1["busy"] - s0["busy"] - named)
        w0, w1 = s0["wal"], s1["wal"]
        out["wal_records_per_job"] = round((w1[0] - w0[0]) / jobs, 2)
        out["wal_fpi_per_job"] = round((w1[1] - w0[1]) / jobs, 3)
        out["wal_bytes_per_job"] = round((w1[2] - w0[2]) / jobs)
        out["transactions_per_100_jobs"] = round((w1[3] - w0[3]) / jobs * 100, 1)
        table = self.statement_table(jobs) if self.statements else []
        if table:
            out["statement_calls_per_job"] = round(sum(r["calls_per_job"] for r in table), 3)
            out["statement_exec_us_per_job"] = round(sum(r["exec_us_per_job"] for r in table), 1)
            out["statement_plan_us_per_job"] = round(sum(r["plan_us_per_job"] for r in table), 1)
        return out, table

    def statement_table(self, jobs):
        """Every statement the daemon's database ran in the window, most execution time first."""
        rows = psql(self.d.url, """
            SELECT calls, total_exec_time, rows, wal_records, wal_bytes, shared_blks_dirtied,
                   max_exec_time, plans, total_plan_time, regexp_replace(query, '\\s+', ' ', 'g')
            FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
              AND query NOT LIKE '%pg_stat_%' AND query NOT LIKE '%pg_current_wal%'
            ORDER BY total_exec_time DESC""")
        table = []
        for row in rows:
            calls, exec_ms, nrows, wal_rec, wal_bytes, dirtied, max_ms, plans, plan_ms = row[:9]
            query, calls = ",".join(row[9:]), int(calls)  # psql splits the text at its commas
            table.append({"calls_per_job": round(calls / jobs, 4),
                          "exec_us_per_job": round(float(exec_ms) * 1000 / jobs, 2),
                          "plans_per_call": round(int(plans) / calls, 2) if calls else 0,
                          "plan_us_per_job": round(float(plan_ms) * 1000 / jobs, 2),
                          "rows_per_call": round(int(nrows) / calls, 1) if calls else 0,
                          "wal_records_per_job": round(int(wal_rec) / jobs, 2),
                          "wal_bytes_per_job": round(float(wal_bytes) / jobs),
                          "dirtied_per_job": round(int(dirtied) / jobs, 3),
                          "mean_ms": round(float(exec_ms) / calls, 3) if calls else 0,
                          "max_ms": round(float(max_ms), 3),
                          "query": query})
        return table


def drain(b, i):
    """The `drain` variant: preloaded jobs, the window from the workers' start to the last end."""
    a = b.args
    d = Daemon(b, f"profile-drain-{i}")
    try:
        d.start(["noop"])  # creates the schema
        d.stop()
        queue_noop_jobs(d.url, a.jobs, "noop")
        d.serve_metrics()  # the drained poll reads the daemon's gauges (Daemon.any_active)
        d.start(["noop"])
        w = Window(b, d)
        w.start()
        d.start_workers(a.workers, ["noop"], a.slots)
        wait_drained(d, a.timeout)
        out, table = w.stop(a.jobs)
        row = psql(d.url, "SELECT count(*) FILTER (WHERE state = 'SUCCEEDED'), "
                          "extract(epoch FROM max(finished_at) - min(dispatched_at)) "
                          "FROM jobs_done")[0]
        if int(row[0]) != a.jobs:
            raise BenchError(f"profile drain: {row[0]} of {a.jobs} jobs succeeded; "
                             f"logs in {d.dir}")
        return {"jobs_per_s": round(a.jobs / float(row[1])), **out}, table
    finally:
        d.stop()
        d.drop()


def flood(b, i, variant, argv, jobs):
    """A load-generator variant (`submit`, `batch`, `runsync`) against a daemon whose workers
    are connected: the window from the first call to the last job's end."""
    a = b.args
    d = Daemon(b, f"profile-{variant}-{i}")
    try:
        d.serve_metrics()  # the drained poll reads the daemon's gauges (Daemon.any_active)
        d.start(["noop"])
        d.start_workers(a.workers, ["noop"], a.slots, start_logs=True)
        rec = os.path.join(d.dir, "records")
        w = Window(b, d)
        w.start()
        s = run_loadgen(b, d, ["--wait-workers", str(a.workers), "--record", rec] + argv,
                        a.timeout)
        wait_drained(d, a.timeout)
        out, table = w.stop(jobs, s["cpu_s"])
        span = float(psql(d.url, "SELECT extract(epoch FROM max(finished_at)) FROM jobs")[0][0])
        d.stop_workers()
        check_ran_once(d, read_records(rec), jobs, read_start_logs(d.start_logs))
        return {"jobs_per_s": round(jobs / (span - s["start_us"] / 1e6)), **out}, table
    finally:
        d.stop()
        d.drop()


VARIANTS = ("drain", "submit", "batch", "runsync")


def parse_variants(text):
    """--variants: a comma-separated list of VARIANTS, each named at most once."""
    names = [v.strip() for v in text.split(",") if v.strip()]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(
            f"unknown variant {', '.join(unknown) or '(none given)'}: choose from "
            f"{','.join(VARIANTS)}")
    return list(dict.fromkeys(names))


def add_arguments(p):
    g = p.add_argument_group("profile")
    g.add_argument("--variants", type=parse_variants, default=list(VARIANTS),
                   help="profile: the ways jobs arrive, comma-separated (default "
                        f"{','.join(VARIANTS)})")


def run_profile(b, i):
    """One run of every variant; the figures prefixed by variant, the tables under "tables"."""
    a = b.args
    flood_argv = ["--clients", str(a.clients), "--threads", str(a.loadgen_threads)]
    runsync_jobs = max(1, a.jobs // 5)
    variants = {
        "drain": lambda: drain(b, i),
        "submit": lambda: flood(b, i, "submit", ["flood", "--jobs", str(a.jobs), "--inflight",
                                                 str(a.inflight), "--batch", "1"] + flood_argv,
                                a.jobs),
        "batch": lambda: flood(b, i, "batch", ["flood", "--jobs", str(a.jobs), "--inflight",
                                               str(a.batch_inflight), "--batch", str(a.batch)]
                               + flood_argv, a.jobs),
        "runsync": lambda: flood(b, i, "runsync", [
            "probe", "--rpc", "runsync", "--count", str(runsync_jobs), "--warmup", "0",
            "--rate", "1000000", "--inflight", str(a.clients * a.inflight)], runsync_jobs),
    }
    out, tables = {}, {}
    for name in a.variants:
        run = variants[name]
        log(f"profile run {i}: {name} ...")
        figures, tables[name] = run()
        out.update({f"{name}_{k}": v for k, v in figures.items()})
    out["tables"] = tables
    return out


def print_tables(tables, run):
    """The statement table of each variant (of one run), as Markdown."""
    for name, table in tables.items():
        if not table:
            print(f"\n  {name}: no statement figures (the server does not load pg_stat_statements)")
            continue
        print(f"\n  {name} (run {run}): statements, per job, most execution time first")
        print("  | calls | exec µs | plan µs | plans/call | rows/call | WAL rec | WAL B | dirtied "
              "| mean ms | max ms | statement |")
        print("  | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
        for r in table[:STATEMENT_ROWS]:
            q = r["query"] if len(r["query"]) <= 90 else r["query"][:87] + "..."
            print(f"  | {r['calls_per_job']} | {r['exec_us_per_job']} | {r['plan_us_per_job']} | "
                  f"{r['plans_per_call']} | {r['rows_per_call']} | "
                  f"{r['wal_records_per_job']} | {r['wal_bytes_per_job']} | "
                  f"{r['dirtied_per_job']} | {r['mean_ms']} | {r['max_ms']} | `{q}` |")
