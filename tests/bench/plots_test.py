"""bench/plots.py draws each scenario's figure from the files bench.py writes. The test writes
small OUT.csv and OUT.json files with the columns each scenario really writes, and each must come
out as a PNG of the scenario's own figure (not the generic chart). It also checks what happens
without matplotlib (a message that says how to get it; bench.py's sitting goes on) and with files
that cannot make a figure (an error).

Run by ctest (bench_plots, label unit) with Debian's /usr/bin/python3, which has
python3-matplotlib (deploy/install-deps.sh); there DISPATCHD_REQUIRE_MATPLOTLIB=1 makes a missing
matplotlib a failure. Run by hand without it, the drawing tests are skipped.
"""

import csv
import json
import os
import struct
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench")
sys.path.insert(0, BENCH)

import plots  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
MACHINE = {"nproc": 2, "cpu": "AMD EPYC", "memory": "23.5 GiB", "kernel": "6.18.44",
           "host": "vm", "python": "3.11.2"}

# Blocks matplotlib in a child interpreter, as on one that lacks it.
NO_MATPLOTLIB = "import sys; sys.modules['matplotlib'] = None; sys.path.insert(0, %r); " % BENCH


def three(base, step=0.04):
    """Three runs' values around `base` (a little apart, as real runs are)."""
    return [round(base * (1 + step * k), 3) for k in (0, 1, -1)]


def runs_of(columns):
    """{column: [three values]} -> three row dicts in the column order given."""
    return [{k: v[i] if isinstance(v, list) else v for k, v in columns.items()} for i in range(3)]


def drain_runs():
    return runs_of({
        "jobs": 100000, "seconds": three(7.3), "jobs_per_s": three(13700), "load_s": three(0.9),
        "first_dispatch_s": three(1.1), "daemon_peak_rss_mib": three(61.0),
        "wal_bytes_per_job": three(870), "cpu_us_per_job": three(140.0),
        "cpu_busy_share": three(0.97), "daemon_cpu_us_per_job": three(42.0),
        "workers_cpu_us_per_job": three(40.0),
        "ceiling_script": "bench/ceiling/claim_complete.sql",
        "ceiling_jobs_per_s": three(24000), "ceiling_cpu_us_per_job": three(80.0),
        "fraction_of_ceiling": three(0.57)})


def profile_runs():
    columns = {}
    for v, rate in (("drain", 10000), ("submit", 5500), ("batch", 6800), ("runsync", 2100)):
        columns.update({f"{v}_jobs_per_s": three(rate), f"{v}_machine_cpu_us_per_job": three(300.0),
                        f"{v}_daemon_cpu_us_per_job": three(60.0)})
        for g in ("dispatch_loop", "turn_writer", "insert_flush", "store_reads", "grpc", "main"):
            columns[f"{v}_daemon_{g}_us_per_job"] = three(10.0)
        columns.update({f"{v}_workers_cpu_us_per_job": three(70.0),
                        f"{v}_loadgen_cpu_us_per_job": three(0.0 if v == "drain" else 80.0),
                        f"{v}_postgres_cpu_us_per_job": three(90.0)})
        for g in ("backends", "walwriter", "checkpoint", "autovacuum", "pg_other"):
            columns[f"{v}_postgres_{g}_us_per_job"] = three(18.0)
        columns.update({f"{v}_other_cpu_us_per_job": [12.0, -3.0, 5.0],  # can go negative
                        f"{v}_wal_records_per_job": three(4.1),
                        f"{v}_wal_bytes_per_job": three(880),
                        f"{v}_transactions_per_100_jobs": three(3.2)})
    return runs_of(columns)


def fleet_runs():
    return runs_of({
        "drain_jobs_per_s": three(9800), "w4_submit_to_worker_p50_ms": three(1.8),
        "w4_submit_to_worker_p99_ms": three(3.1), "steady_jobs_per_s": three(9100),
        "workers": 1000, "slots": 4000, "jobs": 20000, "mean_job_s": 0.275,
        "capacity_jobs_per_s": 14545, "steady_mid_jobs_per_s": three(9600), "load_s": three(0.4),
        "connect_s": three(2.1), "decision_p50_us": three(12.0), "decision_p99_us": three(80.0),
        "fleet_submit_to_worker_p99_ms": three(4.2), "started_twice": 0, "model_loads": 420,
        "loads_over_bound": three(1.05), "fleet_daemon_peak_rss_mib": three(180.0),
        "flap_jobs_per_s": three(8800), "flap_reattempted": 3, "join_jobs_per_s": three(8900),
        "join_reattempted": 0, "join_at_s": three(1.2), "fleet_to_drain": three(0.93),
        "dispatch_p99_to_4_workers": three(1.35), "flap_to_steady": three(0.97),
        "join_to_steady": three(0.98)})


