"""The processes bench.py starts and reads: a daemon on a database of its own, its workers, the
load generator, the job rows they leave, and the CPU they use.

Python 3 standard library only. Used by bench.py; the PostgreSQL and output helpers it builds on
are shared with the scheduler benchmark (sched/sched_e2e_bench.py).
"""

import collections
import hashlib
import json
import math
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "sched"))

from sched_e2e_bench import (  # noqa: E402
    BenchError, psql, spawn, stop_process, tail, yaml_str)


def rss_kib(pid):
    """Peak resident set size of a running process (VmHWM), in KiB; None if unknown."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


class Security:
    """TLS and bearer tokens for the daemons of a sitting, made once in `directory`: a CA and a
    server certificate for 127.0.0.1 (P-256 keys, made with openssl), and a tokens file (mode
    0600) with a `client` token for the load generator and a `worker` token for the workers,
    limited to `types`. Give it to Daemon: the daemon then serves TLS and checks the tokens, and
    its workers and load generator connect with --tls-ca and --token-file."""

    def __init__(self, directory, types):
        os.makedirs(directory, exist_ok=True)
        self.dir = directory
        path = lambda name: os.path.join(directory, name)  # noqa: E731
        self.ca, self.cert, self.key = path("ca.pem"), path("server.pem"), path("server.key")
        p256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        with open(path("server.ext"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        for argv in (
                ["req", "-x509", *p256, "-keyout", path("ca.key"), "-out", self.ca, "-days", "2",
                 "-subj", "/CN=dispatchd-bench-ca"],
                ["req", *p256, "-keyout", self.key, "-out", path("server.csr"),
                 "-subj", "/CN=127.0.0.1"],
                ["x509", "-req", "-in", path("server.csr"), "-CA", self.ca, "-CAkey",
                 path("ca.key"), "-CAcreateserial", "-out", self.cert, "-days", "2",
                 "-extfile", path("server.ext")]):
            r = subprocess.run(["openssl", *argv], capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise BenchError(f"openssl {' '.join(argv[:2])} failed ({r.returncode}):\n"
                                 f"{r.stdout}{r.stderr}")
        self.tokens_file = path("tokens")
        self.token_files = {}
        lines = []
        for name, role, extra in (("bench-client", "client", ""),
                                  ("bench-worker", "worker", " types=" + ",".join(types))):
            token = secrets.token_hex(32)
            self.token_files[role] = path(f"{role}.token")
            write_private(self.token_files[role], token + "\n")
            lines.append(f"{name} {role} sha256:{hashlib.sha256(token.encode()).hexdigest()}"
                         f"{extra}\n")
        write_private(self.tokens_file, "".join(lines))

    def config_lines(self):
        """The daemon's `tls` and `auth` keys."""
        return ["tls:", f"  cert_file: {yaml_str(self.cert)}", f"  key_file: {yaml_str(self.key)}",
                "auth:", f"  tokens_file: {yaml_str(self.tokens_file)}"]

    def argv(self, role):
        """What a worker (role "worker") or the load generator ("client") adds to its argv."""
        return ["--tls-ca", self.ca, "--token-file", self.token_files[role]]


