"""The jobs half of dispatchd.Worker (JobRunner): answers the daemon's assignments, runs each
accepted job's handler on a pool thread, and keeps its result until the daemon acknowledges it.

Internal to dispatchd.worker. JobRunner is a mixin, not an object of its own: the session side
of Worker and this side share one lock and the job tables it guards, and splitting that state
would change when a drain can end or what a heartbeat reports.
"""

import datetime
import functools
import logging
import time

from dispatchd.job import Job, JobFailed
from dispatchd.v1 import worker_service_pb2 as pb

# The worker's logger: these lines belong to the worker's log, whichever module writes them.
_log = logging.getLogger("dispatchd.worker")


class RunningJob:
    """One accepted attempt, from its Accept until its handler returns."""

    __slots__ = ("key", "job", "drop_result", "unstarted")

    def __init__(self, key, job):
        self.key = key
        self.job = job
        # Not re-adopted after a reconnect: cancelled, and its outcome is not reported.
        self.drop_result = False
        # Its Accept was being sent when the stream ended: the daemon may hold it as running or
        # not. Held (and reported in Hello) without running until the next Welcome says.
        self.unstarted = False


class JobRunner:
    """Worker's job side; WorkerBase sets every attribute used here. Under its `_cv`: the
    tables `_running` ((job id, attempt) -> RunningJob, until its handler returns) and
    `_unacked` ((job id, attempt) -> WorkerMessage(result), until acknowledged), and the flags
    `_shutdown`, `_draining`, `_jobs_done_at`, `_session` and `_welcomed`. Also read: `_pool`
    (in _start, which the asyncio worker replaces with a task per job), `_handler`,
        `_type_set`, `_max_concurrent`, `_max_output_bytes`, `worker_id`, and `_frozen_locked()`.
    Thread-safe as Worker is: each method takes `_cv` where it needs it."""

    def _handle_assign(self, session, assign):
        answers = []  # (assignment, message, new RunningJob or None, result to resend or None)
        with self._cv:
            if self._frozen_locked(session):
                session.suspect = True
                _log.warning("worker=%s was frozen: not starting %d assigned job(s) from before",
                             self.worker_id, len(assign.assignments))
                frozen = True
            else:
                frozen = False
        if frozen:
            # The daemon offers them again (to this worker after it reconnects, or another).
            session.cancel()
            return
        with self._cv:
            for a in assign.assignments:
                key = (a.job_id, a.attempt)
                running = len(self._running)
                reason = detail = None
                if key in self._running or key in self._unacked:
                    answers.append((a, pb.WorkerMessage(
                        accept=pb.Accept(job_id=a.job_id, attempt=a.attempt)), None,
                        self._unacked.get(key)))
                    continue
                if self._shutdown or self._draining:
                    reason, detail = pb.Reject.REASON_DRAINING, "worker is draining"
                elif a.type not in self._type_set:
                    reason = pb.Reject.REASON_UNSUPPORTED
                    detail = f'worker does not serve type "{a.type}"'
                elif running >= self._max_concurrent:
                    reason = pb.Reject.REASON_RESOURCE_EXHAUSTED
                    detail = f"{running} of {self._max_concurrent} jobs running"
                if reason is not None:
                    answers.append((a, pb.WorkerMessage(reject=pb.Reject(
                        job_id=a.job_id, attempt=a.attempt, reason=reason, message=detail)),
                        None, None))
                    continue
                job = RunningJob(key, self._new_job(a))
                self._running[key] = job
                answers.append((a, pb.WorkerMessage(
                    accept=pb.Accept(job_id=a.job_id, attempt=a.attempt)), job, None))

        # A job starts only once its Accept has been sent: the daemon may otherwise have given
        # the attempt to another worker after this stream died (a frozen worker waking up).
        for a, message, job, resend in answers:
            if job is not None:
                if not session.write(message, functools.partial(self._accept_sent, job)):
                    self._accept_sent(job, False)
                continue
            written = session.write(message)
            if message.HasField("reject"):
                _log.info("rejected job=%s attempt=%d reason=%s detail=%s", a.job_id, a.attempt,
                          pb.Reject.Reason.Name(message.reject.reason).removeprefix("REASON_")
                          .lower(), message.reject.message)
            else:
                _log.info("accepted again job=%s attempt=%d (already held)", a.job_id, a.attempt)
                if resend is not None and written:
                    session.write(resend)

    def _new_job(self, assignment):
        return Job(assignment)

    def _accept_sent(self, running, sent):
        """Starts an accepted job once its Accept is sent (sent=True); forgets it if it never was
        (False); holds it unstarted for the next Welcome to decide if that is unknown (None)."""
        job_id, attempt = running.key
        if sent is None:
            with self._cv:
                if self._shutdown:  # no Welcome will come to decide: it never ran, forget it
                    self._forget_locked(running.key)
                    return
                running.unstarted = True
                self._cv.notify_all()
            _log.warning("accept may not have reached the daemon job=%s attempt=%d: held until "
                         "the next Welcome", job_id, attempt)
            return
        if not sent:
            # The daemon never saw the Accept: it will offer the job again.
            with self._cv:
                self._forget_locked(running.key)
            _log.warning("accept not delivered job=%s attempt=%d", job_id, attempt)
            return
        if self._start(running):
            _log.info("accepted job=%s attempt=%d type=%s", job_id, attempt, running.job.type)

    def _start(self, running):
        """Hands an accepted job to a handler thread; False if the pool is closed."""
        try:
            self._pool.submit(self._run_job, running)
            return True
        except RuntimeError:  # the pool is shut down: close() raced this job
            self._not_started(running)
            return False

    def _not_started(self, running):
        """An accepted job that cannot start (the worker is closing): its result, a retryable
        failure, is kept for the daemon."""
        with self._cv:
            self._forget_locked(running.key)
            self._unacked[running.key] = self._result_message(
                running.key, None, JobFailed("worker is closing", retryable=True), 0.0)

    def _forget_locked(self, key):
        self._running.pop(key, None)
        if self._draining and not self._running:
            self._jobs_done_at = time.monotonic()
        self._cv.notify_all()

    def _handle_cancel(self, cancel):
        reason = cancel.reason or "cancelled by the daemon"
        with self._cv:
            hit = [k for k in self._running
                   if k[0] == cancel.job_id and (cancel.attempt == 0 or k[1] == cancel.attempt)]
            for key in hit:
                self._running[key].job.cancel(reason)
        if not hit:
            _log.info("cancel for unknown job=%s attempt=%d (already finished?)", cancel.job_id,
                      cancel.attempt)
        for job_id, attempt in hit:
            _log.info("cancelled job=%s attempt=%d reason=%s", job_id, attempt, cancel.reason)


    def _result_message(self, key, output, failure, run_time):
        result = pb.Result(job_id=key[0], attempt=key[1])
        if failure is None:
            result.output = output
        else:
            # Text as UTF-8 whatever the handler raised (protobuf refuses lone surrogates).
            result.failure.message = str(failure.message).encode("utf-8", "replace").decode()
            result.failure.retryable = bool(failure.retryable)
        result.run_time.FromTimedelta(datetime.timedelta(seconds=run_time))
        return pb.WorkerMessage(result=result)

    def _outcome(self, job):
        """Runs the handler: (output bytes, None) or (None, JobFailed)."""
        try:
            value = self._handler(job)
        except JobFailed as e:
            return None, e
        except BaseException as e:  # noqa: BLE001  (a handler error fails the job, not the worker)
            return None, JobFailed(f"handler raised {type(e).__name__}: {e}")
        return self._output(value)

    @staticmethod
    def _output(value):
        """What a handler returned, as (output bytes, None) or (None, JobFailed)."""
        if value is None:
            return b"", None
        if isinstance(value, str):
            return value.encode("utf-8", "replace"), None
        if isinstance(value, (bytes, bytearray, memoryview)):
            return bytes(value), None
        return None, JobFailed(f"handler returned {type(value).__name__}, not bytes or str")

    def _run_job(self, running):
        start = time.monotonic()
        outcome = (None, JobFailed("handler did not return"))
        try:
            outcome = self._outcome(running.job)
        finally:
            # Whatever happened, the job no longer runs: its slot is free, a drain can end.
            self._complete(running, start, *outcome)

    def _complete(self, running, start, output, failure):
        """Records the end of a job's handler (the output, or the JobFailed) and sends its
        result, unless it is dropped."""
        key = running.key
        message = None
        run_time = 0.0
        try:
            if failure is None and len(output) > self._max_output_bytes:
                failure = JobFailed(f"output too large: {len(output)} bytes, limit "
                                    f"{self._max_output_bytes}")
            run_time = time.monotonic() - start
            message = self._result_message(key, output, failure, run_time)
        finally:
            session = self._finish(running, message)
        ok = failure is None
        if running.drop_result:
            _log.info("finished job=%s attempt=%d ok=%d run_time=%.3fs (result dropped: not "
                      "re-adopted)", key[0], key[1], ok, run_time)
            return
        _log.info("finished job=%s attempt=%d ok=%d run_time=%.3fs%s", key[0], key[1], ok,
                  run_time, "" if ok else " error=" + message.result.failure.message)
        if session is not None:
            session.write(message)

    def _finish(self, running, message):
        """Records a job's end; the session to send its result on, if any."""
        key = running.key
        session = None
        with self._cv:
            self._running.pop(key, None)
            if not running.drop_result and message is not None:
                self._unacked[key] = message
                if self._welcomed:
                    session = self._session
            if self._draining and not self._running:
                self._jobs_done_at = time.monotonic()
            self._cv.notify_all()
        if message is None:
            _log.error("job=%s attempt=%d ended without a result to report", key[0], key[1])
        return session