def lab_runs():
    columns = {"seed": [1, 2, 3], "tasks": 1000, "long_tasks": 50, "work_s": three(7400.0),
               "longest_s": three(39.6), "slots": 400, "ideal_fifo_s": three(42.0)}
    for system, makespan in (("baseline", 61.0), ("dispatchd", 40.5), ("dispatchd_rpm", 330.0)):
        columns.update({f"{system}.makespan_s": three(makespan),
                        f"{system}.lower_bound_s": three(39.6),
                        f"{system}.makespan_over_bound": three(makespan / 39.6),
                        f"{system}.busy_drop_seconds": 0})
    return runs_of(columns)


def lab_series(path):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["run", "seed", "system", "second", "completions", "handouts"])
        for run in (1, 2, 3):
            for system, length in (("baseline", 61), ("dispatchd", 41), ("dispatchd_rpm", 80)):
                for k in range(length):
                    w.writerow([run, run, system, k, 20 + (k * 7) % 9, 25])


def latency_peer():
    """OUT.json's peer for latency: graphile-worker's probe runs, as bench.py records them."""
    runs = runs_of({"probes": 1000, "late_probes": 0,
                    **{f"{kind}_{pct}_ms": three(base * scale)
                       for kind, base in (("add_to_start", 4.0), ("add_answered", 2.9))
                       for pct, scale in (("p50", 1.0), ("p90", 1.4), ("p99", 2.2),
                                          ("p999", 4.0), ("max", 5.0))}})
    return {"peer": "graphile-worker 0.18.0", "concurrency": 4, "runs": runs,
            "median": {k: sorted(r[k] for r in runs)[1] for k in runs[0]}}


# The targets bench.py sets against the latency peer: a limit on dispatchd's figure / its.
LATENCY_PEER_TARGETS = {
    "submit_to_worker_p50_to_peer_p50": {"target": 0.35, "op": "<=", "ratio": 1.29, "met": False},
    "submit_to_worker_p99_to_peer_p99": {"target": 0.5, "op": "<=", "ratio": 0.55, "met": True},
    "runsync_p50_to_peer_p50": {"target": 0.6, "op": "<=", "ratio": 1.08, "met": False}}


