"""dispatchd.AsyncClient and dispatchd.AsyncWorker (asyncio, grpc.aio) against a real daemon on
127.0.0.1: the client's calls and errors, and the worker's protocol as its handlers and the
daemon see it (outcomes, backpressure, handlers running at once in one loop, cancellation,
heartbeats, drain, re-adoption after a daemon restart). Run by ctest (tests `python_client` and
`python_wheel`); see test_client.py for the environment it provides.
"""

import asyncio
import datetime
import os
import signal
import subprocess
import sys
import unittest
import uuid

import grpc

import dispatchd
from daemon_fixture import DaemonFixture

_TYPES = ("  - name: py\n    max_attempts: 2\n    retry_backoff: 0s\n"
          "  - name: llm.generate\n")
_EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")


async def _wait_for(predicate, timeout=30.0):
    """Awaits `predicate()` (a coroutine function) until it is true; False after `timeout`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await predicate():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _in(seconds):
    return datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(seconds=seconds)


class AsyncClientTest(unittest.IsolatedAsyncioTestCase):
    """AsyncClient against a daemon whose `echo` jobs dispatch-worker serves."""

    @classmethod
    def setUpClass(cls):
        cls.fx = DaemonFixture()

    @classmethod
    def tearDownClass(cls):
        cls.fx.close()

    async def asyncSetUp(self):
        self.client = dispatchd.AsyncClient(self.fx.address)
        self.addAsyncCleanup(self.client.close)

    async def test_run_returns_the_workers_result(self):
        job = await self.client.run("echo", b"hello from asyncio", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED")
        self.assertEqual(job.result, b"hello from asyncio")
        self.assertEqual(job.worker_id, "py-w")

    async def test_submit_then_watch_to_the_end(self):
        job_id = await self.client.submit("echo", "a str payload", fairness_key="alice")
        states = [dispatchd.state_name(j.state)
                  async for j in self.client.watch(job_id, wait=60)]
        self.assertEqual(states[-1], "SUCCEEDED")
        job = await self.client.status(job_id)
        self.assertEqual(job.result, b"a str payload")
        self.assertEqual(job.fairness_key, "alice")

    async def test_many_calls_at_once_on_one_channel(self):
        jobs = await asyncio.gather(*(self.client.run("echo", f"job {i}", wait=60)
                                      for i in range(20)))
        self.assertEqual([j.result for j in jobs], [f"job {i}".encode() for i in range(20)])

    async def test_submit_batch_is_all_or_none_and_names_the_bad_spec(self):
        ids = await self.client.submit_batch([{"type": "echo", "payload": b"1"},
                                              dispatchd.job_spec("echo", b"2")])
        self.assertEqual(len(ids), 2)
        with self.assertRaises(dispatchd.DispatchError) as err:
            await self.client.submit_batch([{"type": "echo", "payload": b"ok"},
                                            {"type": "nope", "payload": b"x"}])
        self.assertEqual(err.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("specs[1].type", err.exception.message)

    async def test_errors_carry_the_code_and_name_the_field(self):
        with self.assertRaises(dispatchd.DispatchError) as err:
            await self.client.submit("no.such.type", b"x")
        self.assertEqual(err.exception.code, grpc.StatusCode.INVALID_ARGUMENT)
        self.assertIn("spec.type", err.exception.message)
        with self.assertRaises(dispatchd.DispatchError) as err:
            await self.client.status("0" * 32)
        self.assertEqual(err.exception.code, grpc.StatusCode.NOT_FOUND)
        with self.assertRaises(dispatchd.DispatchError) as err:
            async for _ in self.client.watch("0" * 32, wait=10):
                pass
        self.assertEqual(err.exception.code, grpc.StatusCode.NOT_FOUND)

    async def test_cancel_a_job_that_waits_and_a_watch_sees_it(self):
        job_id = await self.client.submit("echo", b"later", not_before=_in(3600),
                                          idempotency_key=uuid.uuid4().hex)
        watch = self.client.watch(job_id, wait=60)
        first = await watch.__anext__()
        self.assertEqual(dispatchd.state_name(first.state), "QUEUED")
        job = await self.client.cancel(job_id)
        self.assertEqual(dispatchd.state_name(job.state), "CANCELLED")
        rest = [dispatchd.state_name(j.state) async for j in watch]
        self.assertEqual(rest[-1], "CANCELLED")
        with self.assertRaises(dispatchd.DispatchError) as err:
            await self.client.cancel(job_id)
        self.assertEqual(err.exception.code, grpc.StatusCode.FAILED_PRECONDITION)

    async def test_run_past_its_wait_is_deadline_exceeded(self):
        with self.assertRaises(dispatchd.DispatchError) as err:
            await self.client.run("echo", b"x", wait=0.5, not_before=_in(3600))
        self.assertEqual(err.exception.code, grpc.StatusCode.DEADLINE_EXCEEDED)

    async def test_unreachable_daemon_is_unavailable(self):
        async with dispatchd.AsyncClient("127.0.0.1:1", timeout=2) as c:
            with self.assertRaises(dispatchd.DispatchError) as err:
                await c.status("x")
        self.assertIn(err.exception.code,
                      (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED))


class AsyncWorkerTest(unittest.IsolatedAsyncioTestCase):
    """AsyncWorker serving `py` jobs, each test in an event loop of its own."""

    @classmethod
    def setUpClass(cls):
        cls.fx = DaemonFixture(types=_TYPES, worker=False)

    @classmethod
    def tearDownClass(cls):
        cls.fx.close()

    async def asyncSetUp(self):
        self.client = dispatchd.AsyncClient(self.fx.address)
        self.addAsyncCleanup(self.client.close)

    def serve(self, handler, **options):
        """Runs an AsyncWorker for `py` jobs as a task until the test ends; returns it and the
        task of its run()."""
        options.setdefault("worker_id", f"aio-{self.id().rsplit('.', 1)[-1]}")
        worker = dispatchd.AsyncWorker(self.fx.address, types=["py"], handler=handler,
                                       **options)
        task = asyncio.create_task(worker.run())

        async def stop():
            await worker.close()
            await asyncio.wait_for(task, 30)
        self.addAsyncCleanup(stop)
        return worker, task

    async def state(self, job_id):
        return dispatchd.state_name((await self.client.status(job_id)).state)

    async def workers(self, worker_id):
        from dispatchd.v1 import admin_service_pb2, admin_service_pb2_grpc
        async with grpc.aio.insecure_channel(self.fx.address) as channel:
            r = await admin_service_pb2_grpc.AdminServiceStub(channel).ListWorkers(
                admin_service_pb2.ListWorkersRequest(), timeout=10)
        return [w for w in r.workers if w.worker_id == worker_id]

    async def test_handler_outcomes_become_the_jobs_outcomes(self):
        async def handler(job):
            await asyncio.sleep(0)
            kind, _, rest = job.payload.decode().partition(":")
            if kind == "ok":
                return rest.upper()
            if kind == "bytes":
                return bytes([0, 255]) + rest.encode()
            if kind == "none":
                return None
            if kind == "fail":
                raise dispatchd.JobFailed("bad input: " + rest)
            if kind == "retry":
                raise dispatchd.JobFailed("gpu busy", retryable=True)
            if kind == "int":
                return 42
            raise ValueError("no such kind " + kind)
        self.serve(handler, slots=4)

        job = await self.client.run("py", b"ok:hello", wait=60)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED")
        self.assertEqual(job.result, b"HELLO")
        self.assertEqual(job.worker_id, "aio-test_handler_outcomes_become_the_jobs_outcomes")
        self.assertEqual((await self.client.run("py", b"bytes:x", wait=60)).result, b"\x00\xffx")
        job = await self.client.run("py", b"none:", wait=60)
        self.assertEqual((dispatchd.state_name(job.state), job.result), ("SUCCEEDED", b""))

        job = await self.client.run("py", b"fail:empty", wait=60)
        self.assertEqual((dispatchd.state_name(job.state), job.attempt), ("FAILED", 1))
        self.assertIn("bad input: empty", job.error)

        job = await self.client.run("py", b"retry:", wait=60)
        self.assertEqual((dispatchd.state_name(job.state), job.attempt), ("FAILED", 2))
        self.assertIn("gpu busy", job.error)

        job = await self.client.run("py", b"int:", wait=60)
        self.assertEqual((dispatchd.state_name(job.state), job.attempt), ("FAILED", 1))
        self.assertIn("handler returned int, not bytes or str", job.error)

        job = await self.client.run("py", b"what:", wait=60)
        self.assertEqual((dispatchd.state_name(job.state), job.attempt), ("FAILED", 1))
        self.assertIn("handler raised ValueError: no such kind what", job.error)

    async def test_handlers_run_at_once_in_one_loop(self):
        # Each handler waits for the others: the jobs end only if all four run together.
        running = []
        all_in = asyncio.Event()

        async def handler(job):
            running.append(job.job_id)
            if len(running) == 4:
                all_in.set()
            await asyncio.wait_for(all_in.wait(), 30)
            return b"together"
        self.serve(handler, slots=4)
        ids = await self.client.submit_batch([{"type": "py", "payload": str(i)}
                                              for i in range(4)])
        for job_id in ids:
            self.assertTrue(await _wait_for(
                lambda: self._ended(job_id), 60), job_id)
            job = await self.client.status(job_id)
            self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED", job.error)
        self.assertEqual(sorted(running), sorted(ids))

    async def _ended(self, job_id):
        return (await self.client.status(job_id)).state in dispatchd.TERMINAL_STATES

    async def test_worker_refuses_beyond_max_concurrent_and_every_job_runs_once(self):
        now = most = 0
        seen = []

        async def handler(job):
            nonlocal now, most
            now += 1
            most = max(most, now)
            seen.append(job.job_id)
            await asyncio.sleep(0.2)
            now -= 1
            return b"done"
        # Four slots advertised, one job at a time in fact: the daemon offers more, the worker
        # refuses them RESOURCE_EXHAUSTED, and they run later.
        with self.assertLogs("dispatchd.worker", "INFO") as logs:
            self.serve(handler, slots=4, max_concurrent=1)
            ids = await self.client.submit_batch([{"type": "py", "payload": str(i)}
                                                  for i in range(6)])
            for job_id in ids:
                self.assertTrue(await _wait_for(
                    lambda: self._succeeded(job_id), 60), job_id)
        self.assertEqual(most, 1)
        self.assertEqual(sorted(seen), sorted(ids))  # each once
        for job_id in ids:
            self.assertEqual((await self.client.status(job_id)).attempt, 1)  # refusals use none
        refusals = [line for line in logs.output
                    if "rejected" in line and "reason=resource_exhausted" in line]
        self.assertTrue(refusals, "the worker never refused a job: " + "\n".join(logs.output))

    async def _succeeded(self, job_id):
        return await self.state(job_id) == "SUCCEEDED"

    async def test_cancel_reaches_the_handler(self):
        started = asyncio.Event()
        reasons = []

        async def handler(job):
            started.set()
            if await job.wait_for_cancellation(60):
                reasons.append(job.cancel_reason)
                raise dispatchd.JobFailed("stopped: " + job.cancel_reason)
            return b"not cancelled"
        worker, _ = self.serve(handler)
        job_id = await self.client.submit("py", b"long")
        await asyncio.wait_for(started.wait(), 30)
        self.assertEqual(worker.running_jobs, 1)
        await self.client.cancel(job_id)
        self.assertTrue(await _wait_for(lambda: _true_if(reasons), 30),
                        "the handler never saw the cancel")
        self.assertEqual(await self.state(job_id), "CANCELLED")
        self.assertTrue(await _wait_for(lambda: _true_if(worker.running_jobs == 0), 30))

    async def test_hello_and_heartbeats_report_models_and_gpus(self):
        async def handler(job):
            return b""
        async def shows(model):
            found = await self.workers("aio-models")
            return bool(found) and model in found[0].models_resident
        with self.assertLogs("dispatchd.worker", "INFO") as logs:
            worker, _ = self.serve(handler, worker_id="aio-models", models_resident=["m1"],
                                   gpus=[dispatchd.Gpu("0", 16 * 10**9)])
            self.assertTrue(await _wait_for(lambda: shows("m1"), 30), "Hello's models not seen")
            # A heartbeat (every 5s by default) carries the new list.
            worker.set_models_resident(["m2"])
            self.assertTrue(await _wait_for(lambda: shows("m2"), 30), "no heartbeat carried m2")
        self.assertNotIn("m1", (await self.workers("aio-models"))[0].models_resident)
        # On the first stream: a worker whose heartbeats stopped would be dropped by the daemon,
        # and its next Hello would carry m2 instead.
        connects = [line for line in logs.output if "connected worker=aio-models" in line]
        self.assertEqual(len(connects), 1, "\n".join(logs.output))

    async def test_drain_finishes_running_jobs_then_run_returns(self):
        started = asyncio.Event()
        release = asyncio.Event()

        async def handler(job):
            started.set()
            await asyncio.wait_for(release.wait(), 30)
            return b"finished while draining"
        # Two slots, one busy: only the drain keeps a second job away.
        worker, task = self.serve(handler, worker_id="aio-drain", slots=2)
        first = await self.client.submit("py", b"first")
        await asyncio.wait_for(started.wait(), 30)
        worker.drain()

        async def draining():
            return any(w.draining for w in await self.workers("aio-drain"))
        self.assertTrue(await _wait_for(draining, 30), "the daemon never saw the drain")
        second = await self.client.submit("py", b"second")

        async def busy():
            return (await self.client.status(second)).wait_reason == "workers_busy"
        self.assertTrue(await _wait_for(busy, 30), await self.client.status(second))
        release.set()
        await asyncio.wait_for(task, 30)  # run() returns once the drain is done
        job = await self.client.status(first)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED")
        self.assertEqual(job.result, b"finished while draining")
        self.assertEqual(await self.state(second), "QUEUED")
        await self.client.cancel(second)

    async def test_close_cancels_running_handlers_and_waits_for_them(self):
        started = asyncio.Event()
        seen = []

        async def handler(job):
            started.set()
            await job.wait_for_cancellation(60)
            seen.append(job.cancel_reason)
            return b"stopped"
        worker = dispatchd.AsyncWorker(self.fx.address, worker_id="aio-close", types=["py"],
                                       handler=handler)
        task = asyncio.create_task(worker.run())
        job_id = await self.client.submit("py", b"x")
        await asyncio.wait_for(started.wait(), 30)
        await asyncio.wait_for(worker.close(), 30)
        self.assertEqual(seen, ["worker shutting down"])
        await asyncio.wait_for(task, 30)
        await self.cancel_if_not_ended(job_id)  # not left for the next test's worker

    async def cancel_if_not_ended(self, job_id):
        try:
            await self.client.cancel(job_id)
        except dispatchd.DispatchError as e:
            self.assertEqual(e.code, grpc.StatusCode.FAILED_PRECONDITION)

    async def test_example_async_worker_serves_every_job_and_drains_on_sigterm(self):
        log_path = os.path.join(self.fx.dir, "async_worker.log")
        with open(log_path, "w") as log:
            proc = subprocess.Popen(
                [sys.executable, os.path.join(_EXAMPLES, "async_worker.py"), "--server",
                 self.fx.address, "--id", "aio-example", "--type", "llm.generate", "--slots",
                 "8", "--step-seconds", "0.02"], stdout=log, stderr=subprocess.STDOUT)
        self.addCleanup(lambda: proc.poll() is None and proc.kill())
        prompts = [f"prompt number {i}" for i in range(16)]
        ids = await self.client.submit_batch([{"type": "llm.generate", "payload": p}
                                              for p in prompts])
        for job_id, prompt in zip(ids, prompts):
            self.assertTrue(await _wait_for(lambda: self._ended(job_id), 60), job_id)
            job = await self.client.status(job_id)
            self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED", job.error)
            self.assertEqual(job.result.decode(), prompt[::-1])
            self.assertEqual(job.worker_id, "aio-example")
        proc.send_signal(signal.SIGTERM)
        self.assertEqual(await asyncio.to_thread(proc.wait, 30), 0)
        with open(log_path) as f:
            log = f.read()
        self.assertIn("draining", log)
        self.assertIn("stopped worker=aio-example reason=drained", log)

    def test_bad_options_are_refused_naming_the_argument(self):
        async def ok(job):
            return b""
        for kwargs, field in [
                (dict(server="", worker_id="w", types=["py"], handler=ok), "server"),
                (dict(server="a:1", worker_id="", types=["py"], handler=ok), "worker_id"),
                (dict(server="a:1", worker_id="w", types="py", handler=ok), "types"),
                (dict(server="a:1", worker_id="w", types=["py"], handler=ok, slots=0), "slots"),
                (dict(server="a:1", worker_id="w", types=["py"], handler=None), "handler")]:
            with self.subTest(field=field):
                server = kwargs.pop("server")
                with self.assertRaises(ValueError) as err:
                    dispatchd.AsyncWorker(server, **kwargs)
                self.assertTrue(str(err.exception).startswith(field), str(err.exception))


class AsyncWorkerRestartTest(unittest.IsolatedAsyncioTestCase):
    """AsyncWorker across a restart of its daemon (a daemon of its own, killed with SIGKILL)."""

    @classmethod
    def setUpClass(cls):
        cls.fx = DaemonFixture(types=_TYPES, worker=False)

    @classmethod
    def tearDownClass(cls):
        cls.fx.close()

    async def test_a_running_job_is_re_adopted_after_a_restart_and_its_result_recorded(self):
        started = asyncio.Event()
        release = asyncio.Event()
        runs = []

        async def handler(job):
            runs.append((job.job_id, job.attempt))
            started.set()
            await asyncio.wait_for(release.wait(), 60)
            return b"finished after the restart"

        def connects():
            return [line for line in logs.output if "connected worker=aio-restart" in line]
        with self.assertLogs("dispatchd.worker", "INFO") as logs:
            worker = dispatchd.AsyncWorker(self.fx.address, worker_id="aio-restart",
                                           types=["py"], handler=handler, reconnect_max=0.5)
            task = asyncio.create_task(worker.run())

            async def stop():
                await worker.close()
                await asyncio.wait_for(task, 30)
            self.addAsyncCleanup(stop)
            async with dispatchd.AsyncClient(self.fx.address) as client:
                job_id = await client.submit("py", b"x")
                await asyncio.wait_for(started.wait(), 30)
            await asyncio.to_thread(self.fx.restart)
            # The worker reconnects by itself, holds the job in its Hello, and the new daemon
            # adopts it; only then may it finish.
            self.assertTrue(await _wait_for(lambda: _true_if(len(connects()) == 2), 30),
                            "\n".join(logs.output))
            self.assertIn("adopted=1", connects()[1])
            release.set()
            async with dispatchd.AsyncClient(self.fx.address) as client:
                async def ended():
                    return (await client.status(job_id)).state in dispatchd.TERMINAL_STATES
                self.assertTrue(await _wait_for(ended, 30))
                job = await client.status(job_id)
        self.assertEqual(dispatchd.state_name(job.state), "SUCCEEDED", job.error)
        self.assertEqual((job.attempt, job.result), (1, b"finished after the restart"))
        self.assertEqual(runs, [(job_id, 1)])  # the handler ran once, on the first stream


async def _true_if(value):
    return bool(value)


if __name__ == "__main__":
    unittest.main()
