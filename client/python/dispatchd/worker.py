"""dispatchd.Worker: serves dispatchd jobs over one WorkerService.Connect stream.

    def embed(job):                       # runs on a thread of its own
        return model.embed(job.payload)   # bytes (or str) is the job's output

    worker = dispatchd.Worker("127.0.0.1:7411", worker_id="gpu-1", types=["llm.embed"],
                              slots=2, handler=embed)
    worker.run()   # until shutdown(), or drain() and its jobs are done

It behaves as the C++ SDK (client/cpp/worker.h) does:

- The worker is the authority on its own capacity: an assignment is accepted only while fewer
  than `max_concurrent` jobs execute, and refused RESOURCE_EXHAUSTED otherwise, whatever the
  daemon believes.
- Each handler runs on a pool thread while it runs. A handler ends its job by returning the
  output, or by raising JobFailed (with `retryable` if another attempt may succeed); any other
  exception fails the job, not retryable.
- Results are kept until the daemon acknowledges them and are sent again after every
  reconnect, for the attempts the daemon re-adopts. Jobs keep running while the stream is
  down; the worker reconnects with jittered exponential backoff, reports the jobs it holds in
  Hello, and cancels those the daemon does not re-adopt.
- Heartbeats carry the jobs held, resident models, RAM and GPU memory.
- A standby daemon's Redirect sends the worker to the leader; after a failed attempt it tries the
  next address of `server` (comma-separated).
- drain() (or the daemon's Drain) refuses new work, lets running jobs finish and their results be
  acknowledged, then run() returns; shutdown() cancels running jobs and returns at once.

Answers, results and acknowledgements that are ready together travel in one message (Batch,
ResultAcks) when the daemon supports it.

The pieces live beside this module: the stream of one connection in session.py, the handler
pool and the results kept until acknowledged in job_runner.py, Job and JobFailed in job.py, the
memory report in memory.py. Everything user code imports from here is still importable here.
WorkerBase holds what this worker and the asyncio one (dispatchd.aio.AsyncWorker) share: the
protocol's decisions; each of them brings the threads or tasks that wait.
"""

from __future__ import annotations

# collections, datetime, functools and pb_grpc are no longer used here; they stay imported
# because dispatchd.worker exposed them before its pieces moved out.
import collections  # noqa: F401
import concurrent.futures
import datetime  # noqa: F401
import functools  # noqa: F401
import logging
import random
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Tuple, Union

import grpc

# Job, JobFailed, Gpu and MemoryReport are public names of this module (see dispatchd/__init__).
from dispatchd.job import Job, JobFailed  # noqa: F401
from dispatchd.job_runner import JobRunner
from dispatchd.memory import Gpu, MemoryReport, fill_memory  # noqa: F401
from dispatchd.nvml import GpuSource
from dispatchd.security import Security
from dispatchd.session import Session
from dispatchd.v1 import worker_service_pb2 as pb
from dispatchd.v1 import worker_service_pb2_grpc as pb_grpc  # noqa: F401

_log = logging.getLogger("dispatchd.worker")

# Outputs larger than this fail the job instead (the daemon's gRPC message limit would refuse
# the Result, again after every reconnect).
DEFAULT_MAX_OUTPUT_BYTES = 4 * 1024 * 1024 - 64 * 1024


class Refused(Exception):
    """run() ends with this when the daemon refuses the worker's credentials (UNAUTHENTICATED)
    or its principal may not serve its types (PERMISSION_DENIED): trying again cannot help."""


Output = Union[bytes, bytearray, memoryview, str, None]
GpuSpec = Union[Gpu, Tuple[str, int]]


def _held(key):
    return pb.HeldJob(job_id=key[0], attempt=key[1])


