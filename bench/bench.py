#!/usr/bin/env python3
"""dispatchd's throughput benchmarks: the real daemon, PostgreSQL and reference workers.

One entry point for every scenario. It starts its own PostgreSQL 15 with durable settings (fsync
and synchronous_commit on, as in production) or uses --pg-url, runs the named scenario --runs
times on a fresh database each time, prints a table of the medians, and writes every run to
JSON and CSV. Where a peer applies it runs ../shared/peers/graphile-yardstick on the same server
in the same sitting and prints the ratio.

Scenarios:
  drain   --jobs no-op jobs (default 100000) queued in the database, then drained by --workers
          reference workers (default 4) x --slots (default 64) in echo mode; jobs/s from the
          first dispatch to the last finish, read from the job rows. Also: the time the daemon
          took to load the backlog at start, and its peak RSS. Peer: graphile-worker.
  e2e     --clients (8) clients of dispatch-loadgen queue --jobs no-op jobs as fast as they are
          admitted, each with --inflight (64) Submit calls in flight, while the workers drain
          them; then again on a fresh database with SubmitBatch calls of --batch (100) specs,
          --batch-inflight (4) per client. For each: jobs/s submitted (first send to last
          answer) and completed (first send to the last finished_at), and the call latency.
  latency light load: --probes (1000, after --warmup 20) Submit calls at --rate (100) per
          second, at most --probe-inflight (1) at once, then as many RunSync calls. Submit to
          worker: from the client's send to the worker's handler start (both CLOCK_REALTIME on
          this host, from dispatch-loadgen --record and dispatch-worker --start-log); RunSync
          round trip: send to answer. p50, p99 and p999.

e2e and latency fail unless every job the clients were answered for exists, SUCCEEDED at its
first attempt and was started by a worker exactly once, and no other job exists.

Examples:
  python3 bench/bench.py drain
  python3 bench/bench.py drain --jobs 20000 --runs 1 --no-peer      # a quick look
  python3 bench/bench.py drain --pg-url postgresql://me@db:5432/postgres --out /tmp/drain
  python3 bench/bench.py e2e --jobs 20000 --runs 1
  python3 bench/bench.py latency --probes 300 --runs 1

Python 3 standard library only; needs the binaries in build/ (or --build) and psql.
"""

import argparse
import collections
import csv
import datetime
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "sched"))

# The process, PostgreSQL and output helpers are shared with the scheduler benchmark.
from sched_e2e_bench import (  # noqa: E402
    BenchError, Postgres, find_binary, log, machine_info, psql, spawn, stop_process, tail,
    yaml_str)

PEER = os.path.join(os.path.dirname(REPO), "shared", "peers", "graphile-yardstick")