# scenario -> (the runs' rows, what OUT.json adds to them).
SITTINGS = {
    "drain": (drain_runs, {"peer": {"runs": [13100, 13650, 12900], "median": 13100,
                                    "best": 13650}}),
    "latency": (lambda: runs_of({
        "probes": 1000, "submit_to_worker_p50_ms": three(1.8),
        "submit_to_worker_p99_ms": three(2.4), "submit_to_worker_p999_ms": three(6.0),
        "submit_to_worker_max_ms": three(9.0), "send_to_insert_p50_ms": three(0.4),
        "insert_to_claim_p50_ms": three(0.9), "claim_to_handler_p50_ms": three(0.5),
        "submit_ack_p50_ms": three(0.7), "submit_ack_p99_ms": three(1.9),
        "runsync_p50_ms": three(2.6), "runsync_p99_ms": three(4.0),
        "runsync_p999_ms": three(7.0), "runsync_max_ms": three(11.0), "late_probes": 0,
        "pg_floor_insert_p50_ms": three(1.1), "pg_floor_insert_p99_ms": three(1.8),
        "pg_floor_insert_back_to_back_ms": three(0.35),
        "pg_floor_command": "pgbench -n -M prepared -c 1 -j 1 -t 1020 -R 100 -l -f "
                            "bench/ceiling/insert_one.sql DB",
        "submit_to_worker_p50_over_floor": three(1.6),
        "submit_to_worker_p99_over_floor": three(1.3)}),
        {"targets": {"submit_to_worker_p50_ms": {"target": 1.0, "op": "<=", "ratio": 1.8,
                                                 "met": False},
                     **LATENCY_PEER_TARGETS},
         "peer": latency_peer()}),
    "profile": (profile_runs, {}),
    "fleet": (fleet_runs, {"targets": {"fleet_to_drain": {"target": 0.8, "op": ">=",
                                                          "ratio": 1.16, "met": True}}}),
    "e2e": (lambda: runs_of({
        "jobs": 100000, "single_submitted_per_s": three(10300),
        "single_completed_per_s": three(8200), "single_call_p50_ms": three(40.0),
        "batch_submitted_per_s": three(21000), "batch_completed_per_s": three(12400),
        "drain_jobs_per_s": three(12800), "single_completed_to_drain": three(0.64),
        "single_cpu_over_parts": three(0.94), "batch_completed_to_drain": three(0.97),
        "batch_cpu_over_parts": three(0.9), "ceiling_script": "bench/ceiling/x.sql",
        "ceiling_jobs_per_s": three(13000), "single_fraction_of_ceiling": three(0.63)}), {}),
    "backlog": (lambda: runs_of({
        "drain_jobs_per_s": three(30000), "jobs": 1000000, "seconds": three(41.0),
        "jobs_per_s": three(24400), "daemon_peak_rss_mib": three(31.0),
        "ratio_to_drain": three(0.81)}), {}),
    "retained": (lambda: runs_of({
        "retained": 5000000, "drain_jobs_per_s": three(29000), "jobs": 100000,
        "jobs_per_s": three(29000), "ratio_to_drain": three(0.998)}), {}),
    "submitted": (lambda: runs_of({
        "drain_jobs_per_s": three(12000), "submitted_jobs_per_s": three(12700),
        "submitted_to_drain": three(1.058), "turn_us_per_job": three(84.0)}), {}),
    "turncost": (lambda: runs_of({
        **{f"q{n}_{k}": three(v) for n in (10000, 100000, 1000000)
           for k, v in (("turn_us_per_job", 95.0), ("jobs_per_s", 12000),
                        ("turn_rows_per_statement", 60.0))},
        "largest_to_smallest": three(1.0)}), {}),
    "security": (lambda: runs_of({
        "order": ["off-on", "on-off", "off-on"],
        **{f"drain_{t}_{k}": three(v) for t in ("off", "on")
           for k, v in (("jobs_per_s", 12000), ("cpu_us_per_job", 150.0))},
        **{f"latency_{t}_{k}": three(v) for t in ("off", "on")
           for k, v in (("submit_to_worker_p50_ms", 1.8), ("submit_to_worker_p99_ms", 2.6),
                        ("runsync_p50_ms", 2.7))},
        "paired_drain_on_to_off": three(0.95)}), {}),
    "lab": (lab_runs, {"args": {"rpm": 20.0}}),
    # No figure of its own: the generic chart, a panel per unit.
    "ceiling": (lambda: runs_of({
        "jobs_per_s_is": "pgbench transactions x 100 / pgbench's seconds",
        "claim_complete_jobs": 100000, "claim_complete_jobs_per_s": three(22500),
        "claim_complete_latency_ms": three(17.0), "claim_complete_cpu_us_per_job": three(88.0),
        "claim_complete_cpu_busy_share": three(0.86),
        "insert_claim_complete_jobs_per_s": three(13100)}), {}),
}


def write_sitting(directory, scenario, rows, extra=None, with_json=True):
    """OUT.csv (and OUT.json) as bench.py writes them; returns OUT."""
    out = os.path.join(directory, scenario)
    with open(out + ".csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["run"] + list(rows[0]))
        w.writeheader()
        for i, r in enumerate(rows, 1):
            w.writerow({"run": i, **r})
    if with_json:
        doc = {"scenario": scenario, "command": f"python3 bench/bench.py {scenario}",
               "started": "2026-11-27T10:00:00+00:00", "machine": MACHINE,
               "args": {"jobs": 100000}, "runs": rows, "median": {}, "targets": {},
               "peer": None, "tables": []}
        for k, v in (extra or {}).items():
            doc[k] = {**doc[k], **v} if isinstance(doc.get(k), dict) else v
        with open(out + ".json", "w") as f:
            json.dump(doc, f)
    if scenario == "lab":
        lab_series(out + "-series.csv")
    return out


def run_python(code, *argv):
    return subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          timeout=120, cwd=REPO)


