#!/usr/bin/env python3
"""End-to-end scheduler benchmark: the real dispatchd, PostgreSQL and reference workers.

Runs each scenario twice on the same input, once with `scheduler.policy: fair` and once with the
`fifo` baseline, reads every job row back from PostgreSQL and computes the figures from the rows
(created_at, dispatched_at, started_at, finished_at, worker_id), so the numbers are what the
daemon really did, not what the scheduler believes.

Scenarios (--scenario swaps|fairness|ratelimit|all):

  swaps      5 model types (llm1..llm5 -> m1..m5, 20 GB each), 2 workers x 1 slot with 24 GB
             (room for one model), 20 ms jobs, 500 ms model load. Run 1: client A's 4 x 250 jobs
             interleaved over m1..m4; model loads and makespan. Run 2: the same, plus client B
             streaming one llm5 job a second while A's jobs run; B's wait vs
             max_affinity_wait + one job + one model load.
  fairness   type `gen`, 2 workers x 4 slots, 50 ms jobs. Run 1: A's 1000 jobs queued, then B's
             10: does every B job start before the 50th A job still waiting at B's submit? Run 2:
             A 500 then B 500: Jain's index of served time while both keys have queued jobs.
  ratelimit  3 models r1..r3 at rpm 20 (burst 1), 8 workers x 50 slots, 3 x 120 jobs of
             1-5 s (5% 20-40 s), run for --ratelimit-seconds: achieved dispatch rate after the
             first 60 s vs 1.0/s, and the most dispatches in any 60 s window vs 3 x (burst + 20).
             The baseline is fifo WITHOUT the rpm keys (fifo keeps rate limits, so fifo with
             them would measure the same bucket): it shows what the limit prevents.

Job submission uses one `dispatchctl submit` process per job (8 at a time). On a small machine
that submits about as fast as the workers serve (~100 jobs/s on 2 cores), so a backlog would never
build up and the scenarios would measure the submitter. By default the jobs that make a scenario's
backlog are therefore queued before the workers start (workers connect, then the measured phase
begins); --workers-first starts the workers before any submission instead.

Python 3 standard library only. Example:
  python3 bench/sched/sched_e2e_bench.py --quick
  python3 bench/sched/sched_e2e_bench.py --scenario swaps --json-out /tmp/swaps.json
"""

import argparse
import json
import math
import os
import platform
import shlex
import shutil
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time

# Re-exported: fair_bench.py, fair_cluster.py and bench/*.py import these from this module.
from e2e_pg import TERMINAL, TERMINAL_SQL, Postgres, db_url, psql  # noqa: F401
from e2e_procs import (  # noqa: F401
    REPO, BenchError, _on_signal, find_binary, kill_all_children, log, spawn, stop_process, tail)
from e2e_run import Run, yaml_str  # noqa: F401


# ------------------------------------------------------------------------------------------------
# Figures.


def model_loads(rows, model_of):
    """Per worker, in started_at order: jobs whose model differs from the previous job's (the
    first job counts as a load)."""
    by_worker = {}
    for r in rows:
        if r["started"] is not None and r["worker"]:
            by_worker.setdefault(r["worker"], []).append(r)
    loads = {}
    for w, rs in by_worker.items():
        rs.sort(key=lambda r: r["started"])
        prev, n = None, 0
        for r in rs:
            m = model_of[r["type"]]
            if m != prev:
                n += 1
            prev = m
        loads[w] = n
    return sum(loads.values()), loads


def jain(xs):
    s, q = sum(xs), sum(x * x for x in xs)
    return (s * s) / (len(xs) * q) if q > 0 else None


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def max_in_window(ts, width):
    ts = sorted(ts)
    best, j = 0, 0
    for i in range(len(ts)):
        while ts[i] - ts[j] >= width:
            j += 1
        best = max(best, i - j + 1)
    return best


def bucket_excess(ts, rate, burst):
    """The worst excess over the exact bound: max over windows [t_i, t_j] of
    (j - i + 1) - (burst + rate * (t_j - t_i)). <= 0 means the bound held."""
    ts = sorted(ts)
    worst = -math.inf
    # O(n^2) is fine for a few hundred dispatches per model.
    for i in range(len(ts)):
        for j in range(i, len(ts)):
            worst = max(worst, (j - i + 1) - (burst + rate * (ts[j] - ts[i])))
    return worst


