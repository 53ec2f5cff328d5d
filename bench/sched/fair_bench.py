#!/usr/bin/env python3
"""Fairness between tenants, end to end: the real dispatchd, PostgreSQL and reference workers.

Each scenario runs with `scheduler.policy: fair` and again with the plain `fifo` policy on the
same input (the same jobs, submitted in the same order by the same principals), reads every job
row back from PostgreSQL and computes the figures from the rows, so they are what the daemon did.
Principals authenticate with bearer tokens from a tokens file; tenants come from the config.

Service is counted as the worker time a tenant's jobs used (finished_at - started_at), credited
at dispatch: S_i(t) is the work of tenant i's jobs dispatched by t. The measured window runs from
the first dispatch to the last dispatch of the tenant whose queue empties first, the span in which
both are backlogged.

Scenarios (--scenario, default all):

  weights    tenants A (weight 3) and B (weight 1), 1500 jobs each of 20-200 ms (seeded), all
             queued before 2 workers x 8 slots connect, A's first. A's share of the served
             work (bar 75% +- 5%), Jain's index over weight-normalised service (bar >= 0.98), and
             the largest weight-normalised service difference |S_A/3 - S_B/1| at any instant, in
             units of the largest job (bar <= 2 per slot: 16 slots dispatch 16 jobs whose cost is
             known only when they end; VTC's bound for a server running a batch likewise grows
             with the batch's capacity).
  wrongcost  tenants A and B of weight 1 on types of the same durations; A's type declares a
             default_cost 10x its jobs' mean, B's the true mean. The same difference (bar <= 2
             largest jobs per slot) and shares (bar 50% +- 5%): a charge is corrected when its
             job ends, and the estimate (an EMA from default_cost) learns within a few jobs.
  keys       a tenant whose gateway spreads 2000 jobs over 1000 end users' keys against a tenant
             with one key and 1000 jobs; then again with the heavy tenant on one key. Each tenant's
             share (bar 50% +- 5%) and the light tenant's p99 queue wait (dispatch - submit) with
             1000 keys over the same with one key (bar <= 1.2).
  floor      tenant A (weight 10) saturates 2 workers x 4 slots with jobs of 0.5-1.5 s; 3 s in,
             tenant F (weight 1, min_running: 4) submits 12 jobs of 1 s. Time from F's first
             submit until 4 of its jobs run at once (bar <= one job, 1 s). Its fair share alone
             (1/11 of the fleet) would give it one slot.
  loads      model loads against the mix's lower bound (one load per model: every worker starts
             empty), bar lower bound + 1: seed 000's three mixes on one GPU (cover_letter 2.5 GB,
             company_research 5 GB, wizard_generate 2.5 GB; 6 GB, 8 GB with two slots, 6 GB),
             and a random mix of 6 models (20 GB each) on 3 workers with room for one, with a
             lone job of a seventh model 5 s in; its wait (bar max_affinity_wait + one job + one
             load). Jobs 200 ms, a load 1 s (the worker's --model-load-delay).
  failover   A (3) and B (1) as in weights, 3000 and 1000 jobs, two daemons sharing the database
             (ha.lease 2s). 6 s in the leader is killed (SIGKILL) and the standby takes over; the
             killed one comes back as a standby; 12 s in both are stopped and started again. A's
             share over the whole window (bar 75% +- 5%): the accounts are kept in PostgreSQL.
             fair only (fifo has no shares to keep).

Output: a table per scenario (medians of --runs) with each figure beside its bar, JSON of every
run (--json-out), the time series as CSV and, with python3-matplotlib installed, a PNG of the
share over time per scenario and policy (--plots DIR).

Example:
  python3 bench/sched/fair_bench.py --runs 3 --plots docs/img
  python3 bench/sched/fair_bench.py --scenario floor --runs 1
"""

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sched_e2e_bench as e2e  # noqa: E402  (processes, PostgreSQL, small helpers)
from fair_cluster import (  # noqa: E402
    BIN_S, Cluster, all_succeeded, share_figures, wait_p99)

from sched_e2e_bench import BenchError, log  # noqa: E402

REPO = e2e.REPO


# ------------------------------------------------------------------------------------------------
# Scenarios: each returns a dict of figures for one policy and one run.


