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

The pieces are beside this file: child processes in e2e_procs.py, PostgreSQL in e2e_pg.py, one
run in e2e_run.py, the scenarios in e2e_scenarios.py, the figures in e2e_figures.py, the tables
in e2e_report.py. Other benchmarks import their helpers from here, so every name stays
importable from this module.

Python 3 standard library only. Example:
  python3 bench/sched/sched_e2e_bench.py --quick
  python3 bench/sched/sched_e2e_bench.py --scenario swaps --json-out /tmp/swaps.json
"""

import argparse
import json
import os
import shlex
import shutil
import signal
import sys
import time

# Re-exported: fair_bench.py, fair_cluster.py and bench/*.py import these from this module.
from e2e_figures import (  # noqa: F401
    bucket_excess, dispatch_time, jain, max_in_window, median_of, model_loads, overlap,
    parse_duration, r3, sanity)
from e2e_pg import TERMINAL, TERMINAL_SQL, Postgres, db_url, psql  # noqa: F401
from e2e_procs import (  # noqa: F401
    REPO, BenchError, _on_signal, find_binary, kill_all_children, log, spawn, stop_process, tail)
from e2e_report import (  # noqa: F401
    fmt, machine_info, print_table, scenario_table, summary, verdict)
from e2e_run import Run, yaml_str  # noqa: F401
from e2e_scenarios import Bench  # noqa: F401


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
