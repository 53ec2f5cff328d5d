"""The client scenarios of bench.py: dispatch-loadgen against the daemon, checked against the
rows and the workers. `e2e` floods a draining daemon with single Submit calls and with
SubmitBatch; `submitted` queues into a running daemon before its workers start; `turncost`
measures the dispatcher's turn statements per job as the queue grows."""

import os
import time

from sched_e2e_bench import BenchError, log, psql
from harness import (
    Daemon, check_ran_once, cpu_figures, cpu_seconds, machine_busy, read_records,
    read_start_logs, run_loadgen, wait_drained)
from measure import drain_once
import ceiling


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
    return ceiling.add_ceiling(b, i, out, "insert_claim_complete", {
        "single_completed_per_s": "single_fraction_of_ceiling",
        "batch_completed_per_s": "batch_fraction_of_ceiling"})


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
