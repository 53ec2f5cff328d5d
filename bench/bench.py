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
          no worker, to set each flood's CPU per job against the sum of its parts.
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
          round trip: send to answer. p50, p99 and p999.
  security
          drain and latency, each with security off (plaintext loopback, no authentication)
          and on (TLS with an openssl-made P-256 certificate for 127.0.0.1, bearer tokens: a
          client token for the load generator, a worker token for the workers), in the same
          run: the drains one after the other, off first in odd runs and on first in even
          ones; the latency probes of both at the same time, each against its own daemon, so
          that other load on the machine falls on both alike. The medians of each, the
          drain's on/off ratio and the latencies' differences on - off.

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

Python 3 standard library only; needs the binaries in build/ (or --build) and psql.
"""

import argparse
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
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(HERE, "sched"))

# The PostgreSQL and output helpers are shared with the scheduler benchmark; the daemon, worker
# and load generator processes, and what they leave, are in harness.py.
from sched_e2e_bench import (  # noqa: E402
    BenchError, Postgres, find_binary, log, machine_info, psql)
import lab  # noqa: E402
from harness import (  # noqa: E402
    Daemon, Security, check_ran_once, cpu_figures, cpu_seconds, keep_finished_jobs, machine_busy,
    percentile, queue_noop_jobs, read_records, read_start_logs, rss_kib, run_loadgen,
    wait_drained)

PEER = os.path.join(os.path.dirname(REPO), "shared", "peers", "graphile-yardstick")


# ------------------------------------------------------------------------------------------------
# Scenarios. Each returns one dict of figures per run.


def drain_once(b, name, jobs, finished=0, security=None):
    """One drain: `jobs` queued no-op jobs (after `finished` SUCCEEDED ones kept for Status),
    loaded by a fresh daemon and drained by the workers. Figures from the job rows. With
    `security` (harness.Security) the daemon serves TLS and checks tokens, and the workers
    present theirs."""
    a = b.args
    d = Daemon(b, name, security)
    try:
        d.start(["noop"])  # creates the schema
        d.stop()
        if finished:
            keep_finished_jobs(d.url, finished, "noop")
        queue_noop_jobs(d.url, jobs, "noop")
        started = time.time()
        load_s = d.start(["noop"])
        busy0, daemon0 = machine_busy(), cpu_seconds(d.proc.pid)
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
        busy1, daemon1 = machine_busy(), cpu_seconds(d.proc.pid)
        workers_cpu = sum(cpu_seconds(w.pid) or 0 for w in d.workers)
        row = psql(d.url, "SELECT count(*), extract(epoch FROM max(finished_at) - "
                          "min(dispatched_at)), count(*) FILTER (WHERE state = 'SUCCEEDED'), "
                          "extract(epoch FROM min(dispatched_at)) "
                          "FROM jobs_done WHERE id NOT LIKE 'f%'")[0]
        n, span, ok = int(row[0]), float(row[1]), int(row[2])
        if ok != n or n != jobs:
            raise BenchError(f"drain: {ok} of {jobs} jobs succeeded ({n} rows); logs in {d.dir}")
        out = {"jobs": n, "seconds": round(span, 3), "jobs_per_s": round(n / span),
               "load_s": round(load_s, 2),
               "first_dispatch_s": round(float(row[3]) - started, 2),
               "daemon_peak_rss_mib": round(peak_rss / 1024, 1)}
        out.update(cpu_figures("", n, busy0, busy1, {
            "daemon": None if daemon0 is None or daemon1 is None else daemon1 - daemon0,
            "workers": workers_cpu}))
        return out
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


def e2e_variant(b, i, variant, batch, inflight):
    """One flood on a fresh database: single Submit calls (batch 1) or SubmitBatch."""
    a = b.args
    d = Daemon(b, f"e2e-{variant}-{i}")
    try:
        d.start(["noop"])
        d.start_workers(a.workers, ["noop"], a.slots, start_logs=True)
        cpu0, busy0 = cpu_seconds(d.proc.pid), machine_busy()
        rec = os.path.join(d.dir, "records")
        s = run_loadgen(b, d, ["--wait-workers", str(a.workers), "--record", rec, "flood",
                               "--jobs", str(a.jobs), "--clients", str(a.clients),
                               "--inflight", str(inflight), "--batch", str(batch),
                               "--threads", str(a.loadgen_threads)], a.timeout)
        wait_drained(d, a.timeout)
        last_finish = float(psql(d.url, "SELECT extract(epoch FROM max(finished_at)) "
                                        "FROM jobs")[0][0])
        cpu1, busy1 = cpu_seconds(d.proc.pid), machine_busy()
        workers_cpu = sum(cpu_seconds(w.pid) or 0 for w in d.workers)
        d.stop_workers()
        check_ran_once(d, read_records(rec), a.jobs, read_start_logs(d.start_logs))
        start = s["start_us"] / 1e6
        lat = s["latency_us"]
        v = variant
        cpu = cpu_figures(f"{v}_", a.jobs, busy0, busy1, {
            "daemon": None if cpu0 is None or cpu1 is None else cpu1 - cpu0,
            "workers": workers_cpu, "loadgen": s["cpu_s"]})
        return {**cpu, f"{v}_submitted_per_s": round(s["jobs"] / s["seconds"]),
                f"{v}_completed_per_s": round(s["jobs"] / (last_finish - start)),
                f"{v}_call_p50_ms": round(lat["p50"] / 1000, 2),
                f"{v}_call_p99_ms": round(lat["p99"] / 1000, 2),
                f"{v}_refused_calls": s["resource_exhausted"],
                f"{v}_loadgen_cpu_s": s["cpu_s"],
                f"{v}_daemon_cpu_s": round(cpu1 - cpu0, 2) if cpu0 is not None and cpu1 else None}
    finally:
        d.stop()
        d.drop()


def submit_only_cpu(b, i, variant, batch, inflight):
    """The machine's CPU per job to submit --jobs jobs as e2e's `variant` does, with no worker
    connected: what the submissions cost apart from the drain."""
    a = b.args
    d = Daemon(b, f"submit-only-{variant}-{i}")
    try:
        d.start(["noop"])
        busy0 = machine_busy()
        run_loadgen(b, d, ["flood", "--jobs", str(a.jobs), "--clients", str(a.clients),
                           "--inflight", str(inflight), "--batch", str(batch),
                           "--threads", str(a.loadgen_threads)], a.timeout)
        busy1 = machine_busy()
        return round((busy1[0] - busy0[0]) / a.jobs * 1e6, 1)
    finally:
        d.stop()
        d.drop()


def run_e2e(b, i):
    """Both floods, and a preloaded drain of as many jobs in the same run to compare with: jobs
    that arrive while the workers drain should complete as fast as a backlog loaded at start.
    Where the machine's CPU is the limit, they complete as fast as the submissions' own cost
    allows: each variant's CPU per job is also set against the sum of what the same submissions
    cost with no worker connected and what the preloaded drain cost (`*_cpu_over_parts`, 1.0
    when doing both at once costs no more than doing them apart)."""
    a = b.args
    out = {"jobs": a.jobs}
    out.update(e2e_variant(b, i, "single", 1, a.inflight))
    out.update(e2e_variant(b, i, "batch", a.batch, a.batch_inflight))
    if not a.no_drain:
        drain = drain_once(b, f"drain-{i}", a.jobs)
        out["drain_jobs_per_s"] = drain["jobs_per_s"]
        for k in ("cpu_us_per_job", "cpu_busy_share", "daemon_cpu_us_per_job",
                  "workers_cpu_us_per_job"):
            out[f"drain_{k}"] = drain[k]
        for v, batch, inflight in (("single", 1, a.inflight),
                                   ("batch", a.batch, a.batch_inflight)):
            out[f"{v}_completed_to_drain"] = round(
                out[f"{v}_completed_per_s"] / out["drain_jobs_per_s"], 3)
            apart = submit_only_cpu(b, i, v, batch, inflight)
            out[f"{v}_submit_only_cpu_us_per_job"] = apart
            out[f"{v}_cpu_over_parts"] = round(
                out[f"{v}_cpu_us_per_job"] / (apart + drain["cpu_us_per_job"]), 3)
    return out


def warm_up(b, d, jobs=1000):
    """Runs `jobs` jobs through d's workers, then stops them: a daemon that has served a short
    queue, whose store sessions have planned their statements on a small table, as a daemon in
    production has before a burst. Then its queue fills with no worker to drain it."""
    a = b.args
    d.start_workers(a.workers, ["noop"], a.slots)
    run_loadgen(b, d, ["--wait-workers", str(a.workers), "flood", "--jobs", str(jobs),
                       "--clients", "1", "--inflight", "16", "--batch", "1"], a.timeout)
    wait_drained(d, a.timeout)
    d.stop_workers()


def drain_submitted(b, d, jobs, batch, inflight):
    """Queues `jobs` into the running daemon d with no worker connected (SubmitBatch calls of
    `batch`, or Submit calls when batch is 1), then starts the workers and drains them. Figures
    from the rows, as drain_once's: jobs/s from the first dispatch to the last finish of the
    jobs queued, plus the daemon's turn statements over the drain, from its /metrics."""
    a = b.args
    t0, busy0 = time.time(), machine_busy()
    run_loadgen(b, d, ["flood", "--jobs", str(jobs), "--clients", str(a.clients), "--inflight",
                       str(inflight), "--batch", str(batch),
                       "--threads", str(a.loadgen_threads)], a.timeout)
    submit_s, busy1 = time.time() - t0, machine_busy()
    m0 = d.metrics()
    started = time.time()
    d.start_workers(a.workers, ["noop"], a.slots)
    wait_drained(d, a.timeout)
    m1, busy2 = d.metrics(), machine_busy()
    row = psql(d.url, "SELECT count(*), extract(epoch FROM max(finished_at) - min(dispatched_at)), "
                      "count(*) FILTER (WHERE state = 'SUCCEEDED') FROM jobs_done "
                      f"WHERE dispatched_at >= to_timestamp({started})")[0]
    n, span, ok = int(row[0]), float(row[1]), int(row[2])
    if ok != n or n != jobs:
        raise BenchError(f"submitted drain: {ok} of {jobs} jobs succeeded ({n} rows); "
                         f"logs in {d.dir}")
    delta = lambda name: (m1.get((name, 'op="turn"'), 0.0) - m0.get((name, 'op="turn"'), 0.0))
    turn_s = delta("dispatchd_store_commit_seconds_sum")
    statements = max(1.0, delta("dispatchd_store_batch_rows_count"))
    return {"jobs": n, "submit_s": round(submit_s, 2), "seconds": round(span, 3),
            "jobs_per_s": round(n / span),
            # The machine's CPU per job while the jobs were submitted, and while they drained.
            "submit_cpu_us_per_job": round((busy1[0] - busy0[0]) / n * 1e6, 1),
            "drain_cpu_us_per_job": round((busy2[0] - busy1[0]) / n * 1e6, 1),
            "turns": int(delta("dispatchd_store_commit_seconds_count")),
            "turn_us_per_job": round(turn_s / n * 1e6, 2),
            "turn_rows_per_statement": round(delta("dispatchd_store_batch_rows_sum") / statements,
                                             1)}


