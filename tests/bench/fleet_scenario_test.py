"""`bench.py fleet` and `bench.py heartbeats` at a tiny size, as a user would run them.

fleet: 20 simulated workers (two more joining mid-run in the join variant, one of them flapping
in the flap variant), 600 short jobs over 5 models and 50 fairness keys, no 4-worker yardstick.
bench.py itself fails a variant unless every queued job ends SUCCEEDED with one row, and fails
the probes unless each started exactly once; this test checks that it exits 0, prints the figures
and their targets, and that its JSON says the flapping worker did flap and reconnect and the
joining workers did connect. heartbeats: 20 idle workers; both of its figures are printed.

Run by ctest (bench_fleet_scenario, label e2e) on the `pg` fixture's server:
DISPATCHD_TEST_PG_URL_FILE names the file holding its URL, DISPATCHD_BUILD_DIR the build tree.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "bench", "bench.py")
JOBS = 600


def fixture(test):
    """The pg fixture's server URL and the build tree, or skips `test`."""
    url_file = os.environ.get("DISPATCHD_TEST_PG_URL_FILE")
    build = os.environ.get("DISPATCHD_BUILD_DIR")
    if not url_file or not os.path.exists(url_file) or not build:
        test.skipTest("needs ctest's pg fixture (DISPATCHD_TEST_PG_URL_FILE) and "
                      "DISPATCHD_BUILD_DIR")
    with open(url_file) as f:
        return f.read().strip(), build


class FleetScenarioTest(unittest.TestCase):
    def test_tiny_fleet_loses_nothing_and_prints_its_figures(self):
        url, build = fixture(self)
        out_dir = tempfile.mkdtemp(prefix="fleet-test-")
        self.addCleanup(shutil.rmtree, out_dir, True)
        out = os.path.join(out_dir, "fleet")
        argv = [sys.executable, BENCH, "fleet", "--runs", "1", "--no-drain", "--pg-url", url,
                "--build", build, "--out", out, "--fleet-workers", "20", "--fleet-slots", "2",
                "--fleet-jobs", str(JOBS), "--fleet-models", "5", "--fairness-keys", "50",
                "--min-ms", "50", "--max-ms", "150", "--join", "2", "--flap-every", "300ms",
                "--idle-s", "1", "--fleet-probes", "20", "--warmup", "2", "--rate", "50",
                "--timeout", "120"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        for figure in ("steady_jobs_per_s", "capacity_jobs_per_s", "decision_p99_us",
                       "fleet_submit_to_worker_p99_ms", "daemon_cpu_us_per_job",
                       "fleet_daemon_peak_rss_mib", "daemon_cpu_us_per_heartbeat",
                       "model_loads_lower_bound", "flap_jobs_per_s", "join_jobs_per_s",
                       "flap_to_steady", "join_to_steady"):
            self.assertIn(figure, r.stdout)
        self.assertIn("target", r.stdout)
        with open(out + ".json") as f:
            doc = json.load(f)
        run = doc["runs"][0]
        self.assertEqual(run["jobs"], JOBS)
        # Each fleet drain checked its rows; the flapping worker came back and was re-adopted.
        self.assertGreater(run["flap_flaps"], 0)
        self.assertGreater(run["flap_connects"], 20)
        self.assertGreaterEqual(run["join_connects"], 22)  # the two joined mid-run
        self.assertGreaterEqual(run["model_loads"], run["model_loads_lower_bound"])
        self.assertGreater(run["model_loads_lower_bound"], 0)
        self.assertIn("fleet_daemon_peak_rss_mib", doc["targets"])

    def test_idle_workers_heartbeat_cost_is_measured_twice(self):
        """`bench.py heartbeats`: 20 idle workers heartbeating every 100 ms; the daemon's CPU per
        heartbeat once they are connected and after they settled, from a daemon that saw them
        all."""
        url, build = fixture(self)
        out_dir = tempfile.mkdtemp(prefix="heartbeats-test-")
        self.addCleanup(shutil.rmtree, out_dir, True)
        out = os.path.join(out_dir, "heartbeats")
        argv = [sys.executable, BENCH, "heartbeats", "--runs", "1", "--pg-url", url,
                "--build", build, "--out", out, "--no-plot", "--fleet-workers", "20",
                "--fleet-models", "5", "--heartbeat-interval", "0.1", "--idle-s", "2",
                "--settle-s", "1", "--timeout", "120"]
        r = subprocess.run(argv, capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(out + ".json") as f:
            run = json.load(f)["runs"][0]
        self.assertEqual(run["workers"], 20)
        self.assertEqual(run["heartbeats_per_s"], 200)
        for figure in ("connected_daemon_cpu_us_per_heartbeat",
                       "settled_daemon_cpu_us_per_heartbeat"):
            self.assertIn(figure, r.stdout)
            self.assertGreaterEqual(run[figure], 0)
        # The workers' heartbeats cost the daemon something on top of its own idling.
        self.assertGreater(run["connected_daemon_cpu_share"], run["no_workers_daemon_cpu_share"])


if __name__ == "__main__":
    unittest.main()
