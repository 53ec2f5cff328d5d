"""The asyncio SDK, on grpc.aio: AsyncClient and AsyncWorker, whose handlers are coroutines.

    async def embed(job):                        # a task of its own in the worker's loop
        return await model.embed(job.payload)    # bytes (or str) is the job's output

    async def main():
        async with dispatchd.AsyncClient("127.0.0.1:7411") as client:
            job = await client.run("echo", b"hello", wait=30)
        worker = dispatchd.AsyncWorker("127.0.0.1:7411", worker_id="gpu-1",
                                       types=["llm.embed"], slots=8, handler=embed)
        async with worker:
            await worker.run()      # until shutdown(), or drain() and its jobs are done

They do what dispatchd.Client and dispatchd.Worker do, with the same arguments and errors; the
worker shares the threaded one's protocol code (WorkerBase, JobRunner, the session's outbox)
and differs only in what waits: the stream's reader, its writer and the session timer are tasks
of the loop run() is awaited in, and each accepted job runs its handler as a task of that loop.
Both must be created and used in the loop that runs them, as grpc.aio's channels are;
AsyncWorker's drain(), shutdown() and set_models_resident() may also be called from other
threads (a signal handler thread, for one).
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from typing import (Any, AsyncIterator, Awaitable, Callable, Dict, Iterable, List, Mapping,
                    Optional, Sequence, Set, Union)

import grpc

from dispatchd.client import DispatchError, job_spec
from dispatchd.job import Job, JobFailed
from dispatchd.memory import MemoryReport, fill_memory
from dispatchd.security import Security
from dispatchd.session import AsyncSession
from dispatchd.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc
from dispatchd.v1 import worker_service_pb2 as pb
from dispatchd.worker import DEFAULT_MAX_OUTPUT_BYTES, GpuSpec, Output, WorkerBase

_log = logging.getLogger("dispatchd.worker")


def _call_in_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[], Any]) -> None:
    """Runs `fn` in `loop`: now from the loop's own thread, soon from another."""
    try:
        if asyncio.get_running_loop() is loop:
            fn()
            return
    except RuntimeError:  # no loop runs in this thread
        pass
    try:
        loop.call_soon_threadsafe(fn)
    except RuntimeError:  # the loop is closed: nothing waits on it any more
        pass


# -- client -------------------------------------------------------------------------------------