def run_submitted(b, i):
    """--jobs queued by SubmitBatch into a running daemon that has served before, then drained;
    beside a drain of as many jobs loaded before the daemon started, in the same run."""
    a = b.args
    plain = drain_once(b, f"drain-{i}", a.jobs)
    d = Daemon(b, f"submitted-{i}")
    try:
        d.serve_metrics()
        d.start(["noop"])
        warm_up(b, d)
        sub = drain_submitted(b, d, a.jobs, a.batch, a.batch_inflight)
        d.stop_workers()
    finally:
        d.stop()
        d.drop()
    return {"drain_jobs_per_s": plain["jobs_per_s"], "submitted_jobs_per_s": sub["jobs_per_s"],
            "submitted_to_drain": round(sub["jobs_per_s"] / plain["jobs_per_s"], 3),
            "drain_cpu_us_per_job": plain["cpu_us_per_job"],
            "submitted_drain_cpu_us_per_job": sub["drain_cpu_us_per_job"],
            "submit_cpu_us_per_job": sub["submit_cpu_us_per_job"],
            "submit_s": sub["submit_s"], "turn_us_per_job": sub["turn_us_per_job"],
            "turn_rows_per_statement": sub["turn_rows_per_statement"]}


def run_turncost(b, i):
    """For each of --queued (10k, 100k, 1M): a daemon that has served a short queue takes that
    many Submit calls with no worker connected, then its workers drain them. The daemon's time in
    turn statements (run and commit, from /metrics) per job drained, at each size, and the
    largest over the smallest."""
    a = b.args
    out = {}
    for n in a.queued:
        d = Daemon(b, f"turncost-{n}-{i}")
        try:
            d.serve_metrics()
            d.start(["noop"])
            warm_up(b, d)
            r = drain_submitted(b, d, n, 1, a.inflight)
            d.stop_workers()
        finally:
            d.stop()
            d.drop()
        log(f"  turncost run {i}: {n} queued: {r}")
        out[f"q{n}_turn_us_per_job"] = r["turn_us_per_job"]
        out[f"q{n}_jobs_per_s"] = r["jobs_per_s"]
        out[f"q{n}_turn_rows_per_statement"] = r["turn_rows_per_statement"]
        out[f"q{n}_submit_cpu_us_per_job"] = r["submit_cpu_us_per_job"]
        out[f"q{n}_drain_cpu_us_per_job"] = r["drain_cpu_us_per_job"]
    costs = [out[f"q{n}_turn_us_per_job"] for n in a.queued]
    out["largest_to_smallest"] = round(costs[-1] / costs[0], 3)
    return out


