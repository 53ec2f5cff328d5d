"""What a handler sees of its job (Job) and how it fails one (JobFailed).

Both are re-exported by dispatchd and dispatchd.worker, where user code imports them from.
"""

from __future__ import annotations

import datetime
import threading
from typing import Any, Optional


class JobFailed(Exception):
    """Raised by a handler to fail its job with `message`; `retryable` asks for another attempt
    (the daemon requeues while attempts remain)."""

    def __init__(self, message: str, retryable: bool = False) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable



class Job:
    """What a handler sees of its job, and its cancellation signal (thread-safe)."""

    def __init__(self, assignment: Any) -> None:
        self.assignment = assignment
        self.job_id: str = assignment.job_id
        self.attempt: int = assignment.attempt
        self.type: str = assignment.type
        self.payload: bytes = assignment.payload
        self.resource_id: str = assignment.resource_id
        self.model: str = assignment.model
        # When this attempt times out (the daemon cancels it then); None if unset.
        self.deadline: Optional[datetime.datetime] = (
            assignment.deadline.ToDatetime(tzinfo=datetime.timezone.utc)
            if assignment.HasField("deadline") else None)
        self._cancelled = threading.Event()
        self._reason = ""
        self._lock = threading.Lock()

    @property
    def cancelled(self) -> bool:
        """True once the daemon cancelled the job (client cancel, timeout, not re-adopted) or the
        worker shuts down. The handler decides what to do; whatever it returns is reported."""
        return self._cancelled.is_set()

    @property
    def cancel_reason(self) -> str:
        """Why it was cancelled ("" while it is not)."""
        with self._lock:
            return self._reason

    def wait_for_cancellation(self, timeout: Optional[float]) -> bool:
        """Blocks until cancelled or `timeout` seconds pass; returns `cancelled`."""
        return self._cancelled.wait(timeout)

    def cancel(self, reason: str) -> None:
        """Cancels the job; idempotent (the first reason wins). Called by the SDK."""
        with self._lock:
            if self._cancelled.is_set():
                return
            self._reason = reason
            self._cancelled.set()