class WorkerBase(JobRunner):
    """What Worker and dispatchd.aio.AsyncWorker share: their options, the job tables and the
    protocol's decisions (Hello, Welcome, answers, heartbeats, drain, reconnect targets), under
    one lock, `_cv`. Each subclass brings run(), the session's reader and timer, and where a
    handler runs. drain(), shutdown() and set_models_resident() are thread-safe."""

    def __init__(self, server: str, *, worker_id: str, types: Sequence[str],
                 handler: Callable[[Job], Any], slots: int = 1, max_concurrent: int = 0,
                 labels: Optional[Mapping[str, str]] = None,
                 models_resident: Iterable[str] = (), gpus: Iterable[GpuSpec] = (),
                 memory_probe: Optional[Callable[[], MemoryReport]] = None, nvml: bool = True,
                 reconnect_min: float = 0.1, reconnect_max: float = 5.0,
                 welcome_timeout: float = 30.0, default_heartbeat_interval: float = 5.0,
                 drain_result_timeout: float = 30.0,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 security: Optional[Security] = None) -> None:
        if not server:
            raise ValueError("server: empty")
        servers = [a.strip() for a in server.split(",")]
        if any(not a for a in servers):
            raise ValueError(f'server: empty address in "{server}"')
        if not worker_id:
            raise ValueError("worker_id: empty")
        if isinstance(types, str):
            raise ValueError("types: a list of type names, not a string")
        types = list(types)
        if not types:
            raise ValueError("types: at least one is required")
        if any(not t for t in types):
            raise ValueError("types: empty type name")
        if slots < 1:
            raise ValueError(f"slots: must be >= 1, got {slots}")
        if max_concurrent < 0:
            raise ValueError(f"max_concurrent: must be >= 0, got {max_concurrent}")
        if not callable(handler):
            raise ValueError("handler: not callable")
        if reconnect_min <= 0 or reconnect_max < reconnect_min:
            raise ValueError("reconnect_min/reconnect_max: need 0 < min <= max")
        if welcome_timeout <= 0 or default_heartbeat_interval <= 0:
            raise ValueError("welcome_timeout/default_heartbeat_interval: must be > 0")
        if drain_result_timeout < 0:
            raise ValueError(f"drain_result_timeout: must be >= 0, got {drain_result_timeout}")
        self._security = security or Security()
        self._security.metadata()  # reads the token file now, so that a bad one fails here
        self.worker_id = worker_id
        self._servers = servers
        self._server = server
        self._types = types
        self._type_set = frozenset(types)
        self._handler = handler
        self._slots = slots
        self._max_concurrent = max_concurrent or slots
        self._labels = dict(labels or {})
        self._gpus = [Gpu(*g) for g in gpus]
        self._memory_probe = memory_probe
        self._gpu_source = GpuSource(self._gpus, nvml, worker_id)
        self._reconnect_min = reconnect_min
        self._reconnect_max = reconnect_max
        self._welcome_timeout = welcome_timeout
        self._drain_result_timeout = drain_result_timeout
        self._max_output_bytes = max_output_bytes

        self._cv = threading.Condition()
        self._run_called = False
        self._shutdown = False
        self._draining = False
        self._jobs_done_at = None  # monotonic time the drain found no job running
        self._models_resident = list(models_resident)
        self._session = None
        self._welcomed = False
        self._heartbeat_interval = default_heartbeat_interval
        self._default_heartbeat_interval = default_heartbeat_interval
        self._running = {}  # (job id, attempt) -> RunningJob, until its handler returns
        self._unacked = {}  # (job id, attempt) -> WorkerMessage(result), until acknowledged
        # Where run() connects next, and how many attempts in a row failed.
        self._failures = 0
        self._next_server = 0
        self._target = servers[0]
        self._refusal = ""

    # -- public -----------------------------------------------------------------------------

    def drain(self) -> None:
        """Stops taking work: tells the daemon, refuses new assignments (REASON_DRAINING), lets
        running jobs finish and their results be acknowledged (up to drain_result_timeout), then
        run() returns. Idempotent."""
        with self._cv:
            if self._draining or self._shutdown:
                return
            self._draining = True
            if not self._running:
                self._jobs_done_at = time.monotonic()
            session = self._session if self._welcomed else None
            _log.info("draining worker=%s running=%d", self.worker_id, len(self._running))
            self._cv.notify_all()
        if session is not None:
            session.write(pb.WorkerMessage(draining=pb.Draining()))

    def shutdown(self) -> None:
        """Stops now: cancels running jobs, closes the stream, and run() returns. Idempotent."""
        with self._cv:
            if self._shutdown:
                return
            self._shutdown = True
            for key, running in list(self._running.items()):
                running.job.cancel("worker shutting down")
                if running.unstarted:
                    self._forget_locked(key)
            session = self._session
            self._cv.notify_all()
        _log.info("shutting down worker=%s", self.worker_id)
        if session is not None:
            session.cancel()

    def set_models_resident(self, models: Iterable[str]) -> None:
        """Replaces the models reported as resident in heartbeats (and the next Hello)."""
        with self._cv:
            self._models_resident = list(models)

    @property
    def running_jobs(self) -> int:
        """Jobs executing now (including any whose result will be dropped)."""
        with self._cv:
            return len(self._running)

    # -- run --------------------------------------------------------------------------------

    def _starting(self) -> None:
        with self._cv:
            if self._run_called:
                raise RuntimeError("run: already called")
            self._run_called = True
        _log.info("starting worker=%s server=%s types=%s slots=%d max_concurrent=%d",
                  self.worker_id, self._server, ",".join(self._types), self._slots,
                  self._max_concurrent)

    def _after_session(self, end: str, redirect_to: str) -> Optional[float]:
        """Where the next attempt goes (self._target) after one that ended `end`; returns the
        seconds to wait first (None: go at once). Raises Refused if retrying cannot help."""
        target = self._target
        if end == "refused":
            _log.error("refused worker=%s server=%s: %s", self.worker_id, target, self._refusal)
            raise Refused(self._refusal)
        if end == "redirected" and redirect_to and redirect_to != target:
            # A standby named the leader: go there at once (a failure starts the list again).
            _log.info("redirected worker=%s from=%s to leader=%s", self.worker_id, target,
                      redirect_to)
            self._target = redirect_to
            self._failures = 0
            return None
        if end != "welcomed":
            # The leader may have moved (a stopping one hands over to a standby): try the next
            # configured daemon.
            self._next_server = (self._next_server + 1) % len(self._servers)
            self._target = self._servers[self._next_server]
        failures = 0 if end in ("welcomed", "stopped") else min(self._failures + 1, 30)
        self._failures = failures
        delay = min(self._reconnect_min * 2 ** max(failures - 1, 0), self._reconnect_max)
        # Jitter: uniform in [delay/2, delay], never below reconnect_min.
        return max(self._reconnect_min, random.uniform(delay / 2, delay))

    def _stopped(self) -> None:
        with self._cv:
            reason = "shutdown" if self._shutdown else "drained"
            if self._unacked:
                _log.warning("stopped worker=%s reason=%s undelivered_results=%d",
                             self.worker_id, reason, len(self._unacked))
            else:
                _log.info("stopped worker=%s reason=%s", self.worker_id, reason)

    # -- sessions ---------------------------------------------------------------------------

    def _drain_done_locked(self):
        return (self._draining and not self._running and
                (not self._unacked or
                 time.monotonic() >= self._jobs_done_at + self._drain_result_timeout))

    def _stop_locked(self):
        return self._shutdown or self._drain_done_locked()

    def _open_session(self, session) -> bool:
        """Makes `session` the current one and writes its Hello; False after shutdown()."""
        hello = pb.Hello(worker_id=self.worker_id, types=self._types, slots=self._slots,
                         labels=self._labels, batching=True,
                         gpus=self._gpu_source.gpus(pb))
        with self._cv:
            if self._shutdown:
                return False
            self._session = session
            self._welcomed = False
            hello.models_resident.extend(self._models_resident)
            hello.running_jobs.extend(_held(k) for k, r in self._running.items()
                                      if not r.drop_result)
            # Finished jobs whose results were never acknowledged are still held: the daemon must
            # keep their attempts current until the results arrive, or it would run them again.
            hello.running_jobs.extend(_held(k) for k in self._unacked if k not in self._running)
        session.write(pb.WorkerMessage(hello=hello))
        return True

    def _handle_first(self, session, target, first) -> Tuple[bool, bool, str]:
        """The daemon's first message (None if the stream ended before one): returns
        (welcomed, redirected, the leader's address on a redirect)."""
        kind = first.WhichOneof("msg") if first is not None else None
        if kind == "welcome":
            self._handle_welcome(session, first.welcome)
            return True, False, ""
        if kind == "redirect":
            _log.info("standby answered worker=%s server=%s message=%s", self.worker_id,
                      target, first.redirect.message)
            return False, True, first.redirect.leader_address
        if kind is not None:
            _log.warning("protocol error worker=%s detail=first message is not Welcome (%s)",
                         self.worker_id, kind)
            session.cancel()
        return False, False, ""

    def _close_session(self, session) -> None:
        """The call is over: `session` is no longer current, and what it did not send never
        will be."""
        with self._cv:
            if self._session is session:
                self._session = None
            self._welcomed = False
            self._cv.notify_all()
        session.fail_unsent()

    def _session_end(self, session, target, welcomed, redirected, redirect_to,
                     error) -> Tuple[str, str]:
        """Logs how `session` ended (error: the grpc.RpcError that ended it, or None); returns
        ("welcomed" | "stopped" | "redirected" | "refused" | "failed", the leader's address on a
        redirect; "stopped": welcomed, and the daemon then said it was stopping)."""
        with self._cv:
            quiet = self._stop_locked()
        code = error.code().name if error is not None else "OK"
        detail = error.details() if error is not None else ""
        if quiet or redirected or session.daemon_stopping:
            _log.info("stream closed worker=%s", self.worker_id)
        elif welcomed:
            _log.warning("stream lost worker=%s code=%s message=%s", self.worker_id, code, detail)
        else:
            _log.warning("connect failed worker=%s server=%s code=%s message=%s", self.worker_id,
                         target, code, detail)
        if welcomed:
            return ("stopped" if session.daemon_stopping else "welcomed"), ""
        if not redirected and code in ("UNAUTHENTICATED", "PERMISSION_DENIED"):
            # The daemon does not know these credentials, or they may not serve these types:
            # trying again cannot help.
            self._refusal = f"{code}: {detail}"
            return "refused", ""
        return ("redirected" if redirected else "failed"), redirect_to

    def _handle_message(self, session, message):
        kind = message.WhichOneof("msg")
        if kind == "assign":
            self._handle_assign(session, message.assign)
        elif kind == "cancel":
            self._handle_cancel(message.cancel)
        elif kind in ("result_ack", "result_acks"):
            acks = [message.result_ack] if kind == "result_ack" else message.result_acks.acks
            with self._cv:
                for ack in acks:
                    self._unacked.pop((ack.job_id, ack.attempt), None)
                self._cv.notify_all()
        elif kind == "drain":
            _log.info("drain requested by daemon worker=%s", self.worker_id)
            self.drain()
        elif kind == "stopping":
            # Nothing new comes on this stream; running jobs finish and report here as usual.
            _log.info("daemon stopping worker=%s message=%s", self.worker_id,
                      message.stopping.message)
            session.daemon_stopping = True
        elif kind == "welcome":
            _log.warning("protocol error worker=%s detail=second Welcome ignored", self.worker_id)
        else:
            _log.warning("unknown daemon message worker=%s kind=%s", self.worker_id, kind)

    def _handle_welcome(self, session, welcome):
        interval = welcome.heartbeat_interval.ToTimedelta().total_seconds()
        if interval <= 0:
            interval = self._default_heartbeat_interval
        adopted = {(h.job_id, h.attempt) for h in welcome.adopted_jobs}
        session.batching = welcome.batching
        resend, dropped, start = [], [], []
        with self._cv:
            self._heartbeat_interval = interval
            for key, running in list(self._running.items()):
                if running.unstarted:
                    # Held since its Accept's fate was unknown: run it if the daemon holds it.
                    running.unstarted = False
                    if key in adopted:
                        start.append(running)
                    else:
                        self._forget_locked(key)
                        dropped.append(key)
                    continue
                if running.drop_result or key in adopted:
                    continue
                running.drop_result = True
                running.job.cancel("not re-adopted by the daemon after reconnect")
                dropped.append(key)
            if self._session is session:
                self._welcomed = True
            # A result the daemon did not adopt is for an attempt that is no longer current (or
            # one it already recorded): sending it again would only be discarded.
            for key in list(self._unacked):
                if key in adopted:
                    resend.append(self._unacked[key])
                else:
                    dropped.append(key)
                    del self._unacked[key]
            draining = self._draining
            self._cv.notify_all()
        _log.info("connected worker=%s session=%s heartbeat=%gs adopted=%d resending=%d",
                  self.worker_id, welcome.session_id, interval, len(adopted), len(resend))
        for job_id, attempt in dropped:
            _log.warning("cancelled job=%s attempt=%d reason=not re-adopted", job_id, attempt)
        for running in start:
            if self._start(running):
                _log.info("accepted job=%s attempt=%d type=%s (re-adopted before it started)",
                          running.key[0], running.key[1], running.job.type)
        for message in resend:
            session.write(message)
        if draining:
            session.write(pb.WorkerMessage(draining=pb.Draining()))

    def _frozen_locked(self, session):
        """True if this process was stopped (SIGSTOP, a paused VM) for longer than the heartbeat
        interval allows since the session timer last came round: the daemon may have declared
        this worker lost and given its new attempts to another, so the stream cannot be trusted
        to start anything. Whichever of the reader and the timer wakes first sees it."""
        if session.suspect:
            return True
        if session.last_tick is None:
            return False
        limit = max(2 * self._heartbeat_interval, 1.0)
        return time.monotonic() - session.last_tick > limit

    def _heartbeat_locked(self):
        hb = pb.Heartbeat()
        hb.running_jobs.extend(_held(k) for k, r in self._running.items() if not r.drop_result)
        # Finished jobs whose results are not acknowledged yet are still held (as in Hello): the
        # daemon counts a job its worker stops reporting as lost.
        hb.running_jobs.extend(_held(k) for k in self._unacked if k not in self._running)
        hb.models_resident.extend(self._models_resident)
        return hb

    def _welcome_wait_over_locked(self, session) -> bool:
        return self._welcomed or self._session is not session or self._shutdown

    def _after_welcome_wait_locked(self, session) -> bool:
        """After waiting welcome_timeout for the Welcome: True to go on with heartbeats; False
        (the session is cancelled where it must be) to end the timer."""
        if self._session is not session or self._shutdown:
            if self._shutdown:
                session.cancel()
            return False
        if not self._welcomed:
            _log.warning("no Welcome within %gs worker=%s", self._welcome_timeout, self.worker_id)
            session.cancel()
            return False
        session.last_tick = time.monotonic()
        return True

    def _tick_wait_over_locked(self, session) -> bool:
        return self._session is not session or self._shutdown or self._drain_done_locked()

    def _tick_locked(self, session) -> Tuple[str, Optional[pb.Heartbeat]]:
        """One turn of the session timer: ("stop", None) when the session is over, ("frozen",
        None) when this process was frozen too long, ("drained", None) when the drain is done,
        or ("heartbeat", the heartbeat to send once fill_memory() completes it)."""
        if self._session is not session or self._shutdown:
            return "stop", None
        if self._frozen_locked(session):
            session.suspect = True
        session.last_tick = time.monotonic()
        if session.suspect:
            return "frozen", None
        if self._drain_done_locked():
            return "drained", None
        return "heartbeat", self._heartbeat_locked()

    def _log_frozen(self) -> None:
        _log.warning("worker=%s was frozen for longer than its heartbeats allow: dropping the "
                     "stream, the next Hello reports what still runs", self.worker_id)

    def _close_drained(self, session) -> None:
        _log.info("drained worker=%s: closing the stream", self.worker_id)
        # drain() announces itself too, but may lose the race with the timer.
        session.write(pb.WorkerMessage(draining=pb.Draining()))
        session.close()