def dispatch_time(r):
    return r["dispatched"] if r["dispatched"] is not None else r["started"]


def sanity(rows):
    return {"jobs": len(rows),
            "not_succeeded": sum(1 for r in rows if r["state"] != "SUCCEEDED"),
            "retried": sum(1 for r in rows if r["attempt"] > 1)}


def r3(x):
    return None if x is None else round(x, 3)


# ------------------------------------------------------------------------------------------------
# Scenarios. Each returns {run: {figure: value}} for one policy.


class Bench:
    def __init__(self, args):
        self.args = args
        self.seq = 0
        self.seed_base = args.seed
        self.workdir = args.workdir or tempfile.mkdtemp(prefix="sched-e2e-")
        os.makedirs(self.workdir, exist_ok=True)
        build = args.build_dir
        # Copies, so that a rebuild in the build tree during the benchmark changes nothing here.
        bindir = os.path.join(self.workdir, "bin")
        os.makedirs(bindir, exist_ok=True)
        self.binaries = {}
        for name, sub in (("dispatchd", os.path.join("server", "daemon")),
                          ("dispatch-worker", os.path.join("client", "cpp")),
                          ("dispatchctl", os.path.join("client", "cpp"))):
            src = find_binary(build, name, sub)
            dst = os.path.join(bindir, name)
            shutil.copy2(src, dst)
            self.binaries[name] = {"path": src, "mtime": time.strftime(
                "%Y-%m-%d %H:%M:%S", time.localtime(os.stat(src).st_mtime))}
            setattr(self, {"dispatchd": "dispatchd", "dispatch-worker": "worker",
                           "dispatchctl": "ctl"}[name], dst)
        self.pg = Postgres(self.workdir, args.pg_url)

    # Starts workers before the submissions with --workers-first, else after `backlog` jobs.
    def _phase_start(self, run, start_workers, backlog, tag):
        if self.args.workers_first:
            t = start_workers()
            ids = run.submit_many(backlog, tag) if backlog else []
        else:
            ids = run.submit_many(backlog, tag) if backlog else []
            t = start_workers()
        return t, ids

    # -- swaps -------------------------------------------------------------------------------
    def swaps(self, policy):
        a = self.args
        per_model = 50 if a.quick else a.swaps_jobs
        maw = a.max_affinity_wait
        types = [{"name": f"llm{i}", "model": f"m{i}", "vram_gb": 20, "max_affinity_wait": maw}
                 for i in range(1, 6)]
        model_of = {t["name"]: t["model"] for t in types}
        job_s, load_s = 0.020, 0.500
        backlog = [(f"llm{(i % 4) + 1}", "A") for i in range(4 * per_model)]
        timeout = a.run_timeout
        out = {}
        for with_b in (False, True):
            name = f"swaps-{policy}-{'ab' if with_b else 'a'}"
            run = Run(self, name, policy, types)
            try:
                run.start_daemon()
                start = lambda: run.start_workers(
                    2, [t["name"] for t in types], 1, "100%:20ms", gpu_gb=24, load_delay="500ms")
                t_workers, _ = self._phase_start(run, start, backlog, "A")
                b_ids = []
                if with_b:
                    b_ids = self._stream_b(run, "llm5", "B", 1.0, until_done_key="A",
                                           timeout=timeout)
                run.wait_terminal(timeout)
                rows = run.rows()
            finally:
                run.stop()
            ra = [r for r in rows if r["key"] == "A"]
            loads, per_worker = model_loads(rows, model_of)
            res = {"model_loads": loads, "loads_per_worker": per_worker,
                   "makespan_s": r3(max(r["finished"] for r in ra) - min(r["created"] for r in ra)),
                   "busy_span_s": r3(max(r["finished"] for r in ra) - t_workers),
                   **sanity(rows)}
            if with_b:
                rb = [r for r in rows if r["key"] == "B"]
                waits = [r["started"] - r["created"] for r in rb if r["started"] is not None]
                bound = parse_duration(maw) + job_s + load_s
                res.update({"b_jobs": len(rb),
                            "b_wait_median_s": r3(statistics.median(waits)) if waits else None,
                            "b_wait_max_s": r3(max(waits)) if waits else None,
                            "b_wait_bound_s": r3(bound),
                            "b_over_bound": sum(1 for w in waits if w > bound),
                            # The acceptance's stricter reading: max_affinity_wait + one job.
                            "b_over_maw_plus_job": sum(
                                1 for w in waits if w > parse_duration(maw) + job_s)})
            out["A+B" if with_b else "A"] = res
        return out

    def _stream_b(self, run, jtype, key, period, until_done_key, timeout):
        """Submits one job every `period` seconds until key `until_done_key` has no active job."""
        ids, stop = [], threading.Event()
        errors = []

        def loop():
            t_next, i = time.time(), 0
            while not stop.is_set():
                try:
                    ids.append(run.submit_one(jtype, key, f"{key}-{i}"))
                except Exception as e:  # reported by the main thread
                    errors.append(e)
                    return
                i += 1
                t_next += period
                stop.wait(max(0.0, t_next - time.time()))

        th = threading.Thread(target=loop, daemon=True)
        th.start()
        try:
            run.wait_terminal(timeout, where=f"fairness_key = '{until_done_key}'",
                              what=f"{until_done_key}'s jobs")
        finally:
            stop.set()
            th.join(timeout=120)
        if errors:
            raise errors[0]
        log(f"  {run.name}: streamed {len(ids)} {key} jobs")
        return ids

    # -- fairness ----------------------------------------------------------------------------
    def fairness(self, policy):
        a = self.args
        n1 = 200 if a.quick else a.fairness_jobs
        n_b = 10
        n2 = n1 // 2
        types = [{"name": "gen"}]
        start_args = (2, ["gen"], 4, "100%:50ms")
        out = {}

        # Run 1: A's backlog, then B's 10 jobs while A's run.
        run = Run(self, f"fairness-{policy}-1", policy, types)
        try:
            run.start_daemon()
            t_workers, _ = self._phase_start(run, lambda: run.start_workers(*start_args),
                                             [("gen", "A")] * n1, "A")
            run.submit_many([("gen", "B")] * n_b, "B")
            run.wait_terminal(a.run_timeout)
            rows = run.rows()
        finally:
            run.stop()
        ra = [r for r in rows if r["key"] == "A"]
        rb = [r for r in rows if r["key"] == "B"]
        t_b = min(r["created"] for r in rb)
        a_after = sorted(r["started"] for r in ra if r["started"] > t_b)
        b_starts = [r["started"] for r in rb]
        b_last = max(b_starts)
        fiftieth = a_after[49] if len(a_after) >= 50 else None
        out["A then B"] = {
            "a_waiting_at_b_submit": len(a_after),
            "b_max_start_delay_s": r3(max(r["started"] - r["created"] for r in rb)),
            "a_started_between_b_submit_and_b_last_start":
                sum(1 for t in a_after if t <= b_last),
            "fiftieth_waiting_a_start_after_b_submit_s": r3(fiftieth - t_b) if fiftieth else None,
            "b_all_before_50th_a": (all(t < fiftieth for t in b_starts)
                                    if fiftieth is not None else None),
            **sanity(rows)}

        # Run 2: A 500 then B 500, both queued; Jain's index while both have queued jobs.
        run = Run(self, f"fairness-{policy}-2", policy, types)
        try:
            run.start_daemon()
            if a.workers_first:
                t_workers = run.start_workers(*start_args)
            run.submit_many([("gen", "A")] * n2, "A")
            run.submit_many([("gen", "B")] * n2, "B")
            if not a.workers_first:
                t_workers = run.start_workers(*start_args)
            run.wait_terminal(a.run_timeout)
            rows = run.rows()
        finally:
            run.stop()
        by_key = {k: [r for r in rows if r["key"] == k] for k in ("A", "B")}
        w0 = min(r["started"] for r in by_key["B"])
        w1 = min(max(dispatch_time(r) for r in rs) for rs in by_key.values())
        served = {k: sum(overlap(r["started"], r["finished"], w0, w1) for r in rs)
                  for k, rs in by_key.items()}
        window = w1 - w0
        out["A+B"] = {
            "window_s": r3(window),
            "served_a_s": r3(served["A"]), "served_b_s": r3(served["B"]),
            "jain": r3(jain(list(served.values()))) if window > 0 else None,
            "b_wait_median_s": r3(statistics.median(
                r["started"] - r["created"] for r in by_key["B"])),
            "makespan_s": r3(max(r["finished"] for r in rows) - min(r["created"] for r in rows)),
            **sanity(rows)}
        return out

    # -- ratelimit ---------------------------------------------------------------------------
    def ratelimit(self, policy, limited):
        a = self.args
        seconds = 90 if a.quick else a.ratelimit_seconds
        rpm, burst = 20, a.ratelimit_burst
        types = []
        for i in range(1, 4):
            t = {"name": f"rl{i}", "model": f"r{i}"}
            if limited:
                t.update({"rpm": rpm, "burst": burst})
            types.append(t)
        jobs = [(f"rl{(i % 3) + 1}", "A") for i in range(3 * a.ratelimit_jobs)]
        name = f"ratelimit-{policy}-{'rpm' if limited else 'nolimit'}"
        run = Run(self, name, policy, types)
        early = False
        try:
            run.start_daemon()
            start = lambda: run.start_workers(8, [t["name"] for t in types], 50,
                                              "95%:1s-5s,5%:20s-40s")
            t0, _ = self._phase_start(run, start, jobs, "A")
            deadline = time.time() + seconds
            while time.time() < deadline:
                run.check_alive()
                time.sleep(1)
                # Nothing is left to dispatch and the steady window has started: stop early.
                if time.time() - (deadline - seconds) > 65 and run.count_active(
                        "state = 'QUEUED'") == 0:
                    early = True
                    break
            t_end = run.db_now()
            rows = run.rows()
        finally:
            run.stop()
        disp = sorted(dispatch_time(r) for r in rows
                      if dispatch_time(r) is not None and dispatch_time(r) <= t_end)
        steady = [t for t in disp if t > t0 + 60]
        steady_len = t_end - (t0 + 60)
        per_model = {}
        for r in rows:
            t = dispatch_time(r)
            if t is not None and t <= t_end:
                per_model.setdefault(r["type"], []).append(t)
        res = {"rpm_limited": limited, "burst": burst if limited else None,
               "elapsed_s": r3(t_end - t0), "stopped_early_all_dispatched": early,
               "dispatched": len(disp), "submitted": len(rows),
               "steady_rate_per_s": r3(len(steady) / steady_len) if steady_len > 0 else None,
               "theoretical_rate_per_s": 3 * rpm / 60.0,
               # The most the buckets allow over that window: 3 x (burst + rate x length).
               "steady_rate_bound_per_s": (r3(3 * (burst + rpm / 60.0 * steady_len) / steady_len)
                                           if limited and steady_len > 0 else None),
               "max_dispatches_60s": max_in_window(disp, 60.0),
               "allowed_60s": 3 * (burst + rpm),
               "all_dispatched_within_s": r3(disp[-1] - t0) if len(disp) == len(rows) else None}
        if limited:
            res["bucket_worst_excess_jobs"] = r3(max(
                bucket_excess(ts, rpm / 60.0, burst) for ts in per_model.values()))
        return res

    # -- driver ------------------------------------------------------------------------------
    def run_scenario(self, name):
        a = self.args
        if name == "ratelimit":
            runs = [("fair", lambda: {"rpm": self.ratelimit("fair", True)}),
                    ("fifo", lambda: {"no rpm": self.ratelimit("fifo", False)})]
            if a.ratelimit_fifo_limited:
                runs.append(("fifo+rpm", lambda: {"rpm": self.ratelimit("fifo", True)}))
        else:
            scenario_fn = getattr(self, name)
            runs = [(p, (lambda p=p: scenario_fn(p))) for p in ("fair", "fifo")]
        if a.policy != "both":
            runs = [r for r in runs if r[0].startswith(a.policy)]
        results = {}
        for label, run_fn in runs:
            reps = []
            for rep in range(a.repeat):
                log(f"{name} / {label}: repetition {rep + 1} of {a.repeat}")
                reps.append(run_fn())
            results[label] = {"median": median_of(reps), "repetitions": reps}
        return results