class PngCheck:
    def assert_png(self, path):
        """A whole PNG of a chart: the signature, an IHDR of plausible size first and IEND last,
        and when decoded, many colours (bars, text), not a blank canvas."""
        with open(path, "rb") as f:
            data = f.read()
        self.assertEqual(data[:8], PNG_SIGNATURE, f"{path}: not a PNG")
        self.assertEqual(data[12:16], b"IHDR", f"{path}: no IHDR first")
        width, height = struct.unpack(">II", data[16:24])
        self.assertTrue(400 <= width <= 4000 and 200 <= height <= 4000,
                        f"{path}: {width} x {height} px")
        self.assertEqual(data[-8:-4], b"IEND", f"{path}: cut short")
        self.assertTrue(8000 < len(data) < 3000000, f"{path}: {len(data)} bytes")
        import matplotlib.image
        import numpy
        rgba = (matplotlib.image.imread(path) * 255).astype(numpy.uint8)
        if rgba.shape[-1] == 3:
            rgba = numpy.dstack([rgba, numpy.full(rgba.shape[:2], 255, numpy.uint8)])
        colours = len(numpy.unique(rgba.reshape(-1, 4).view(numpy.uint32)))
        self.assertGreater(colours, 20, f"{path}: {colours} colours, a blank figure?")