def rss_kib(pid):
    """Peak resident set size of a running process (VmHWM), in KiB; None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Daemon:
    """One dispatchd on a database of its own."""

    def __init__(self, bench, name):
        self.b = bench
        self.dir = os.path.join(bench.workdir, name)
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        self.dbname = f"bench_{os.getpid()}_{name}".replace("-", "_")
        self.url = bench.pg.create_db(self.dbname)
        self.proc = None
        self.addr = None
        self.workers = []
        self.start_logs = []

    def write_config(self, types):
        cfg = os.path.join(self.dir, "dispatchd.yaml")
        lines = [
            "listen: 127.0.0.1:0",
            f"state_dir: {yaml_str(os.path.join(self.dir, 'state'))}",
            "log_level: warn",
            "max_active: 10000000",
            "postgres:",
            f"  url: {yaml_str(self.url)}",
            "types:",
        ] + [f"  - name: {t}" for t in types]
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        return cfg

    def start(self, types):
        """Starts the daemon; returns seconds from exec to ready (it has loaded its jobs)."""
        cfg = self.write_config(types)
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        t0 = time.time()
        self.proc = spawn([self.b.dispatchd, "--config", cfg, "--ready-file", ready],
                          os.path.join(self.dir, "dispatchd.log"))
        deadline = t0 + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"dispatchd exited with {self.proc.returncode}; log "
                                 f"{self.proc.log_path}:\n{tail(self.proc.log_path)}")
            if os.path.exists(ready):
                with open(ready) as f:
                    addr = f.read().strip()
                if addr:
                    self.addr = addr
                    return time.time() - t0
            time.sleep(0.02)
        raise BenchError(f"dispatchd not ready in 600 s; log {self.proc.log_path}")

    def start_workers(self, n, types, slots, start_logs=False):
        """Starts n echo workers; with start_logs each writes dispatch-worker --start-log to
        self.start_logs (complete once stop_workers has returned)."""
        for i in range(1, n + 1):
            argv = [self.b.worker, "--server", self.addr, "--id", f"w{i}", "--types",
                    ",".join(types), "--slots", str(slots), "--echo", "--log-level", "warn"]
            if start_logs:
                path = os.path.join(self.dir, f"starts-w{i}")
                argv += ["--start-log", path]
                self.start_logs.append(path)
            self.workers.append(spawn(argv, os.path.join(self.dir, f"worker-w{i}.log")))

    def stop_workers(self):
        """Drains the workers (SIGTERM) and checks that each exited 0, so that their start logs
        are complete."""
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)  # once: a second signal exits without draining
        deadline = time.time() + 10
        for w in self.workers:
            try:
                w.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        codes = [(w, stop_process(w, grace=1)) for w in self.workers]
        self.workers = []
        for w, rc in codes:
            if rc != 0:
                raise BenchError(f"worker exited with {rc}; log {w.log_path}:\n{tail(w.log_path)}")

    def check_alive(self):
        for p in [self.proc] + self.workers:
            if p is not None and p.poll() is not None:
                raise BenchError(f"{os.path.basename(p.argv[0])} exited with {p.returncode}; "
                                 f"log {p.log_path}:\n{tail(p.log_path)}")

    def stop(self):
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            stop_process(w, grace=10)
        self.workers = []
        if self.proc is not None:
            stop_process(self.proc, grace=20)
            self.proc = None

    def drop(self):
        if not self.b.args.keep_dbs:
            self.b.pg.drop_db(self.dbname)

    def any_active(self):
        """Whether any job is still active: one index probe, so that polling costs the server
        next to nothing while it is being measured."""
        return psql(self.url, "SELECT EXISTS (SELECT 1 FROM jobs_active WHERE state IN "
                              "('QUEUED', 'DISPATCHED', 'RUNNING'))")[0][0] == "t"


def queue_noop_jobs(url, n, jtype):
    """Inserts n queued jobs in one statement, as a client's bulk load would leave them."""
    psql(url, "INSERT INTO jobs_active (id, type, payload, state, max_attempts, timeout_ms, "
              f"created_at, updated_at) SELECT 'j' || i, '{jtype}', ''::bytea, 'QUEUED', 3, 60000, "
              f"now(), now() FROM generate_series(1, {int(n)}) AS i", timeout=600)
    psql(url, "VACUUM ANALYZE jobs_active", timeout=600)


# ------------------------------------------------------------------------------------------------
# Scenarios. Each returns one dict of figures per run.


def keep_finished_jobs(url, n, jtype):
    """Adds n SUCCEEDED jobs that finished just now (within their retention), into the table
    and partition the daemon keeps ended jobs in."""
    psql(url, "INSERT INTO jobs_done (seq, id, type, payload, state, attempt, max_attempts, "
              "timeout_ms, worker_id, result, created_at, dispatched_at, finished_at, updated_at) "
              f"SELECT i, 'f' || i, '{jtype}', 'x'::bytea, 'SUCCEEDED', 1, 3, 60000, 'w1', "
              f"'x'::bytea, now(), now(), now(), now() FROM generate_series(1, {int(n)}) AS i",
         timeout=3600)
    psql(url, "VACUUM ANALYZE jobs_done", timeout=3600)