def write_private(path, text):
    """Writes a file only its owner may read (mode 0600 from its creation)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


class Daemon:
    """One dispatchd on a database of its own; with `security` (a Security), serving TLS and
    checking bearer tokens, and its workers and load generator presenting them."""

    def __init__(self, bench, name, security=None):
        self.b = bench
        self.security = security
        self.dir = os.path.join(bench.workdir, name)
        os.makedirs(os.path.join(self.dir, "state"), exist_ok=True)
        self.dbname = f"bench_{os.getpid()}_{name}".replace("-", "_")
        self.url = bench.pg.create_db(self.dbname)
        self.proc = None
        self.addr = None
        self.workers = []
        self.start_logs = []
        self.metrics_addr = None  # set by serve_metrics
        if security is not None:
            self.serve_metrics()  # wait_workers reads it: a client token may not list workers

    def serve_metrics(self):
        """Makes the next start serve /metrics on a free port of its own (read with metrics())."""
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.metrics_addr = f"127.0.0.1:{s.getsockname()[1]}"

    def metrics(self):
        """The daemon's /metrics: {(name, labels text): value}, e.g.
        {("dispatchd_store_commit_seconds_sum", 'op="turn"'): 1.5}."""
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=10) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            m = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', line)
            if m:
                out[(m.group(1), m.group(2) or "")] = float(m.group(3))
        return out

    def write_config(self, types, policy=None, extra=()):
        """types: names, or dicts of a name and other `types[]` keys (model, rpm, burst);
        extra: more top-level lines (e.g. "heartbeat_interval: 1s")."""
        cfg = os.path.join(self.dir, "dispatchd.yaml")
        lines = [
            "listen: 127.0.0.1:0",
            "metrics:",
            f"  listen: {self.metrics_addr or '127.0.0.1:0'}",
            f"state_dir: {yaml_str(os.path.join(self.dir, 'state'))}",
            "log_level: warn",
            "max_active: 10000000",
            *extra,
            "postgres:",
            f"  url: {yaml_str(self.url)}",
        ] + [f"  {k}: {v}" for k, v in (("pool_size", getattr(self.b.args, "pool_size", None)),
                                        ("turns_in_flight",
                                         getattr(self.b.args, "turns_in_flight", None)))
             if v is not None] + (["scheduler:", f"  policy: {policy}"] if policy else []) + (
            self.security.config_lines() if self.security else []) + [
            "types:",
        ]
        for t in types:
            t = {"name": t} if isinstance(t, str) else t
            lines.append(f"  - name: {t['name']}")
            lines += [f"    {k}: {yaml_str(v) if isinstance(v, str) else v}"
                      for k, v in t.items() if k != "name" and v is not None]
        with open(cfg, "w") as f:
            f.write("\n".join(lines) + "\n")
        return cfg

    def start(self, types, policy=None, extra=()):
        """Starts the daemon; returns seconds from exec to ready (it has loaded its jobs)."""
        cfg = self.write_config(types, policy, extra)
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.unlink(ready)
        t0 = time.time()
        self.proc = spawn([self.b.dispatchd, "--config", cfg, "--ready-file", ready],
                          os.path.join(self.dir, "dispatchd.log"))
        deadline = t0 + 600
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise BenchError(f"dispatchd exited with {self.proc.returncode}; log "
                                 f"{self.proc.log_path}:\n{tail(self.proc.log_path)}")
            if os.path.exists(ready):
                with open(ready) as f:
                    addr = f.read().strip()
                if addr:
                    self.addr = addr
                    return time.time() - t0
            time.sleep(0.02)
        raise BenchError(f"dispatchd not ready in 600 s; log {self.proc.log_path}")

    def start_workers(self, n, types, slots, mode=("--echo",), start_logs=False):
        """Starts n reference workers in `mode` (echo by default); with start_logs each writes
        dispatch-worker --start-log to self.start_logs (complete once stop_workers has
        returned)."""
        for i in range(1, n + 1):
            argv = [self.b.worker, "--server", self.addr, "--id", f"w{i}", "--types",
                    ",".join(types), "--slots", str(slots), *mode, "--log-level", "warn"]
            if self.security is not None:
                argv += self.security.argv("worker")
            if start_logs:
                path = os.path.join(self.dir, f"starts-w{i}")
                argv += ["--start-log", path]
                self.start_logs.append(path)
            self.workers.append(spawn(argv, os.path.join(self.dir, f"worker-w{i}.log")))

    def stop_workers(self):
        """Drains the workers (SIGTERM) and checks that each exited 0, so that their start logs
        are complete."""
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)  # once: a second signal exits without draining
        deadline = time.time() + 10
        for w in self.workers:
            try:
                w.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                pass
        codes = [(w, stop_process(w, grace=1)) for w in self.workers]
        self.workers = []
        for w, rc in codes:
            if rc != 0:
                raise BenchError(f"worker exited with {rc}; log {w.log_path}:\n{tail(w.log_path)}")

    def wait_workers(self, n, timeout=60):
        """Waits until the daemon counts n connected workers (its /metrics gauge)."""
        deadline = time.time() + timeout
        seen = 0
        while time.time() < deadline:
            self.check_alive()
            seen = self.metrics().get(("dispatchd_workers", ""), 0)
            if seen >= n:
                return
            time.sleep(0.05)
        raise BenchError(f"only {seen:g} of {n} workers connected in {timeout} s; logs in "
                         f"{self.dir}")

    def check_alive(self):
        for p in [self.proc] + self.workers:
            if p is not None and p.poll() is not None:
                raise BenchError(f"{os.path.basename(p.argv[0])} exited with {p.returncode}; "
                                 f"log {p.log_path}:\n{tail(p.log_path)}")

    def stop(self):
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            stop_process(w, grace=10)
        self.workers = []
        if self.proc is not None:
            stop_process(self.proc, grace=20)
            self.proc = None

    def drop(self):
        if not self.b.args.keep_dbs:
            self.b.pg.drop_db(self.dbname)

    def any_active(self):
        """Whether any job is still active. Where the daemon serves /metrics (serve_metrics), its
        queued and running gauges answer while they count jobs, and the database only once they
        read zero: a scan of jobs_active in the middle of a drain costs the server milliseconds
        (it passes the index entries of the rows just finished, until vacuum), which would be
        charged to the drain. The database has the last word, since a job whose result is being
        written, or one a starting daemon has not loaded yet, is in no gauge."""
        if self.metrics_addr is not None and self.proc is not None:
            try:
                m = self.metrics()
            except OSError:
                m = {}
            if sum(v for (name, _), v in m.items()
                   if name in ("dispatchd_jobs_queued", "dispatchd_jobs_running")) > 0:
                return True
        return psql(self.url, "SELECT EXISTS (SELECT 1 FROM jobs_active WHERE state IN "
                              "('QUEUED', 'DISPATCHED', 'RUNNING'))")[0][0] == "t"


def queue_noop_jobs(url, n, jtype):
    """Inserts n queued jobs in one statement, shaped as dispatch-loadgen's Submit calls leave
    them: the daemon's id format (j_ + 12 hex digits of milliseconds, in arrival order, + 16
    random ones), the caller's address as the fairness key and a one-byte payload. So a drain of
    them and a drain of the same number submitted to a running daemon do the same work."""
    psql(url, "INSERT INTO jobs_active (id, type, payload, fairness_key, state, max_attempts, "
              "timeout_ms, created_at, updated_at) "
              "SELECT 'j_' || lpad(to_hex((extract(epoch FROM now()) * 1000)::int8 + i / 20), 12, "
              "'0') || lpad(to_hex((random() * 2147483647)::int8 * 4294967296 + "
              "(random() * 4294967295)::int8), 16, '0'), "
              f"'{jtype}', 'x'::bytea, 'ipv4:127.0.0.1', 'QUEUED', 3, 60000, now(), now() "
              f"FROM generate_series(1, {int(n)}) AS i", timeout=600)
    psql(url, "VACUUM ANALYZE jobs_active", timeout=600)


def machine_busy():
    """(busy, all) CPU seconds of the whole machine so far, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    hz = os.sysconf("SC_CLK_TCK")
    idle = v[3] + v[4]
    return (sum(v) - idle) / hz, sum(v) / hz


