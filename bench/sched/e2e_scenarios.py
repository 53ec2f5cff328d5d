"""The scenarios of sched_e2e_bench (swaps, fairness, ratelimit) on one Bench: each runs a
policy's runs and returns {run: {figure: value}}."""

import os
import shutil
import statistics
import tempfile
import threading
import time

from e2e_figures import (bucket_excess, dispatch_time, jain, max_in_window, median_of,
                         model_loads, overlap, parse_duration, r3, sanity)
from e2e_pg import Postgres
from e2e_procs import find_binary, log
from e2e_run import Run


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
