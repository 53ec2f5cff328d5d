"""The `lab` scenario's parts that need no daemon: seed 001's task set, the baseline that
reproduces its "current" blocking batch dispatch, and the figures both are judged by.

bench.py runs the scenario; this module holds what can be checked without PostgreSQL:

  tasks = make_tasks(1000, 10, seed=1)          # 95 % of 1-5 s, 5 % of 20-40 s, models m0..m9
  base = run_baseline(tasks, 40, 10)            # real sleeps on threads, about a minute
  figs, series, detail = run_figures(tasks, base, slots=400)

A run is described by one Timeline per task: when the task was handed to whatever runs it
(dispatchd: `dispatched_at`; baseline: the start of its sub-batch's call), when it started, and
when its result was recorded (dispatchd: `finished_at`; baseline: the return of its sub-batch's
call, since the batch endpoint returns every result at once). All times are seconds on one clock.

Python 3 standard library only.
"""

import collections
import heapq
import math
import os
import random
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "sched"))

# The exact token-bucket checks are the scheduler benchmark's; shared, not copied.
from sched_e2e_bench import bucket_excess, max_in_window  # noqa: E402

# Seed 001's lab mix: 95 % "standard" tasks of 1-5 s, 5 % outliers of 20-40 s.
SHORT_S = (1.0, 5.0)
LONG_S = (20.0, 40.0)
LONG_SHARE = 0.05

# Targets (the project's issue).
MAKESPAN_SLACK = 0.10   # makespan within 10 % of the lower bound
RATE_FLOOR = 0.99       # rate-limited: at least 99 % of the theoretical rate
DROP_FRACTION = 0.5     # a "deep drop": a second with fewer completions than half the mean
# The rate-limited run's hand-out times are `dispatched_at`, the start of the transaction that
# records a dispatcher turn's claims: after the scheduler's decision by however long the loop takes
# to get there, milliseconds, or tens of them when the machine is busy. So two hand-outs one bucket
# interval apart may lie closer in the rows. A worst excess over the bucket's bound worth less
# than this much hand-out time is reported as such, apart from a real one; a real error of rate
# adds up over the run's windows far beyond it, and a double hand-out is a whole token.
STAMP_TOLERANCE_MS = 50

Task = collections.namedtuple("Task", "index model seconds")
# handed: given to an executor; started: began running; done: stopped running (the baseline's
# own sleep, which the batch call then holds); finished: its result recorded.
Timeline = collections.namedtuple("Timeline", "handed started done finished")


def make_tasks(n, models, seed):
    """n tasks in submission order. Exactly round(5 % of n) outliers at positions drawn from the
    seeded generator, durations uniform in their range and rounded to the millisecond (the
    payload carries them exactly), models m0..m{models-1} in turn so that every model has the
    same share (the rate-limited run keeps all of them busy to the end)."""
    rng = random.Random(seed)
    longs = set(rng.sample(range(n), round(n * LONG_SHARE)))
    tasks = []
    for i in range(n):
        lo, hi = LONG_S if i in longs else SHORT_S
        tasks.append(Task(i, f"m{i % models}", round(rng.uniform(lo, hi), 3)))
    return tasks


def lower_bound(tasks, slots):
    """No schedule on `slots` slots ends sooner: max(longest task, total work / slots)."""
    return max(max(t.seconds for t in tasks), sum(t.seconds for t in tasks) / slots)


def list_schedule(durations, slots):
    """Makespan of greedy list scheduling with no overhead: each task, in the given order, starts
    on the first slot to come free. In submission order this is what an ideal FIFO dispatcher
    achieves; longest first, what a dispatcher that knew the durations could."""
    free = [0.0] * slots
    end = 0.0
    for d in durations:
        t = heapq.heappop(free)
        heapq.heappush(free, t + d)
        end = max(end, t + d)
    return end


def split_batches(tasks, n):
    """The "current" system's fixed batches: n contiguous slices whose sizes differ by one at most."""
    q, r = divmod(len(tasks), n)
    out, at = [], 0
    for i in range(n):
        size = q + (1 if i < r else 0)
        out.append(tasks[at:at + size])
        at += size
    return [b for b in out if b]


def baseline_ideal(tasks, batch_workers, sub_batch):
    """The baseline's makespan with no overhead: the slowest batch worker's sum of sub-batch maxima."""
    return max(sum(max(t.seconds for t in b[i:i + sub_batch]) for i in range(0, len(b), sub_batch))
               for b in split_batches(tasks, batch_workers))


