"""What a handler sees of its job (Job) and how it fails one (JobFailed).

Both are re-exported by dispatchd and dispatchd.worker, where user code imports them from.
"""

import datetime
import threading


class JobFailed(Exception):
    """Raised by a handler to fail its job with `message`; `retryable` asks for another attempt
    (the daemon requeues while attempts remain)."""

    def __init__(self, message, retryable=False):
        super().__init__(message)
        self.message = message
        self.retryable = retryable



class Job:
    """What a handler sees of its job, and its cancellation signal (thread-safe)."""

    def __init__(self, assignment):
        self.assignment = assignment
        self.job_id = assignment.job_id
        self.attempt = assignment.attempt
        self.type = assignment.type
        self.payload = assignment.payload
        self.resource_id = assignment.resource_id
        self.model = assignment.model
        # When this attempt times out (the daemon cancels it then); None if unset.
        self.deadline = (assignment.deadline.ToDatetime(tzinfo=datetime.timezone.utc)
                         if assignment.HasField("deadline") else None)
        self._cancelled = threading.Event()
        self._reason = ""
        self._lock = threading.Lock()

    @property
    def cancelled(self):
        """True once the daemon cancelled the job (client cancel, timeout, not re-adopted) or the
        worker shuts down. The handler decides what to do; whatever it returns is reported."""
        return self._cancelled.is_set()

    @property
    def cancel_reason(self):
        """Why it was cancelled ("" while it is not)."""
        with self._lock:
            return self._reason

    def wait_for_cancellation(self, timeout):
        """Blocks until cancelled or `timeout` seconds pass; returns `cancelled`."""
        return self._cancelled.wait(timeout)

    def cancel(self, reason):
        """Cancels the job; idempotent (the first reason wins). Called by the SDK."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._reason = reason
            self._cancelled.set()
