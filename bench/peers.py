"""bench.py's peer, graphile-worker, on the same PostgreSQL server in the same sitting: its drain
(../shared/peers/graphile-yardstick) and its light-load latency (peer/graphile-latency.js), and
dispatchd's figures set against them, printed and recorded with their targets.

Python 3 standard library only.
"""

import json
import os
import re
import statistics
import subprocess

from sched_e2e_bench import BenchError, log
from measure import median_figures

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# The drain's peer: ../shared/peers/graphile-yardstick beside the repository.
PEER = os.path.join(os.path.dirname(REPO), "shared", "peers", "graphile-yardstick")
# The latency scenario's peer: graphile-worker's add_job to task start, probed at the same rate.
PEER_LATENCY = os.path.join(HERE, "peer", "graphile-latency.js")
# Where graphile-yardstick installs graphile-worker and pg (YARDSTICK_CACHE moves it there too);
# the latency probe uses the same copy, installed the same way when it is missing.
PEER_CACHE = os.environ.get("YARDSTICK_CACHE") or os.path.expanduser(
    "~/.cache/dispatchd-yardstick")
PEER_PACKAGES = ("graphile-worker@0.18.0", "pg@8")
# The latency targets set against the peer, measured in the same sitting on the same server:
# dispatchd's figure (median of its runs) / graphile-worker's add_job to task start at percentile
# pct (median of its runs) <= limit. graphile-worker has no RunSync, so its add_job to task start
# is RunSync's yardstick too.
PEER_LATENCY_TARGETS = (("submit_to_worker_p50_ms", "p50", 0.35),
                        ("submit_to_worker_p99_ms", "p99", 0.5),
                        ("runsync_p50_ms", "p50", 0.6))
# The drain's target against the peer: its median jobs/s at least this many times the peer's.
PEER_DRAIN_TARGET = 1.5


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


def peer_node_modules():
    """The node_modules folder with graphile-worker 0.18.0 and pg 8, installed from the npm
    registry into PEER_CACHE as graphile-yardstick installs them, if they are not there yet."""
    modules = os.path.join(PEER_CACHE, "node_modules")
    if os.path.isdir(os.path.join(modules, "graphile-worker")):
        return modules
    log(f"installing {' '.join(PEER_PACKAGES)} into {PEER_CACHE} ...")
    os.makedirs(PEER_CACHE, exist_ok=True)
    for argv in (["npm", "init", "-y"],
                 ["npm", "install", "--no-audit", "--no-fund", *PEER_PACKAGES]):
        try:
            r = subprocess.run(argv, cwd=PEER_CACHE, capture_output=True, text=True, timeout=900)
        except (OSError, subprocess.TimeoutExpired) as e:
            raise BenchError(f"{' '.join(argv)} in {PEER_CACHE}: {e}")
        if r.returncode != 0:
            raise BenchError(f"{' '.join(argv)} in {PEER_CACHE} failed ({r.returncode}):\n"
                             f"{r.stdout}{r.stderr}")
    return modules


def run_peer_latency(b):
    """graphile-worker's light-load latency on the same server, --runs times at the latency
    scenario's --probes, --warmup and --rate (bench/peer/graphile-latency.js, on a fresh database
    each run): add_job sent to the task's start, and to add_job's answer. Each run's figures and
    their medians."""
    a = b.args
    if "://" not in b.pg.url:
        raise BenchError("the graphile-worker peer needs --pg-url as a postgresql:// URL "
                         "(or --no-peer)")
    env = dict(os.environ, NODE_PATH=peer_node_modules())
    db = "yardstick_lat"
    runs, version = [], ""
    try:
        for i in range(1, a.runs + 1):
            argv = ["node", PEER_LATENCY, "--url", b.pg.url, "--db", db, "--fresh",
                    "--probes", str(a.probes), "--warmup", str(a.warmup), "--rate", str(a.rate),
                    "--concurrency", str(a.peer_concurrency), "--timeout", str(int(a.timeout))]
            try:
                r = subprocess.run(argv, capture_output=True, text=True, env=env,
                                   timeout=a.timeout + 60)
            except (OSError, subprocess.TimeoutExpired) as e:
                raise BenchError(f"graphile-latency.js: {e}")
            if r.returncode != 0:
                raise BenchError(f"graphile-latency.js failed ({r.returncode}):\n"
                                 f"{r.stdout}{r.stderr}")
            try:
                got = json.loads(r.stdout.strip().splitlines()[-1])
                version = got.get("version", version)
                run = {"probes": got["probes"], "late_probes": got["late_probes"]}
                for kind in ("add_to_start", "add_answered"):
                    for pct in ("p50", "p90", "p99", "p999", "max"):
                        run[f"{kind}_{pct}_ms"] = got[f"{kind}_ms"][pct]
            except (ValueError, KeyError, IndexError, TypeError):
                raise BenchError(f"cannot read graphile-latency.js's output:\n{r.stdout}")
            log(f"  graphile-worker latency run {i}: " +
                " ".join(f"{k}={v}" for k, v in run.items()))
            runs.append(run)
    finally:
        if not a.keep_dbs:
            b.pg.drop_db(db)
    return {"peer": f"graphile-worker {version}".strip(),
            "concurrency": a.peer_concurrency, "runs": runs, "median": median_figures(runs)}


