"""The `lab` scenario against the daemon, for bench.py: seed 001's tasks queued as jobs, run by
dispatch-workers that sleep each task's duration, and the figures and table of the scenario.
lab.py holds the parts that need no daemon.

Python 3 standard library only.
"""

import csv
import math
import time

from sched_e2e_bench import BenchError, log, psql
import lab
from harness import Daemon
from measure import median_figures


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
