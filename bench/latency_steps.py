#!/usr/bin/env python3
"""Where a light-load Submit spends its time on its way to a worker, step by step.

`bench.py latency` measures Submit to worker end to end and splits it at the insert's
transaction. This follows one probe through the threads that carry it, from the kernel's
scheduler: it runs `bench.py latency` (--probes, --runs 1, --no-peer) and, while its Submit
probes run, records every wakeup on the machine (`perf sched record -a`) for --seconds. A probe
is the chain of wakeups it causes, each thread waking the next:

  load generator -> daemon (gRPC) -> inserter -> loop (Place) -> inserter -> PostgreSQL
  -> inserter -> loop (the placed job) -> worker (its Assign)

and each step is the time from one wakeup in the chain to the next: what the thread woken at the
start of the step did (its wakeup, then its CPU) before it woke the next one. The medians over
every whole chain are printed. A probe whose chain is broken (another thread took a step, a wakeup
came before the thread slept) is left out; the count of those kept is printed.

Run as root (perf records the whole machine), with perf installed (apt-get install linux-perf),
after building: python3 bench/latency_steps.py [--build DIR] [--seconds 5] [--probes 3000]

Python 3 standard library only.
"""

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))

# (waker, woken) of each wakeup of a probe's chain, by thread name as the kernel shortens it, and
# what the woken thread does before the next wakeup of the chain (the step that follows).
CHAIN = [
    ("dispatch-loadge", "nexting_thread", "daemon, gRPC: reads the request, admits the job"),
    ("nexting_thread", "insert-flush", "inserter: asks the loop to place the job"),
    ("insert-flush", "dispatch-loop", "loop: places it"),
    ("dispatch-loop", "insert-flush", "inserter: sends the insert"),
    ("insert-flush", "postgres", "PostgreSQL: the insert and its commit"),
    ("postgres", "insert-flush", "inserter: hands the placed job to the loop"),
    ("insert-flush", "dispatch-loop", "loop: writes the job's Assign to the worker's stream"),
    ("dispatch-loop", "dispatch-worker", None),
]
WAKEUP = re.compile(r"\s*([\d.]+)\s+\[\d+\]\s+(\S+?)\[.*awakened: (\S+?)\[")


def chains(timehist_lines, within_s=0.01):
    """The probes' chains found in `perf sched timehist -w` output: a list of wakeup times."""
    events = []
    for line in timehist_lines:
        m = WAKEUP.match(line)
        if m:
            events.append((float(m.group(1)), m.group(2), m.group(3)))
    found, i = [], 0
    while i < len(events):
        if events[i][1:] != CHAIN[0][:2]:
            i += 1
            continue
        times, k, j = [events[i][0]], 1, i + 1
        while j < len(events) and k < len(CHAIN) and events[j][0] - times[0] < within_s:
            if events[j][1:] == CHAIN[k][:2]:
                times.append(events[j][0])
                k += 1
            j += 1
        if k == len(CHAIN):
            found.append(times)
            i = j
        else:
            i += 1
    return found


def steps(found):
    """(what the step is, its median in us) for each step of the chains `found`, then ("in all",
    the median of the whole chains)."""
    out = []
    for k in range(1, len(CHAIN)):
        out.append((CHAIN[k - 1][2], statistics.median((c[k] - c[k - 1]) * 1e6 for c in found)))
    out.append(("in all, from the request's arrival to the worker's wakeup",
                statistics.median((c[-1] - c[0]) * 1e6 for c in found)))
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(os.path.dirname(HERE), "build"))
    p.add_argument("--seconds", type=float, default=5, help="how long perf records")
    p.add_argument("--probes", type=int, default=3000, help="Submit probes (at 100 a second)")
    args = p.parse_args()
    work = tempfile.mkdtemp(prefix="dispatchd-steps-")
    bench = [sys.executable, os.path.join(HERE, "bench.py"), "latency", "--runs", "1",
             "--no-peer", "--probes", str(args.probes), "--build", args.build,
             "--out", os.path.join(work, "latency")]
    log = os.path.join(work, "bench.log")
    with open(log, "w") as out:
        run = subprocess.Popen(bench, stdout=out, stderr=subprocess.STDOUT)
    try:
        # The probes start when this run's load generator does (not another run's: the
        # recording sees the whole machine, so nothing else should run meanwhile).
        deadline = time.time() + 120
        own_loadgen = ["pgrep", "-P", str(run.pid), "-f", "dispatch-loadgen"]
        while subprocess.run(own_loadgen, capture_output=True).returncode:
            if run.poll() is not None or time.time() > deadline:
                sys.exit(f"the probes never started: see {log}")
            time.sleep(0.2)
        time.sleep(2)  # past the warm-up
        data = os.path.join(work, "sched.data")
        subprocess.run(["perf", "sched", "record", "-a", "-o", data, "--", "sleep",
                        str(args.seconds)], check=True, capture_output=True)
        hist = subprocess.run(["perf", "sched", "timehist", "-i", data, "-w"], check=True,
                              capture_output=True, text=True).stdout.splitlines()
    finally:
        run.terminate()
        run.wait()
    found = chains(hist)
    shutil.rmtree(work)  # the recording is some megabytes a second; the figures are below
    if not found:
        sys.exit("no whole chain found: is the daemon's inserter placing jobs (a leader with idle "
                 "workers)?")
    print(f"{len(found)} probes followed ({' '.join(bench)}; perf sched record -a for "
          f"{args.seconds:g} s)")
    for what, us in steps(found):
        print(f"  {us:6.0f} us  {what}")


if __name__ == "__main__":
    main()