def median_of(reps):
    """Figure by figure, the median across repetitions (numbers), or the first value."""
    if len(reps) == 1:
        return reps[0]
    out = {}
    for k, v in reps[0].items():
        vals = [r.get(k) for r in reps]
        if isinstance(v, dict):
            out[k] = median_of(vals)
        elif all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in vals):
            out[k] = r3(statistics.median(vals))
        elif all(isinstance(x, bool) for x in vals):
            out[k] = all(vals)
        else:
            out[k] = v
    return out


def parse_duration(s):
    units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
    for u in ("ms", "s", "m", "h"):
        if s.endswith(u):
            try:
                return float(s[: -len(u)]) * units[u]
            except ValueError:
                break
    raise argparse.ArgumentTypeError(f"bad duration {s!r} (use e.g. 5s, 500ms)")


# ------------------------------------------------------------------------------------------------
# Output.


def machine_info():
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
            mem = f"{kb / 1048576:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    return {"nproc": len(os.sched_getaffinity(0)), "cpu": cpu, "memory": mem,
            "kernel": platform.release(), "host": socket.gethostname(),
            "python": platform.python_version()}


def fmt(v):
    if v is None:
        return "-"
    if isinstance(v, bool):
        return "yes" if v else "no"
    if isinstance(v, float):
        return f"{v:.3f}" if abs(v) < 100 else f"{v:.1f}"
    if isinstance(v, dict):
        return " ".join(f"{k}={fmt(x)}" for k, x in sorted(v.items()))
    return str(v)


