"""One measurement of a fresh daemon, for bench.py: a drain of preloaded jobs, the light-load
latency probes, and both with security off and on (the `security` scenario).

Python 3 standard library only.
"""

import os
import statistics
import threading
import time

from sched_e2e_bench import BenchError, psql
from harness import (
    Daemon, Security, check_ran_once, cpu_figures, cpu_seconds, keep_finished_jobs, machine_busy,
    percentile, queue_noop_jobs, read_records, read_start_logs, rss_kib, run_loadgen,
    wait_drained)


def drain_once(b, name, jobs, finished=0, security=None):
    """One drain: `jobs` queued no-op jobs (after `finished` SUCCEEDED ones kept for Status),
    loaded by a fresh daemon and drained by the workers. Figures from the job rows, but for the
    messages on worker streams, from the daemon's /metrics. With
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
        wal0 = psql(d.url, "SELECT pg_current_wal_lsn()")[0][0]
        d.serve_metrics()
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
        metrics = d.metrics()
        row = psql(d.url, "SELECT count(*), extract(epoch FROM max(finished_at) - "
                          "min(dispatched_at)), count(*) FILTER (WHERE state = 'SUCCEEDED'), "
                          "extract(epoch FROM min(dispatched_at)) "
                          "FROM jobs_done WHERE id NOT LIKE 'f%'")[0]
        n, span, ok = int(row[0]), float(row[1]), int(row[2])
        if ok != n or n != jobs:
            raise BenchError(f"drain: {ok} of {jobs} jobs succeeded ({n} rows); logs in {d.dir}")
        # What PostgreSQL logged for the drain (the daemon's start included), to set beside the
        # same figure of its ceiling (ceiling.py).
        wal = psql(d.url, f"SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '{wal0}')")[0][0]
        out = {"jobs": n, "seconds": round(span, 3), "jobs_per_s": round(n / span),
               "load_s": round(load_s, 2),
               "first_dispatch_s": round(float(row[3]) - started, 2),
               "daemon_peak_rss_mib": round(peak_rss / 1024, 1),
               "wal_bytes_per_job": round(float(wal) / n)}
        # Messages on the worker streams per job, each way (None from a daemon without the
        # counter): the jobs one message carries is most of what a stream costs.
        for direction in ("received", "sent"):
            m = metrics.get(("dispatchd_worker_stream_messages_total",
                             f'direction="{direction}"'))
            out[f"worker_messages_{direction}_per_job"] = None if m is None else round(m / n, 3)
        out.update(cpu_figures("", n, busy0, busy1, {
            "daemon": None if daemon0 is None or daemon1 is None else daemon1 - daemon0,
            "workers": workers_cpu}))
        return out
    finally:
        d.stop()
        d.drop()


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


def median_figures(runs):
    """The median of each numeric figure over `runs`; the first run's value of any other."""
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs]
        out[k] = statistics.median(vals) if all(isinstance(v, (int, float)) for v in vals) \
            else vals[0]
    return out
