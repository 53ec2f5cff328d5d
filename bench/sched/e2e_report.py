"""What sched_e2e_bench prints: the machine, one table per scenario, and the summary against
the targets."""

import os
import platform
import socket
import sys

from e2e_figures import parse_duration, r3


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
