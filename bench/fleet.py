"""The `fleet` scenario of bench.py: one daemon and a thousand simulated GPU workers.

dispatch-fleet (bench/fleet/) runs several hundred WorkerService streams per process. Each run:

  1. (unless --no-drain) the 4-worker `drain` of --jobs no-op jobs, and light-load Submit probes
     against a daemon with those 4 reference workers: the yardsticks of the same sitting;
  2. steady: --fleet-jobs jobs queued before the daemon starts, of --fleet-models job types, each
     its own model with a VRAM budget (8, 16, 24 or 40 GB, seeded), over --fairness-keys keys,
     each holding a worker slot for a seeded 50-500 ms (its payload); --fleet-workers workers of
     --fleet-slots slots and 80 GB each drain them, once the daemon has idled --idle-s seconds
     with no worker. Then the fleet idles as long (heartbeats only), then takes --fleet-probes
     light-load Submit probes;
  3. flap: the same jobs, with one of the workers dropping its stream every second;
  4. join: the same jobs, with --join more workers connecting at once when half the jobs have
     left the queue.

Every variant fails unless each queued job ends SUCCEEDED, one row each (nothing lost).

Python 3 standard library only.
"""

import json
import os
import random
import signal
import time

from sched_e2e_bench import BenchError, psql, spawn
from harness import (
    Daemon, cpu_seconds, machine_busy, percentile, read_records, read_start_logs, rss_kib,
    run_loadgen, wait_drained)
from measure import drain_once, latency_start

# Figure -> (">=" or "<=", target), printed by bench.py with the ratio.
TARGETS = {
    "fleet_to_drain": (">=", 0.8),
    "dispatch_p99_to_4_workers": ("<=", 2.0),
    "fleet_daemon_peak_rss_mib": ("<=", 1024),
    "flap_to_steady": (">=", 0.9),
    "join_to_steady": (">=", 0.9),
}

VRAM_GB = (8, 16, 24, 40)
WORKER_VRAM_GB = 80
STREAMS_PER_PROCESS = 500


def add_arguments(p):
    g = p.add_argument_group("fleet")
    g.add_argument("--fleet-workers", type=int, default=1000, help="simulated workers")
    g.add_argument("--fleet-slots", type=int, default=4, help="slots per simulated worker")
    g.add_argument("--fleet-jobs", type=int, default=20000, help="jobs per fleet drain")
    g.add_argument("--fleet-models", type=int, default=100, help="models (a job type each)")
    g.add_argument("--fairness-keys", type=int, default=10000, help="fairness keys of the jobs")
    g.add_argument("--min-ms", type=int, default=50, help="shortest job, ms")
    g.add_argument("--max-ms", type=int, default=500, help="longest job, ms")
    g.add_argument("--affinity-wait", default="1s",
                   help="each type's max_affinity_wait (a simulated model load takes no time)")
    g.add_argument("--join", type=int, default=100, help="workers that join at once mid-run")
    g.add_argument("--flap-every", default="1s", help="the flapping worker's period")
    g.add_argument("--idle-s", type=float, default=5, help="idle window for the heartbeat cost")
    g.add_argument("--settle-s", type=float, default=60,
                   help="heartbeats: seconds between the first idle window and the second")
    g.add_argument("--heartbeat-interval", type=float, default=1.0,
                   help="the daemon's heartbeat_interval, seconds")
    g.add_argument("--fleet-probes", type=int, default=300,
                   help="light-load Submit probes, fleet and 4-worker alike (at --rate)")


def fleet_types(a):
    """The daemon's types: t<k> runs model m<k> with its seeded VRAM budget; noop has none (the
    probes' type)."""
    rng = random.Random(a.seed)
    types = [{"name": f"t{k}", "model": f"m{k}", "vram_gb": rng.choice(VRAM_GB),
              "max_affinity_wait": a.affinity_wait} for k in range(a.fleet_models)]
    return types + ["noop"]


