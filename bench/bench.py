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

Examples:
  python3 bench/bench.py drain
  python3 bench/bench.py drain --jobs 20000 --runs 1 --no-peer      # a quick look
  python3 bench/bench.py drain --pg-url postgresql://me@db:5432/postgres --out /tmp/drain

Python 3 standard library only; needs the binaries in build/ (or --build) and psql.
"""

import argparse
import csv
import datetime
import json
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

    def start_workers(self, n, types, slots):
        for i in range(1, n + 1):
            argv = [self.b.worker, "--server", self.addr, "--id", f"w{i}", "--types",
                    ",".join(types), "--slots", str(slots), "--echo", "--log-level", "warn"]
            self.workers.append(spawn(argv, os.path.join(self.dir, f"worker-w{i}.log")))

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


SCENARIOS = {"drain": run_drain, "backlog": run_backlog, "retained": run_retained}


# ------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        build = os.path.abspath(args.build)
        self.dispatchd = find_binary(build, "dispatchd", "server/daemon")
        self.worker = find_binary(build, "dispatch-worker", "client/cpp")
        self.workdir = tempfile.mkdtemp(prefix="dispatchd-bench-")
        self.pg = Postgres(self.workdir, args.pg_url)


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
    for k, v in med.items():
        print(f"  {k:<{width}}  {v}")
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
                   "peer": peer}, f, indent=2)
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