class DrawTest(PngCheck, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if plots.pyplot() is None:
            message = f"{plots.missing_matplotlib()} (deploy/install-deps.sh installs it)"
            if os.environ.get("DISPATCHD_REQUIRE_MATPLOTLIB") == "1":
                raise AssertionError(message)
            raise unittest.SkipTest(message)
        cls.tmp = tempfile.TemporaryDirectory(prefix="plots-test-")

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_every_scenario_draws_its_own_figure(self):
        for scenario, (rows, extra) in SITTINGS.items():
            with self.subTest(scenario=scenario):
                out = write_sitting(self.tmp.name, scenario, rows(), extra)
                # strict: a scenario with a figure of its own must draw it from these columns.
                png = plots.draw(out + ".json", strict=scenario in plots.FIGURES)
                self.assertEqual(png, out + ".png")
                self.assert_png(png)
        self.assertEqual(set(plots.FIGURES) - set(SITTINGS), set(),
                         "a scenario's figure without a sitting in this test")

    def test_title_names_the_scenario_the_machine_and_the_date(self):
        out = write_sitting(self.tmp.name, "drain", drain_runs())
        self.assertEqual(plots.Sitting(out).title(),
                         "drain: AMD EPYC, 2 cores, 23.5 GiB; 2026-11-27; 3 runs")

    def test_a_csv_alone_draws_with_the_scenario_given(self):
        d = os.path.join(self.tmp.name, "csv-alone")
        os.makedirs(d)
        out = write_sitting(d, "drain", drain_runs(), with_json=False)
        with self.assertRaisesRegex(plots.PlotError, "--scenario"):
            plots.draw(out + ".csv")
        self.assert_png(plots.draw(out + ".csv", scenario="drain", strict=True))

    def test_a_run_of_one_and_missing_columns(self):
        # One run, no ceiling, no peer (drain --runs 1 --no-ceiling --no-peer).
        d = os.path.join(self.tmp.name, "one-run")
        os.makedirs(d)
        rows = [{k: v for k, v in drain_runs()[0].items() if "ceiling" not in k}]
        self.assert_png(plots.draw(write_sitting(d, "drain", rows), strict=True))

    def test_latency_with_and_without_its_peer(self):
        d = os.path.join(self.tmp.name, "latency-peer")
        os.makedirs(d)
        rows, extra = SITTINGS["latency"]
        s = plots.Sitting(write_sitting(d, "latency", rows(), extra))
        kinds, runs, med = plots.peer_latency(s)
        self.assertEqual([k for k, _ in kinds], ["add_to_start", "add_answered"])
        self.assertEqual(len(runs), 3)
        # Each target against the peer, at the latency it allows: the limit x the peer's median.
        allowed = plots.peer_targets(s, med)
        self.assertEqual(set(allowed), {("submit_to_worker", "p50"), ("submit_to_worker", "p99"),
                                        ("runsync", "p50")})
        self.assertAlmostEqual(allowed[("submit_to_worker", "p99")], 0.5 * 4.0 * 2.2)
        self.assertAlmostEqual(allowed[("runsync", "p50")], 0.6 * 4.0)
        self.assert_png(plots.draw(s.base, strict=True))
        # latency --no-peer: no peer, no targets against it.
        d = os.path.join(self.tmp.name, "latency-no-peer")
        os.makedirs(d)
        s = plots.Sitting(write_sitting(d, "latency", rows()))
        self.assertEqual(plots.peer_latency(s), ([], [], {}))
        self.assert_png(plots.draw(s.base, strict=True))

    def test_without_its_columns_a_scenario_falls_back_to_the_generic_chart(self):
        d = os.path.join(self.tmp.name, "fallback")
        os.makedirs(d)
        rows = [{k: v for k, v in r.items() if k != "jobs_per_s"} for r in drain_runs()]
        out = write_sitting(d, "drain", rows)
        with self.assertRaisesRegex(plots.PlotError, "jobs_per_s"):
            plots.draw(out, strict=True)
        self.assert_png(plots.draw(out))

    def test_files_that_cannot_make_a_figure_are_an_error(self):
        d = os.path.join(self.tmp.name, "bad")
        os.makedirs(d)
        with self.assertRaises(plots.PlotError):
            plots.draw(os.path.join(d, "nothing.json"))
        out = write_sitting(d, "words", runs_of({"order": ["a", "b", "c"]}))
        with self.assertRaisesRegex(plots.PlotError, "no numeric column"):
            plots.draw(out)
        self.assertFalse(os.path.exists(out + ".png"))
        # The command says so and exits non-zero.
        r = subprocess.run([sys.executable, os.path.join(BENCH, "plots.py"), out + ".json"],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("no numeric column", r.stderr)

    def test_the_png_check_fails_on_what_is_not_a_chart(self):
        d = os.path.join(self.tmp.name, "not-png")
        os.makedirs(d)
        path = os.path.join(d, "x.png")
        with open(path, "wb") as f:
            f.write(b"not a png at all" * 1000)
        with self.assertRaises(AssertionError):
            self.assert_png(path)
        plt = plots.pyplot()
        fig = plt.figure(figsize=(8, 4))
        fig.savefig(path, dpi=90)  # a blank canvas of the right size
        plt.close(fig)
        with self.assertRaises(AssertionError):
            self.assert_png(path)

    def test_the_command_redraws_several_sittings(self):
        d = os.path.join(self.tmp.name, "command")
        os.makedirs(d)
        outs = [write_sitting(d, s, SITTINGS[s][0](), SITTINGS[s][1]) for s in ("e2e", "fleet")]
        r = subprocess.run([sys.executable, os.path.join(BENCH, "plots.py"), outs[0] + ".json",
                            outs[1]], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        for out in outs:
            self.assertIn(f"wrote {out}.png", r.stdout)
            self.assert_png(out + ".png")


class WithoutMatplotlibTest(unittest.TestCase):
    """An interpreter without matplotlib (`python3` on PATH may be one): no plot, a message that
    says how to get one, and bench.py's sitting does not fail."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory(prefix="plots-test-")
        cls.out = write_sitting(cls.tmp.name, "drain", drain_runs())

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def test_draw_says_how_to_get_matplotlib(self):
        r = run_python(NO_MATPLOTLIB + "import plots; print(plots.draw(sys.argv[1]))", self.out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "None")
        self.assertIn("apt-get install python3-matplotlib", r.stderr)
        self.assertIn("/usr/bin/python3", r.stderr)
        self.assertFalse(os.path.exists(self.out + ".png"))

    def test_the_command_fails_with_the_message(self):
        r = run_python(NO_MATPLOTLIB + "import runpy; sys.argv = ['plots.py', sys.argv[1]]; "
                       "runpy.run_path(%r, run_name='__main__')"
                       % os.path.join(BENCH, "plots.py"), self.out + ".json")
        self.assertEqual(r.returncode, 1)
        self.assertIn("apt-get install python3-matplotlib", r.stderr)

    def test_bench_goes_on_and_says_how_to_redraw(self):
        r = run_python(NO_MATPLOTLIB + "import bench; print(bench.draw_plot(sys.argv[1]))",
                       self.out)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "None")
        self.assertIn("apt-get install python3-matplotlib", r.stderr)
        self.assertIn(f"bench/plots.py {self.out}.json", r.stderr)

    def test_bench_goes_on_when_the_files_cannot_make_a_figure(self):
        r = run_python(NO_MATPLOTLIB + "import bench; print(bench.draw_plot(sys.argv[1]))",
                       os.path.join(self.tmp.name, "missing"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "None")
        self.assertIn("no plot", r.stderr)


if __name__ == "__main__":
    unittest.main()