def queue_fleet_jobs(url, a, seed):
    """--fleet-jobs queued jobs: type t<i mod models>, fairness key k<(i * 7919) mod keys>, and a
    payload of milliseconds drawn in [min-ms, max-ms] by PostgreSQL's seeded random(). Returns
    their mean duration in seconds."""
    psql(url, f"SELECT setseed({(seed % 1000) / 1000.0}); "
              "INSERT INTO jobs_active (id, type, payload, fairness_key, state, max_attempts, "
              "timeout_ms, created_at, updated_at) "
              "SELECT 'j_' || lpad(to_hex((extract(epoch FROM now()) * 1000)::int8 + i / 20), 12, "
              "'0') || lpad(to_hex(i), 16, '0'), "
              f"'t' || (i % {a.fleet_models}), "
              f"convert_to(({a.min_ms} + floor(random() * {a.max_ms - a.min_ms + 1}))::int::text, "
              f"'UTF8'), 'k' || ((i * 7919) % {a.fairness_keys}), 'QUEUED', 3, 60000, now(), now() "
              f"FROM generate_series(1, {int(a.fleet_jobs)}) AS i", timeout=600)
    psql(url, "VACUUM ANALYZE jobs_active", timeout=600)
    return float(psql(url, "SELECT avg(convert_from(payload, 'UTF8')::int) / 1000.0 "
                           "FROM jobs_active")[0][0])


class Fleet:
    """dispatch-fleet processes against one daemon: spawn adds one, stop ends them all and
    returns their summaries."""

    def __init__(self, b, d, a):
        self.b, self.d, self.a = b, d, a
        self.procs, self.start_logs = [], []
        self.models = ",".join(f"{t['model']}={t['vram_gb']}" for t in fleet_types(a)
                               if isinstance(t, dict))
        self.types = ",".join(t["name"] if isinstance(t, dict) else t for t in fleet_types(a))

    def spawn(self, n, first, extra=()):
        left = n
        while left > 0:
            k = min(left, STREAMS_PER_PROCESS)
            name = f"fleet-{first}"
            log = os.path.join(self.d.dir, f"starts-{name}")
            argv = [self.b.fleet(), "--server", self.d.addr, "--workers", str(k), "--first",
                    str(first), "--types", self.types, "--models", self.models, "--slots",
                    str(self.a.fleet_slots), "--vram-gb", str(WORKER_VRAM_GB), "--min-ms",
                    str(self.a.min_ms), "--max-ms", str(self.a.max_ms), "--seed",
                    str(self.a.seed), "--start-log", log, *extra]
            p = spawn(argv, os.path.join(self.d.dir, f"{name}.log"))
            self.procs.append(p)
            self.start_logs.append(log)
            first += k
            left -= k
        return first

    def cpu(self):
        return sum(cpu_seconds(p.pid) or 0 for p in self.procs)

    def check_alive(self):
        for p in self.procs:
            if p.poll() is not None:
                raise BenchError(f"dispatch-fleet exited with {p.returncode}; log {p.log_path}")

    def stop(self):
        """SIGTERM to each; their JSON summaries, summed."""
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        total = {}
        for p in self.procs:
            try:
                p.wait(timeout=30)
            except Exception:
                p.kill()
                p.wait(timeout=10)
            with open(p.log_path) as f:
                lines = [l for l in f.read().splitlines() if l.startswith("{")]
            if p.returncode != 0 or not lines:
                raise BenchError(f"dispatch-fleet failed ({p.returncode}); log {p.log_path}")
            for k, v in json.loads(lines[-1]).items():
                total[k] = total.get(k, 0) + v
        self.procs = []
        return total


def started_twice(logs):
    """Jobs the simulated workers started more than once (their start logs, once they exited)."""
    return sum(1 for v in read_start_logs(logs).values() if len(v) > 1)


def histogram_quantile(m0, m1, name, q):
    """The q-quantile of histogram `name` over the window between two /metrics reads, linear
    within its bucket as Prometheus' histogram_quantile; None when nothing was observed."""
    buckets = []
    for (n, labels), v in m1.items():
        if n == name + "_bucket":
            le = labels.split('le="')[1].rstrip('"')
            buckets.append((float("inf") if le == "+Inf" else float(le),
                            v - m0.get((n, labels), 0.0)))
    buckets.sort()
    total = buckets[-1][1] if buckets else 0
    if total <= 0:
        return None
    rank, prev_le, prev_count = q * total, 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return prev_le
            return prev_le + (le - prev_le) * (rank - prev_count) / max(count - prev_count, 1e-9)
        prev_le, prev_count = le, count
    return prev_le