def drain_once(b, name, jobs, finished=0):
    """One drain: `jobs` queued no-op jobs (after `finished` SUCCEEDED ones kept for Status),
    loaded by a fresh daemon and drained by the workers. Figures from the job rows."""
    a = b.args
    d = Daemon(b, name)
    try:
        d.start(["noop"])  # creates the schema
        d.stop()
        if finished:
            keep_finished_jobs(d.url, finished, "noop")
        queue_noop_jobs(d.url, jobs, "noop")
        started = time.time()
        load_s = d.start(["noop"])
        d.start_workers(a.workers, ["noop"], a.slots)
        peak_rss = 0
        deadline = time.time() + a.timeout
        while True:
            d.check_alive()
            peak_rss = max(peak_rss, rss_kib(d.proc.pid) or 0)
            if not d.any_active():
                break
            if time.time() > deadline:
                raise BenchError(f"drain did not finish in {a.timeout} s; logs in {d.dir}")
            time.sleep(0.5)
        row = psql(d.url, "SELECT count(*), extract(epoch FROM max(finished_at) - "
                          "min(dispatched_at)), count(*) FILTER (WHERE state = 'SUCCEEDED'), "
                          "extract(epoch FROM min(dispatched_at)) "
                          "FROM jobs_done WHERE id NOT LIKE 'f%'")[0]
        n, span, ok = int(row[0]), float(row[1]), int(row[2])
        if ok != n or n != jobs:
            raise BenchError(f"drain: {ok} of {jobs} jobs succeeded ({n} rows); logs in {d.dir}")
        return {"jobs": n, "seconds": round(span, 3), "jobs_per_s": round(n / span),
                "load_s": round(load_s, 2),
                "first_dispatch_s": round(float(row[3]) - started, 2),
                "daemon_peak_rss_mib": round(peak_rss / 1024, 1)}
    finally:
        d.stop()
        d.drop()


def run_drain(b, i):
    return drain_once(b, f"drain-{i}", b.args.jobs)


def run_backlog(b, i):
    """drain of --backlog queued jobs, beside a plain drain in the same sitting."""
    plain = drain_once(b, f"drain-{i}", b.args.jobs)
    big = drain_once(b, f"backlog-{i}", b.args.backlog)
    out = {"drain_jobs_per_s": plain["jobs_per_s"]}
    out.update(big)
    out["ratio_to_drain"] = round(big["jobs_per_s"] / plain["jobs_per_s"], 3)
    return out


def run_retained(b, i):
    """drain with --retained finished jobs kept, beside a plain drain in the same sitting."""
    plain = drain_once(b, f"drain-{i}", b.args.jobs)
    kept = drain_once(b, f"retained-{i}", b.args.jobs, finished=b.args.retained)
    out = {"retained": b.args.retained, "drain_jobs_per_s": plain["jobs_per_s"]}
    out.update(kept)
    out["ratio_to_drain"] = round(kept["jobs_per_s"] / plain["jobs_per_s"], 3)
    return out