def print_table(title, header, rows):
    print(f"\n== {title}")
    cols = [header] + [[fmt(c) if not isinstance(c, str) else c for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cols) for i in range(len(header))]
    for i, r in enumerate(cols):
        print("  " + "  ".join(c.ljust(widths[j]) if j == 0 else c.rjust(widths[j])
                               for j, c in enumerate(r)))
        if i == 0:
            print("  " + "  ".join("-" * w for w in widths))
    sys.stdout.flush()


def scenario_table(name, res, args):
    labels = list(res)
    med = {l: res[l]["median"] for l in labels}
    runs = []
    for l in labels:
        for run in med[l]:
            if run not in runs:
                runs.append(run)
    rows = []
    for run in runs:
        keys = []
        for l in labels:
            for k in med[l].get(run, {}):
                if k not in keys:
                    keys.append(k)
        for k in keys:
            rows.append([f"{run}: {k}"] + [med[l].get(run, {}).get(k) for l in labels])
    rep = f" (median of {args.repeat})" if args.repeat > 1 else ""
    titles = {
        "swaps": f"swaps: A = {'4x50' if args.quick else f'4x{args.swaps_jobs}'} jobs interleaved "
                 f"m1..m4; 2 workers x 1 slot, VRAM for one model; 20ms jobs, 500ms load; "
                 f"max_affinity_wait {args.max_affinity_wait}; B = one llm5 job/s",
        "fairness": f"fairness: type gen, 2 workers x 4 slots, 50ms jobs; run 1: A "
                    f"{200 if args.quick else args.fairness_jobs} then B 10; run 2: A then B "
                    f"{(200 if args.quick else args.fairness_jobs) // 2} each",
        "ratelimit": f"ratelimit: 3 models x rpm 20 (burst {args.ratelimit_burst}); 8 workers x 50 "
                     f"slots; 3x{args.ratelimit_jobs} jobs 95%:1s-5s,5%:20s-40s; "
                     f"{90 if args.quick else args.ratelimit_seconds}s",
    }
    print_table(titles[name] + rep, ["figure"] + labels, rows)