def run_latency(b, i):
    return latency_once(b, f"latency-{i}")


def latency_start(b, name, security=None):
    """A fresh daemon (with `security`, as drain_once's) and its workers, for the probes."""
    a = b.args
    d = Daemon(b, name, security)
    d.start(["noop"])
    d.start_workers(a.workers, ["noop"], a.slots, start_logs=True)
    return d


def latency_probe(b, d, rpc):
    """The light-load probes of `rpc` (submit or runsync) against d: the load generator's
    summary; its records go to d.dir."""
    a = b.args
    probe = ["--count", str(a.probes + a.warmup), "--warmup", str(a.warmup), "--rate",
             str(a.rate), "--inflight", str(a.probe_inflight)]
    wait = ["--wait-workers", str(a.workers)] if rpc == "submit" else []
    return run_loadgen(b, d, wait + ["--record", os.path.join(d.dir, f"{rpc}-records"), "probe",
                                     "--rpc", rpc] + probe, a.timeout)


def latency_once(b, name, security=None):
    """Submit probes, then RunSync probes, at light load on a fresh daemon (with `security`, as
    drain_once's); the figures from the load generator's records and the workers' start logs."""
    d = latency_start(b, name, security)
    try:
        return latency_figures(b, d, latency_probe(b, d, "submit"), latency_probe(b, d, "runsync"))
    finally:
        d.stop()
        d.drop()