def run_peer_drain(b):
    """graphile-worker's drain on the same server: each run's jobs/s, and its best."""
    if not os.access(PEER, os.X_OK):
        raise BenchError(f"peer yardstick not found at {PEER}")
    env = dict(os.environ, PGURL=b.pg.url, RUNS=str(b.args.runs))
    r = subprocess.run([PEER, str(b.args.jobs)], capture_output=True, text=True, env=env,
                       timeout=3600)
    if r.returncode != 0:
        raise BenchError(f"graphile-yardstick failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    runs = [int(x) for x in re.findall(r"= (\d+) jobs/s", r.stdout)]
    best = re.search(r"graphile-worker best: (\d+) jobs/s", r.stdout)
    if not runs or not best:
        raise BenchError(f"cannot read graphile-yardstick's output:\n{r.stdout}")
    return {"runs": runs, "median": statistics.median(runs), "best": int(best.group(1))}


# ------------------------------------------------------------------------------------------------
# Client scenarios: dispatch-loadgen against the daemon, checked against the rows and the workers.


def run_loadgen(b, d, argv, timeout):
    """Runs dispatch-loadgen against d; returns its JSON summary. Fails on a non-zero exit."""
    cmd = [b.loadgen(), "--server", d.addr, "--type", "noop"] + argv
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"dispatch-loadgen did not finish in {timeout} s; logs in {d.dir}")
    with open(os.path.join(d.dir, "loadgen.log"), "a") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise BenchError(f"dispatch-loadgen failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return json.loads(lines[-1])


def read_records(path):
    """dispatch-loadgen --record: a list of (seq, job_id, sent_us, answered_us)."""
    out = []
    with open(path) as f:
        for line in f:
            seq, job_id, sent, answered = line.split()
            out.append((int(seq), job_id, int(sent), int(answered)))
    return out


def read_start_logs(paths):
    """dispatch-worker --start-log files: job id -> list of handler start times (us)."""
    starts = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                job_id, _attempt, us = line.split()
                starts[job_id].append(int(us))
    return starts


def wait_drained(d, timeout):
    deadline = time.time() + timeout
    while True:
        d.check_alive()
        if not d.any_active():
            return
        if time.time() > deadline:
            raise BenchError(f"jobs still active after {timeout} s; logs in {d.dir}")
        time.sleep(0.5)  # a probe costs the server next to nothing; the figures come from rows


def check_ran_once(d, records, expected, starts):
    """Fails unless the clients were answered for `expected` distinct jobs, the database holds
    exactly those, each SUCCEEDED at attempt 1, and the workers started each exactly once."""
    ids = [r[1] for r in records]
    problems = []
    if len(ids) != expected:
        problems.append(f"the clients were answered for {len(ids)} jobs, not {expected}")
    if len(set(ids)) != len(ids):
        problems.append(f"{len(ids) - len(set(ids))} job ids were answered twice")
    rows = {r[0]: (r[1], r[2]) for r in psql(d.url, "SELECT id, state, attempt FROM jobs",
                                              timeout=600)}
    missing = [i for i in ids if i not in rows]
    extra = set(rows) - set(ids)
    bad = [(i, st, at) for i, (st, at) in rows.items() if st != "SUCCEEDED" or at != "1"]
    not_once = [(i, len(starts.get(i, []))) for i in ids if len(starts.get(i, [])) != 1]
    unknown = set(starts) - set(ids)
    if missing:
        problems.append(f"{len(missing)} answered jobs have no row, e.g. {missing[:3]}")
    if extra:
        problems.append(f"{len(extra)} rows no client was answered for, e.g. {sorted(extra)[:3]}")
    if bad:
        problems.append(f"{len(bad)} rows not SUCCEEDED at attempt 1, e.g. {bad[:3]}")
    if not_once:
        problems.append(f"{len(not_once)} jobs not started exactly once by the workers "
                        f"(id, starts), e.g. {not_once[:3]}")
    if unknown:
        problems.append(f"workers started {len(unknown)} unknown jobs, e.g. {sorted(unknown)[:3]}")
    if problems:
        raise BenchError("jobs lost or run twice: " + "; ".join(problems) + f"; logs in {d.dir}")


def percentile(sorted_values, q):
    """Nearest rank, as dispatch-loadgen computes it."""
    n = len(sorted_values)
    k = min(max(math.ceil(q * n), 1), n)
    return sorted_values[k - 1]


def cpu_seconds(pid):
    """User + system CPU seconds of a running process so far; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def e2e_variant(b, i, variant, batch, inflight):
    """One flood on a fresh database: single Submit calls (batch 1) or SubmitBatch."""
    a = b.args
    d = Daemon(b, f"e2e-{variant}-{i}")
    try:
        d.start(["noop"])
        d.start_workers(a.workers, ["noop"], a.slots, start_logs=True)
        cpu0 = cpu_seconds(d.proc.pid)
        rec = os.path.join(d.dir, "records")
        s = run_loadgen(b, d, ["--wait-workers", str(a.workers), "--record", rec, "flood",
                               "--jobs", str(a.jobs), "--clients", str(a.clients),
                               "--inflight", str(inflight), "--batch", str(batch),
                               "--threads", str(a.loadgen_threads)], a.timeout)
        wait_drained(d, a.timeout)
        last_finish = float(psql(d.url, "SELECT extract(epoch FROM max(finished_at)) "
                                        "FROM jobs")[0][0])
        cpu1 = cpu_seconds(d.proc.pid)
        d.stop_workers()
        check_ran_once(d, read_records(rec), a.jobs, read_start_logs(d.start_logs))
        start = s["start_us"] / 1e6
        lat = s["latency_us"]
        v = variant
        return {f"{v}_submitted_per_s": round(s["jobs"] / s["seconds"]),
                f"{v}_completed_per_s": round(s["jobs"] / (last_finish - start)),
                f"{v}_call_p50_ms": round(lat["p50"] / 1000, 2),
                f"{v}_call_p99_ms": round(lat["p99"] / 1000, 2),
                f"{v}_refused_calls": s["resource_exhausted"],
                f"{v}_loadgen_cpu_s": s["cpu_s"],
                f"{v}_daemon_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 else None}
    finally:
        d.stop()
        d.drop()


def run_e2e(b, i):
    a = b.args
    out = {"jobs": a.jobs}
    out.update(e2e_variant(b, i, "single", 1, a.inflight))
    out.update(e2e_variant(b, i, "batch", a.batch, a.batch_inflight))
    return out


def run_latency(b, i):
    a = b.args
    d = Daemon(b, f"latency-{i}")
    try:
        d.start(["noop"])
        d.start_workers(a.workers, ["noop"], a.slots, start_logs=True)
        probe = ["--count", str(a.probes + a.warmup), "--warmup", str(a.warmup), "--rate",
                 str(a.rate), "--inflight", str(a.probe_inflight)]
        sub_rec = os.path.join(d.dir, "submit-records")
        run_rec = os.path.join(d.dir, "runsync-records")
        sub = run_loadgen(b, d, ["--wait-workers", str(a.workers), "--record", sub_rec, "probe",
                                 "--rpc", "submit"] + probe, a.timeout)
        run = run_loadgen(b, d, ["--record", run_rec, "probe", "--rpc", "runsync"] + probe,
                          a.timeout)
        wait_drained(d, a.timeout)
        d.stop_workers()
        sub_records = read_records(sub_rec)
        starts = read_start_logs(d.start_logs)
        check_ran_once(d, sub_records + read_records(run_rec), 2 * (a.probes + a.warmup), starts)
        measured = [(job_id, sent) for seq, job_id, sent, _ in sub_records if seq >= a.warmup]
        to_worker = sorted(starts[job_id][0] - sent for job_id, sent in measured)
        # Where the time goes, from the rows' timestamps (the database server's clock, the same
        # CLOCK_REALTIME): created_at is the insert's transaction start, dispatched_at the claim's.
        rows = {r[0]: (int(r[1]), int(r[2])) for r in psql(
            d.url, "SELECT id, (extract(epoch FROM created_at) * 1e6)::int8, "
                   "(extract(epoch FROM dispatched_at) * 1e6)::int8 FROM jobs")}
        to_insert = sorted(rows[j][0] - sent for j, sent in measured)
        to_claim = sorted(rows[j][1] - rows[j][0] for j, _ in measured)
        to_handler = sorted(starts[j][0] - rows[j][1] for j, _ in measured)
        ms = lambda us: round(us / 1000, 3)  # noqa: E731
        return {"probes": len(to_worker),
                "submit_to_worker_p50_ms": ms(percentile(to_worker, 0.5)),
                "submit_to_worker_p99_ms": ms(percentile(to_worker, 0.99)),
                "submit_to_worker_p999_ms": ms(percentile(to_worker, 0.999)),
                "submit_to_worker_max_ms": ms(to_worker[-1]),
                "send_to_insert_p50_ms": ms(percentile(to_insert, 0.5)),
                "insert_to_claim_p50_ms": ms(percentile(to_claim, 0.5)),
                "claim_to_handler_p50_ms": ms(percentile(to_handler, 0.5)),
                "submit_ack_p50_ms": ms(sub["latency_us"]["p50"]),
                "submit_ack_p99_ms": ms(sub["latency_us"]["p99"]),
                "runsync_p50_ms": ms(run["latency_us"]["p50"]),
                "runsync_p99_ms": ms(run["latency_us"]["p99"]),
                "runsync_p999_ms": ms(run["latency_us"]["p999"]),
                "runsync_max_ms": ms(run["latency_us"]["max"]),
                "late_probes": sub["late"] + run["late"]}
    finally:
        d.stop()
        d.drop()


SCENARIOS = {"drain": run_drain, "backlog": run_backlog, "retained": run_retained,
             "e2e": run_e2e, "latency": run_latency}

# Targets: figure -> (">=" or "<=", value). Printed with the ratio figure/target.
TARGETS = {
    "single_submitted_per_s": (">=", 15000),
    "single_completed_per_s": (">=", 15000),
    "submit_to_worker_p50_ms": ("<=", 1.0),
    "submit_to_worker_p99_ms": ("<=", 5.0),
    "runsync_p50_ms": ("<=", 3.0),
}


def target_check(key, value):
    """(text, record) for a figure with a target, or (None, None)."""
    if key not in TARGETS or not isinstance(value, (int, float)):
        return None, None
    op, target = TARGETS[key]
    ratio = value / target
    met = value >= target if op == ">=" else value <= target
    text = f"target {'≥' if op == '>=' else '≤'} {target}: {ratio:.2f}x, {'met' if met else 'not met'}"
    return text, {"target": target, "op": op, "ratio": round(ratio, 3), "met": met}


# ------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        build = os.path.abspath(args.build)
        self.dispatchd = find_binary(build, "dispatchd", "server/daemon")
        self.worker = find_binary(build, "dispatch-worker", "client/cpp")
        self.workdir = tempfile.mkdtemp(prefix="dispatchd-bench-")
        self.pg = Postgres(self.workdir, args.pg_url)

    def loadgen(self):
        return find_binary(os.path.abspath(self.args.build), "dispatch-loadgen", "bench/loadgen")


def median_figures(runs):
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs]
        out[k] = statistics.median(vals) if all(isinstance(v, (int, float)) for v in vals) \
            else vals[0]
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Scenarios:"):])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported)")
    p.add_argument("--jobs", type=int, default=100000)
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--backlog", type=int, default=1000000,
                   help="backlog: queued jobs when the daemon starts")
    p.add_argument("--retained", type=int, default=5000000,
                   help="retained: finished jobs kept in the database")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    g = p.add_argument_group("e2e")
    g.add_argument("--clients", type=int, default=8, help="loadgen clients (channels)")
    g.add_argument("--inflight", type=int, default=64, help="Submit calls in flight per client")
    g.add_argument("--batch", type=int, default=100, help="specs per SubmitBatch call")
    g.add_argument("--batch-inflight", type=int, default=4,
                   help="SubmitBatch calls in flight per client")
    g.add_argument("--loadgen-threads", type=int, default=1,
                   help="dispatch-loadgen completion-queue threads")
    g = p.add_argument_group("latency")
    g.add_argument("--probes", type=int, default=1000, help="probes per kind, after the warm-up")
    g.add_argument("--warmup", type=int, default=20, help="probes per kind left out first")
    g.add_argument("--rate", type=float, default=100, help="probes per second")
    g.add_argument("--probe-inflight", type=int, default=1, help="probes in flight at most")
    p.add_argument("--pg-url", help="use this PostgreSQL server (a database per run is created)")
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--out", help="write OUT.json and OUT.csv (default bench-SCENARIO-TIME)")
    p.add_argument("--no-peer", action="store_true", help="skip the graphile-worker yardstick")
    p.add_argument("--keep-dbs", action="store_true")
    args = p.parse_args()

    if args.pg_url is None:
        os.environ["DISPATCHD_PG_DURABLE"] = "1"
    b = Bench(args)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    try:
        b.pg.start()
        runs = []
        for i in range(1, args.runs + 1):
            r = SCENARIOS[args.scenario](b, i)
            log(f"{args.scenario} run {i}: " + " ".join(f"{k}={v}" for k, v in r.items()))
            runs.append(r)
        peer = None
        if args.scenario == "drain" and not args.no_peer:
            log("graphile-worker yardstick on the same server ...")
            peer = run_peer_drain(b)
            log(f"graphile-worker: {peer}")
    finally:
        b.pg.stop()
        shutil.rmtree(b.workdir, ignore_errors=True)

    med = median_figures(runs)
    command = "python3 bench/bench.py " + " ".join(sys.argv[1:])
    print(f"\n== {args.scenario}: median of {len(runs)} run(s)   ({command})")
    width = max(len(k) for k in med)
    targets = {}
    for k, v in med.items():
        text, record = target_check(k, v)
        print(f"  {k:<{width}}  {v}" + (f"    ({text})" if text else ""))
        if record:
            targets[k] = record
    if peer:
        ratio = med["jobs_per_s"] / peer["best"]
        print(f"  {'graphile-worker':<{width}}  best {peer['best']} jobs/s, runs {peer['runs']}")
        print(f"  {'ratio':<{width}}  {ratio:.2f}x graphile-worker's best")
        med["peer_best_jobs_per_s"] = peer["best"]
        med["ratio_to_peer_best"] = round(ratio, 3)

    out = args.out or f"bench-{args.scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    with open(out + ".json", "w") as f:
        json.dump({"scenario": args.scenario, "command": command, "started": started,
                   "machine": machine_info(), "args": vars(args), "runs": runs, "median": med,
                   "targets": targets, "peer": peer}, f, indent=2)
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run"] + list(runs[0]))
        w.writeheader()
        for i, r in enumerate(runs, 1):
            w.writerow({"run": i, **r})
    print(f"  wrote {out}.json and {out}.csv")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
