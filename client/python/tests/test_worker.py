"""dispatchd.Worker, and the example GPU worker, against a real daemon on 127.0.0.1.

The Python reference worker (dispatch-worker.py) also runs the C++ end-to-end suite in place of
dispatch-worker (ctest -R python_worker/); these tests cover what only the SDK's API shows:
handler outcomes, backpressure as the handler sees it, cancellation, drain, and bad options.
Run by ctest (tests `python_client` and `python_wheel`); see test_client.py for the environment.
"""

import json
import os
import signal
import subprocess
import sys
import threading
import time
import unittest

import grpc

import dispatchd
from daemon_fixture import DaemonFixture

# The reference worker (dispatch-worker.py, or the installed package's dispatch-worker-py), run
# from whichever dispatchd package this interpreter imports: the build tree's or an installed one.
_REFERENCE_WORKER = [sys.executable, "-m", "dispatchd.reference_worker"]
# The examples, beside the tests in the source tree; they import dispatchd as these tests do.
_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")

_TYPES = ("  - name: py\n    max_attempts: 2\n    retry_backoff: 0s\n"
          "  - name: embed.text\n    model: toy-embed\n    vram_gb: 2\n")


def _wait_for(predicate, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


class _Running:
    """Counts the handlers running at once."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = self.most = 0

    def __enter__(self):
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)

    def __exit__(self, *exc):
        with self.lock:
            self.now -= 1


class WorkerTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.fx = DaemonFixture(types=_TYPES, worker=False)
        cls.client = dispatchd.Client(cls.fx.address)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.fx.close()

    def serve(self, handler, **options):
        """Runs a Worker for `py` jobs on a thread until the test ends; returns it."""
        options.setdefault("worker_id", f"py-{self.id().rsplit('.', 1)[-1]}")
        worker = dispatchd.Worker(self.fx.address, types=["py"], handler=handler, **options)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()

        def stop():
            worker.close()
            thread.join(30)
            self.assertFalse(thread.is_alive(), "Worker.run did not return after close()")
        self.addCleanup(stop)
        return worker

    def test_handler_outcomes_become_the_jobs_outcomes(self):
        def handler(job):
            kind, _, rest = job.payload.decode().partition(":")
            if kind == "ok":
                return rest.upper()
            if kind == "bytes":
                return bytes([0, 255]) + rest.encode()
            if kind == "fail":
                raise dispatchd.JobFailed("bad input: " + rest)
            if kind == "retry":
                raise dispatchd.JobFailed("gpu busy", retryable=True)
            raise ValueError("no such kind " + kind)
        self.serve(handler, slots=4)

        job = self.client.run("py", b"ok:hello", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED")
        self.assertEqual(job.result, b"HELLO")
        job = self.client.run("py", b"bytes:x", wait=60)
        self.assertEqual(job.result, b"\x00\xffx")

        job = self.client.run("py", b"fail:empty", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "FAILED")
        self.assertEqual(job.attempt, 1)
        self.assertIn("bad input: empty", job.error)

        job = self.client.run("py", b"retry:", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "FAILED")
        self.assertEqual(job.attempt, 2)  # max_attempts: 2, both used
        self.assertIn("gpu busy", job.error)

        job = self.client.run("py", b"what:", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "FAILED")
        self.assertEqual(job.attempt, 1)
        self.assertIn("handler raised ValueError: no such kind what", job.error)

    def test_worker_refuses_beyond_max_concurrent_and_every_job_runs_once(self):
        running = _Running()
        seen = []

        def handler(job):
            with running:
                seen.append(job.job_id)
                time.sleep(0.2)
                return b"done"
        # Four slots advertised, one job at a time in fact: the daemon offers more, the worker
        # refuses them RESOURCE_EXHAUSTED, and they run later.
        with self.assertLogs("dispatchd.worker", "INFO") as logs:
            self.serve(handler, slots=4, max_concurrent=1)
            ids = self.client.submit_batch([{"type": "py", "payload": str(i)} for i in range(6)])
            for job_id in ids:
                self.assertTrue(_wait_for(lambda: dispatchd.state_name(
                    self.client.status(job_id).state) == "SUCCEEDED", 60), job_id)
        self.assertEqual(running.most, 1)
        self.assertEqual(sorted(seen), sorted(ids))  # each once
        for job_id in ids:
            self.assertEqual(self.client.status(job_id).attempt, 1)  # a refusal uses none
        refusals = [line for line in logs.output
                    if "rejected" in line and "reason=resource_exhausted" in line]
        self.assertTrue(refusals, "the worker never refused a job: " + "\n".join(logs.output))

    def test_cancel_reaches_the_handler(self):
        started = threading.Event()
        reasons = []

        def handler(job):
            started.set()
            if job.wait_for_cancellation(60):
                reasons.append(job.cancel_reason)
                raise dispatchd.JobFailed("stopped: " + job.cancel_reason)
            return b"not cancelled"
        self.serve(handler)
        job_id = self.client.submit("py", b"long")
        self.assertTrue(started.wait(30))
        self.client.cancel(job_id)
        self.assertTrue(_wait_for(lambda: reasons, 30), "the handler never saw the cancel")
        self.assertEqual(dispatchd.state_name(self.client.status(job_id).state), "CANCELLED")

    def test_drain_finishes_running_jobs_then_run_returns(self):
        started = threading.Event()
        release = threading.Event()

        def handler(job):
            started.set()
            release.wait(30)
            return b"finished while draining"
        # Two slots, one busy: only the drain keeps a second job away.
        worker = dispatchd.Worker(self.fx.address, worker_id="py-drain", types=["py"],
                                  handler=handler, slots=2)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        self.addCleanup(worker.close)
        first = self.client.submit("py", b"first")
        self.assertTrue(started.wait(30))
        worker.drain()
        self.assertTrue(_wait_for(lambda: any(
            w.worker_id == "py-drain" and w.draining for w in self._workers())),
            "the daemon never saw the drain")
        second = self.client.submit("py", b"second")
        # The daemon looked at the second job and found no worker free to take it.
        self.assertTrue(_wait_for(
            lambda: self.client.status(second).wait_reason == "workers_busy"),
            self.client.status(second))
        release.set()
        thread.join(30)
        self.assertFalse(thread.is_alive(), "run() did not return after the drain")
        job = self.client.status(first)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED")
        self.assertEqual(job.result, b"finished while draining")
        # The drained worker took no more work: the second job still waits for a worker.
        self.assertEqual(dispatchd.state_name(self.client.status(second).state), "QUEUED")
        self.client.cancel(second)

    def _workers(self):
        from dispatchd.v1 import admin_service_pb2, admin_service_pb2_grpc
        with grpc.insecure_channel(self.fx.address) as channel:
            return admin_service_pb2_grpc.AdminServiceStub(channel).ListWorkers(
                admin_service_pb2.ListWorkersRequest(), timeout=10).workers

    def test_bad_options_are_refused_naming_the_argument(self):
        def ok(job):
            return b""
        cases = [
            (dict(server="", worker_id="w", types=["py"], handler=ok), "server"),
            (dict(server="a:1,,b:2", worker_id="w", types=["py"], handler=ok), "server"),
            (dict(server="a:1", worker_id="", types=["py"], handler=ok), "worker_id"),
            (dict(server="a:1", worker_id="w", types=[], handler=ok), "types"),
            (dict(server="a:1", worker_id="w", types="py", handler=ok), "types"),
            (dict(server="a:1", worker_id="w", types=["py"], handler=ok, slots=0), "slots"),
            (dict(server="a:1", worker_id="w", types=["py"], handler=ok, max_concurrent=-1),
             "max_concurrent"),
            (dict(server="a:1", worker_id="w", types=["py"], handler=None), "handler"),
            (dict(server="a:1", worker_id="w", types=["py"], handler=ok, reconnect_min=0),
             "reconnect_min"),
        ]
        for kwargs, field in cases:
            with self.subTest(field=field, kwargs=kwargs):
                server = kwargs.pop("server")
                with self.assertRaises(ValueError) as err:
                    dispatchd.Worker(server, **kwargs)
                self.assertTrue(str(err.exception).startswith(field), str(err.exception))

    def test_reference_worker_refuses_a_bad_command_line_by_name(self):
        for args, field in [(["--types", ""], "--types"),
                            (["--types", "py", "--simulate", "90%:1s"], "--simulate"),
                            (["--types", "py", "--labels", "novalue"], "--labels")]:
            with self.subTest(args=args):
                r = subprocess.run(_REFERENCE_WORKER + ["--server", self.fx.address] + args,
                                   capture_output=True, text=True, timeout=30)
                self.assertEqual(r.returncode, 2, r.stderr)
                self.assertIn(field, r.stderr)

    def test_reference_worker_exec_stops_a_cancelled_command_with_sigterm(self):
        # The worker blocks SIGTERM for its own signal thread; the command must not inherit that,
        # or a cancel would wait out the grace period and SIGKILL it without its trap running.
        mark = os.path.join(self.fx.dir, "got-sigterm")
        # (Not a shell trap: dash clears its signal mask itself. A program that does not is what
        # shows whether the worker passed its own mask on.)
        command = (f"exec {sys.executable} -c \"import signal, sys, time; "
                   f"signal.signal(signal.SIGTERM, lambda *_: (open('{mark}', 'w').close(), "
                   f"sys.exit(1))); open('{mark}.ready', 'w').close(); time.sleep(60)\"")
        with open(os.path.join(self.fx.dir, "exec-worker.log"), "w") as log:
            proc = subprocess.Popen(_REFERENCE_WORKER + ["--server", self.fx.address,
                                     "--id", "py-exec", "--types", "py", "--exec", command],
                                    stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        job_id = self.client.submit("py", b"until cancelled")
        self.assertTrue(_wait_for(lambda: os.path.exists(mark + ".ready"), 30),
                        "the command did not start")
        self.client.cancel(job_id)
        self.assertTrue(_wait_for(lambda: os.path.exists(mark), 10),
                        "the command never got SIGTERM")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0)

    def test_example_gpu_worker_loads_its_model_once_and_serves_every_job(self):
        example = os.path.join(_EXAMPLES, "gpu_worker.py")
        log_path = os.path.join(self.fx.dir, "gpu_worker.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, example, "--server", self.fx.address, "--id", "gpu-0",
                 "--type", "embed.text", "--model", "toy-embed", "--slots", "4",
                 "--gpu-memory-gb", "8", "--load-seconds", "0.5"],
                stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        ids = self.client.submit_batch([{"type": "embed.text", "payload": f"document {i}"}
                                        for i in range(20)])
        outputs = []
        for job_id in ids:
            self.assertTrue(_wait_for(lambda: dispatchd.state_name(
                self.client.status(job_id).state) in ("SUCCEEDED", "FAILED"), 60), job_id)
            job = self.client.status(job_id)
            self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED", job.error)
            self.assertEqual(job.worker_id, "gpu-0")
            outputs.append(json.loads(job.result))
        self.assertEqual({o["model"] for o in outputs}, {"toy-embed"})
        self.assertEqual(len({o["load_id"] for o in outputs}), 1, "the model was loaded again")
        self.assertTrue(all(len(o["embedding"]) == 16 for o in outputs))
        # The same text embeds the same way; different texts differently.
        again = json.loads(self.client.run("embed.text", "document 3", wait=60).result)
        self.assertEqual(again["embedding"], outputs[3]["embedding"])
        self.assertNotEqual(outputs[1]["embedding"], outputs[2]["embedding"])

        # The daemon sees the model resident on the worker, within its reported VRAM.
        gpu0 = [w for w in self._workers() if w.worker_id == "gpu-0"]
        self.assertEqual(len(gpu0), 1)
        self.assertIn("toy-embed", list(gpu0[0].models_resident))

        proc.send_signal(signal.SIGTERM)
        self.assertEqual(proc.wait(30), 0)
        with open(log_path) as f:
            log = f.read()
        self.assertEqual(log.count("loaded model=toy-embed"), 1, log)


if __name__ == "__main__":
    unittest.main()