class AsyncClient:
    """JobService of one daemon, or of any of several sharing a database, for asyncio: the
    methods of dispatchd.Client as coroutines, and watch() as an async iterator. Create it in
    the event loop that uses it; `await close()` (or `async with`) ends the channel.

    Every call has a deadline: `timeout` seconds (default 10), or `wait` for run and watch.
    Errors are DispatchError, as Client's."""

    def __init__(self, address: str = "127.0.0.1:7411", timeout: float = 10.0,
                 security: Optional[Security] = None) -> None:
        if not address:
            raise ValueError("address: required, host:port")
        self._timeout = timeout
        security = security or Security()
        self._metadata = security.metadata()
        self._channel = security.aio_channel(address, [
            ("grpc.max_receive_message_length", -1),
        ])
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> "AsyncClient":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _call(self, method: Any, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return await method(request, timeout=timeout or self._timeout,
                                metadata=self._metadata)
        except grpc.RpcError as e:
            raise DispatchError.from_rpc_error(e) from None

    async def submit(self, type: str, payload: Union[bytes, str] = b"", **spec: Any) -> str:
        """Queues a job; returns its id (an idempotency_key repeat returns the existing one's).
        Keyword arguments as dispatchd.client.job_spec()."""
        r = await self._call(self._jobs.Submit,
                             job_service_pb2.SubmitRequest(spec=job_spec(type, payload, **spec)))
        return r.job_id

    async def submit_batch(self, specs: Iterable[Union[job_pb2.JobSpec, Dict[str, Any]]]
                           ) -> List[str]:
        """Queues many jobs at once, all or none; returns the ids in order. As
        Client.submit_batch()."""
        messages = [s if isinstance(s, job_pb2.JobSpec) else job_spec(**s) for s in specs]
        r = await self._call(self._jobs.SubmitBatch,
                             job_service_pb2.SubmitBatchRequest(specs=messages))
        return [x.job_id for x in r.results]

    async def run(self, type: str, payload: Union[bytes, str] = b"", wait: float = 3600.0,
                  **spec: Any) -> job_pb2.Job:
        """Queues a job and waits up to `wait` seconds for it to end; returns the final Job,
        whatever its state. DispatchError DEADLINE_EXCEEDED if `wait` passes first."""
        r = await self._call(self._jobs.RunSync,
                             job_service_pb2.RunSyncRequest(spec=job_spec(type, payload, **spec)),
                             timeout=wait)
        return r.job

    async def status(self, job_id: str) -> job_pb2.Job:
        """The job as recorded now; DispatchError NOT_FOUND for an unknown id."""
        r = await self._call(self._jobs.Status, job_service_pb2.StatusRequest(job_id=job_id))
        return r.job

    async def cancel(self, job_id: str) -> job_pb2.Job:
        """Cancels a queued or running job; returns it. FAILED_PRECONDITION if it already ended."""
        r = await self._call(self._jobs.Cancel, job_service_pb2.CancelRequest(job_id=job_id))
        return r.job

    async def watch(self, job_id: str, wait: float = 86400.0) -> AsyncIterator[job_pb2.Job]:
        """Yields the job at each state change, first as it is when the watch begins, until it
        ends (the last one yielded is terminal) or `wait` seconds pass (DispatchError
        DEADLINE_EXCEEDED). Leaving the loop early ends the call."""
        call = self._jobs.Watch(job_service_pb2.WatchRequest(job_id=job_id), timeout=wait,
                                metadata=self._metadata)
        try:
            async for event in call:
                yield event.job
        except grpc.RpcError as e:
            raise DispatchError.from_rpc_error(e) from None
        finally:
            call.cancel()


# -- worker -------------------------------------------------------------------------------------


class AsyncJob(Job):
    """A Job whose cancellation an asyncio handler can await."""

    def __init__(self, assignment: pb.Assignment, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(assignment)
        self._loop = loop
        self._cancelled_event = asyncio.Event()

    async def wait_for_cancellation(  # type: ignore[override]
            self, timeout: Optional[float] = None) -> bool:
        """Waits until cancelled or `timeout` seconds pass (None: no limit); returns
        `cancelled`."""
        try:
            await asyncio.wait_for(self._cancelled_event.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        return self.cancelled

    def cancel(self, reason: str) -> None:
        """Cancels the job; idempotent (the first reason wins). Called by the SDK."""
        super().cancel(reason)
        _call_in_loop(self._loop, self._cancelled_event.set)


class _LoopCondition(threading.Condition):
    """The worker's lock, whose notify_all() also wakes the coroutines in wait_async(): state
    changes under it from the loop and from other threads alike."""

    def __init__(self) -> None:
        super().__init__()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._async_waiters: Set[asyncio.Event] = set()

    def notify(self, n: int = 1) -> None:
        super().notify(n)
        self._wake_async()

    def notify_all(self) -> None:
        super().notify_all()
        self._wake_async()

    def _wake_async(self) -> None:
        if self._loop is not None:
            for event in self._async_waiters:
                _call_in_loop(self._loop, event.set)

    async def wait_async(self, predicate: Callable[[], bool],
                         timeout: Optional[float] = None) -> bool:
        """Waits until `predicate()` (called under the lock) holds, or `timeout` seconds pass;
        returns its last value. The lock is not held while waiting."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        event = asyncio.Event()
        with self:
            self._loop = loop
            self._async_waiters.add(event)
        try:
            while True:
                with self:
                    event.clear()  # a notify from now on sets it again
                    if predicate():
                        return True
                remaining = None if deadline is None else deadline - loop.time()
                if remaining is not None and remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except asyncio.TimeoutError:
                    pass
        finally:
            with self:
                self._async_waiters.discard(event)


class _LocallyCancelled:
    """How a session's call ended when this worker cancelled it (as grpc's RpcError says it)."""

    @staticmethod
    def code() -> grpc.StatusCode:
        return grpc.StatusCode.CANCELLED

    @staticmethod
    def details() -> str:
        return "Locally cancelled by application!"


class AsyncWorker(WorkerBase):
    """Serves jobs to the daemon from an asyncio event loop: `await run()` connects, serves and
    reconnects as dispatchd.Worker's run() does, with the same protocol (Hello, Accept and
    Reject with max_concurrent backpressure, results kept until acknowledged, heartbeats,
    reconnect and re-adoption, Redirect, Draining). Each accepted job runs `await handler(job)`
    as a task of that loop; up to max_concurrent run at once.

    drain(), shutdown() and set_models_resident() are thread-safe; run() and close() belong to
    the loop."""

    def __init__(self, server: str, *, worker_id: str, types: Sequence[str],
                 handler: Callable[[AsyncJob], Awaitable[Output]], slots: int = 1,
                 max_concurrent: int = 0, labels: Optional[Mapping[str, str]] = None,
                 models_resident: Iterable[str] = (), gpus: Iterable[GpuSpec] = (),
                 memory_probe: Optional[Callable[[], MemoryReport]] = None, nvml: bool = True,
                 reconnect_min: float = 0.1, reconnect_max: float = 5.0,
                 welcome_timeout: float = 30.0, default_heartbeat_interval: float = 5.0,
                 drain_result_timeout: float = 30.0,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 security: Optional[Security] = None) -> None:
        """The arguments and their errors are dispatchd.Worker's; `handler` is an async def
        function called with an AsyncJob, which returns the output (bytes, str or None) or
        raises JobFailed. (A plain function that returns the output is called in the loop,
        which it blocks while it runs.) `memory_probe` and the NVML readings run on a thread of the
        loop's default executor."""
        super().__init__(server, worker_id=worker_id, types=types, handler=handler, slots=slots,
                         max_concurrent=max_concurrent, labels=labels,
                         models_resident=models_resident, gpus=gpus, memory_probe=memory_probe,
                         nvml=nvml, reconnect_min=reconnect_min, reconnect_max=reconnect_max,
                         welcome_timeout=welcome_timeout,
                         default_heartbeat_interval=default_heartbeat_interval,
                         drain_result_timeout=drain_result_timeout,
                         max_output_bytes=max_output_bytes, security=security)
        self._cv = _LoopCondition()
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._tasks: Set[asyncio.Task] = set()  # handler tasks, until they end
        self._closing = False

    # -- public -----------------------------------------------------------------------------

    async def run(self) -> None:
        """Connects, serves and reconnects until shutdown() or a completed drain. Raises Refused
        if the daemon refuses the worker's credentials. Cancelling it shuts the worker down."""
        self._starting()
        self._loop = asyncio.get_running_loop()
        try:
            while True:
                with self._cv:
                    if self._stop_locked():
                        break
                end, redirect_to = await self._run_session(self._target)
                delay = self._after_session(end, redirect_to)
                if delay is None:
                    continue
                with self._cv:
                    if self._stop_locked():
                        break
                    _log.info("reconnecting worker=%s in=%.3fs", self.worker_id, delay)
                await self._cv.wait_async(self._stop_locked, delay)
        except asyncio.CancelledError:
            self.shutdown()
            raise
        self._stopped()

    async def close(self) -> None:
        """shutdown(), then waits for every handler to return. Not from a handler: it would wait
        for itself."""
        self.shutdown()
        self._closing = True
        await self._cv.wait_async(lambda: not self._running)
        if self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def __aenter__(self) -> "AsyncWorker":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    # -- sessions ---------------------------------------------------------------------------

    async def _run_session(self, target: str):
        """One connection attempt, as Worker._run_session."""
        session = AsyncSession(target, self._security)
        if not self._open_session(session):
            await session.channel.close()
            return "failed", ""
        timer = self._loop.create_task(self._session_timer(session))

        welcomed = redirected = False
        redirect_to = ""
        error = None
        try:
            call = session.start()
            first = await self._read(session, call)
            welcomed, redirected, redirect_to = self._handle_first(session, target, first)
            while welcomed:
                message = await self._read(session, call)
                if message is None:
                    break
                self._handle_message(session, message)
        except grpc.RpcError as e:
            error = e
        except _StreamCancelled:
            error = _LocallyCancelled()
        finally:
            self._close_session(session)
            try:
                await timer
            except Exception:  # noqa: BLE001  (a timer bug must not keep the worker down)
                _log.exception("session timer failed worker=%s", self.worker_id)
            await session.stop()
        return self._session_end(session, target, welcomed, redirected, redirect_to, error)

    @staticmethod
    async def _read(session: AsyncSession, call: Any) -> Optional[pb.DaemonMessage]:
        """The next message of the call; None at its end. grpc.RpcError if it failed,
        _StreamCancelled if this worker cancelled it."""
        try:
            message = await call.read()
        except asyncio.CancelledError:
            # grpc.aio reads a call this worker cancelled as a CancelledError; the task that
            # awaits this one being cancelled is another matter.
            task = asyncio.current_task()
            being_cancelled = task is not None and getattr(task, "cancelling", lambda: 0)()
            if session.cancelled and not being_cancelled:
                raise _StreamCancelled() from None
            raise
        return None if message is grpc.aio.EOF else message

    async def _session_timer(self, session: AsyncSession) -> None:
        """Heartbeats, and the welcome and drain watchdogs, of one session."""
        await self._cv.wait_async(lambda: self._welcome_wait_over_locked(session),
                                  self._welcome_timeout)
        with self._cv:
            if not self._after_welcome_wait_locked(session):
                return
        while True:
            await self._cv.wait_async(lambda: self._tick_wait_over_locked(session),
                                      self._heartbeat_interval)
            with self._cv:
                action, heartbeat = self._tick_locked(session)
            if action == "stop":
                return
            if action == "frozen":
                self._log_frozen()
                session.cancel()
                return
            if action == "drained":
                self._close_drained(session)
                gone = await self._cv.wait_async(lambda: self._session is not session, 2.0)
                if not gone:
                    session.cancel()
                return
            heartbeat.gpus.extend(await asyncio.to_thread(self._gpu_source.gpus, pb))
            if self._memory_probe is None:
                fill_memory(heartbeat, None, self.worker_id)
            else:
                await asyncio.to_thread(fill_memory, heartbeat, self._memory_probe,
                                        self.worker_id)
            session.write(pb.WorkerMessage(heartbeat=heartbeat))

    # -- jobs (JobRunner's hooks) -----------------------------------------------------------

    def _new_job(self, assignment: pb.Assignment) -> AsyncJob:
        return AsyncJob(assignment, self._loop)

    def _start(self, running) -> bool:
        """Starts an accepted job's handler as a task; False once close() began."""
        if self._closing:
            self._not_started(running)
            return False
        task = self._loop.create_task(self._run_job_async(running),
                                      name=f"dispatchd-job-{running.key[0]}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    async def _run_job_async(self, running) -> None:
        start = time.monotonic()
        outcome = (None, JobFailed("handler was cancelled", retryable=True))
        try:
            outcome = await self._outcome_async(running.job)
        finally:
            # Whatever happened, the job no longer runs: its slot is free, a drain can end.
            self._complete(running, start, *outcome)

    async def _outcome_async(self, job: AsyncJob):
        """Runs the handler: (output bytes, None) or (None, JobFailed). A cancelled handler task
        raises CancelledError on."""
        try:
            value = self._handler(job)
            if inspect.isawaitable(value):
                value = await value
        except JobFailed as e:
            return None, e
        except asyncio.CancelledError:
            raise
        except Exception as e:  # noqa: BLE001  (a handler error fails the job, not the worker)
            return None, JobFailed(f"handler raised {type(e).__name__}: {e}")
        return self._output(value)


class _StreamCancelled(Exception):
    """The session's call was cancelled by this worker (shutdown, a watchdog)."""