def check_rows(d, jobs, variant):
    """Fails unless each of the `jobs` queued jobs has one row, SUCCEEDED; returns how many of
    them took more than one attempt (a job its worker lost while it ran)."""
    n, ok, later = (int(x) for x in psql(
        d.url, "SELECT count(*), count(*) FILTER (WHERE state = 'SUCCEEDED'), "
               "count(*) FILTER (WHERE attempt > 1) FROM jobs WHERE type <> 'noop'")[0])
    distinct = int(psql(d.url, "SELECT count(DISTINCT id) FROM jobs WHERE type <> 'noop'")[0][0])
    if n != jobs or ok != jobs or distinct != jobs:
        raise BenchError(f"{variant}: {ok} of {jobs} jobs SUCCEEDED ({n} rows, {distinct} ids): "
                         f"jobs lost; logs in {d.dir}")
    return later


def fleet_drain(b, i, variant, probes=False, join=False):
    """One fleet drain on a fresh daemon (`variant`: steady, flap or join); its figures."""
    a = b.args
    d = Daemon(b, f"fleet-{variant}-{i}")
    types = fleet_types(a)
    # Without authentication every worker is the same principal: room for the whole fleet.
    extra = [f"heartbeat_interval: {int(a.heartbeat_interval * 1000)}ms", "limits:",
             f"  worker_streams_per_principal: {a.fleet_workers + a.join + 10}"]
    fl = Fleet(b, d, a)
    try:
        d.serve_metrics()
        d.start(types, extra=extra)  # creates the schema
        d.stop()
        mean_s = queue_fleet_jobs(d.url, a, a.seed + i)
        load_s = d.start(types, extra=extra)
        idle = idle_cpu(d, a) if probes else None  # no worker yet: the daemon's own idle cost
        m0, busy0, cpu0 = d.metrics(), machine_busy(), cpu_seconds(d.proc.pid)
        steady = a.fleet_workers - (1 if variant == "flap" else 0)
        spawned = time.time()
        first = fl.spawn(steady, 1)
        if variant == "flap":
            first = fl.spawn(1, first, ["--flap-every", a.flap_every])
        connected, joined, peak_rss = None, None, 0
        deadline = spawned + a.timeout
        while True:
            if join and joined is None and int(psql(
                    d.url, "SELECT count(*) FROM jobs_active WHERE state = 'QUEUED'")[0][0]) \
                    <= a.fleet_jobs // 2:
                fl.spawn(a.join, first)
                joined = time.time() - spawned
            if not d.any_active():
                break
            d.check_alive()
            fl.check_alive()
            peak_rss = max(peak_rss, rss_kib(d.proc.pid) or 0)
            if connected is None and d.metrics().get(("dispatchd_workers", ""), 0) >= steady:
                connected = time.time() - spawned
            if time.time() > deadline:
                raise BenchError(f"fleet {variant} did not finish in {a.timeout} s; "
                                 f"logs in {d.dir}")
            time.sleep(0.2)
        m1, busy1, cpu1, sim_cpu = d.metrics(), machine_busy(), cpu_seconds(d.proc.pid), fl.cpu()
        if join and joined is None:
            raise BenchError("join: the drain ended before the workers joined (more --fleet-jobs)")
        reattempted = check_rows(d, a.fleet_jobs, variant)
        n = a.fleet_jobs
        span, t10, t90, first_s = (float(x) for x in psql(
            d.url, "SELECT extract(epoch FROM max(finished_at) - min(dispatched_at)), "
                   "extract(epoch FROM percentile_disc(0.1) WITHIN GROUP (ORDER BY finished_at)), "
                   "extract(epoch FROM percentile_disc(0.9) WITHIN GROUP (ORDER BY finished_at)), "
                   "extract(epoch FROM min(dispatched_at)) FROM jobs WHERE type <> 'noop'")[0])
        out = {f"{variant}_jobs_per_s": round(n / span)}
        if variant != "steady":
            out[f"{variant}_reattempted"] = reattempted
        if variant == "join":
            out["join_at_s"] = round(joined - (first_s - spawned), 2)
        if not probes:
            out.update({f"{variant}_{k}": v for k, v in fl.stop().items()
                        if k in ("connects", "flaps", "adopted", "dropped", "results_resent")})
            out[f"{variant}_started_twice"] = started_twice(fl.start_logs)
            return out
        name = "dispatchd_dispatch_decision_seconds"
        us = lambda s: None if s is None else round(s * 1e6, 1)  # noqa: E731
        decisions = m1.get((name + "_count", ""), 0) - m0.get((name + "_count", ""), 0)
        bound = int(psql(d.url, "SELECT count(*) FROM (SELECT DISTINCT worker_id, type FROM jobs "
                                "WHERE type <> 'noop') AS pairs")[0][0])
        daemon_loads = sum(v for (k, _), v in m1.items()
                           if k == "dispatchd_worker_model_loads_total")
        out.update({
            "workers": a.fleet_workers, "slots": a.fleet_workers * a.fleet_slots, "jobs": n,
            "mean_job_s": round(mean_s, 4),
            "capacity_jobs_per_s": round(a.fleet_workers * a.fleet_slots / mean_s),
            "steady_mid_jobs_per_s": round(0.8 * n / (t90 - t10)),
            "load_s": round(load_s, 2),
            "connect_s": None if connected is None else round(connected, 2),
            "decision_p50_us": us(histogram_quantile(m0, m1, name, 0.5)),
            "decision_p99_us": us(histogram_quantile(m0, m1, name, 0.99)),
            "decision_mean_us": us((m1.get((name + "_sum", ""), 0) - m0.get((name + "_sum", ""), 0))
                                   / max(decisions, 1)),
            "decisions_per_job": round(decisions / n, 3),
            "daemon_cpu_us_per_job": round((cpu1 - cpu0) / n * 1e6, 1),
            "fleet_cpu_us_per_job": round(sim_cpu / n * 1e6, 1),
            "cpu_us_per_job": round((busy1[0] - busy0[0]) / n * 1e6, 1),
            "model_loads_lower_bound": bound, "model_loads_daemon": int(daemon_loads)})
        out.update(heartbeat_cost(d, a, idle))
        rec = run_probes(b, d, a, payload="20")
        peak_rss = max(peak_rss, rss_kib(d.proc.pid) or 0)
        summary = fl.stop()  # its start logs are complete once it has exited
        out.update(probe_figures(d, a, rec, fl.start_logs, "fleet_"))
        out["started_twice"] = started_twice(fl.start_logs)
        out["model_loads"] = summary["model_loads"]
        out["loads_over_bound"] = round(summary["model_loads"] / max(bound, 1), 3)
        out["fleet_daemon_peak_rss_mib"] = round(peak_rss / 1024, 1)
        return out
    finally:
        for p in fl.procs:
            p.kill()
        d.stop()
        d.drop()