def latency_side_by_side(b, names, securities):
    """latency_once for several configurations at once: a daemon and workers each, probed at the
    same time (each at --rate), so that whatever else loads the machine weighs on all of them
    alike. A list of figures, one per name."""
    ds = []
    try:
        for name, sec in zip(names, securities):
            ds.append(latency_start(b, name, sec))
        figures = [{} for _ in ds]
        for rpc in ("submit", "runsync"):
            results, errors = [None] * len(ds), []

            def probe(k):
                try:
                    results[k] = latency_probe(b, ds[k], rpc)
                except BenchError as e:
                    errors.append(e)

            threads = [threading.Thread(target=probe, args=(k,)) for k in range(len(ds))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]
            for k, r in enumerate(results):
                figures[k][rpc] = r
        return [latency_figures(b, d, f["submit"], f["runsync"]) for d, f in zip(ds, figures)]
    finally:
        for d in ds:
            d.stop()
            d.drop()


def latency_figures(b, d, sub, run):
    """latency_once's figures from d's probes (`sub`, `run`: the load generator's summaries);
    stops d's workers once every job has run."""
    a = b.args
    sub_rec = os.path.join(d.dir, "submit-records")
    run_rec = os.path.join(d.dir, "runsync-records")
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


# The figures of drain and latency that `security` sets side by side, off and on.
SECURITY_DRAIN = ("jobs_per_s", "cpu_us_per_job", "daemon_cpu_us_per_job",
                  "workers_cpu_us_per_job")
SECURITY_LATENCY = ("submit_to_worker_p50_ms", "submit_to_worker_p99_ms", "submit_ack_p50_ms",
                    "runsync_p50_ms", "runsync_p99_ms")


def run_security(b, i):
    """The drain and the latency probes, each once with security off (plaintext on loopback, no
    authentication: the default) and once on (TLS with a certificate for 127.0.0.1, bearer tokens:
    the load generator's of role client, the workers' of role worker), in the same run. The drains
    (each takes the whole machine) run one after the other: odd runs off first, even runs on
    first, so that a drift over the sitting falls on both. The latency probes of the two run at
    the same time, each against its own daemon and workers, so that the machine's other load,
    which moves a light-load p50 by milliseconds from one minute to the next, falls on both."""
    a = b.args
    if b.security is None:
        b.security = Security(os.path.join(b.workdir, "security"), ["noop"])
    order = [("off", None), ("on", b.security)]
    if i % 2 == 0:
        order.reverse()
    out = {"order": "-".join(tag for tag, _ in order)}
    for tag, sec in order:
        r = drain_once(b, f"drain-{tag}-{i}", a.jobs, security=sec)
        out.update({f"drain_{tag}_{k}": r[k] for k in SECURITY_DRAIN})
    # The latency probes of both at once: a light load each, under the same noise.
    figures = latency_side_by_side(b, [f"latency-{tag}-{i}" for tag, _ in order],
                                   [sec for _, sec in order])
    for (tag, _), r in zip(order, figures):
        out.update({f"latency_{tag}_{k}": r[k] for k in SECURITY_LATENCY})
    # The same comparisons within this run (their medians are printed as `paired_*`).
    out["paired_drain_on_to_off"] = round(out["drain_on_jobs_per_s"] /
                                          out["drain_off_jobs_per_s"], 3)
    out["paired_submit_to_worker_p50_on_minus_off_ms"] = round(
        out["latency_on_submit_to_worker_p50_ms"] - out["latency_off_submit_to_worker_p50_ms"], 3)
    return out


def security_summary(med, runs):
    """What security costs, from the medians of each configuration: the drain's ratio and the
    latencies' differences (on - off)."""
    out = {"order": ", ".join(r["order"] for r in runs),
           "drain_on_to_off": round(med["drain_on_jobs_per_s"] / med["drain_off_jobs_per_s"], 3)}
    for k in SECURITY_LATENCY:
        out[f"{k[:-3]}_on_minus_off_ms"] = round(med[f"latency_on_{k}"] - med[f"latency_off_{k}"],
                                                 3)
    return out


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

def lab_types(a, rpm):
    """One job type per model, lab.m0 .. lab.mN; with `rpm`, each model's token bucket. No tier,
    no max_concurrency and no VRAM figure: nothing but the slots holds the run below 400.

    Seed 001's models are remote LLM services: quotas, not weights loaded on a GPU. So by default
    a type names no `model` (its rate limit is its own, and the scheduler has no model to keep
    workers on); --gpu-models names one per type, which brings model affinity in."""
    return [{"name": f"lab.m{k}", "model": f"m{k}" if a.gpu_models else None,
             "rpm": rpm, "burst": a.burst if rpm else None} for k in range(a.models)]