def peer_latency_ratios(med, peer):
    """dispatchd's latencies over the peer's (both medians of their runs) against
    PEER_LATENCY_TARGETS: {figure_to_peer_pct: (ratio, limit, met)}."""
    out = {}
    for key, pct, limit in PEER_LATENCY_TARGETS:
        own, theirs = med.get(key), peer["median"].get(f"add_to_start_{pct}_ms")
        if isinstance(own, (int, float)) and theirs:
            ratio = own / theirs
            out[f"{key[:-3]}_to_peer_{pct}"] = (ratio, limit, ratio <= limit)
    return out


def report_latency(med, targets, peer, width):
    """Prints the peer's latency and dispatchd's ratios to it beside the medians (`width`: their
    column), and adds them to `med` and `targets`."""
    pm = peer["median"]
    ratios = peer_latency_ratios(med, peer)
    width = max([width, *map(len, ratios)])
    print(f"  {'graphile-worker':<{width}}  add_job to task start p50 "
          f"{pm['add_to_start_p50_ms']:g} ms, p99 {pm['add_to_start_p99_ms']:g} ms; add_job "
          f"answered p50 {pm['add_answered_p50_ms']:g} ms  (median of {len(peer['runs'])} "
          f"run(s), concurrency {peer['concurrency']})")
    print(f"  {'':<{width}}  runs: p50 {[r['add_to_start_p50_ms'] for r in peer['runs']]}, "
          f"p99 {[r['add_to_start_p99_ms'] for r in peer['runs']]}")
    for kind in ("add_to_start", "add_answered"):
        for pct in ("p50", "p99"):
            med[f"peer_{kind}_{pct}_ms"] = pm[f"{kind}_{pct}_ms"]
    for key, (ratio, limit, met) in ratios.items():
        print(f"  {key:<{width}}  {ratio:.3f}    (target <= {limit}: "
              f"{'met' if met else 'MISSED'})")
        med[key] = round(ratio, 3)
        targets[key] = {"target": limit, "op": "<=", "ratio": round(ratio / limit, 3),
                        "met": met}


def report_drain(med, targets, peer, width):
    """Prints the peer's drain and dispatchd's ratio to it beside the medians, and adds them to
    `med` and `targets`."""
    # The target compares medians; the ratio to the peer's best run is shown beside it.
    ratio = med["jobs_per_s"] / peer["median"]
    ratio_best = med["jobs_per_s"] / peer["best"]
    print(f"  {'graphile-worker':<{width}}  median {peer['median']:g} jobs/s, best {peer['best']}, "
          f"runs {peer['runs']}")
    met = ratio >= PEER_DRAIN_TARGET
    print(f"  {'ratio':<{width}}  {ratio:.2f}x graphile-worker's median    (target >= "
          f"{PEER_DRAIN_TARGET}: {'met' if met else 'MISSED'}); {ratio_best:.2f}x its best")
    med["peer_median_jobs_per_s"] = peer["median"]
    med["peer_best_jobs_per_s"] = peer["best"]
    med["ratio_to_peer_median"] = round(ratio, 3)
    med["ratio_to_peer_best"] = round(ratio_best, 3)
    targets["ratio_to_peer_median"] = {"target": PEER_DRAIN_TARGET, "op": ">=",
                                       "ratio": round(ratio / PEER_DRAIN_TARGET, 3),
                                       "met": met}