def idle_cpu(d, a):
    """The daemon's CPU share (cores) over --idle-s seconds."""
    cpu0, t0 = cpu_seconds(d.proc.pid), time.time()
    time.sleep(a.idle_s)
    return (cpu_seconds(d.proc.pid) - cpu0) / (time.time() - t0)


def heartbeat_cost(d, a, before):
    """The daemon's CPU while the fleet is connected and idle (heartbeats only), over --idle-s
    seconds, less its CPU with no worker connected (`before`, cores), per heartbeat."""
    share = idle_cpu(d, a)
    per_s = a.fleet_workers / a.heartbeat_interval
    return {"idle_daemon_cpu_share": round(share, 4),
            "no_workers_daemon_cpu_share": round(before, 4),
            "heartbeats_per_s": round(per_s),
            "daemon_cpu_us_per_heartbeat": round(max(share - before, 0) / per_s * 1e6, 1)}


def run_probes(b, d, a, payload=None):
    """--fleet-probes (after --warmup) Submit probes at --rate, one in flight, of type noop;
    waits until they have run. Returns the load generator's record file."""
    rec = os.path.join(d.dir, "probe-records")
    argv = ["--record", rec] + (["--payload", payload] if payload else []) + [
        "probe", "--rpc", "submit", "--count", str(a.fleet_probes + a.warmup), "--warmup",
        str(a.warmup), "--rate", str(a.rate), "--inflight", "1"]
    run_loadgen(b, d, argv, a.timeout)
    wait_drained(d, a.timeout)
    return rec


def probe_figures(d, a, rec, logs, prefix):
    """Submit to the worker's start (the load generator's send, the worker's start log: one clock)
    and created_at to dispatched_at (the rows), p50 and p99, of the probes after the warm-up.
    Fails unless each probe started exactly once."""
    records = read_records(rec)
    starts = read_start_logs(logs)
    measured = [(job_id, sent) for seq, job_id, sent, _ in records if seq >= a.warmup]
    wrong = [j for _, j, _, _ in records if len(starts.get(j, [])) != 1]
    if wrong or not measured:
        raise BenchError(f"{len(wrong)} probes not started exactly once, e.g. {wrong[:3]}; "
                         f"logs in {d.dir}")
    to_worker = sorted(starts[j][0] - sent for j, sent in measured)
    rows = {r[0]: int(r[1]) for r in psql(
        d.url, "SELECT id, ((extract(epoch FROM dispatched_at) - extract(epoch FROM created_at))"
               " * 1e6)::int8 FROM jobs WHERE type = 'noop'")}
    queued = sorted(rows[j] for j, _ in measured)
    ms = lambda us: round(us / 1000, 3)  # noqa: E731
    return {f"{prefix}submit_to_worker_p50_ms": ms(percentile(to_worker, 0.5)),
            f"{prefix}submit_to_worker_p99_ms": ms(percentile(to_worker, 0.99)),
            f"{prefix}created_to_dispatched_p50_ms": ms(percentile(queued, 0.5)),
            f"{prefix}created_to_dispatched_p99_ms": ms(percentile(queued, 0.99))}


