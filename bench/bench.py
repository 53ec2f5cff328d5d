#!/usr/bin/env python3
"""dispatchd's throughput benchmarks: the real daemon, PostgreSQL and reference workers.

One entry point for every scenario. It starts its own PostgreSQL 15 with durable settings (fsync
and synchronous_commit on, as in production) or uses --pg-url, runs the named scenario --runs
times on a fresh database each time, prints a table of the medians, and writes every run to
JSON and CSV. Where a peer applies (drain, latency) it runs graphile-worker on the same server in
the same sitting and prints the ratio: ../shared/peers/graphile-yardstick for the drain,
bench/peer/graphile-latency.js for the latency.

Scenarios:
  drain   --jobs no-op jobs (default 100000) queued in the database, then drained by --workers
          reference workers (default 4) x --slots (default 64) in echo mode; jobs/s from the
          first dispatch to the last finish, read from the job rows. Also: the time the daemon
          took to load the backlog at start, and its peak RSS. Peer: graphile-worker. Each run
          is followed by PostgreSQL's ceiling (see ceiling) and prints its fraction of it.
  lab     seed 001's experiment: --tasks (1000; 95% of 1-5 s, 5% of 20-40 s, from a seeded
          generator) over --models (10) job types, queued in the database, run by --workers (8)
          reference workers x --slots (50) that sleep each task's own duration; the same tasks
          through a baseline of seed 001's blocking batch dispatch (--batch-workers 40 threads x
          sub-batches of --sub-batch 10, in this process); then dispatchd again with --rpm (20)
          per model. Makespan against max(longest task, work / slots), completions per second,
          and the rate limit's steady rate and exact bound. See bench/README.md.
  e2e     --clients (8) clients of dispatch-loadgen queue --jobs no-op jobs as fast as they are
          admitted, each with --inflight (64) Submit calls in flight, while the workers drain
          them; then again on a fresh database with SubmitBatch calls of --batch (100) specs,
          --batch-inflight (4) per client. For each: jobs/s submitted (first send to last
          answer) and completed (first send to the last finished_at), and the call latency.
          Each run also drains --jobs preloaded jobs (as `drain`, unless --no-drain) and prints
          each flood's completions over that rate; and submits the same jobs to a daemon with
          no worker, to set each flood's CPU per job against the sum of its parts. And each
          flood's completions as a fraction of PostgreSQL's ceiling (insert_claim_complete.sql).
  submitted
          a daemon that has served a short queue (1000 jobs through its workers, which then
          stop) takes --jobs jobs by SubmitBatch with no worker connected; then the workers
          drain them. jobs/s as `drain` measures it, beside a preloaded drain in the same run,
          and the daemon's time in turn statements per job (its /metrics).
  turncost
          as `submitted`, with single Submit calls, once for each of --queued (10k, 100k and
          1M jobs): the daemon's time in turn statements (run and commit) per job drained at
          each size, and the largest over the smallest.
  latency light load: --probes (1000, after --warmup 20) Submit calls at --rate (100) per
          second, at most --probe-inflight (1) at once, then as many RunSync calls. Submit to
          worker: from the client's send to the worker's handler start (both CLOCK_REALTIME on
          this host, from dispatch-loadgen --record and dispatch-worker --start-log); RunSync
          round trip: send to answer. p50, p99 and p999. Peer (unless --no-peer): after
          dispatchd's runs, --runs runs of bench/peer/graphile-latency.js on the same server: a
          graphile-worker runner (--peer-concurrency 4) in one Node process that adds as many
          probe jobs by add_job, at the same rate, and times add_job's send to the task's start
          (and to add_job's answer). Targets against it, medians of the runs: Submit to worker
          p50 <= 0.35x and p99 <= 0.5x its p50 and p99, RunSync p50 <= 0.6x its p50. Floor
          (unless --no-ceiling): beside each run, bench/ceiling/insert_one.sql (one job inserted
          and committed) from one pgbench client at --rate, --warmup + --probes times, and then
          back to back: PostgreSQL's own commit p50 and p99 at that rate, and Submit to worker
          over them.
  ceiling PostgreSQL alone on the same writes: the pgbench scripts of bench/ceiling/ on
          dispatchd's schema, --ceiling-clients (4) clients: claim_complete.sql claims 100 of
          --jobs queued rows and moves them to jobs_done, insert_claim_complete.sql inserts 100
          first. jobs/s = pgbench transactions x 100 / seconds. drain and e2e run the matching
          one beside each run (unless --no-ceiling) and print their jobs/s as a fraction of it.
  fleet   --fleet-workers (1000) simulated GPU workers (dispatch-fleet, 500 streams per
          process) x --fleet-slots (4) drain --fleet-jobs (20000) queued jobs of 50-500 ms over
          --fleet-models (100) models with VRAM budgets and --fairness-keys (10000) keys: jobs/s
          against the 4-worker drain of --jobs (unless --no-drain) and the fleet's capacity,
          the dispatch decision's cost (dispatchd_dispatch_decision_seconds), Submit to worker
          at light load against 4 workers', daemon CPU per job and peak RSS, its CPU per
          heartbeat while the fleet idles, model loads against their lower bound; then the same
          with one worker flapping every second, and with --join (100) more joining at once
          when half the jobs have been dispatched. See bench/fleet.py and bench/README.md.
  heartbeats
          the daemon's CPU per heartbeat with --fleet-workers (1000) simulated workers connected
          and idle (no job), every --heartbeat-interval (1 s): over --idle-s (5) seconds once
          all have connected, and again --settle-s (60) seconds later, less its CPU with no
          worker.
  security
          drain and latency, each with security off (plaintext loopback, no authentication)
          and on (TLS with an openssl-made P-256 certificate for 127.0.0.1, bearer tokens: a
          client token for the load generator, a worker token for the workers), in the same
          run: the drains one after the other, off first in odd runs and on first in even
          ones; the latency probes of both at the same time, each against its own daemon, so
          that other load on the machine falls on both alike. The medians of each, the
          drain's on/off ratio and the latencies' differences on - off.
  profile where each microsecond of a job goes, for each way jobs arrive (preloaded drain,
          Submit flood, SubmitBatch flood, RunSync): CPU per job by process (the daemon by
          thread, workers, load generator, PostgreSQL by process kind, the rest), WAL records
          and bytes and commits per job, and pg_stat_statements' table per job (see
          bench/cost_profile.py).

e2e and latency fail unless every job the clients were answered for exists, SUCCEEDED at its
first attempt and was started by a worker exactly once, and no other job exists.

Examples:
  python3 bench/bench.py drain
  python3 bench/bench.py drain --jobs 20000 --runs 1 --no-peer      # a quick look
  python3 bench/bench.py lab                                         # 3 runs, ~25 min
  python3 bench/bench.py lab --runs 1 --variant unlimited            # ~3 min
  python3 bench/bench.py drain --pg-url postgresql://me@db:5432/postgres --out /tmp/drain
  python3 bench/bench.py e2e --jobs 20000 --runs 1
  python3 bench/bench.py submitted --jobs 100000
  python3 bench/bench.py turncost --runs 1                           # ~10 min
  python3 bench/bench.py latency --probes 300 --runs 1
  python3 bench/bench.py security --runs 3                         # ~2 min per run
  python3 bench/bench.py ceiling --runs 3                            # ~30 s per run
  python3 bench/bench.py profile --runs 3                            # ~2 min per run
  python3 bench/bench.py fleet --runs 3 --jobs 20000                 # ~2 min per run
  python3 bench/plots.py OUT.json                  # redraw OUT.png from a sitting's files

Each sitting also draws OUT.png, its scenario's figure, from OUT.csv and OUT.json (bench/plots.py;
--no-plot skips it). That needs matplotlib (Debian: python3-matplotlib, for /usr/bin/python3);
without it the sitting says so and goes on.

Python 3 standard library only, plus matplotlib for the plot; needs the binaries in build/ (or
--build) and psql.
"""