def queue_lab_tasks(url, tasks, chunk=2000):
    """Inserts the tasks as QUEUED jobs `lab-<index>` in task order (seq follows the index), each
    payload the task's duration for `dispatch-worker --sleep-payload`, e.g. `3.217s`. In chunks,
    so that no statement outgrows a command-line argument."""
    for at in range(0, len(tasks), chunk):
        part = tasks[at:at + chunk]
        types = ",".join(f"lab.{t.model}" for t in part)
        payloads = ",".join(f"{t.seconds:.3f}s" for t in part)
        psql(url, "INSERT INTO jobs_active (id, type, payload, fairness_key, state, max_attempts, "
                  f"timeout_ms, created_at, updated_at) SELECT 'lab-' || (i - 1 + {at}), t, "
                  "convert_to(p, 'UTF8'), 'lab', 'QUEUED', 3, 600000, now(), now() "
                  f"FROM unnest('{{{types}}}'::text[], '{{{payloads}}}'::text[]) "
                  "WITH ORDINALITY AS x(t, p, i) ORDER BY i", timeout=300)
    psql(url, "VACUUM ANALYZE jobs_active", timeout=300)


def run_lab_dispatchd(b, i, tasks, rpm):
    """One run of the tasks on dispatchd: the backlog queued before the daemon starts (it loads
    it), then the workers. Returns ({task index: Timeline}, figures of the run itself)."""
    a = b.args
    d = Daemon(b, f"lab-{i}-{'rpm' if rpm else 'free'}")
    types = lab_types(a, rpm)
    names = [t["name"] for t in types]
    try:
        d.start(types, a.policy)  # creates the schema
        d.stop()
        queue_lab_tasks(d.url, tasks)
        d.start(types, a.policy)
        d.start_workers(a.workers, names, a.slots, mode=["--sleep-payload"])
        t_start = time.time()
        deadline = t_start + a.timeout
        last_log = t_start
        while True:
            d.check_alive()
            if not d.any_active():
                break
            if time.time() > deadline:
                raise BenchError(f"lab did not finish in {a.timeout} s; logs in {d.dir}")
            if time.time() - last_log > 60:
                log(f"  lab run {i}{' (rpm)' if rpm else ''}: {time.time() - t_start:.0f} s ...")
                last_log = time.time()
            time.sleep(0.5 if rpm is None else 2)
        rows = psql(d.url, "SELECT id, state, attempt, worker_id, extract(epoch FROM dispatched_at), "
                           "extract(epoch FROM started_at), extract(epoch FROM finished_at) "
                           "FROM jobs", timeout=300)
    finally:
        d.stop()
        d.drop()
    timeline, first_by_worker, retried = {}, {}, 0
    failed = [r[0] for r in rows if r[1] != "SUCCEEDED"]
    if failed or len(rows) != len(tasks):
        raise BenchError(f"lab: {len(failed)} of {len(rows)} jobs did not succeed "
                         f"(e.g. {failed[:3]}); logs in {d.dir}")
    for job_id, _state, attempt, worker, disp, start, fin in rows:
        handed, finished = float(disp), float(fin)
        started = float(start) if start else handed  # a result may overtake its RUNNING mark
        timeline[int(job_id[len("lab-"):])] = lab.Timeline(handed, started, finished, finished)
        first_by_worker[worker] = min(first_by_worker.get(worker, math.inf), handed)
        retried += int(attempt) > 1
    return timeline, {
        "retried": retried, "workers_used": len(first_by_worker),
        # How far apart the workers got their first job: the stagger of their connections.
        "worker_first_handout_spread_s": lab.r3(max(first_by_worker.values()) -
                                                min(first_by_worker.values()))}


def run_lab(b, i):
    """One run: a task set from seed --seed + i - 1, through the baseline, dispatchd, and dispatchd
    with --rpm per model (as --variant and --no-baseline say). Flat figures, one key per system and
    figure (`dispatchd.makespan_s`), plus "detail": the tasks, per-second series and timelines."""
    a = b.args
    seed = a.seed + i - 1
    tasks = lab.make_tasks(a.tasks, a.models, seed)
    slots = a.workers * a.slots
    durations = [t.seconds for t in tasks]
    figs = {
        "seed": seed, "tasks": len(tasks),
        "long_tasks": sum(1 for t in tasks if t.seconds >= lab.LONG_S[0]),
        "work_s": round(sum(durations), 3), "longest_s": max(durations), "slots": slots,
        # Overhead-free schedules of the same tasks, to tell the order's cost from the path's.
        "ideal_fifo_s": lab.r3(lab.list_schedule(durations, slots)),
        "ideal_longest_first_s": lab.r3(lab.list_schedule(sorted(durations, reverse=True), slots)),
        "ideal_baseline_s": lab.r3(lab.baseline_ideal(tasks, a.batch_workers, a.sub_batch)),
    }
    detail = {"seed": seed, "tasks": [list(t) for t in tasks], "series": {}, "timelines": {}}

    def record(system, timeline, system_slots, extra, rate):
        f, series, tl = lab.run_figures(tasks, timeline, system_slots)
        f.update(extra)
        if rate:
            f.update(lab.rate_figures(tasks, timeline, a.models, a.rpm, a.burst, a.rate_warmup))
        figs.update({f"{system}.{k}": v for k, v in f.items()})
        detail["series"][system] = series
        detail["timelines"][system] = tl

    rate_run = a.variant in ("both", "ratelimit")
    if not a.no_baseline:
        log(f"lab run {i} (seed {seed}): baseline, {a.batch_workers} batch workers x "
            f"sub-batches of {a.sub_batch} ...")
        # With a rate-limited run beside it, the baseline's hand-outs are held to the same
        # bound, to show what the seed's system would send a model.
        record("baseline", lab.run_baseline(tasks, a.batch_workers, a.sub_batch),
               a.batch_workers * a.sub_batch, {}, rate_run)
    if a.variant in ("both", "unlimited"):
        log(f"lab run {i} (seed {seed}): dispatchd, {a.workers} workers x {a.slots} slots ...")
        timeline, extra = run_lab_dispatchd(b, i, tasks, None)
        record("dispatchd", timeline, slots, extra, False)
    if rate_run:
        log(f"lab run {i} (seed {seed}): dispatchd with rpm {a.rpm:g} per model, dispatching for "
            f"about {len(tasks) / (a.models * a.rpm / 60):.0f} s ...")
        timeline, extra = run_lab_dispatchd(b, i, tasks, a.rpm)
        record("dispatchd_rpm", timeline, slots, extra, True)
    figs["detail"] = detail
    return figs


