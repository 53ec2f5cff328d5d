"""The figures of sched_e2e_bench, computed from the job rows: model loads, Jain's index, the
token-bucket bound (bucket_excess, max_in_window), and the median across repetitions.

Pure functions of their arguments: no processes, no database.
"""

import argparse
import math
import statistics


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
