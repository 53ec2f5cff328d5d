"""`bench.py profile` measures what it says on a real daemon, workers and PostgreSQL: it runs
each variant at a small size with its own PostgreSQL (which loads pg_stat_statements), and the
figures it writes must account for the work each variant does.

Run by ctest (bench_profile, label e2e): DISPATCHD_BUILD_DIR names the build with dispatchd,
dispatch-worker and dispatch-loadgen.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOBS = 2000  # RunSync: JOBS / 5


class ProfileTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        build = os.environ.get("DISPATCHD_BUILD_DIR")
        if not build:
            raise unittest.SkipTest("needs DISPATCHD_BUILD_DIR (a build with the binaries)")
        cls.tmp = tempfile.TemporaryDirectory(prefix="profile-test-")
        out = os.path.join(cls.tmp.name, "profile")
        r = subprocess.run(
            [sys.executable, os.path.join(REPO, "bench", "bench.py"), "profile", "--runs", "1",
             "--jobs", str(JOBS), "--workers", "2", "--slots", "16", "--clients", "2",
             "--inflight", "8", "--build", build, "--out", out],
            capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise AssertionError(f"bench.py profile failed ({r.returncode}):\n{r.stdout}{r.stderr}")
        cls.stdout = r.stdout
        with open(out + ".json") as f:
            cls.doc = json.load(f)

    @classmethod
    def tearDownClass(cls):
        cls.tmp.cleanup()

    def figure(self, variant, name):
        return self.doc["runs"][0][f"{variant}_{name}"]

    def statements(self, variant):
        return self.doc["tables"][0][variant]

    def test_every_variant_charges_the_daemon_its_workers_and_postgres(self):
        for v in ("drain", "submit", "batch", "runsync"):
            with self.subTest(variant=v):
                self.assertGreater(self.figure(v, "jobs_per_s"), 0)
                self.assertGreater(self.figure(v, "daemon_cpu_us_per_job"), 0)
                # The daemon's threads are named: the loop's share is its own. The kernel counts
                # a thread's CPU in whole ticks (10 ms), and RunSync's JOBS / 5 jobs take the loop
                # about one: there a reading of none is a tick not yet counted.
                loop = self.figure(v, "daemon_dispatch_loop_us_per_job")
                if v != "runsync":
                    self.assertGreater(loop, 0)
                self.assertLessEqual(loop, self.figure(v, "daemon_cpu_us_per_job"))
                self.assertGreater(self.figure(v, "workers_cpu_us_per_job"), 0)
                self.assertGreater(self.figure(v, "postgres_backends_us_per_job"), 0)
                self.assertGreater(self.figure(v, "wal_bytes_per_job"), 0)
        # Only the clients' variants run a load generator.
        self.assertEqual(self.figure("drain", "loadgen_cpu_us_per_job"), 0)
        self.assertGreater(self.figure("submit", "loadgen_cpu_us_per_job"), 0)

    def test_statement_tables_show_each_variants_writes(self):
        def calls(variant, which):
            return sum(r["calls_per_job"] for r in self.statements(variant) if which(r["query"]))

        def turn(q):
            return q.startswith("WITH fence AS") and "INSERT INTO jobs_active" not in q

        def insert(q):
            return "INSERT INTO jobs_active" in q
        for v in ("drain", "submit", "batch", "runsync"):
            with self.subTest(variant=v):
                self.assertGreater(calls(v, turn), 0)  # the dispatcher's turns
        self.assertEqual(calls("drain", insert), 0)  # loaded, not inserted
        for v in ("submit", "batch", "runsync"):
            self.assertGreater(calls(v, insert), 0)
        self.assertIn("statements, per job", self.stdout)

    def test_runsync_answers_without_reading_its_job(self):
        # RunSync answers from the row its job's finish committed: no read of the job. (A call
        # whose job ended otherwise, or a deduplicated one, would read it once.)
        reads = sum(r["calls_per_job"] for r in self.statements("runsync")
                    if r["query"].startswith("SELECT id, type, payload,"))
        self.assertLess(reads, 0.01)

    def test_an_unknown_variant_is_refused_by_name(self):
        r = subprocess.run(
            [sys.executable, os.path.join(REPO, "bench", "bench.py"), "profile", "--variants",
             "drain,submitbatch"], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("unknown variant submitbatch: choose from drain,submit,batch,runsync",
                      r.stderr)


if __name__ == "__main__":
    unittest.main()