def summary(results, args):
    """(scenario, figure, fair, fifo, target, verdict) lines."""
    out = []

    def g(sc, label, run, k):
        try:
            return results[sc][label]["median"][run][k]
        except (KeyError, TypeError):
            return None

    if "swaps" in results:
        fl = g("swaps", "fair", "A", "model_loads")
        out.append(["swaps", "model loads (A only)", fl, g("swaps", "fifo", "A", "model_loads"),
                    "fair <= 8", verdict(None if fl is None else fl <= 8)])
        out.append(["swaps", "makespan s (A only)", g("swaps", "fair", "A", "makespan_s"),
                    g("swaps", "fifo", "A", "makespan_s"), "", ""])
        bw = g("swaps", "fair", "A+B", "b_wait_max_s")
        bound = r3(parse_duration(args.max_affinity_wait) + 0.020 + 0.500)
        out.append(["swaps", "B worst wait s", bw, g("swaps", "fifo", "A+B", "b_wait_max_s"),
                    f"fair <= {fmt(bound)}", verdict(None if bw is None else bw <= bound)])
        ov = g("swaps", "fair", "A+B", "b_over_maw_plus_job")
        out.append(["swaps", "B jobs over maw + 1 job", ov,
                    g("swaps", "fifo", "A+B", "b_over_maw_plus_job"),
                    f"fair 0 (> {fmt(r3(parse_duration(args.max_affinity_wait) + 0.02))} s)",
                    verdict(None if ov is None else ov == 0)])
        out.append(["swaps", "B median wait s", g("swaps", "fair", "A+B", "b_wait_median_s"),
                    g("swaps", "fifo", "A+B", "b_wait_median_s"), "", ""])
    if "fairness" in results:
        ok = g("fairness", "fair", "A then B", "b_all_before_50th_a")
        out.append(["fairness", "B all start before 50th waiting A", ok,
                    g("fairness", "fifo", "A then B", "b_all_before_50th_a"), "fair: yes",
                    verdict(ok if ok is None else ok is not False)])
        out.append(["fairness", "B max start delay s",
                    g("fairness", "fair", "A then B", "b_max_start_delay_s"),
                    g("fairness", "fifo", "A then B", "b_max_start_delay_s"), "", ""])
        j = g("fairness", "fair", "A+B", "jain")
        out.append(["fairness", "Jain index (both queued)", j, g("fairness", "fifo", "A+B", "jain"),
                    "fair >= 0.95", verdict(None if j is None else j >= 0.95)])
    if "ratelimit" in results:
        m = g("ratelimit", "fair", "rpm", "max_dispatches_60s")
        allowed = 3 * (args.ratelimit_burst + 20)
        out.append(["ratelimit", "max dispatches in 60s", m,
                    g("ratelimit", "fifo", "no rpm", "max_dispatches_60s"),
                    f"fair <= {fmt(allowed)}", verdict(None if m is None else m <= allowed)])
        r = g("ratelimit", "fair", "rpm", "steady_rate_per_s")
        rb = g("ratelimit", "fair", "rpm", "steady_rate_bound_per_s")
        out.append(["ratelimit", "steady rate /s (after 60s)", r,
                    g("ratelimit", "fifo", "no rpm", "steady_rate_per_s"),
                    f"fair 0.9 .. {fmt(rb)}",
                    verdict(None if r is None or rb is None else 0.9 <= r <= rb)])
        e = g("ratelimit", "fair", "rpm", "bucket_worst_excess_jobs")
        out.append(["ratelimit", "worst excess over burst+rate*t", e, None, "fair <= 0",
                    verdict(None if e is None else e <= 0.001)])
    return out