def cpu_figures(prefix, jobs, busy0, busy1, procs):
    """CPU per job over a window: the whole machine's busy time and its busy share, and each
    named process's (procs: name -> CPU seconds in the window, None if unknown)."""
    busy, total = busy1[0] - busy0[0], busy1[1] - busy0[1]
    out = {f"{prefix}cpu_us_per_job": round(busy / jobs * 1e6, 1),
           f"{prefix}cpu_busy_share": round(busy / total, 3) if total else None}
    for name, sec in procs.items():
        out[f"{prefix}{name}_cpu_us_per_job"] = None if sec is None else round(sec / jobs * 1e6, 1)
    return out


def keep_finished_jobs(url, n, jtype):
    """Adds n SUCCEEDED jobs that finished just now (within their retention), into the table
    and partition the daemon keeps ended jobs in."""
    psql(url, "INSERT INTO jobs_done (seq, id, type, payload, state, attempt, max_attempts, "
              "timeout_ms, worker_id, result, created_at, dispatched_at, finished_at, updated_at) "
              f"SELECT i, 'f' || i, '{jtype}', 'x'::bytea, 'SUCCEEDED', 1, 3, 60000, 'w1', "
              f"'x'::bytea, now(), now(), now(), now() FROM generate_series(1, {int(n)}) AS i",
         timeout=3600)
    psql(url, "VACUUM ANALYZE jobs_done", timeout=3600)