SCENARIOS = {"drain": run_drain, "backlog": run_backlog, "retained": run_retained,
             "e2e": run_e2e, "submitted": run_submitted, "turncost": run_turncost,
             "latency": run_latency, "lab": run_lab, "security": run_security}


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


def median_figures(runs):
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs]
        out[k] = statistics.median(vals) if all(isinstance(v, (int, float)) for v in vals) \
            else vals[0]
    return out


# Figures of the lab scenario judged by their worst run, not their median: bounds that must hold
# in every run.
LAB_WORST = ("rate_bucket_worst_excess", "rate_bucket_worst_early_ms", "rate_max_one_model_60s")


def lab_summary(runs):
    """The medians of the lab runs, except LAB_WORST figures: their worst (largest) value."""
    med = median_figures(runs)
    for k in med:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        if k.endswith(LAB_WORST) and vals:
            med[k] = max(vals)
        elif vals and all(isinstance(v, int) for v in vals) and float(med[k]).is_integer():
            med[k] = int(med[k])  # counts stay counts
    med["seed"] = [r["seed"] for r in runs]
    # The task that ended last, run by run: a median of positions means nothing.
    for p in ("baseline.", "dispatchd.", "dispatchd_rpm."):
        if runs[0].get(p + "last_task_index") is not None:
            med[p + "last_task"] = ", ".join(
                f"{r[p + 'last_task_index']} ({r[p + 'last_task_model']}, "
                f"{r[p + 'last_task_seconds']:.1f} s)" for r in runs)
    # Run by run, as "made up / all": two counts of one run only make sense together.
    k = "dispatchd_rpm.rate_short_gaps"
    if any(r.get(k) is not None for r in runs):
        med[k] = ", ".join(f"{r.get(k + '_after_long')}/{r.get(k)}" for r in runs)
    return med


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, float):
        if 0 < abs(v) < 0.01:
            return f"{v:.1e}"
        return f"{v:.3f}" if abs(v) < 10 else f"{v:.1f}"
    return str(v)


def verdict(ok):
    return "-" if ok is None else "met" if ok else "MISSED"


def ratio(a, b):
    return None if a is None or not b else a / b


