"""A daemon for the Python SDK's tests: a database of its own on the `pg` fixture's server."""

import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import uuid


def _psql(url, sql):
    subprocess.run(["psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", url, "-c", sql], check=True,
                   capture_output=True, text=True)


def _with_database(url, name):
    parts = urllib.parse.urlsplit(url)
    return urllib.parse.urlunsplit(parts._replace(path="/" + name))


class DaemonFixture:
    """A database of its own, a daemon on it, and (unless `worker` is False) dispatch-worker
    serving `echo` with 4 slots. `types` is the config's types list, in YAML."""

    def __init__(self, types="  - name: echo\n", worker=True):
        with open(os.environ["DISPATCHD_TEST_PG_URL_FILE"]) as f:
            self.server_url = f.read().strip()
        self.db = "py_" + uuid.uuid4().hex[:12]
        _psql(self.server_url, f"CREATE DATABASE {self.db}")
        self.dir = tempfile.mkdtemp(prefix="dispatchd-py-")
        os.chmod(self.dir, 0o755)
        self._types = types
        self.daemon_log = open(os.path.join(self.dir, "daemon.log"), "w")
        self.address = self._start_daemon("127.0.0.1:0")
        self.worker_log = open(os.path.join(self.dir, "worker.log"), "w")
        self.worker = None if not worker else subprocess.Popen(
            [os.environ["DISPATCH_WORKER_BIN"], "--server", self.address, "--id", "py-w",
             "--types", "echo", "--slots", "4", "--echo"],
            stdout=self.worker_log, stderr=subprocess.STDOUT)

    def _start_daemon(self, listen):
        """Starts the daemon listening on `listen`; returns the address it bound."""
        config = os.path.join(self.dir, "dispatchd.yaml")
        with open(config, "w") as f:
            f.write(f"listen: {listen}\n"
                    f"state_dir: {self.dir}/state\n"
                    "metrics:\n  listen: 127.0.0.1:0\n"
                    f"postgres:\n  url: \"{_with_database(self.server_url, self.db)}\"\n"
                    "types:\n" + self._types)
        ready = os.path.join(self.dir, "ready")
        if os.path.exists(ready):
            os.remove(ready)
        self.daemon = subprocess.Popen([os.environ["DISPATCHD_BIN"], "--config", config,
                                        "--ready-file", ready],
                                       stdout=self.daemon_log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while not os.path.exists(ready):
            if self.daemon.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("dispatchd did not start: " + self.log())
            time.sleep(0.05)
        with open(ready) as f:
            return f.read().strip()

    def restart(self):
        """Kills the daemon (SIGKILL) and starts it again on the same address and database."""
        self.daemon.kill()
        self.daemon.wait(10)
        self.daemon_log.flush()
        self._start_daemon(self.address)

    def log(self):
        with open(os.path.join(self.dir, "daemon.log")) as f:
            return f.read()

    def close(self):
        for p in (self.worker, self.daemon):
            if p is None:
                continue
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        self.daemon_log.close()
        self.worker_log.close()
        _psql(self.server_url, f"DROP DATABASE IF EXISTS {self.db} WITH (FORCE)")
        shutil.rmtree(self.dir, ignore_errors=True)