def run_baseline(tasks, batch_workers, sub_batch):
    """Seed 001's "current" dispatch, in this process: the tasks are split into `batch_workers`
    fixed batches; one thread per batch sends it in sub-batches of `sub_batch` to a blocking
    batch endpoint, which runs each task of the sub-batch at once (a thread sleeping the task's
    duration) and returns only when all of them are done. No rate control, as in the seed.
    Returns {task index: Timeline} on the time.time() clock."""
    out = {}
    lock = threading.Lock()
    go = threading.Event()

    def batch_endpoint(sub):
        t_call = time.time()
        done = {}

        def run(t):
            time.sleep(t.seconds)
            done[t.index] = time.time()

        threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in sub]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        t_return = time.time()
        with lock:
            for t in sub:
                out[t.index] = Timeline(t_call, t_call, done[t.index], t_return)

    def batch_worker(batch):
        go.wait()
        for i in range(0, len(batch), sub_batch):
            batch_endpoint(batch[i:i + sub_batch])

    workers = [threading.Thread(target=batch_worker, args=(b,), daemon=True)
               for b in split_batches(tasks, batch_workers)]
    for w in workers:
        w.start()
    go.set()
    for w in workers:
        w.join()
    return out


# ------------------------------------------------------------------------------------------------
# Figures.


def r3(x):
    return None if x is None else round(x, 3)


def percentile(xs, p):
    """Nearest-rank percentile of a non-empty list."""
    s = sorted(xs)
    return s[max(0, min(len(s) - 1, math.ceil(p / 100 * len(s)) - 1))]


def per_second(times, t0, length):
    """Counts of `times` in each second [t0 + k, t0 + k + 1) for k in range(length)."""
    counts = [0] * length
    for t in times:
        k = int(math.floor(t - t0))
        if 0 <= k < length:
            counts[k] += 1
    return counts


def run_figures(tasks, timeline, slots):
    """The figures of one system's run of `tasks` (timeline: {index: Timeline}).

    Makespan: from the first hand-out to the last recorded result, the same definition for
    dispatchd and the baseline. Completions per second: results recorded in each second from the
    first hand-out. The busy span is from the second of the first completion to the second of the
    last hand-out, while tasks still wait to be handed out; its summary is taken over those
    seconds only (after it, completions fall because the work is running out, not because
    anything waits). A deep drop is a second of the busy span with fewer completions than
    DROP_FRACTION of the span's mean (the mean, not the median: the baseline's results come ten
    at a time, so its median second may hold none). Returns (figures, series, detail)."""
    tl = [timeline[t.index] for t in tasks]
    t0 = min(x.handed for x in tl)
    t_end = max(x.finished for x in tl)
    makespan = t_end - t0
    bound = lower_bound(tasks, slots)
    length = int(math.ceil(makespan)) or 1
    completions = per_second([x.finished for x in tl], t0, length)
    handouts = per_second([x.handed for x in tl], t0, length)
    first_done = min(x.finished for x in tl)
    last_handed = max(x.handed for x in tl)
    k0, k1 = int(first_done - t0), int(last_handed - t0)
    busy = completions[k0:k1 + 1] if k1 >= k0 else []
    figs = {
        "makespan_s": r3(makespan),
        "lower_bound_s": r3(bound),
        "makespan_over_bound": r3(makespan / bound),
        "tasks_per_s": r3(len(tasks) / makespan),
        "last_handout_s": r3(last_handed - t0),
        "busy_span_s": len(busy),
    }
    if busy:
        mean = statistics.mean(busy)
        figs.update({
            "busy_completions_mean": r3(mean),
            "busy_completions_median": statistics.median(busy),
            "busy_completions_min": min(busy),
            "busy_completions_p10": percentile(busy, 10),
            "busy_completions_max": max(busy),
            "busy_completions_stdev": r3(statistics.pstdev(busy)),
            "busy_completions_cv": r3(statistics.pstdev(busy) / mean) if mean > 0 else None,
            "busy_drop_seconds": sum(1 for c in busy if c < DROP_FRACTION * mean),
        })
    else:  # everything was handed out before anything finished (more slots than tasks)
        figs.update({k: None for k in ("busy_completions_mean", "busy_completions_median",
                                       "busy_completions_min",
                                       "busy_completions_p10", "busy_completions_max",
                                       "busy_completions_stdev", "busy_completions_cv",
                                       "busy_drop_seconds")})

    # Where the makespan goes: the task that ended last, the latest hand-out of an outlier, and
    # the time between hand-out, start and result.
    last = max(tasks, key=lambda t: (timeline[t.index].finished, timeline[t.index].done))
    lt = timeline[last.index]
    longs = [t for t in tasks if t.seconds >= LONG_S[0]]
    figs.update({
        "last_task_index": last.index,
        "last_task_model": last.model,
        "last_task_seconds": last.seconds,
        "last_task_handed_s": r3(lt.handed - t0),
        "long_last_handed_s": r3(max(timeline[t.index].handed for t in longs) - t0)
        if longs else None,
        # The same hand-out order with no overhead: the order's share of the makespan.
        "ideal_in_handout_order_s": r3(list_schedule(
            [t.seconds for t in sorted(tasks, key=lambda t: timeline[t.index].handed)], slots)),
        "handed_to_started_median_ms": r3(1000 * statistics.median(x.started - x.handed for x in tl)),
        # Hand-out to recorded result, less the task's own duration: what the path costs.
        "path_overhead_median_ms": r3(1000 * statistics.median(
            x.finished - x.handed - t.seconds for x, t in zip(tl, tasks))),
        "path_overhead_p99_ms": r3(1000 * percentile(
            [x.finished - x.handed - t.seconds for x, t in zip(tl, tasks)], 99)),
        "result_held_mean_s": r3(statistics.mean(x.finished - x.done for x in tl)),
    })
    series = {"completions": completions, "handouts": handouts}
    detail = [[t.index, r3(x.handed - t0), r3(x.started - t0), r3(x.done - t0),
               r3(x.finished - t0)] for t, x in zip(tasks, tl)]
    return figs, series, detail