import argparse
import csv
import datetime
import json
import os
import shutil
import signal
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "sched"))

# The PostgreSQL and output helpers are shared with the scheduler benchmark; the daemon, worker
# and load generator processes, and what they leave, are in harness.py; one drain or latency
# measurement in measure.py; the e2e, submitted and turncost scenarios in client_scenarios.py;
# the lab scenario's run and table in lab_run.py; the graphile-worker peer's runs and the ratios
# to it in peers.py.
from sched_e2e_bench import BenchError, Postgres, find_binary, log, machine_info  # noqa: E402
import lab  # noqa: E402
from measure import (  # noqa: E402
    drain_once, latency_once, median_figures, run_security, security_summary)
from lab_run import lab_summary, print_lab, run_lab, write_lab_series  # noqa: E402
from client_scenarios import run_e2e, run_submitted, run_turncost  # noqa: E402
import ceiling  # noqa: E402
import cost_profile as profile  # noqa: E402
import fleet  # noqa: E402
import peers  # noqa: E402
import plots  # noqa: E402

# ------------------------------------------------------------------------------------------------
# Scenarios. Each returns one dict of figures per run.


def run_drain(b, i):
    out = drain_once(b, f"drain-{i}", b.args.jobs)
    return ceiling.add_ceiling(b, i, out, "claim_complete", {"jobs_per_s": "fraction_of_ceiling"})


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


