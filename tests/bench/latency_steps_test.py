"""bench/latency_steps.py finds each light-load probe's chain of wakeups in `perf sched timehist
-w` output and times its steps. The test feeds it lines in perf's format: a probe whose chain is
whole, with other wakeups between its own, is timed step by step; a probe whose chain breaks (its
insert's answer never wakes the inserter) is left out rather than joined to the next probe's.

Run by ctest (bench_latency_steps, label unit). Python 3 standard library only.
"""

import os
import sys
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))

import latency_steps  # noqa: E402

THREADS = {"dispatch-loadge": "dispatch-loadge[2001]",
           "nexting_thread": "nexting_thread[1001/1000]",
           "insert-flush": "insert-flush[1002/1000]",
           "dispatch-loop": "dispatch-loop[1003/1000]",
           "postgres": "postgres[3001]",
           "dispatch-worker": "dispatch-worker[4001]"}


def wakeup(t, waker, woken, cpu=0):
    """A line of `perf sched timehist -w` for a wakeup at t seconds."""
    return (f"{t:15.6f} [{cpu:04d}]  {THREADS.get(waker, waker):<30}"
            f"                                 awakened: {THREADS.get(woken, woken)}")


def switch(t, task):
    """A line for a context switch (no wakeup), as timehist prints between them."""
    return f"{t:15.6f} [0001]  {task:<30}      0.100      0.010      0.050"


def probe(start, gaps_us, skip=None):
    """The lines of one probe's chain starting at `start` s, the steps `gaps_us` apart; `skip`:
    the index of a wakeup left out (a broken chain)."""
    lines, t = [], start
    for k, (waker, woken, _) in enumerate(latency_steps.CHAIN):
        if k > 0:
            t += gaps_us[k - 1] / 1e6
        if k != skip:
            lines.append(wakeup(t, waker, woken, cpu=k % 2))
        lines.append(switch(t + 1e-6, THREADS.get(woken, woken)))
    return lines


class LatencyStepsTest(unittest.TestCase):
    GAPS = [200, 50, 60, 55, 800, 45, 100]

    def test_a_whole_chain_is_timed_step_by_step(self):
        lines = probe(100.0, self.GAPS)
        # Wakeups of other threads, and of the chain's own threads for other reasons, in between.
        lines.insert(3, wakeup(100.00001, "grpc_global_tim[5]", "dispatch-loadge"))
        lines.insert(6, wakeup(100.00021, "turn-writer[1004/1000]", "postgres"))
        found = latency_steps.chains(lines)
        self.assertEqual(len(found), 1)
        timed = latency_steps.steps(found)
        self.assertEqual(len(timed), len(self.GAPS) + 1)
        for (what, us), gap in zip(timed, self.GAPS):
            self.assertAlmostEqual(us, gap, delta=0.5, msg=what)
        self.assertEqual(timed[-1][0], "in all, from the request's arrival to the worker's wakeup")
        self.assertAlmostEqual(timed[-1][1], sum(self.GAPS), delta=0.5)

    def test_a_broken_chain_is_left_out(self):
        # The first probe's insert never wakes the inserter back; the second is whole. The first
        # must not borrow the second's later wakeups.
        lines = probe(200.0, self.GAPS, skip=5) + probe(200.02, [g * 2 for g in self.GAPS])
        found = latency_steps.chains(lines)
        self.assertEqual(len(found), 1)
        self.assertAlmostEqual(found[0][0], 200.02, delta=1e-6)
        self.assertAlmostEqual(latency_steps.steps(found)[4][1], 1600, delta=0.5)

    def test_medians_over_probes(self):
        lines = []
        for n, scale in enumerate((1, 3, 2)):
            lines += probe(300.0 + n * 0.02, [g * scale for g in self.GAPS])
        found = latency_steps.chains(lines)
        self.assertEqual(len(found), 3)
        self.assertAlmostEqual(latency_steps.steps(found)[0][1], 400, delta=0.5)

    def test_no_wakeups_no_chain(self):
        self.assertEqual(latency_steps.chains([switch(1.0, "postgres[3001]"), ""]), [])


if __name__ == "__main__":
    unittest.main()
