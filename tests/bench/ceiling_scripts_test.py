"""bench/ceiling's pgbench scripts stay valid on dispatchd's schema: each runs a handful of
transactions with pgbench on a fresh database (migrated by the daemon, as bench.py does it), and
the rows must have moved: jobs_done grew by 100 per transaction, as SUCCEEDED with the result,
and jobs_active shrank by as many (claim_complete.sql, oldest first) or holds none
(insert_claim_complete.sql); insert_one.sql, the latency's floor, queues one job a transaction.

Run by ctest (bench_ceiling_scripts, label store) on the `pg` fixture's server:
DISPATCHD_TEST_PG_URL_FILE names the file holding its URL, DISPATCHD_BIN the daemon.
"""

import os
import shutil
import sys
import tempfile
import types
import unittest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "bench"))
sys.path.insert(0, os.path.join(REPO, "bench", "sched"))

import ceiling  # noqa: E402
from e2e_pg import Postgres, psql  # noqa: E402
from harness import Daemon, queue_noop_jobs  # noqa: E402

CLIENTS, TRANSACTIONS = 2, 3  # 600 jobs a script
MOVED = CLIENTS * TRANSACTIONS * ceiling.BATCH
FLOOR_PROBES = 30


class CeilingScriptsTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        url_file = os.environ.get("DISPATCHD_TEST_PG_URL_FILE")
        dispatchd = os.environ.get("DISPATCHD_BIN")
        if not url_file or not os.path.exists(url_file) or not dispatchd:
            raise unittest.SkipTest("needs ctest's pg fixture (DISPATCHD_TEST_PG_URL_FILE) and "
                                    "DISPATCHD_BIN")
        with open(url_file) as f:
            url = f.read().strip()
        cls.workdir = tempfile.mkdtemp(prefix="ceiling-test-")
        # What harness.Daemon needs of bench.py's Bench.
        cls.bench = types.SimpleNamespace(
            dispatchd=dispatchd, workdir=cls.workdir, pg=Postgres(cls.workdir, url),
            args=types.SimpleNamespace(keep_dbs=False, ceiling_clients=CLIENTS,
                                       ceiling_threads=1, timeout=120, no_ceiling=False,
                                       probes=FLOOR_PROBES, warmup=2, rate=200))

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.workdir, ignore_errors=True)

    def migrated_db(self, name):
        """A fresh database with dispatchd's schema: the daemon started once and stopped."""
        d = Daemon(self.bench, name)
        self.addCleanup(d.drop)
        d.start(["noop"])
        d.stop()
        return d.url

    def counts(self, url):
        return [int(x) for x in psql(url, """
            SELECT (SELECT count(*) FROM jobs_done),
                   (SELECT count(*) FROM jobs_done WHERE state = 'SUCCEEDED' AND attempt = 1
                      AND result = 'x'::bytea AND dispatched_at IS NOT NULL
                      AND worker_id LIKE 'w%'),
                   (SELECT count(*) FROM jobs_active),
                   (SELECT count(*) FROM jobs_active WHERE state = 'QUEUED')""")[0]]

    def test_claim_complete_moves_the_oldest_queued_rows(self):
        url = self.migrated_db("claim_complete")
        queue_noop_jobs(url, 1000, "noop")
        p = ceiling.run_pgbench(url, "claim_complete", CLIENTS, 1, TRANSACTIONS, timeout=120)
        self.assertEqual(p["transactions"], CLIENTS * TRANSACTIONS)
        self.assertEqual(self.counts(url), [MOVED, MOVED, 1000 - MOVED, 1000 - MOVED])
        # Claimed in seq order: every row moved is older than every row left.
        left = psql(url, "SELECT (SELECT max(seq) FROM jobs_done) < "
                         "(SELECT min(seq) FROM jobs_active)")[0][0]
        self.assertEqual(left, "t")

    def test_insert_claim_complete_moves_every_row_it_inserts(self):
        url = self.migrated_db("insert_claim_complete")
        p = ceiling.run_pgbench(url, "insert_claim_complete", CLIENTS, 1, TRANSACTIONS,
                                timeout=120)
        self.assertEqual(p["transactions"], CLIENTS * TRANSACTIONS)
        self.assertEqual(self.counts(url), [MOVED, MOVED, 0, 0])
        ids = psql(url, "SELECT count(DISTINCT id), min(length(id)), max(length(id)) "
                        "FROM jobs_done WHERE id LIKE 'j\\_%'")[0]
        self.assertEqual(ids, [str(MOVED), "30", "30"])  # the daemon's id format

    def test_ceiling_once_checks_and_reports(self):
        for script in ceiling.SCRIPTS:
            r = ceiling.ceiling_once(self.bench, f"once_{script}", script, MOVED)
            self.assertEqual(r["jobs"], MOVED)
            self.assertGreater(r["jobs_per_s"], 0)
            self.assertIn(f"-t {TRANSACTIONS} -f bench/ceiling/{script}.sql", r["command"])

    def test_insert_one_queues_one_job_a_transaction(self):
        url = self.migrated_db("insert_one")
        p = ceiling.run_pgbench(url, "insert_one", 1, 1, 7, timeout=120)
        self.assertEqual(p["transactions"], 7)
        self.assertEqual(self.counts(url), [0, 0, 7, 7])
        ids = psql(url, "SELECT count(DISTINCT id), min(length(id)), max(length(id)) "
                        "FROM jobs_active WHERE id LIKE 'j\\_%' AND type = 'noop'")[0]
        self.assertEqual(ids, ["7", "30", "30"])

    def test_floor_reports_the_commit_at_the_probes_rate_beside_the_probes(self):
        out = {"submit_to_worker_p50_ms": 3.0, "submit_to_worker_p99_ms": 6.0}
        ceiling.add_floor(self.bench, 1, out)
        p50, p99 = out["pg_floor_insert_p50_ms"], out["pg_floor_insert_p99_ms"]
        self.assertGreaterEqual(p50, 0)
        self.assertLessEqual(p50, p99)
        self.assertGreater(out["pg_floor_insert_back_to_back_ms"], 0)
        # This server runs without fsync: its commits may end before pgbench can time them.
        self.assertIn(out["pg_floor_untimed"], range(FLOOR_PROBES + 1))
        for pct, ms in (("p50", 3.0), ("p99", 6.0)):
            floor = out[f"pg_floor_insert_{pct}_ms"]
            self.assertEqual(out[f"submit_to_worker_{pct}_over_floor"],
                             round(ms / floor, 3) if floor > 0 else None)
        self.assertIn(f"-t {FLOOR_PROBES + 2} -R 200 -l -f bench/ceiling/insert_one.sql",
                      out["pg_floor_command"])

    def test_a_pgbench_log_gives_each_transactions_time_from_its_start(self):
        path = os.path.join(self.workdir, "floor.123")
        with open(path, "w") as f:
            f.write("0 0 1500 0 1700000000 100 400\n0 1 900 0 1700000000 200 0\n")
        self.assertEqual(ceiling.read_pgbench_log(path), [1100, 900])
        # The warm-up is the first transactions, not the fastest.
        self.assertEqual(ceiling.measured_times(path, 1), [900])
        with open(path, "w") as f:
            f.write("0 0 skipped 0 1700000000 100 400\n")
        with self.assertRaises(ceiling.BenchError):
            ceiling.read_pgbench_log(path)


if __name__ == "__main__":
    unittest.main()
