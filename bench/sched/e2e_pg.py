"""PostgreSQL for the scheduler benchmarks: psql, one database per run, and a private server
from tests/pg/pg_fixture.sh when no URL is given."""

import os
import subprocess
import urllib.parse

from e2e_procs import REPO, BenchError, log

TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "EXPIRED")
TERMINAL_SQL = "('SUCCEEDED','FAILED','CANCELLED','EXPIRED')"


def db_url(base, dbname):
    """The URL of database `dbname` on the server of `base` (a URL or a key=value string)."""
    if "://" in base:
        u = urllib.parse.urlsplit(base)
        return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + dbname, u.query, u.fragment))
    return f"{base} dbname={dbname}"


def psql(url, sql, timeout=120):
    try:
        r = subprocess.run(
            ["psql", "-X", "-q", "-At", "-F", ",", "-v", "ON_ERROR_STOP=1", url, "-c", sql],
            capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise BenchError(f"psql timed out after {timeout}s: {sql[:80]}")
    if r.returncode != 0:
        raise BenchError(f"psql failed ({r.returncode}) on {sql[:80]!r}: {r.stderr.strip()}")
    return [line.split(",") for line in r.stdout.splitlines() if line != ""]


class Postgres:
    def __init__(self, workdir, url):
        self.state = os.path.join(workdir, "pg")
        self.url = url
        self.own = url is None
        self.dbs = []

    def start(self):
        if not self.own:
            psql(self.url, "SELECT 1")
            return
        fixture = os.path.join(REPO, "tests", "pg", "pg_fixture.sh")
        r = subprocess.run([fixture, "start", self.state], capture_output=True, text=True,
                           timeout=180)
        if r.returncode != 0:
            raise BenchError(f"pg_fixture.sh start failed:\n{r.stdout}{r.stderr}")
        with open(os.path.join(self.state, "url")) as f:
            self.url = f.read().strip()
        log(f"PostgreSQL: {self.url}")

    def create_db(self, name):
        psql(self.url, f'CREATE DATABASE "{name}"')
        self.dbs.append(name)
        return db_url(self.url, name)

    def drop_db(self, name):
        try:
            psql(self.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        except BenchError as e:
            log(f"warning: {e}")

    def stop(self):
        if self.own and os.path.exists(os.path.join(self.state, "datadir")):
            fixture = os.path.join(REPO, "tests", "pg", "pg_fixture.sh")
            subprocess.run([fixture, "stop", self.state], capture_output=True, timeout=180)