class Worker(WorkerBase):
    """Serves jobs to the daemon. run() blocks; drain(), shutdown() and set_models_resident()
    are thread-safe and may be called from any thread, a handler included.

    WorkerBase holds the protocol; this class adds the threads: the stream's reader in run(), a
    session timer thread (heartbeats, the welcome and drain watchdogs), and a pool of handler
    threads (the job side, JobRunner's, shares the lock)."""

    def __init__(self, server: str, *, worker_id: str, types: Sequence[str],
                 handler: Callable[[Job], Output], slots: int = 1, max_concurrent: int = 0,
                 labels: Optional[Mapping[str, str]] = None,
                 models_resident: Iterable[str] = (), gpus: Iterable[GpuSpec] = (),
                 memory_probe: Optional[Callable[[], MemoryReport]] = None, nvml: bool = True,
                 reconnect_min: float = 0.1, reconnect_max: float = 5.0,
                 welcome_timeout: float = 30.0, default_heartbeat_interval: float = 5.0,
                 drain_result_timeout: float = 30.0,
                 max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES,
                 security: Optional[Security] = None) -> None:
        """ValueError naming the argument for an empty server, worker_id or type list, slots < 1,
        max_concurrent < 0, a handler that is not callable, or non-positive timings.

        server: host:port, or several comma-separated for daemons sharing one database.
        handler: called with a Job; returns the output (bytes, str or None) or raises JobFailed.
        max_concurrent: jobs executing at once, more are refused; 0 means `slots`.
        gpus: Gpu(id, memory_total_bytes) each; the daemon places a model here only if the VRAM
            of its models fits in their total. None reported: no limit. Empty (the default):
            the GPUs NVML reads, if `nvml`.
        nvml: when `gpus` is empty, read the GPUs (those CUDA_VISIBLE_DEVICES leaves visible)
            and their memory from NVML (libnvidia-ml.so.1, or the library the environment's
            DISPATCHD_NVML_LIBRARY names, loaded at run time): Hello reports each GPU's name,
            UUID and memory, each heartbeat its memory in use and the part this process and its
            children hold. Without the library, a driver or a GPU: none, and one log line.
        memory_probe: returns a MemoryReport for each heartbeat (default: host RAM from
            /proc/meminfo, GPU use from NVML); its gpu_used_bytes replace NVML's, per GPU.
        security: a dispatchd.Security (TLS and the bearer token); default none. Its files are
            read here: ValueError naming the flag if one cannot be read.
        Timings are in seconds."""
        super().__init__(server, worker_id=worker_id, types=types, handler=handler, slots=slots,
                         max_concurrent=max_concurrent, labels=labels,
                         models_resident=models_resident, gpus=gpus, memory_probe=memory_probe,
                         nvml=nvml, reconnect_min=reconnect_min, reconnect_max=reconnect_max,
                         welcome_timeout=welcome_timeout,
                         default_heartbeat_interval=default_heartbeat_interval,
                         drain_result_timeout=drain_result_timeout,
                         max_output_bytes=max_output_bytes, security=security)
        # Handler threads, started as jobs need them and kept for the next jobs.
        self._pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._max_concurrent, thread_name_prefix="dispatchd-job")

    def run(self) -> None:
        """Connects, serves and reconnects until shutdown() or a completed drain. Raises Refused
        if the daemon refuses the worker's credentials."""
        self._starting()
        while True:
            with self._cv:
                if self._stop_locked():
                    break
            end, redirect_to = self._run_session(self._target)
            delay = self._after_session(end, redirect_to)
            if delay is None:
                continue
            with self._cv:
                if self._stop_locked():
                    break
                _log.info("reconnecting worker=%s in=%.3fs", self.worker_id, delay)
                self._cv.wait_for(self._stop_locked, delay)
        self._stopped()

    def close(self) -> None:
        """shutdown(), then waits for every handler to return. Not from a handler: it would wait
        for itself."""
        self.shutdown()
        with self._cv:
            self._cv.wait_for(lambda: not self._running)
        self._pool.shutdown(wait=True)

    def __enter__(self) -> "Worker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _run_session(self, target):
        """One connection attempt: Hello, Welcome, then messages until the stream ends. Returns
        what _session_end returns."""
        session = Session(target, self._security)
        if not self._open_session(session):
            session.channel.close()
            return "failed", ""
        timer = threading.Thread(target=self._session_timer, args=(session,),
                                 name="dispatchd-session", daemon=True)
        timer.start()

        welcomed = redirected = False
        redirect_to = ""
        error = None
        try:
            call = session.start()
            responses = iter(call)
            welcomed, redirected, redirect_to = self._handle_first(
                session, target, next(responses, None))
            if welcomed:
                for message in responses:
                    self._handle_message(session, message)
        except grpc.RpcError as e:
            error = e
        finally:
            self._close_session(session)
            timer.join()
            session.cancel()
            session.channel.close()
        return self._session_end(session, target, welcomed, redirected, redirect_to, error)

    def _session_timer(self, session):
        """Heartbeats, and the welcome and drain watchdogs, of one session."""
        with self._cv:
            self._cv.wait_for(lambda: self._welcome_wait_over_locked(session),
                              self._welcome_timeout)
            if not self._after_welcome_wait_locked(session):
                return
        while True:
            with self._cv:
                self._cv.wait_for(lambda: self._tick_wait_over_locked(session),
                                  self._heartbeat_interval)
                action, heartbeat = self._tick_locked(session)
            if action == "stop":
                return
            if action == "frozen":
                self._log_frozen()
                session.cancel()
                return
            if action == "drained":
                self._close_drained(session)
                with self._cv:
                    gone = self._cv.wait_for(lambda: self._session is not session, 2.0)
                if not gone:
                    session.cancel()
                return
            heartbeat.gpus.extend(self._gpu_source.gpus(pb))
            fill_memory(heartbeat, self._memory_probe, self.worker_id)
            session.write(pb.WorkerMessage(heartbeat=heartbeat))