class Bench:
    def __init__(self, args):
        self.args = args
        self.seq = 0
        self.workdir = args.workdir or tempfile.mkdtemp(prefix="fair-bench-")
        os.makedirs(self.workdir, exist_ok=True)
        bindir = os.path.join(self.workdir, "bin")
        os.makedirs(bindir, exist_ok=True)
        for name, sub, attr in (("dispatchd", "server/daemon", "dispatchd"),
                                ("dispatch-worker", "client/cpp", "worker"),
                                ("dispatchctl", "client/cpp", "ctl")):
            dst = os.path.join(bindir, name)
            shutil.copy2(e2e.find_binary(args.build_dir, name, sub), dst)
            setattr(self, attr, dst)
        sys.path.insert(0, os.path.join(args.build_dir, "client", "python"))
        self.pg = e2e.Postgres(self.workdir, args.pg_url)
        self.run_no = 0
        self.series = {}

    def save_series(self, name, header, points):
        key = f"{name}"
        self.series.setdefault(key, {})[self.run_no] = (header, points)
        path = os.path.join(self.workdir, f"{name}-run{self.run_no}.csv")
        with open(path, "w") as f:
            f.write(",".join(header) + "\n")
            for p in points:
                f.write(",".join(f"{x:.4f}" for x in p) + "\n")

    def rng(self, salt):
        return random.Random(f"{self.args.seed}-{salt}")

    def durations(self, n, salt, lo=20, hi=200):
        r = self.rng(salt)
        return [f"{r.randint(lo, hi)}ms" for _ in range(n)]

    # -- weights and wrongcost ----------------------------------------------------------------
    def two_tenants(self, policy, name, weights, default_costs, jobs=1500):
        tenants = [{"name": "A", "principals": ["alice"], "weight": weights[0]},
                   {"name": "B", "principals": ["bob"], "weight": weights[1]}]
        types = [{"name": "ta", "default_cost": default_costs[0]},
                 {"name": "tb", "default_cost": default_costs[1]}]
        c = Cluster(self, name, policy, types, tenants,
                    {"alice": "client", "bob": "client", "gpu": "worker", "ops": "admin"})
        rows = self.backlog_then_drain(c, [
            ("alice", [{"type": "ta", "payload": d} for d in self.durations(jobs, f"{name}-a")]),
            ("bob", [{"type": "tb", "payload": d} for d in self.durations(jobs, f"{name}-b")])],
            ["ta", "tb"])
        f = share_figures(rows, tenants, f"{name}-{policy}", self)
        return {"share_A": f["shares"]["A"], "jain": f["jain"],
                "max_diff_jobs": f["max_diff_jobs"], "max_diff_at_s": f["max_diff_at_s"],
                "max_accrued_diff_jobs": f["max_accrued_diff_jobs"], "window_s": f["window_s"]}

    def backlog_then_drain(self, c, backlog, types):
        """Starts `c`, queues each (principal, specs) of `backlog` in order, then starts 2
        workers x 8 slots of `types` and returns the rows once every job has ended."""
        try:
            c.start()
            for principal, specs in backlog:
                c.submit(principal, specs)
            c.start_workers(2, types, 8, ["--sleep-payload"])
            c.wait_done(600)
            rows = c.rows()
        finally:
            c.stop()
        all_succeeded(rows)
        return rows

    def weights(self, policy):
        return self.two_tenants(policy, "weights", (3, 1), (0.11, 0.11))

    def wrongcost(self, policy):
        # Both types' jobs average 110 ms; A's type claims 1.1 s.
        return self.two_tenants(policy, "wrongcost", (1, 1), (1.1, 0.11))

    # -- keys ----------------------------------------------------------------------------------
    def keys_run(self, policy, heavy_keys):
        tenants = [{"name": "H", "principals": ["front"]}, {"name": "L", "principals": ["lee"]}]
        c = Cluster(self, f"keys{heavy_keys}", policy, [{"name": "gen", "default_cost": 0.11}],
                    tenants, {"front": "gateway", "lee": "client", "gpu": "worker",
                              "ops": "admin"})
        heavy = self.durations(2000, "keys-h")
        rows = self.backlog_then_drain(c, [
            ("front", [{"type": "gen", "payload": d, "fairness_key": f"user{i % heavy_keys}"}
                       for i, d in enumerate(heavy)]),
            ("lee", [{"type": "gen", "payload": d} for d in self.durations(1000, "keys-l")])],
            ["gen"])
        f = share_figures(rows, tenants, f"keys{heavy_keys}-{policy}", self)
        return f, wait_p99(rows, "lee")

    def keys(self, policy):
        many, p99_many = self.keys_run(policy, 1000)
        one, p99_one = self.keys_run(policy, 1)
        return {"share_H_1000_keys": many["shares"]["H"], "share_H_1_key": one["shares"]["H"],
                "light_p99_wait_1000_keys_s": p99_many, "light_p99_wait_1_key_s": p99_one,
                "light_p99_ratio": p99_many / p99_one if p99_one else None}

    # -- floor ---------------------------------------------------------------------------------
    def floor(self, policy):
        tenants = [{"name": "A", "principals": ["alice"], "weight": 10},
                   {"name": "F", "principals": ["fay"], "weight": 1, "min_running": 4}]
        c = Cluster(self, "floor", policy, [{"name": "gen", "default_cost": 1.0}], tenants,
                    {"alice": "client", "fay": "client", "gpu": "worker", "ops": "admin"})
        try:
            c.start()
            # Durations of 0.5-1.5 s, so that slots free up one by one as in a real fleet.
            c.submit("alice", [{"type": "gen", "payload": d}
                               for d in self.durations(200, "floor", 500, 1500)])
            c.start_workers(2, ["gen"], 4, ["--sleep-payload"])
            time.sleep(3)
            c.submit("fay", [{"type": "gen", "payload": "1s"} for _ in range(12)])
            c.wait_done(600)
            rows = c.rows()
        finally:
            c.stop()
        all_succeeded(rows)
        fay = [r for r in rows if r["owner"] == "fay"]
        submitted = min(r["created"] for r in fay)
        # The first instant at which 4 of F's jobs run at once.
        edges = sorted([(r["finished"] - r["cost"], 1) for r in fay] +
                       [(r["finished"], -1) for r in fay])
        running, reached = 0, None
        for t, d in edges:
            running += d
            if running >= 4:
                reached = t
                break
        return {"time_to_floor_s": None if reached is None else reached - submitted,
                "F_jobs": len(fay)}

    # -- loads ---------------------------------------------------------------------------------
    def mix_run(self, policy, name, types, jobs, workers, gpu_gb, slots=1, lone=None):
        """jobs: list of type names in submission order (by alice); lone: (type, after_s)."""
        c = Cluster(self, name, policy, types, [],
                    {"alice": "client", "bob": "client", "gpu": "worker", "ops": "admin"})
        try:
            c.start()
            c.submit("alice", [{"type": t, "payload": "x"} for t in jobs])
            c.start_workers(workers, [t["name"] for t in types], slots,
                            ["--simulate", "100%:200ms"], gpu_gb=gpu_gb, load_delay="1s")
            if lone:
                time.sleep(lone[1])
                c.submit("bob", [{"type": lone[0], "payload": "x"}])
            c.wait_done(900)
            loads = c.model_loads()
            rows = c.rows()
        finally:
            c.stop()
        all_succeeded(rows)
        models = {t["name"]: t["model"] for t in types}
        bound = len({models[r["type"]] for r in rows})
        out = {"loads": loads, "lower_bound": bound, "over_bound": loads - bound}
        if lone:
            r = next(r for r in rows if r["owner"] == "bob")
            out["lone_wait_s"] = e2e.dispatch_time(r) - r["created"]
        return out

    def loads(self, policy):
        seed000 = [{"name": "cover_letter", "model": "cover", "vram_gb": 2.5},
                   {"name": "company_research", "model": "research", "vram_gb": 5},
                   {"name": "wizard_generate", "model": "wizard", "vram_gb": 2.5}]
        r = self.rng("mix")
        out = {}
        mix1 = ["cover_letter"] * 20 + ["company_research"] * 10
        r.shuffle(mix1)
        mix3 = ["cover_letter", "company_research", "wizard_generate"] * 12
        r.shuffle(mix3)
        for label, jobs, gb, slots in (("seed000_deepest", mix1, 6, 1),
                                       ("seed000_concurrent", mix1, 8, 2),
                                       ("seed000_three", mix3, 6, 1)):
            f = self.mix_run(policy, label, seed000, jobs, 1, gb, slots)
            out[f"{label}_loads"] = f["loads"]
            out[f"{label}_over_bound"] = f["over_bound"]
        types = [{"name": f"t{m}", "model": f"m{m}", "vram_gb": 20, "max_affinity_wait": "10s"}
                 for m in range(7)]
        jobs = [f"t{m}" for m in range(6) for _ in range(r.randint(5, 60))]
        r.shuffle(jobs)
        f = self.mix_run(policy, "random6", types, jobs, 3, 24, lone=("t6", 5))
        out["random6_loads"] = f["loads"]
        out["random6_lower_bound"] = f["lower_bound"]
        out["random6_over_bound"] = f["over_bound"]
        out["random6_lone_wait_s"] = f["lone_wait_s"]
        out["worst_over_bound"] = max(v for k, v in out.items() if k.endswith("_over_bound"))
        return out

    # -- failover ------------------------------------------------------------------------------
    def failover(self, policy):
        tenants = [{"name": "A", "principals": ["alice"], "weight": 3},
                   {"name": "B", "principals": ["bob"], "weight": 1}]
        c = Cluster(self, "failover", policy,
                    [{"name": "ta", "default_cost": 0.11}, {"name": "tb", "default_cost": 0.11}],
                    tenants, {"alice": "client", "bob": "client", "gpu": "worker",
                              "ops": "admin"}, daemons=2, lease="2s")
        try:
            c.start()
            c.submit("alice", [{"type": "ta", "payload": d}
                               for d in self.durations(3000, "fo-a")])
            c.submit("bob", [{"type": "tb", "payload": d}
                             for d in self.durations(1000, "fo-b")])
            c.start_workers(2, ["ta", "tb"], 8, ["--sleep-payload"])
            time.sleep(6)
            lead = c.leader()
            if lead is None:
                raise BenchError("no daemon leads")
            c.stop_daemon(lead, signal.SIGKILL)
            killed = time.time()
            while c.leader() != 1 - lead:
                if time.time() - killed > 20:
                    raise BenchError("the standby did not take over in 20 s")
                time.sleep(0.05)
            took_over = time.time() - killed
            c.start_daemon(lead)  # back, as a standby
            time.sleep(6)
            for i in range(2):
                c.stop_daemon(i)
            for i in range(2):
                c.start_daemon(i)
            c.wait_done(600)
            rows = c.rows()
        finally:
            c.stop()
        all_succeeded(rows)
        f = share_figures(rows, tenants, f"failover-{policy}", self)
        return {"share_A": f["shares"]["A"], "jain": f["jain"], "window_s": f["window_s"],
                "max_diff_jobs": f["max_diff_jobs"], "standby_took_over_s": took_over}


