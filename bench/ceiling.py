"""PostgreSQL's own ceiling for dispatchd's hot path, for bench.py: the `ceiling` scenario, and
the ceiling that `drain` and `e2e` set their jobs/s against (unless --no-ceiling).

A throughput figure of the daemon means little without what the same PostgreSQL, on the same
machine and in the same sitting, does with the same writes and nothing else. The pgbench scripts
in bench/ceiling/ do the least work per job on dispatchd's real schema (their headers say what
and why): claim_complete.sql claims 100 queued rows and moves them to jobs_done, as the drain
needs; insert_claim_complete.sql inserts 100 first, as jobs submitted while the workers drain
need. Each runs on a fresh database given its schema by the daemon itself (started once, then
stopped), with `--ceiling-clients` (4, the drain's workers) pgbench clients on
`--ceiling-threads` (2) threads and as many transactions as make `--jobs` jobs.

jobs/s = pgbench's transactions x 100 / its seconds without the initial connection time, which
is pgbench's `tps` x 100: one transaction of a script is one run of it, 100 jobs. Each run also
checks the rows: jobs_done must hold exactly transactions x 100 SUCCEEDED rows and jobs_active
none, or the run fails.

The light-load latency has a floor of the same kind (floor_once, beside each `latency` run unless
--no-ceiling): insert_one.sql inserts one job and commits, from one pgbench client at the probes'
--rate, so that the server idles between transactions as it does between probes. On a virtual
machine whose idle CPUs sleep, that rate costs a commit several times what it costs back to
back, and the probes pay the same.

Python 3 standard library only; needs pgbench (PostgreSQL 15's, from DISPATCHD_PG_BIN,
/usr/lib/postgresql/15/bin or PATH).
"""

import os
import re
import resource
import shutil
import subprocess

from sched_e2e_bench import BenchError, log, psql
from harness import Daemon, machine_busy, percentile, queue_noop_jobs

SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ceiling")
BATCH = 100  # jobs per run of a script

# name -> whether its jobs are queued before the run (as the drain's are).
SCRIPTS = {"claim_complete": True, "insert_claim_complete": False}

# The daemon's planner settings (kPinPointPlans in server/store/pg_statements.h): point plans
# whatever the statistics say, which matters most to a table that pgbench empties as it runs.
# Not its plan_cache_mode = force_generic_plan: the ceiling is PostgreSQL's best, and for these
# scripts' batches of 100 the plans made for the values at hand are faster (claim_complete
# measured 0.90 x as fast with the generic plan forced, three rounds in turn), while the daemon's
# turns of that size ran the generic plan under the default setting anyway.
PIN_POINT_PLANS = ("-c enable_seqscan=off -c enable_bitmapscan=off -c enable_hashjoin=off "
                   "-c enable_mergejoin=off -c enable_material=off -c jit=off")

HOW = "pgbench transactions x 100 / pgbench's seconds (tps without initial connection time x 100)"


def add_arguments(p):
    g = p.add_argument_group("ceiling (also drain and e2e) and floor (latency)")
    g.add_argument("--no-ceiling", action="store_true",
                   help="drain, e2e: skip PostgreSQL's ceiling run beside each run; latency: "
                        "skip its floor")
    g.add_argument("--ceiling-clients", type=int, default=4, help="pgbench clients (-c)")
    g.add_argument("--ceiling-threads", type=int, default=2, help="pgbench threads (-j)")


def pgbench_binary():
    for d in (os.environ.get("DISPATCHD_PG_BIN"), "/usr/lib/postgresql/15/bin"):
        if d and os.access(os.path.join(d, "pgbench"), os.X_OK):
            return os.path.join(d, "pgbench")
    found = shutil.which("pgbench")
    if not found:
        raise BenchError("pgbench not found (DISPATCHD_PG_BIN, /usr/lib/postgresql/15/bin, PATH)")
    return found


def pgbench_argv(script, clients, threads, transactions, extra=()):
    """pgbench's arguments for `transactions` runs of bench/ceiling/SCRIPT.sql per client, less
    the database: prepared statements (as the daemon's; the scripts' :ids travel as a parameter),
    no vacuum of pgbench's own tables (there are none), then `extra`."""
    return ["-n", "-M", "prepared", "-c", str(clients), "-j", str(threads),
            "-t", str(transactions), *extra, "-f", os.path.join(SCRIPTS_DIR, script + ".sql")]


def shown_command(script, clients, threads, transactions, extra=()):
    """The pgbench command of a run, as printed beside its figures (the script by its path in
    the repository, DB for the database)."""
    argv = pgbench_argv(script, clients, threads, transactions, extra)
    argv[-1] = os.path.join("bench", "ceiling", script + ".sql")
    return f"PGOPTIONS='{PIN_POINT_PLANS}' pgbench {' '.join(argv)} DB"