def verdict(ok):
    return "-" if ok is None else "met" if ok else "MISSED"


# ------------------------------------------------------------------------------------------------


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", choices=["swaps", "fairness", "ratelimit", "all"], default="all")
    p.add_argument("--policy", choices=["both", "fair", "fifo"], default="both",
                   help="run only this policy (default both, side by side)")
    p.add_argument("--quick", action="store_true",
                   help="smoke sizes: swaps 4x50, fairness 200, ratelimit 90 s")
    p.add_argument("--pg-url", help="use this PostgreSQL (needs CREATEDB) instead of starting one "
                                    "with tests/pg/pg_fixture.sh")
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--workdir", help="logs and state (default: a new /tmp/sched-e2e-* directory)")
    p.add_argument("--json-out", help="write all figures as JSON to this file")
    p.add_argument("--repeat", type=int, default=1, help="runs per scenario and policy; tables "
                                                         "show the median")
    p.add_argument("--concurrency", type=int, default=8, help="dispatchctl submits at once")
    p.add_argument("--workers-first", action="store_true",
                   help="start workers before submitting (default: queue the backlog first)")
    p.add_argument("--max-affinity-wait", default="5s", help="swaps: the types' max_affinity_wait")
    p.add_argument("--swaps-jobs", type=int, default=250, help="swaps: A's jobs per model")
    p.add_argument("--fairness-jobs", type=int, default=1000, help="fairness: A's jobs in run 1 "
                                                                   "(run 2: half each)")
    p.add_argument("--ratelimit-seconds", type=int, default=300)
    p.add_argument("--ratelimit-jobs", type=int, default=120, help="ratelimit: jobs per model")
    p.add_argument("--ratelimit-burst", type=int, default=1)
    p.add_argument("--ratelimit-fifo-limited", action="store_true",
                   help="ratelimit: also run fifo with the rpm keys (fifo keeps rate limits)")
    p.add_argument("--run-timeout", type=float, default=1800,
                   help="seconds a run may take to drain its jobs")
    p.add_argument("--seed", type=int, default=1, help="workers' --seed base")
    p.add_argument("--keep-dbs", action="store_true", help="do not drop the per-run databases")
    p.add_argument("--keep-logs", action="store_true", help="keep the work directory on success")
    args = p.parse_args()
    parse_duration(args.max_affinity_wait)

    signal.signal(signal.SIGTERM, _on_signal)
    signal.signal(signal.SIGHUP, _on_signal)

    machine = machine_info()
    cmd = " ".join(shlex.quote(a) for a in [sys.executable] + sys.argv)
    print(f"command: {cmd}")
    print(f"machine: {machine['nproc']} CPUs ({machine['cpu']}), {machine['memory']}, "
          f"Linux {machine['kernel']}, Python {machine['python']}")
    print(f"start:   {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; submissions by dispatchctl, "
          f"{args.concurrency} at a time; "
          f"{'workers start first' if args.workers_first else 'backlog queued before workers'}")
    sys.stdout.flush()

    scenarios = ["swaps", "fairness", "ratelimit"] if args.scenario == "all" else [args.scenario]
    bench = None
    ok = False
    results = {}
    try:
        bench = Bench(args)
        print("binaries: " + ", ".join(f"{v['path']} ({v['mtime']})"
                                       for v in bench.binaries.values()))
        print(f"workdir: {bench.workdir}")
        sys.stdout.flush()
        bench.pg.start()
        for sc in scenarios:
            results[sc] = bench.run_scenario(sc)
            scenario_table(sc, results[sc], args)
        summ = summary(results, args)
        print_table("summary" + (f" (median of {args.repeat})" if args.repeat > 1 else ""),
                    ["scenario", "figure", "fair", "fifo", "target", "verdict"], summ)
        if args.json_out:
            with open(args.json_out, "w") as f:
                json.dump({"command": cmd, "machine": machine, "args": vars(args),
                           "binaries": bench.binaries,
                           "scenarios": results,
                           "summary": [dict(zip(["scenario", "figure", "fair", "fifo", "target",
                                                 "verdict"], s)) for s in summ]}, f, indent=2)
            print(f"\nJSON: {args.json_out}")
        ok = True
    except BenchError as e:
        print(f"\nsched_e2e_bench: error: {e}", file=sys.stderr)
        if bench:
            print(f"sched_e2e_bench: logs kept in {bench.workdir}", file=sys.stderr)
        return 1
    except BaseException:
        if bench:
            print(f"\nsched_e2e_bench: interrupted or failed; logs kept in {bench.workdir}",
                  file=sys.stderr)
        raise
    finally:
        kill_all_children()
        if bench:
            bench.pg.stop()
            if ok and not args.keep_logs and not args.workdir:
                shutil.rmtree(bench.workdir, ignore_errors=True)
            elif ok:
                print(f"logs: {bench.workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