def run_latency(b, i):
    return ceiling.add_floor(b, i, latency_once(b, f"latency-{i}"))


# Targets: figure -> (">=" or "<=", value). Printed with the ratio figure/target.
TARGETS = {
    "single_submitted_per_s": (">=", 15000),
    "single_completed_per_s": (">=", 15000),
    "submit_to_worker_p50_ms": ("<=", 1.0),
    "submit_to_worker_p99_ms": ("<=", 5.0),
    "runsync_p50_ms": ("<=", 3.0),
    # Jobs that arrive while the workers drain, or before they start, against the same run's
    # preloaded drain; the turn's cost per job from 10k to 1M queued.
    "single_completed_to_drain": (">=", 0.8),
    "batch_completed_to_drain": (">=", 0.9),
    "single_cpu_over_parts": ("<=", 1.1),
    "batch_cpu_over_parts": ("<=", 1.1),
    "submitted_to_drain": (">=", 0.9),
    "largest_to_smallest": ("<=", 1.5),
    # What TLS and tokens cost (security): the drain's rate and the light-load latency.
    "drain_on_to_off": (">=", 0.9),
    "submit_to_worker_p50_on_minus_off_ms": ("<=", 0.3),
    **fleet.TARGETS,
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

SCENARIOS = {"drain": run_drain, "backlog": run_backlog, "retained": run_retained,
             "e2e": run_e2e, "submitted": run_submitted, "turncost": run_turncost,
             "latency": run_latency, "lab": run_lab, "security": run_security,
             "ceiling": ceiling.run_ceiling, "profile": profile.run_profile,
             "fleet": fleet.run_fleet, "heartbeats": fleet.run_heartbeats}


# ------------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, args):
        self.args = args
        build = os.path.abspath(args.build)
        self.dispatchd = find_binary(build, "dispatchd", "server/daemon")
        self.worker = find_binary(build, "dispatch-worker", "client/cpp")
        self.workdir = tempfile.mkdtemp(prefix="dispatchd-bench-")
        self.pg = Postgres(self.workdir, args.pg_url)
        self.security = None  # harness.Security, made by the first run that needs it

    def loadgen(self):
        return find_binary(os.path.abspath(self.args.build), "dispatch-loadgen", "bench/loadgen")

    def fleet(self):
        return find_binary(os.path.abspath(self.args.build), "dispatch-fleet", "bench/fleet")


def draw_plot(out):
    """OUT.png from the sitting's OUT.csv and OUT.json (bench/plots.py): its path, or None. No
    plot costs the sitting nothing, since its figures are written already; the log says why there
    is none and how to draw it later."""
    redraw = f"/usr/bin/python3 bench/plots.py {out}.json"
    try:
        png = plots.draw(out)
        if png is None:
            log(f"no plot; once matplotlib is there: {redraw}")
        return png
    except plots.PlotError as e:
        log(f"no plot: {e}")
    except Exception:  # a plotting bug must not fail a sitting whose figures are written
        log(f"no plot: bench/plots.py failed ({redraw} to retry):\n{traceback.format_exc()}")
    return None


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Scenarios:"):])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported)")
    p.add_argument("--jobs", type=int, default=100000,
                   help="drain, retained and backlog's drain, e2e, ceiling: jobs")
    p.add_argument("--workers", type=int, help="reference workers (lab 8, others 4)")
    p.add_argument("--slots", type=int, help="slots per worker (lab 50, others 64)")
    p.add_argument("--backlog", type=int, default=1000000,
                   help="backlog: queued jobs when the daemon starts")
    p.add_argument("--retained", type=int, default=5000000,
                   help="retained: finished jobs kept in the database")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    p.add_argument("--no-drain", action="store_true",
                   help="e2e: skip the preloaded drain run beside the floods; fleet: skip the "
                        "4-worker drain and probes")
    p.add_argument("--queued", type=lambda v: [int(x) for x in v.split(",")],
                   default=[10000, 100000, 1000000],
                   help="turncost: queue sizes, comma-separated (default 10000,100000,1000000)")
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
    g.add_argument("--peer-concurrency", type=int, default=4,
                   help="graphile-worker's concurrency for its latency probes")
    p.add_argument("--pg-url", help="use this PostgreSQL server (a database per run is created)")
    p.add_argument("--pg-locale",
                   help="initdb the private server with this locale (e.g. en_US.UTF-8, as many "
                        "production servers are) instead of C; not with --pg-url")
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--pool-size", type=int,
                   help="the daemon's postgres.pool_size (default: the daemon's own default)")
    p.add_argument("--turns-in-flight", type=int,
                   help="the daemon's postgres.turns_in_flight (default: the daemon's own default)")
    p.add_argument("--out",
                   help="write OUT.json, OUT.csv and OUT.png (default bench-SCENARIO-TIME)")
    p.add_argument("--no-plot", action="store_true",
                   help="do not draw OUT.png (redraw it later: python3 bench/plots.py OUT.json)")
    p.add_argument("--no-peer", action="store_true",
                   help="skip the graphile-worker peer (drain, latency)")
    p.add_argument("--keep-dbs", action="store_true")
    ceiling.add_arguments(p)
    profile.add_arguments(p)
    fleet.add_arguments(p)
    g = p.add_argument_group("lab")
    g.add_argument("--tasks", type=int, default=1000, help="tasks per run")
    g.add_argument("--models", type=int, default=10, help="models (one job type each)")
    g.add_argument("--seed", type=int, default=1, help="run i draws its tasks with seed SEED+i-1")
    g.add_argument("--variant", choices=["both", "unlimited", "ratelimit"], default="both",
                   help="dispatchd runs: without a rate limit, with --rpm per model, or both")
    g.add_argument("--no-baseline", action="store_true", help="skip the blocking-batch baseline")
    g.add_argument("--gpu-models", action="store_true",
                   help="give each type a `model` (GPU affinity) instead of remote models")
    g.add_argument("--policy", choices=["fair", "fifo"], default="fair",
                   help="dispatchd's scheduler.policy (fifo: arrival order, no model affinity)")
    g.add_argument("--batch-workers", type=int, default=40,
                   help="baseline: fixed batches, one thread each (seed 001: 20)")
    g.add_argument("--sub-batch", type=int, default=10, help="baseline: tasks per blocking call")
    g.add_argument("--rpm", type=float, default=20, help="rate-limited run: rpm per model")
    g.add_argument("--burst", type=int, default=1, help="rate-limited run: burst per model")
    g.add_argument("--rate-warmup", type=float, default=60,
                   help="rate-limited run: seconds after the first hand-out left out of the rate")
    g.add_argument("--stamp-tolerance-ms", type=float, default=lab.STAMP_TOLERANCE_MS,
                   help="rate-limited run: an excess over the bucket bound worth less hand-out "
                        "time than this is reported as dispatched_at's jitter, not a miss")
    args = p.parse_args()
    defaults = {"lab": (8, 50)}.get(args.scenario, (4, 64))  # seed 001's 8 x 50 for lab
    args.workers = args.workers or defaults[0]
    args.slots = args.slots or defaults[1]
    if args.pg_locale and args.pg_url:
        p.error("--pg-locale sets up the private server; a --pg-url server has its own locale")
    if args.pg_url is None:
        os.environ["DISPATCHD_PG_DURABLE"] = "1"
        if args.pg_locale:
            os.environ["DISPATCHD_PG_LOCALE"] = args.pg_locale
        if args.scenario == "profile":
            os.environ["DISPATCHD_PG_OPTIONS"] = profile.PG_OPTIONS
    b = Bench(args)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    details, tables = [], []  # lab's series, profile's statement tables
    try:
        b.pg.start()
        runs = []
        for i in range(1, args.runs + 1):
            r = SCENARIOS[args.scenario](b, i)
            if "detail" in r:
                details.append(r.pop("detail"))
            if "tables" in r:
                tables.append(r.pop("tables"))
            shown = {k: v for k, v in r.items()
                     if args.scenario != "lab" or k.endswith(("makespan_s", "rate_steady_per_s"))}
            log(f"{args.scenario} run {i}: " + " ".join(f"{k}={v}" for k, v in shown.items()))
            runs.append(r)
        peer = None
        if args.scenario == "drain" and not args.no_peer:
            log("graphile-worker yardstick on the same server ...")
            peer = peers.run_peer_drain(b)
            log(f"graphile-worker: {peer}")
        elif args.scenario == "latency" and not args.no_peer:
            log("graphile-worker's latency on the same server ...")
            peer = peers.run_peer_latency(b)
    finally:
        b.pg.stop()
        shutil.rmtree(b.workdir, ignore_errors=True)

    command = "python3 bench/bench.py " + " ".join(sys.argv[1:])
    targets = {}
    if args.scenario == "lab":
        med = lab_summary(runs)
        print_lab(med, args, len(runs), command)
        width = 0
    else:
        med = median_figures(runs)
        if args.scenario == "security":
            med.update(security_summary(med, runs))
        print(f"\n== {args.scenario}: median of {len(runs)} run(s)   ({command})")
        m = machine_info()
        print(f"   machine: {m['cpu']}, {m['nproc']} cores, {m['memory']}, Linux {m['kernel']}")
        width = max(len(k) for k in med)
        for k, v in med.items():
            text, record = target_check(k, v)
            print(f"  {k:<{width}}  {v}" + (f"    ({text})" if text else ""))
            if record:
                targets[k] = record
    if tables:
        profile.print_tables(tables[-1], len(tables))
    if peer and args.scenario == "latency":
        peers.report_latency(med, targets, peer, width)
    elif peer:
        peers.report_drain(med, targets, peer, width)

    out = args.out or f"bench-{args.scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    doc = {"scenario": args.scenario, "command": command, "started": started,
           "machine": machine_info(), "args": vars(args), "runs": runs, "median": med,
           "targets": targets, "peer": peer, "tables": tables,
           # Other work on the machine: the 1, 5 and 15 min load averages before and after.
           "loadavg": {"before": load_before, "after": os.getloadavg()}}
    with open(out + ".json", "w") as f:
        text = json.dumps(doc, indent=2)
        if details:  # the per-task and per-second lists on one line each
            text = (text[:-2] + ',\n  "details": [\n    ' +
                    ",\n    ".join(json.dumps(d) for d in details) + "\n  ]\n}")
        f.write(text + "\n")
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run"] + list(runs[0]))
        w.writeheader()
        for i, r in enumerate(runs, 1):
            w.writerow({"run": i, **r})
    written = [out + ".json", out + ".csv"]
    if details:
        write_lab_series(out + "-series.csv", runs, details)
        written.append(out + "-series.csv")
    if not args.no_plot:
        png = draw_plot(out)  # after the files it draws from
        if png:
            written.append(png)
    print(f"  wrote {', '.join(written[:-1])} and {written[-1]}")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
