"""The fairness benchmark's cluster and figures (see fair_bench.py): a database, one or two
dispatchd daemons with a tokens file and tenants, reference workers, submissions through the
Python SDK, and the shares, differences and waits computed from the job rows."""

import hashlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import sched_e2e_bench as e2e  # noqa: E402  (processes, PostgreSQL, small helpers)

from sched_e2e_bench import BenchError  # noqa: E402

CHUNK = 500  # specs per SubmitBatch
BIN_S = 0.5  # the plots' time step


def payload_seconds(payload):
    """'120ms' or '1.5s' -> seconds; None for anything else."""
    if isinstance(payload, bytes):
        payload = payload.decode(errors="replace")
    for suffix, scale in (("ms", 1e-3), ("s", 1.0)):
        if payload.endswith(suffix):
            try:
                return float(payload[:-len(suffix)]) * scale
            except ValueError:
                return None
    return None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(xs, p):
    xs = sorted(xs)
    if not xs:
        return None
    return xs[min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))]


# ------------------------------------------------------------------------------------------------
# A cluster: one database, one or two daemons with tokens and tenants, reference workers.


class Cluster:
    def __init__(self, bench, name, policy, types, tenants, principals, daemons=1, lease=None):
        self.b = bench
        self.name = name
        self.policy = policy
        self.types = types            # dicts: name, model, vram_gb, default_cost, max_affinity_wait
        self.tenants = tenants        # dicts: name, principals, weight, min_running
        self.principals = principals  # {name: role}
        bench.seq += 1
        self.dir = os.path.join(bench.workdir, f"{bench.seq:02d}-{name}-{policy}")
        os.makedirs(self.dir, exist_ok=True)
        self.dbname = f"fair_bench_{os.getpid()}_{bench.seq}"
        self.url = None
        self.ports = [free_port() for _ in range(daemons)]
        self.lease = lease
        self.daemons = [None] * daemons
        self.workers = []
        self.clients = {}
        self.tokens = {}
        self.costs = {}  # job id -> seconds its payload makes a --sleep-payload worker sleep

    @property
    def addresses(self):
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _write_tokens(self):
        lines = []
        for name, role in self.principals.items():
            token = secrets.token_hex(32)
            path = os.path.join(self.dir, f"{name}.token")
            with open(path, "w") as f:
                f.write(token + "\n")
            os.chmod(path, 0o600)
            self.tokens[name] = path
            lines.append(f"{name} {role} sha256:{hashlib.sha256(token.encode()).hexdigest()}")
        path = os.path.join(self.dir, "tokens")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(path, 0o600)
        return path

    def _write_config(self, i, tokens_file):
        y = e2e.yaml_str
        state = os.path.join(self.dir, f"state{i}")
        os.makedirs(state, exist_ok=True)
        lines = [f"listen: 127.0.0.1:{self.ports[i]}", "metrics:", "  listen: 127.0.0.1:0",
                 f"state_dir: {y(state)}", "log_level: info", "postgres:", f"  url: {y(self.url)}",
                 "auth:", f"  tokens_file: {y(tokens_file)}", "scheduler:",
                 f"  policy: {self.policy}"]
        if self.lease:
            lines += ["ha:", f"  lease: {self.lease}"]
        lines.append("types:")
        for t in self.types:
            lines.append(f"  - name: {t['name']}")
            for k in ("model", "vram_gb", "default_cost", "max_affinity_wait"):
                if t.get(k) is not None:
                    v = t[k]
                    lines.append(f"    {k}: {y(v) if isinstance(v, str) else v}")
        if self.tenants:
            lines.append("tenants:")
            for t in self.tenants:
                lines.append(f"  - name: {t['name']}")
                lines.append(f"    principals: [{', '.join(t['principals'])}]")
                for k in ("weight", "min_running"):
                    if t.get(k) is not None:
                        lines.append(f"    {k}: {t[k]}")
        path = os.path.join(self.dir, f"dispatchd{i}.yaml")
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        return path

    def start(self):
        self.url = self.b.pg.create_db(self.dbname)
        tokens_file = self._write_tokens()
        self.configs = [self._write_config(i, tokens_file) for i in range(len(self.ports))]
        for i in range(len(self.ports)):
            self.start_daemon(i)

    def start_daemon(self, i):
        ready = os.path.join(self.dir, f"ready{i}")
        if os.path.exists(ready):
            os.unlink(ready)
        self.daemons[i] = e2e.spawn(
            [self.b.dispatchd, "--config", self.configs[i], "--ready-file", ready],
            os.path.join(self.dir, f"dispatchd{i}.{int(time.time() * 1000)}.log"))
        deadline = time.time() + 60
        while time.time() < deadline:
            if self.daemons[i].poll() is not None:
                raise BenchError(f"dispatchd {i} exited with {self.daemons[i].returncode}; log "
                                 f"{self.daemons[i].log_path}:\n{e2e.tail(self.daemons[i].log_path)}")
            if os.path.exists(ready) and open(ready).read().strip():
                return
            time.sleep(0.05)
        raise BenchError(f"dispatchd {i} not ready in 60 s; log {self.daemons[i].log_path}")

    def stop_daemon(self, i, sig=signal.SIGTERM):
        p = self.daemons[i]
        if p is None:
            return
        if sig == signal.SIGKILL:
            p.kill()
            p.wait(timeout=30)
        else:
            e2e.stop_process(p, grace=20)
        self.daemons[i] = None

    def leader(self):
        """Index of the daemon that leads, from the lease row's address."""
        addr = e2e.psql(self.url, "SELECT address FROM dispatchd_leader")[0][0]
        for i, port in enumerate(self.ports):
            if self.daemons[i] is not None and addr == f"127.0.0.1:{port}":
                return i
        return None

    def ctl(self, argv, principal="ops", check=True):
        full = [self.b.ctl, "--token-file", self.tokens[principal]]
        if "--server" not in argv:
            full += ["--server", self.addresses]
        r = subprocess.run(full + argv, capture_output=True, text=True, timeout=60)
        if check and r.returncode != 0:
            raise BenchError(f"dispatchctl {' '.join(argv)}: exit {r.returncode}: {r.stderr}")
        return r

    def start_workers(self, n, types, slots, mode, gpu_gb=None, load_delay=None, prefix="w"):
        for i in range(1, n + 1):
            argv = [self.b.worker, "--server", self.addresses, "--token-file", self.tokens["gpu"],
                    "--id", f"{prefix}{i}", "--types", ",".join(types), "--slots", str(slots),
                    "--seed", str(i)] + mode
            if gpu_gb is not None:
                argv += ["--gpu-memory-gb", str(gpu_gb)]
            if load_delay is not None:
                argv += ["--model-load-delay", load_delay]
            self.workers.append(e2e.spawn(argv, os.path.join(self.dir, f"worker-{prefix}{i}.log")))
        deadline = time.time() + 60
        while time.time() < deadline:
            self.check_alive()
            r = self.ctl(["--json", "workers"], check=False)
            if r.returncode == 0 and len(json.loads(r.stdout or "{}").get("workers", [])) >= n:
                return
            time.sleep(0.05)
        raise BenchError(f"{n} workers did not connect in 60 s; logs in {self.dir}")

    def model_loads(self):
        r = self.ctl(["--json", "workers"])
        ws = json.loads(r.stdout or "{}").get("workers", [])
        return sum(int(w.get("modelLoads", w.get("model_loads", 0))) for w in ws)

    def check_alive(self):
        for w in self.workers:
            if w.poll() is not None:
                raise BenchError(f"worker exited with {w.returncode}; log {w.log_path}:\n"
                                 f"{e2e.tail(w.log_path)}")

    def client(self, principal):
        if principal not in self.clients:
            import dispatchd
            self.clients[principal] = dispatchd.Client(
                "ipv4:" + self.addresses, timeout=60,
                security=dispatchd.Security(token_file=self.tokens[principal]))
        return self.clients[principal]

    def submit(self, principal, specs):
        """Queues `specs` (dicts of dispatchd.job_spec arguments) in order; returns the ids."""
        import dispatchd
        ids = []
        for i in range(0, len(specs), CHUNK):
            chunk = specs[i:i + CHUNK]
            for attempt in range(100):
                try:
                    got = self.client(principal).submit_batch(chunk)
                    for job_id, spec in zip(got, chunk):
                        self.costs[job_id] = payload_seconds(spec.get("payload", ""))
                    ids += got
                    break
                except dispatchd.DispatchError as e:
                    if e.code.name not in ("RESOURCE_EXHAUSTED", "UNAVAILABLE") or attempt == 99:
                        raise BenchError(f"{principal}: SubmitBatch: {e}")
                    time.sleep(0.2)
        return ids

    def wait_done(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            self.check_alive()
            n = int(e2e.psql(self.url, "SELECT count(*) FROM jobs WHERE state NOT IN "
                                       f"{e2e.TERMINAL_SQL}")[0][0])
            if n == 0:
                return
            time.sleep(0.25)
        raise BenchError(f"{self.name}: jobs still active after {timeout:.0f}s; logs in {self.dir}")

    def rows(self):
        """Every job row; `cost` is the job's own duration where its payload names one (the
        time a --sleep-payload worker spends on it), else the time from start to finish."""
        out = []
        for r in e2e.psql(self.url,
                          "SELECT id, type, fairness_key, owner, worker_id, state, attempt, "
                          "extract(epoch from created_at), extract(epoch from dispatched_at), "
                          "extract(epoch from started_at), extract(epoch from finished_at) "
                          "FROM jobs ORDER BY created_at, id", timeout=300):
            f = lambda s: float(s) if s != "" else None  # noqa: E731
            out.append({"id": r[0], "type": r[1], "key": r[2], "owner": r[3], "worker": r[4],
                        "state": r[5], "attempt": int(r[6]), "created": f(r[7]),
                        "dispatched": f(r[8]), "started": f(r[9]), "finished": f(r[10])})
            c = self.costs.get(r[0])
            if c is None and out[-1]["started"] is not None and out[-1]["finished"] is not None:
                c = out[-1]["finished"] - out[-1]["started"]
            out[-1]["cost"] = c
        return out

    def stop(self):
        for c in self.clients.values():
            c.close()
        self.clients = {}
        for w in self.workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in self.workers:
            e2e.stop_process(w, grace=10)
        self.workers = []
        for i in range(len(self.daemons)):
            self.stop_daemon(i)
        if self.url and not self.b.args.keep_dbs:
            self.b.pg.drop_db(self.dbname)


# ------------------------------------------------------------------------------------------------
# Figures from the rows.


def tenant_of(row, tenants):
    for t in tenants:
        if row["owner"] in t["principals"]:
            return t["name"]
    return row["owner"]


def served(rows, tenants):
    """Per tenant, (dispatch time, work) of each job that ran, by dispatch time."""
    out = {t["name"]: [] for t in tenants}
    for r in rows:
        if r["cost"] is None or r["dispatched"] is None:
            continue
        t = tenant_of(r, tenants)
        out.setdefault(t, []).append((r["dispatched"], r["cost"]))
    for v in out.values():
        v.sort()
    return out


def backlogged_window(series):
    """From the first dispatch to the last dispatch of the tenant that finishes first."""
    starts = [v[0][0] for v in series.values() if v]
    ends = [v[-1][0] for v in series.values() if v]
    return min(starts), min(ends)


def share_figures(rows, tenants, plot_name=None, bench=None):
    """Shares of served work in the window, Jain over weight-normalised service, the largest
    weight-normalised difference at any instant, and the time series (for the CSV and plot)."""
    weights = {t["name"]: t.get("weight", 1) for t in tenants}
    series = served(rows, tenants)
    names = [t["name"] for t in tenants]
    t0, t1 = backlogged_window({n: series[n] for n in names})
    events = sorted((ts, n, w) for n in names for ts, w in series[n] if ts <= t1)
    acc = {n: 0.0 for n in names}
    worst, worst_at = 0.0, 0.0
    for ts, n, w in events:
        acc[n] += w
        norm = [acc[x] / weights[x] for x in names]
        if max(norm) - min(norm) > worst:
            worst_at = ts - t0
        worst = max(worst, max(norm) - min(norm))
    total = sum(acc.values())
    cmax = max(w for n in names for _ts, w in series[n])
    out = {"window_s": t1 - t0,
           "shares": {n: acc[n] / total for n in names},
           "jain": e2e.jain([acc[n] / weights[n] for n in names]),
           "max_diff_s": worst, "max_diff_at_s": worst_at, "largest_job_s": cmax, "max_diff_jobs": worst / cmax,
           "max_accrued_diff_jobs": accrued_diff(rows, tenants, weights, t0, t1) / cmax}
    if plot_name and bench is not None:
        with open(os.path.join(bench.workdir, f"{plot_name}-run{bench.run_no}-rows.json"), "w") as f:
            json.dump(rows, f)
        # The share of the work dispatched in each half second of the window.
        bins = {}
        for ts, n, w in events:
            bins.setdefault(int((ts - t0) / BIN_S), {x: 0.0 for x in names})[n] += w
        points = [((b + 0.5) * BIN_S, *(v[x] / sum(v.values()) for x in names))
                  for b, v in sorted(bins.items()) if sum(v.values()) > 0]
        bench.save_series(plot_name, ["t_s"] + [f"share_{n}" for n in names], points)
    return out


def accrued_diff(rows, tenants, weights, t0, t1):
    """The largest weight-normalised difference between tenants' accrued service (worker time
    used so far, counting running jobs' progress: VTC's counter) at any instant in [t0, t1].
    Service is piecewise linear between starts and ends, so the largest gap is at one of them."""
    names = [t["name"] for t in tenants]
    edges = []
    for r in rows:
        if r["cost"] is None or r["finished"] is None:
            continue
        n = tenant_of(r, tenants)
        if n in weights:
            # The job ran for `cost` up to its end (started_at is when the daemon recorded the
            # start, which a short job's result can overtake).
            edges.append((r["finished"] - r["cost"], n, 1))
            edges.append((r["finished"], n, -1))
    edges.sort()
    running = {n: 0 for n in names}
    acc = {n: 0.0 for n in names}
    last, worst = t0, 0.0
    for ts, n, d in edges:
        ts_c = min(max(ts, t0), t1)
        if ts_c > last:
            for x in names:
                acc[x] += running[x] * (ts_c - last)
            last = ts_c
            norm = [acc[x] / weights[x] for x in names]
            worst = max(worst, max(norm) - min(norm))
        running[n] += d
    return worst


def wait_p99(rows, principal, t1=None):
    waits = [e2e.dispatch_time(r) - r["created"] for r in rows
             if r["owner"] == principal and r["dispatched"] is not None
             and (t1 is None or e2e.dispatch_time(r) <= t1)]
    return percentile(waits, 99)


def all_succeeded(rows):
    bad = [r for r in rows if r["state"] != "SUCCEEDED"]
    if bad:
        raise BenchError(f"{len(bad)} jobs did not succeed, e.g. {bad[0]}")