def four_worker_latency(b, i):
    """The same probes against a daemon with the 4 reference workers of `drain`."""
    a = b.args
    d = latency_start(b, f"latency-{i}")
    try:
        rec = run_probes(b, d, a)
        d.stop_workers()
        return probe_figures(d, a, rec, d.start_logs, "w4_")
    finally:
        d.stop()
        d.drop()


def run_heartbeats(b, i):
    """One run of the `heartbeats` scenario: a daemon with no job, and --fleet-workers simulated
    workers that connect and only heartbeat. The daemon's CPU per heartbeat over --idle-s seconds
    once they have all connected, and again --settle-s seconds later: gRPC probes each new
    connection's bandwidth with a PING when data arrives, at intervals that grow while its
    estimate holds, so a fleet's first minute costs more than its steady state."""
    a = b.args
    d = Daemon(b, f"heartbeats-{i}")
    extra = [f"heartbeat_interval: {int(a.heartbeat_interval * 1000)}ms", "limits:",
             f"  worker_streams_per_principal: {a.fleet_workers + 10}"]
    fl = Fleet(b, d, a)
    try:
        d.serve_metrics()
        d.start(fleet_types(a), extra=extra)
        alone = idle_cpu(d, a)
        spawned = time.time()
        fl.spawn(a.fleet_workers, 1)
        while d.metrics().get(("dispatchd_workers", ""), 0) < a.fleet_workers:
            d.check_alive()
            fl.check_alive()
            if time.time() > spawned + a.timeout:
                raise BenchError(f"heartbeats: the fleet did not connect in {a.timeout} s; "
                                 f"logs in {d.dir}")
            time.sleep(0.2)
        connect_s = time.time() - spawned
        first = heartbeat_cost(d, a, alone)
        time.sleep(a.settle_s)
        settled = heartbeat_cost(d, a, alone)
        fl.check_alive()
        fl.stop()
        return {"workers": a.fleet_workers, "heartbeats_per_s": first["heartbeats_per_s"],
                "connect_s": round(connect_s, 2),
                "no_workers_daemon_cpu_share": first["no_workers_daemon_cpu_share"],
                "connected_daemon_cpu_share": first["idle_daemon_cpu_share"],
                "settled_daemon_cpu_share": settled["idle_daemon_cpu_share"],
                "connected_daemon_cpu_us_per_heartbeat": first["daemon_cpu_us_per_heartbeat"],
                "settled_daemon_cpu_us_per_heartbeat": settled["daemon_cpu_us_per_heartbeat"]}
    finally:
        for p in fl.procs:
            p.kill()
        d.stop()
        d.drop()


def run_fleet(b, i):
    """One run: the 4-worker yardsticks (unless --no-drain), then the steady, flap and join
    drains of the fleet; their ratios."""
    a = b.args
    out = {}
    if not a.no_drain:
        out["drain_jobs_per_s"] = drain_once(b, f"drain-{i}", a.jobs)["jobs_per_s"]
        out.update(four_worker_latency(b, i))
    steady = fleet_drain(b, i, "steady", probes=True)
    out.update(steady)
    out.update(fleet_drain(b, i, "flap"))
    out.update(fleet_drain(b, i, "join", join=True))
    if not a.no_drain:
        out["fleet_to_drain"] = round(out["steady_jobs_per_s"] / out["drain_jobs_per_s"], 3)
        out["dispatch_p99_to_4_workers"] = round(
            out["fleet_submit_to_worker_p99_ms"] / out["w4_submit_to_worker_p99_ms"], 3)
    out["flap_to_steady"] = round(out["flap_jobs_per_s"] / out["steady_jobs_per_s"], 3)
    out["join_to_steady"] = round(out["join_jobs_per_s"] / out["steady_jobs_per_s"], 3)
    return out