# ------------------------------------------------------------------------------------------------
# Bars, tables and plots.

# The service difference is bounded per slot: VTC's bound for a server that runs a batch at once
# is 2 x (the largest job + the batch's capacity), and 16 slots dispatch 16 jobs whose cost is
# only known when they end.
SLOTS = 16
BARS = {
    "weights": [("share_A", "75% +- 5%", lambda v: abs(v - 0.75) <= 0.05),
                ("jain", ">= 0.98", lambda v: v >= 0.98),
                ("max_diff_jobs", f"<= 2 x {SLOTS} slots", lambda v: v <= 2 * SLOTS)],
    "wrongcost": [("share_A", "50% +- 5%", lambda v: abs(v - 0.5) <= 0.05),
                  ("jain", ">= 0.98", lambda v: v >= 0.98),
                  ("max_diff_jobs", f"<= 2 x {SLOTS} slots", lambda v: v <= 2 * SLOTS)],
    "keys": [("share_H_1000_keys", "50% +- 5%", lambda v: abs(v - 0.5) <= 0.05),
             ("share_H_1_key", "50% +- 5%", lambda v: abs(v - 0.5) <= 0.05),
             ("light_p99_ratio", "<= 1.2", lambda v: v <= 1.2)],
    "floor": [("time_to_floor_s", "<= 1 s (one job)", lambda v: v is not None and v <= 1.0)],
    "loads": [("worst_over_bound", "<= 1", lambda v: v <= 1),
              ("random6_lone_wait_s", "<= 10 s + 0.2 s + 1 s", lambda v: v <= 11.2)],
    "failover": [("share_A", "75% +- 5%", lambda v: abs(v - 0.75) <= 0.05)],
}
POLICIES = {"failover": ["fair"]}