def run_loadgen(b, d, argv, timeout):
    """Runs dispatch-loadgen against d; returns its JSON summary. Fails on a non-zero exit.
    With d.security it connects with TLS and the client token; a client may not list the
    workers (an admin call), so this waits for --wait-workers itself, from the daemon's
    /metrics, before the load generator starts."""
    cmd = [b.loadgen(), "--server", d.addr, "--type", "noop"]
    if d.security is not None:
        cmd += d.security.argv("client")
        if "--wait-workers" in argv:
            k = argv.index("--wait-workers")
            d.wait_workers(int(argv[k + 1]))
            argv = argv[:k] + argv[k + 2:]
    cmd += argv
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"dispatch-loadgen did not finish in {timeout} s; logs in {d.dir}")
    with open(os.path.join(d.dir, "loadgen.log"), "a") as f:
        f.write(" ".join(cmd) + "\n" + r.stdout + r.stderr)
    lines = [l for l in r.stdout.splitlines() if l.startswith("{")]
    if r.returncode != 0 or not lines:
        raise BenchError(f"dispatch-loadgen failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return json.loads(lines[-1])


def read_records(path):
    """dispatch-loadgen --record: a list of (seq, job_id, sent_us, answered_us)."""
    out = []
    with open(path) as f:
        for line in f:
            seq, job_id, sent, answered = line.split()
            out.append((int(seq), job_id, int(sent), int(answered)))
    return out


def read_start_logs(paths):
    """dispatch-worker --start-log files: job id -> list of handler start times (us)."""
    starts = collections.defaultdict(list)
    for path in paths:
        with open(path) as f:
            for line in f:
                job_id, _attempt, us = line.split()
                starts[job_id].append(int(us))
    return starts


def wait_drained(d, timeout):
    deadline = time.time() + timeout
    while True:
        d.check_alive()
        if not d.any_active():
            return
        if time.time() > deadline:
            raise BenchError(f"jobs still active after {timeout} s; logs in {d.dir}")
        time.sleep(0.5)  # a probe costs the server next to nothing; the figures come from rows


def check_ran_once(d, records, expected, starts):
    """Fails unless the clients were answered for `expected` distinct jobs, the database holds
    exactly those, each SUCCEEDED at attempt 1, and the workers started each exactly once."""
    ids = [r[1] for r in records]
    problems = []
    if len(ids) != expected:
        problems.append(f"the clients were answered for {len(ids)} jobs, not {expected}")
    if len(set(ids)) != len(ids):
        problems.append(f"{len(ids) - len(set(ids))} job ids were answered twice")
    rows = {r[0]: (r[1], r[2]) for r in psql(d.url, "SELECT id, state, attempt FROM jobs",
                                              timeout=600)}
    missing = [i for i in ids if i not in rows]
    extra = set(rows) - set(ids)
    bad = [(i, st, at) for i, (st, at) in rows.items() if st != "SUCCEEDED" or at != "1"]
    not_once = [(i, len(starts.get(i, []))) for i in ids if len(starts.get(i, [])) != 1]
    unknown = set(starts) - set(ids)
    if missing:
        problems.append(f"{len(missing)} answered jobs have no row, e.g. {missing[:3]}")
    if extra:
        problems.append(f"{len(extra)} rows no client was answered for, e.g. {sorted(extra)[:3]}")
    if bad:
        problems.append(f"{len(bad)} rows not SUCCEEDED at attempt 1, e.g. {bad[:3]}")
    if not_once:
        problems.append(f"{len(not_once)} jobs not started exactly once by the workers "
                        f"(id, starts), e.g. {not_once[:3]}")
    if unknown:
        problems.append(f"workers started {len(unknown)} unknown jobs, e.g. {sorted(unknown)[:3]}")
    if problems:
        raise BenchError("jobs lost or run twice: " + "; ".join(problems) + f"; logs in {d.dir}")


def percentile(sorted_values, q):
    """Nearest rank, as dispatch-loadgen computes it."""
    n = len(sorted_values)
    k = min(max(math.ceil(q * n), 1), n)
    return sorted_values[k - 1]


def cpu_seconds(pid):
    """User + system CPU seconds of a running process so far; None if unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None