def print_lab(med, args, n_runs, command):
    """The lab table: each figure with its target, its ratio to the target and a verdict."""
    d, bl, rl = "dispatchd.", "baseline.", "dispatchd_rpm."
    g = lambda prefix, k: med.get(prefix + k)
    rate = args.models * args.rpm / 60.0
    print(f"\n== lab: median of {n_runs} run(s), seeds {med['seed']}   ({command})")
    print(f"   {med['tasks']} tasks ({med['long_tasks']} of 20-40 s, the rest 1-5 s; "
          f"{med['work_s']:.0f} s of work, longest {med['longest_s']:.1f} s) over {args.models} "
          f"models; dispatchd ({args.policy}): {args.workers} workers x {args.slots} slots; baseline: "
          + ("skipped" if args.no_baseline else
             f"{args.batch_workers} batch workers x sub-batches of {args.sub_batch} (threads in "
             f"bench.py)"))
    print(f"   makespan: first hand-out to last result; busy span: first completion to last "
          f"hand-out; deep drop: a second under {lab.DROP_FRACTION:.0%} of the busy span's mean")
    rows = []

    def row(name, dv, bv, target="", r=None, ok=None):
        rows.append([name, fmt(dv), fmt(bv), target, "-" if r is None else f"{r:.4f}",
                     verdict(ok)])

    if g(d, "makespan_s") is not None or g(bl, "makespan_s") is not None:
        # Judged run by run (each has its own bound): the median of the runs' ratios.
        over = g(d, "makespan_over_bound")
        row("makespan s", g(d, "makespan_s"), g(bl, "makespan_s"),
            f"<= {1 + lab.MAKESPAN_SLACK:.2f} x bound", over,
            None if over is None else over <= 1 + lab.MAKESPAN_SLACK)
        row("lower bound s: max(longest, work/slots)", g(d, "lower_bound_s"),
            g(bl, "lower_bound_s"))
        row("makespan / bound", g(d, "makespan_over_bound"), g(bl, "makespan_over_bound"))
        row("ideal schedule s (no overhead)", med["ideal_fifo_s"],
            None if args.no_baseline else med["ideal_baseline_s"],
            f"longest first: {fmt(med['ideal_longest_first_s'])}")
        row("  ideal in the run's hand-out order s", g(d, "ideal_in_handout_order_s"), None)
        row("tasks/s (tasks / makespan)", g(d, "tasks_per_s"), g(bl, "tasks_per_s"))
        row("busy span s", g(d, "busy_span_s"), g(bl, "busy_span_s"))
        row("completions/s in busy span: mean", g(d, "busy_completions_mean"),
            g(bl, "busy_completions_mean"))
        row("  median", g(d, "busy_completions_median"), g(bl, "busy_completions_median"))
        mm = lambda p: (None if g(p, "busy_completions_min") is None else
                        f"{g(p, 'busy_completions_min')}/{g(p, 'busy_completions_p10')}/"
                        f"{g(p, 'busy_completions_max')}")
        row("  min/p10/max", mm(d), mm(bl))
        row("  stdev / mean (cv)", g(d, "busy_completions_cv"), g(bl, "busy_completions_cv"))
        drops = g(d, "busy_drop_seconds")
        row("  seconds in a deep drop", drops, g(bl, "busy_drop_seconds"), "0",
            None, None if drops is None else drops == 0)
        row("last task to end: handed out at s", g(d, "last_task_handed_s"),
            g(bl, "last_task_handed_s"))
        row("last 20-40 s task handed out at s", g(d, "long_last_handed_s"),
            g(bl, "long_last_handed_s"))
        row("hand-out to start ms, median", g(d, "handed_to_started_median_ms"),
            g(bl, "handed_to_started_median_ms"))
        row("path overhead ms, median / p99",
            None if g(d, "path_overhead_median_ms") is None else
            f"{fmt(g(d, 'path_overhead_median_ms'))} / {fmt(g(d, 'path_overhead_p99_ms'))}",
            None if g(bl, "path_overhead_median_ms") is None else
            f"{fmt(g(bl, 'path_overhead_median_ms'))} / {fmt(g(bl, 'path_overhead_p99_ms'))}")
        row("result held by its sub-batch s, mean", g(d, "result_held_mean_s"),
            g(bl, "result_held_mean_s"))
        row("workers' first hand-outs spread s", g(d, "worker_first_handout_spread_s"), None)
    if g(rl, "makespan_s") is not None:
        rows.append([f"with rpm {args.rpm:g} per model, burst {args.burst} (dispatchd only; the "
                     f"baseline has no rate control: its unlimited run)", "", "", "", "", ""])
        r = g(rl, "rate_steady_per_s")
        rr = ratio(r, rate)
        row(f"  steady hand-outs/s after {args.rate_warmup:.0f} s",
            None if r is None else f"{r:.3f}", None,
            f"{lab.RATE_FLOOR * rate:.3f} .. {rate:.3f}", rr,
            None if rr is None else lab.RATE_FLOOR <= rr <= 1 + 5e-4)
        e, early = g(rl, "rate_bucket_worst_excess"), g(rl, "rate_bucket_worst_early_ms")
        row("  worst excess over burst + rate*t (any t)", e, g(bl, "rate_bucket_worst_excess"),
            "<= 0 (worst run)", None, None if e is None else e <= 0)
        if e is not None and e > 0:
            rows[-1][-1] = (f"met ({early:.2g} ms early < {args.stamp_tolerance_ms:g} ms "
                            "of stamp jitter)" if early <= args.stamp_tolerance_ms
                            else f"MISSED ({early:.3g} ms early)")
        sg = g(rl, "rate_short_gaps")
        if sg:
            row("    gaps < 1/rate: after a longer one / all", sg, None)
        m = g(rl, "rate_max_one_model_60s")
        allowed = g(rl, "rate_allowed_60s")
        row("  most hand-outs of one model in 60 s", m, g(bl, "rate_max_one_model_60s"),
            f"<= {fmt(allowed)} (worst run)", ratio(m, allowed),
            None if m is None else m <= allowed + 1e-9)
        row("  makespan s", g(rl, "makespan_s"), g(bl, "makespan_s"))
        row("  tasks/s (tasks / makespan)", g(rl, "tasks_per_s"), g(bl, "tasks_per_s"))
        row("  last hand-out s", g(rl, "last_handout_s"), g(bl, "last_handout_s"))
    header = ["figure", "dispatchd", "baseline", "target", "ratio", "verdict"]
    widths = [max(len(x[j]) for x in [header] + rows if len(x[j]) < 60) for j in range(6)]
    for n, x in enumerate([header] + rows):
        if x[1:] == [""] * 5:
            print("  " + x[0])
            continue
        print("  " + "  ".join(c.ljust(widths[j]) if j in (0, 3) else c.rjust(widths[j])
                               for j, c in enumerate(x)).rstrip())
        if n == 0:
            print("  " + "  ".join("-" * w for w in widths))
    for name, p in (("dispatchd", d), ("baseline", bl), ("dispatchd with rpm", rl)):
        if g(p, "last_task"):
            print(f"  last task to end, per run, {name}: position (model, duration) "
                  f"{g(p, 'last_task')}")