def median_of(runs):
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r.get(k), (int, float))]
        out[k] = statistics.median(vals) if vals else None
    return out


def plot(bench, plots_dir):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log("python3-matplotlib is not installed: no plots (apt-get install python3-matplotlib)")
        return []
    os.makedirs(plots_dir, exist_ok=True)
    made = []
    groups = {}
    for name, runs in bench.series.items():
        scenario, policy = name.rsplit("-", 1)
        groups.setdefault(scenario, {})[policy] = runs
    for scenario, by_policy in sorted(groups.items()):
        fig, axes = plt.subplots(1, len(by_policy), figsize=(5 * len(by_policy), 3.2),
                                 squeeze=False, sharey=True)
        for ax, (policy, runs) in zip(axes[0], sorted(by_policy.items())):
            run_no = sorted(runs)[len(runs) // 2]
            header, points = runs[run_no]
            for col in range(1, len(header)):
                ax.plot([p[0] for p in points], [p[col] for p in points],
                        label=header[col].replace("share_", "tenant "))
            ax.set_title(f"{scenario}: {policy}")
            ax.set_xlabel("seconds since the first dispatch")
            ax.set_ylim(-0.02, 1.02)
            ax.grid(alpha=0.3)
        axes[0][0].set_ylabel(f"share of the work dispatched\nin each {BIN_S} s")
        axes[0][-1].legend(loc="best", fontsize=8)
        fig.tight_layout()
        path = os.path.join(plots_dir, f"fair-{scenario}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        made.append(path)
    return made


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--scenario", default="all",
                   help="weights, wrongcost, keys, floor, loads, failover, or all (comma-separated)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--build-dir", default=os.path.join(REPO, "build"))
    p.add_argument("--pg-url", default=None, help="use this PostgreSQL instead of starting one")
    p.add_argument("--workdir", default=None)
    p.add_argument("--keep-dbs", action="store_true")
    p.add_argument("--plots", default=None, help="directory for the PNG plots")
    p.add_argument("--json-out", default=None)
    args = p.parse_args()
    names = list(BARS) if args.scenario == "all" else args.scenario.split(",")
    for n in names:
        if n not in BARS:
            p.error(f"--scenario: unknown {n!r}")

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, e2e._on_signal)
    bench = Bench(args)
    bench.pg.start()
    results = {}
    ok_all = True
    try:
        for n in names:
            for policy in POLICIES.get(n, ["fair", "fifo"]):
                runs = []
                for i in range(args.runs):
                    bench.run_no = i
                    log(f"{n} {policy}: run {i + 1} of {args.runs}")
                    runs.append(getattr(bench, n)(policy))
                    log(f"  {json.dumps(runs[-1])}")
                results.setdefault(n, {})[policy] = {"runs": runs, "median": median_of(runs)}
    finally:
        bench.pg.stop()
        e2e.kill_all_children()
    print(f"\nmachine: {json.dumps(e2e.machine_info())}")
    print(f"command: python3 bench/sched/fair_bench.py {' '.join(sys.argv[1:])}")
    for n in names:
        print(f"\n== {n} (median of {args.runs})")
        pols = list(results[n])
        print(f"{'figure':34} {'bar':24} " + " ".join(f"{x:>10}" for x in pols) + "  met")
        fair = results[n]["fair"]["median"]
        for key, bar, test in BARS[n]:
            met = fair.get(key) is not None and test(fair[key])
            ok_all &= met
            vals = " ".join(f"{e2e.fmt(results[n][x]['median'].get(key)):>10}" for x in pols)
            print(f"{key:34} {bar:24} {vals}  {'yes' if met else 'NO'}")
        shown = {k for k, _b, _t in BARS[n]}
        for key in fair:
            if key not in shown:
                vals = " ".join(f"{e2e.fmt(results[n][x]['median'].get(key)):>10}" for x in pols)
                print(f"{key:34} {'':24} {vals}")
    if args.plots:
        for path in plot(bench, args.plots):
            print(f"plot: {path}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump({"machine": e2e.machine_info(), "args": vars(args), "results": results},
                      f, indent=1)
    print(f"\nworkdir (CSV of each run's shares over time): {bench.workdir}")
    print("every bar met" if ok_all else "SOME BARS NOT MET")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
