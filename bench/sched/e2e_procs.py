"""The scheduler benchmarks' base: BenchError, log, and the child processes (the daemon, workers,
PostgreSQL tools), each tracked and killed on exit, exception or signal.

Shared by sched_e2e_bench.py, fair_bench.py, fair_cluster.py and bench/*.py, which import these
names from sched_e2e_bench.
"""

import atexit
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class BenchError(Exception):
    pass


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------------
# Child processes: every one is tracked and killed on exit, exception or signal.

_children = []
_children_lock = threading.Lock()
_SETPRIV = shutil.which("setpriv")


def _setpriv_has_pdeathsig():
    if not _SETPRIV:
        return False
    try:
        out = subprocess.run([_SETPRIV, "--help"], capture_output=True, text=True, timeout=5)
        return "--pdeathsig" in out.stdout
    except Exception:
        return False


_PDEATHSIG = _setpriv_has_pdeathsig()


def spawn(argv, log_path):
    """Starts argv with stdout+stderr to log_path. With util-linux setpriv the child also gets
    SIGKILL if this process dies without cleaning up (e.g. SIGKILL)."""
    full = ([_SETPRIV, "--pdeathsig", "KILL", "--"] + argv) if _PDEATHSIG else argv
    f = open(log_path, "ab")
    try:
        p = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=f, stderr=subprocess.STDOUT)
    finally:
        f.close()
    p.log_path = log_path
    p.argv = argv
    with _children_lock:
        _children.append(p)
    return p


def stop_process(p, grace):
    """SIGTERM, wait up to `grace` seconds, then SIGKILL. Returns the exit status."""
    if p.poll() is None:
        try:
            p.send_signal(signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            log(f"pid {p.pid} ({os.path.basename(p.argv[0])}) did not stop in {grace}s "
                f"(a worker drains its running jobs first): SIGKILL")
            p.kill()
            p.wait(timeout=30)
    with _children_lock:
        if p in _children:
            _children.remove(p)
    return p.returncode


def kill_all_children():
    with _children_lock:
        procs = list(_children)
    for p in procs:
        if p.poll() is None:
            try:
                p.kill()
            except ProcessLookupError:
                pass
    for p in procs:
        try:
            p.wait(timeout=10)
        except Exception:
            pass
    with _children_lock:
        _children.clear()


atexit.register(kill_all_children)


def _on_signal(signum, _frame):
    raise SystemExit(128 + signum)


def tail(path, n=25):
    try:
        with open(path, "rb") as f:
            lines = f.read().decode("utf-8", "replace").splitlines()
        return "\n".join("    " + l for l in lines[-n:])
    except OSError as e:
        return f"    (cannot read {path}: {e})"


def find_binary(build, name, sub):
    p = os.path.join(build, sub, name)
    if os.path.isfile(p) and os.access(p, os.X_OK):
        return p
    for root, _dirs, files in os.walk(build):
        if name in files and os.access(os.path.join(root, name), os.X_OK):
            return os.path.join(root, name)
    raise BenchError(f"{name} not found under {build} (build with `ninja -C {build}`)")