def run_pgbench(url, script, clients, threads, transactions, timeout=900, extra=(), cwd=None):
    """Runs the script against `url` (pgbench's `extra` arguments, in `cwd`); returns pgbench's
    figures: transactions, tps (without the initial connection time), average latency, its own
    CPU seconds. Fails unless every transaction ran."""
    argv = ([pgbench_binary()] + pgbench_argv(script, clients, threads, transactions, extra) +
            [url])
    env = dict(os.environ, PGOPTIONS=PIN_POINT_PLANS)
    ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout,
                           cwd=cwd)
    except subprocess.TimeoutExpired:
        raise BenchError(f"pgbench {script} did not finish in {timeout} s")
    ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = r.stdout + r.stderr
    done = re.search(r"number of transactions actually processed: (\d+)/(\d+)", out)
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", out)
    lat = re.search(r"latency average = ([\d.]+) ms", out)
    if r.returncode != 0 or not done or not tps or done.group(1) != done.group(2):
        raise BenchError(f"pgbench {script} failed ({r.returncode}):\n{out}")
    return {"transactions": int(done.group(1)), "tps": float(tps.group(1)),
            "latency_ms": float(lat.group(1)) if lat else None,
            "cpu_s": (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)}


def ceiling_once(b, name, script, jobs):
    """One run of bench/ceiling/SCRIPT.sql on a fresh database with dispatchd's schema (and, for
    claim_complete, its jobs queued first as the drain queues them): about `jobs` jobs, as many
    transactions as make them. Figures: jobs/s (HOW), the same from the rows as the drain
    measures it (first dispatched_at to last finished_at), the machine's CPU and pgbench's per
    job, and the WAL written per job."""
    a = b.args
    clients, threads = a.ceiling_clients, a.ceiling_threads
    per_client = max(1, jobs // (BATCH * clients))
    n = per_client * clients * BATCH
    d = Daemon(b, name)
    try:
        d.start(["noop"])  # creates the schema and jobs_done's partitions
        d.stop()
        if SCRIPTS[script]:
            queue_noop_jobs(d.url, n, "noop")
        wal0 = psql(d.url, "SELECT pg_current_wal_lsn()")[0][0]
        busy0 = machine_busy()
        p = run_pgbench(d.url, script, clients, threads, per_client, a.timeout)
        busy1 = machine_busy()
        wal = psql(d.url, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{wal0}')")[0][0]
        row = psql(d.url, "SELECT count(*), count(*) FILTER (WHERE state = 'SUCCEEDED' AND "
                          "result = 'x'::bytea), extract(epoch FROM max(finished_at) - "
                          "min(dispatched_at)), (SELECT count(*) FROM jobs_active) "
                          "FROM jobs_done")[0]
        done, ok, span, active = int(row[0]), int(row[1]), float(row[2]), int(row[3])
        moved = p["transactions"] * BATCH
        if done != moved or ok != done or active != 0:
            raise BenchError(f"ceiling {script}: {p['transactions']} transactions should have moved "
                             f"{moved} jobs; jobs_done holds {done} ({ok} SUCCEEDED with the "
                             f"result), jobs_active {active}")
        return {"jobs": moved, "seconds": round(p["transactions"] / p["tps"], 3),
                "jobs_per_s": round(p["tps"] * BATCH),
                "rows_jobs_per_s": round(moved / span),
                "latency_ms": p["latency_ms"],
                "cpu_us_per_job": round((busy1[0] - busy0[0]) / moved * 1e6, 1),
                "cpu_busy_share": round((busy1[0] - busy0[0]) / (busy1[1] - busy0[1]), 3),
                "pgbench_cpu_us_per_job": round(p["cpu_s"] / moved * 1e6, 1),
                "wal_bytes_per_job": round(float(wal) / moved),
                "command": shown_command(script, clients, threads, per_client)}
    finally:
        d.stop()
        d.drop()


FLOOR_SCRIPT = "insert_one"


def read_pgbench_log(path):
    """Each transaction's time from its start, in microseconds and in the log's order, from
    pgbench's per-transaction log (-l) of a run with --rate: `client transaction time script
    epoch us schedule_lag`, where the time counts from the transaction's scheduled start, so the
    lag comes off."""
    times = []
    with open(path) as f:
        for line in f:
            fields = line.split()
            if len(fields) < 7 or fields[2] == "skipped":
                raise BenchError(f"{path}: not a --rate run's transaction: {line.strip()!r}")
            times.append(int(fields[2]) - int(fields[6]))
    return times


def measured_times(path, warmup):
    """read_pgbench_log's times less the first `warmup` transactions, sorted."""
    return sorted(read_pgbench_log(path)[warmup:])


def floor_once(b, name):
    """PostgreSQL's own light-load floor beside a latency run: bench/ceiling/insert_one.sql from
    one client at --rate, --warmup + --probes transactions, on a fresh database with dispatchd's
    schema. Figures: the commit's p50 and p99 in ms (the first --warmup left out, as the probes'
    are), and the same script back to back, for what idling between transactions costs."""
    a = b.args
    d = Daemon(b, name)
    logdir = os.path.join(b.workdir, name + "-log")
    os.makedirs(logdir, exist_ok=True)
    try:
        d.start(["noop"])  # creates the schema
        d.stop()
        n = a.probes + a.warmup
        rate = ["-R", f"{a.rate:g}", "-l", "--log-prefix", "floor"]
        run_pgbench(d.url, FLOOR_SCRIPT, 1, 1, n, a.timeout, extra=rate, cwd=logdir)
        logs = [f for f in os.listdir(logdir) if f.startswith("floor")]
        if len(logs) != 1:
            raise BenchError(f"pgbench left {logs} in {logdir}, not one log")
        times = measured_times(os.path.join(logdir, logs[0]), a.warmup)
        if len(times) < a.probes:
            raise BenchError(f"pgbench logged {len(times) + a.warmup} of {n} transactions")
        busy = run_pgbench(d.url, FLOOR_SCRIPT, 1, 1, n, a.timeout)
        ms = lambda us: round(us / 1000, 3)  # noqa: E731
        # pgbench takes a transaction's end time lazily, in the step of its state machine that
        # ends it: one that ends in the step that started it (on a server without fsync, say)
        # reads as its lag alone, a time of 0. A commit that waits for a WAL flush never does.
        return {"pg_floor_insert_p50_ms": ms(percentile(times, 0.5)),
                "pg_floor_insert_p99_ms": ms(percentile(times, 0.99)),
                "pg_floor_untimed": sum(1 for t in times if t <= 0),
                "pg_floor_insert_back_to_back_ms": busy["latency_ms"],
                "pg_floor_command": shown_command(FLOOR_SCRIPT, 1, 1, n,
                                                  ["-R", f"{a.rate:g}", "-l"])}
    finally:
        d.stop()
        d.drop()
        shutil.rmtree(logdir, ignore_errors=True)


def add_floor(b, i, out):
    """Runs the floor beside one latency run (unless --no-ceiling) and adds its figures to `out`,
    with the probes' Submit-to-worker p50 and p99 over the floor's."""
    if b.args.no_ceiling:
        return out
    r = floor_once(b, f"floor-{i}")
    log(f"  floor run {i}: {FLOOR_SCRIPT}: p50 {r['pg_floor_insert_p50_ms']} ms, p99 "
        f"{r['pg_floor_insert_p99_ms']} ms at {b.args.rate:g}/s; "
        f"{r['pg_floor_insert_back_to_back_ms']} ms back to back")
    out.update(r)
    for pct in ("p50", "p99"):
        floor = r[f"pg_floor_insert_{pct}_ms"]
        out[f"submit_to_worker_{pct}_over_floor"] = (
            round(out[f"submit_to_worker_{pct}_ms"] / floor, 3) if floor > 0 else None)
    return out


def run_ceiling(b, i):
    """The `ceiling` scenario: each script once, on a database of its own."""
    out = {"jobs_per_s_is": HOW}
    for script in SCRIPTS:
        r = ceiling_once(b, f"ceiling-{script}-{i}", script, b.args.jobs)
        out.update({f"{script}_{k}": v for k, v in r.items()})
    return out


def add_ceiling(b, i, out, script, figures):
    """Runs `script`'s ceiling beside one run of drain or e2e (unless --no-ceiling) and adds to
    `out` the ceiling's jobs/s (`ceiling_jobs_per_s`) and each of `figures` over it (figures:
    the key of a jobs/s in out -> the key of its fraction)."""
    if b.args.no_ceiling:
        return out
    r = ceiling_once(b, f"ceiling-{script}-{i}", script, b.args.jobs)
    log(f"  ceiling run {i}: {script}: {r['jobs_per_s']} jobs/s ({HOW})")
    out["ceiling_script"] = f"bench/ceiling/{script}.sql"
    out["ceiling_jobs_per_s"] = r["jobs_per_s"]
    out["ceiling_cpu_us_per_job"] = r["cpu_us_per_job"]
    for key, fraction in figures.items():
        out[fraction] = round(out[key] / r["jobs_per_s"], 3)
    return out
