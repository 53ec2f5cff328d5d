"""One run of a scheduler benchmark scenario (Run): a fresh database, a daemon, workers,
submissions by dispatchctl, and the job rows read back."""

import concurrent.futures
import json
import os
import signal
import subprocess
import time

from e2e_pg import TERMINAL_SQL, psql
from e2e_procs import BenchError, log, spawn, stop_process, tail


def yaml_str(s):
    return json.dumps(s)  # a JSON string is a valid YAML double-quoted scalar


class Run:
    def __init__(self, bench, name, policy, types):
        self.b = bench
        self.name = name
        self.policy = policy
        self.types = types  # list of dicts: name, model, vram_gb, rpm, burst, max_affinity_wait
        bench.seq += 1
        self.dir = os.path.join(bench.workdir, f"{bench.seq:02d}-{name}")
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        self.dbname = f"sched_e2e_{os.getpid()}_{bench.seq}"
        self.daemon = None
        self.workers = []
        self.addr = None
        self.url = None
        self.columns = set()

    # -- lifecycle ---------------------------------------------------------------------------
    def start_daemon(self):
        self.url = self.b.pg.create_db(self.dbname)
        cfg = os.path.join(self.dir, "dispatchd.yaml")
        lines = [
            "listen: 127.0.0.1:0",
            "metrics:",
            "  listen: 127.0.0.1:0",
            f"state_dir: {yaml_str(os.path.join(self.dir, 'state'))}",
            "log_level: info",
            "postgres:",
            f"  url: {yaml_str(self.url)}",
            "scheduler:",
            f"  policy: {self.policy}",
            "types:",
        ]
        for t in self.types:
            lines.append(f"  - name: {t['name']}")
            for k in ("model", "vram_gb", "rpm", "burst", "max_affinity_wait"):
                if t.get(k) is not None:
                    v = t[k]
                    lines.append(f"    {k}: {yaml_str(v) if isinstance(v, str) else v}")
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        self.daemon = spawn([self.b.dispatchd, "--config", cfg, "--ready-file", ready],
                            os.path.join(self.dir, "dispatchd.log"))
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.daemon.poll() is not None:
                raise BenchError(f"dispatchd exited with {self.daemon.returncode} before ready; "
                                 f"log {self.daemon.log_path}:\n{tail(self.daemon.log_path)}")
            if os.path.exists(ready):
                with open(ready) as f:
                    addr = f.read().strip()
                if addr:
                    self.addr = addr
                    break
            time.sleep(0.05)
        else:
            raise BenchError(f"dispatchd not ready in 60 s; log {self.daemon.log_path}")
        self.columns = {r[0] for r in psql(
            self.url, "SELECT column_name FROM information_schema.columns "
                      "WHERE table_name = 'jobs'")}
        for c in ("id", "type", "fairness_key", "worker_id", "state", "created_at", "started_at",
                  "finished_at"):
            if c not in self.columns:
                raise BenchError(f"table jobs has no column {c} (columns: {sorted(self.columns)})")

    def start_workers(self, n, types, slots, simulate, gpu_gb=None, load_delay=None):
        """Starts n workers and waits until all are connected. Returns the database time just
        before the first one started (the daemon dispatches as soon as one connects)."""
        t_start = self.db_now()
        for i in range(1, n + 1):
            argv = [self.b.worker, "--server", self.addr, "--id", f"w{i}", "--types",
                    ",".join(types), "--slots", str(slots), "--simulate", simulate,
                    "--seed", str(self.b.seed_base * 100 + i)]
            if gpu_gb is not None:
                argv += ["--gpu-memory-gb", str(gpu_gb)]
            if load_delay is not None:
                argv += ["--model-load-delay", load_delay]
            self.workers.append(spawn(argv, os.path.join(self.dir, f"worker-w{i}.log")))
        deadline = time.time() + 60
        while time.time() < deadline:
            self.check_alive()
            r = subprocess.run([self.b.ctl, "--server", self.addr, "--json", "workers"],
                               capture_output=True, text=True, timeout=30)
            if r.returncode == 0:
                got = len(json.loads(r.stdout or "{}").get("workers", []))
                if got >= n:
                    return t_start
            time.sleep(0.05)
        raise BenchError(f"{n} workers did not connect in 60 s; logs in {self.dir}")

    def check_alive(self):
        if self.daemon is not None and self.daemon.poll() is not None:
            raise BenchError(f"dispatchd exited with {self.daemon.returncode}; log "
                             f"{self.daemon.log_path}:\n{tail(self.daemon.log_path)}")
        for w in self.workers:
            if w.poll() is not None:
                raise BenchError(f"worker exited with {w.returncode}; log {w.log_path}:\n"
                                 f"{tail(w.log_path)}")

    def stop(self):
        for w in self.workers:  # all at once: each drains its running jobs
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            stop_process(w, grace=10)
        if self.daemon is not None:
            rc = stop_process(self.daemon, grace=20)
            if rc not in (0, -signal.SIGTERM):
                log(f"warning: dispatchd exited with {rc}; log {self.daemon.log_path}")
        self.workers = []
        self.daemon = None
        if self.url and not self.b.args.keep_dbs:
            self.b.pg.drop_db(self.dbname)

    # -- submissions -------------------------------------------------------------------------
    def submit_one(self, jtype, key, idem):
        argv = [self.b.ctl, "--server", self.addr, "submit", "--type", jtype, "--payload", "x",
                "--fairness-key", key, "--idempotency-key", idem]
        for attempt in range(20):
            try:
                r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
            except subprocess.TimeoutExpired:
                continue
            if r.returncode == 0:
                return r.stdout.strip()
            if r.returncode in (6, 8):  # RESOURCE_EXHAUSTED / unavailable: retry, idempotent
                time.sleep(min(0.1 * (attempt + 1), 2))
                continue
            raise BenchError(f"dispatchctl submit exited {r.returncode}: {r.stderr.strip()}")
        raise BenchError(f"dispatchctl submit kept failing: {argv}")

    def submit_many(self, jobs, tag):
        """jobs: list of (type, key). Submitted in order, `concurrency` at a time."""
        t0 = time.time()
        with concurrent.futures.ThreadPoolExecutor(self.b.args.concurrency) as ex:
            futs = [ex.submit(self.submit_one, t, k, f"{tag}-{i}") for i, (t, k) in enumerate(jobs)]
            try:
                ids = [f.result() for f in futs]
            except BaseException:
                for f in futs:
                    f.cancel()
                raise
        dt = time.time() - t0
        log(f"  {self.name}: submitted {len(jobs)} jobs ({tag}) in {dt:.1f}s "
            f"({len(jobs) / max(dt, 1e-9):.0f}/s)")
        return ids

    # -- database ----------------------------------------------------------------------------
    def db_now(self):
        return float(psql(self.url, "SELECT extract(epoch from clock_timestamp())")[0][0])

    def count_active(self, where="TRUE"):
        return int(psql(self.url, f"SELECT count(*) FROM jobs WHERE state NOT IN {TERMINAL_SQL} "
                                  f"AND ({where})")[0][0])

    def wait_terminal(self, timeout, where="TRUE", what="jobs"):
        deadline = time.time() + timeout
        last_log = time.time()
        while True:
            self.check_alive()
            n = self.count_active(where)
            if n == 0:
                return
            if time.time() > deadline:
                raise BenchError(f"{self.name}: timed out after {timeout:.0f}s waiting for {what} "
                                 f"to end ({n} still active); logs in {self.dir}")
            if time.time() - last_log > 30:
                log(f"  {self.name}: {n} {what} still active")
                last_log = time.time()
            time.sleep(0.25)

    def rows(self):
        disp = "extract(epoch from dispatched_at)" if "dispatched_at" in self.columns else "NULL"
        order = "seq" if "seq" in self.columns else "created_at, id"
        att = "attempt" if "attempt" in self.columns else "0"
        out = []
        for r in psql(self.url,
                      f"SELECT id, type, fairness_key, worker_id, state, {att}, "
                      f"extract(epoch from created_at), {disp}, extract(epoch from started_at), "
                      f"extract(epoch from finished_at) FROM jobs ORDER BY {order}", timeout=300):
            f = lambda s: float(s) if s != "" else None
            out.append({"id": r[0], "type": r[1], "key": r[2], "worker": r[3], "state": r[4],
                        "attempt": int(r[5]), "created": f(r[6]), "dispatched": f(r[7]),
                        "started": f(r[8]), "finished": f(r[9])})
        return out