def write_lab_series(path, runs, details):
    """One row per run, system and second: completions and hand-outs in that second."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seed", "system", "second", "completions", "handouts"])
        for i, det in enumerate(details, 1):
            for system, series in det["series"].items():
                for k, (c, h) in enumerate(zip(series["completions"], series["handouts"])):
                    w.writerow([i, det["seed"], system, k, c, h])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__[__doc__.index("Scenarios:"):])
    p.add_argument("scenario", choices=sorted(SCENARIOS))
    p.add_argument("--runs", type=int, default=3, help="runs per scenario (median reported)")
    p.add_argument("--jobs", type=int, default=100000,
                   help="drain, retained and backlog's drain, e2e: jobs")
    p.add_argument("--workers", type=int, help="reference workers (lab 8, others 4)")
    p.add_argument("--slots", type=int, help="slots per worker (lab 50, others 64)")
    p.add_argument("--backlog", type=int, default=1000000,
                   help="backlog: queued jobs when the daemon starts")
    p.add_argument("--retained", type=int, default=5000000,
                   help="retained: finished jobs kept in the database")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    p.add_argument("--no-drain", action="store_true",
                   help="e2e: skip the preloaded drain run beside the floods")
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
    p.add_argument("--pg-url", help="use this PostgreSQL server (a database per run is created)")
    p.add_argument("--build", default=os.path.join(REPO, "build"))
    p.add_argument("--out", help="write OUT.json and OUT.csv (default bench-SCENARIO-TIME)")
    p.add_argument("--no-peer", action="store_true", help="skip the graphile-worker yardstick")
    p.add_argument("--keep-dbs", action="store_true")
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
    if args.pg_url is None:
        os.environ["DISPATCHD_PG_DURABLE"] = "1"
    b = Bench(args)
    signal.signal(signal.SIGTERM, lambda s, f: sys.exit(128 + s))
    started = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    load_before = os.getloadavg()
    details = []
    try:
        b.pg.start()
        runs = []
        for i in range(1, args.runs + 1):
            r = SCENARIOS[args.scenario](b, i)
            if "detail" in r:
                details.append(r.pop("detail"))
            shown = {k: v for k, v in r.items()
                     if args.scenario != "lab" or k.endswith(("makespan_s", "rate_steady_per_s"))}
            log(f"{args.scenario} run {i}: " + " ".join(f"{k}={v}" for k, v in shown.items()))
            runs.append(r)
        peer = None
        if args.scenario == "drain" and not args.no_peer:
            log("graphile-worker yardstick on the same server ...")
            peer = run_peer_drain(b)
            log(f"graphile-worker: {peer}")
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
    if peer:
        # The target compares medians; the ratio to the peer's best run is shown beside it.
        ratio = med["jobs_per_s"] / peer["median"]
        ratio_best = med["jobs_per_s"] / peer["best"]
        print(f"  {'graphile-worker':<{width}}  median {peer['median']:g} jobs/s, best {peer['best']}, "
              f"runs {peer['runs']}")
        verdict = "met" if ratio >= 1.0 else "MISSED"
        print(f"  {'ratio':<{width}}  {ratio:.2f}x graphile-worker's median    (target >= 1.0: {verdict}); "
              f"{ratio_best:.2f}x its best")
        med["peer_median_jobs_per_s"] = peer["median"]
        med["peer_best_jobs_per_s"] = peer["best"]
        med["ratio_to_peer_median"] = round(ratio, 3)
        med["ratio_to_peer_best"] = round(ratio_best, 3)
        targets["ratio_to_peer_median"] = {"target": 1.0, "op": ">=", "ratio": round(ratio, 3),
                                           "met": ratio >= 1.0}

    out = args.out or f"bench-{args.scenario}-{time.strftime('%Y%m%d-%H%M%S')}"
    doc = {"scenario": args.scenario, "command": command, "started": started,
           "machine": machine_info(), "args": vars(args), "runs": runs, "median": med,
           "targets": targets, "peer": peer,
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
    if details:
        write_lab_series(out + "-series.csv", runs, details)
        print(f"  wrote {out}.json, {out}.csv and {out}-series.csv")
    else:
        print(f"  wrote {out}.json and {out}.csv")


if __name__ == "__main__":
    try:
        main()
    except BenchError as e:
        print(f"bench: {e}", file=sys.stderr)
        sys.exit(1)