def rate_figures(tasks, timeline, models, rpm, burst, warmup):
    """Rate-limit figures of one run: per model, hand-outs after `warmup` seconds from the first
    hand-out give the steady rate (the mean gap between a model's consecutive hand-outs, so that a
    window's edges add no bias), summed over the models, against models x rpm / 60; and the exact
    token-bucket bound: the most hand-outs of one model in any window of length t never exceed
    burst + rate x t (worst excess over it, in tokens and in how many milliseconds too early the
    hand-out that exceeds it lies, and the most in any 60 s window)."""
    rate = rpm / 60.0
    t0 = min(timeline[t.index].handed for t in tasks)
    by_model = collections.defaultdict(list)
    for t in tasks:
        by_model[t.model].append(timeline[t.index].handed)
    steady, counted = 0.0, 0
    for ts in by_model.values():
        late = sorted(x for x in ts if x > t0 + warmup)
        if len(late) >= 2 and late[-1] > late[0]:
            steady += (len(late) - 1) / (late[-1] - late[0])
            counted += 1
    theoretical = models * rate
    excess = max(bucket_excess(ts, rate, burst) for ts in by_model.values())
    # Consecutive hand-outs of a model closer than one interval (by more than a millisecond), and
    # how many of them come right after a gap longer by at least as much: a hand-out whose stamp
    # is late makes the gap before it long and the gap after it short by the same amount, while
    # the decisions stay one interval apart. Meaningful with burst 1 only.
    interval, slack = 1 / rate, 0.001
    short = made_up = 0
    for ts in by_model.values():
        ts = sorted(ts)
        gaps = [b - a for a, b in zip(ts, ts[1:])]
        for k, gap in enumerate(gaps):
            if gap < interval - slack:
                short += 1
                made_up += k > 0 and gaps[k - 1] + gap >= 2 * interval - slack
    return {
        "rate_theoretical_per_s": r3(theoretical),
        "rate_steady_per_s": r3(steady) if counted == len(by_model) else None,
        "rate_ratio": r3(steady / theoretical) if counted == len(by_model) else None,
        "rate_bucket_worst_excess": round(excess, 5),
        "rate_bucket_worst_early_ms": r3(1000 * excess / rate),
        "rate_max_one_model_60s": max(max_in_window(ts, 60.0) for ts in by_model.values()),
        "rate_short_gaps": short if burst == 1 else None,
        "rate_short_gaps_after_long": made_up if burst == 1 else None,
        "rate_allowed_60s": r3(burst + rate * 60),
    }
