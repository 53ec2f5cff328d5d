"""dispatchd.Client: JobService over gRPC with deadlines, and errors that say what to do next."""

from __future__ import annotations

import datetime
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Union

import grpc
from google.protobuf import duration_pb2, timestamp_pb2

from dispatchd.security import Security
from dispatchd.v1 import job_pb2, job_service_pb2, job_service_pb2_grpc

# The daemon's hint, on RESOURCE_EXHAUSTED, of when to try again.
RETRY_AFTER_TRAILER = "retry-after-ms"

TERMINAL_STATES = frozenset({
    job_pb2.JOB_STATE_SUCCEEDED,
    job_pb2.JOB_STATE_FAILED,
    job_pb2.JOB_STATE_CANCELLED,
    job_pb2.JOB_STATE_EXPIRED,
})


def state_name(state: int) -> str:
    """'SUCCEEDED' for job_pb2.JOB_STATE_SUCCEEDED, and so on."""
    return job_pb2.JobState.Name(state).removeprefix("JOB_STATE_")


class DispatchError(Exception):
    """A call the daemon refused or could not answer.

    `code` is the grpc.StatusCode (INVALID_ARGUMENT names the field, e.g. "spec.type: unknown job
    type"; NOT_FOUND; RESOURCE_EXHAUSTED when admission refuses, with `retry_after` in seconds;
    UNAVAILABLE or DEADLINE_EXCEEDED when the daemon cannot be reached in time)."""

    def __init__(self, code: grpc.StatusCode, message: str,
                 retry_after: Optional[float] = None) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.retry_after = retry_after

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "DispatchError":
        retry_after = None
        trailers = error.trailing_metadata() or ()
        for key, value in trailers:
            if key == RETRY_AFTER_TRAILER:
                try:
                    retry_after = int(value) / 1000.0
                except ValueError:
                    pass
        return cls(error.code(), error.details() or "", retry_after)


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromTimedelta(datetime.timedelta(seconds=seconds))
    return d


def job_spec(type: str, payload: Union[bytes, str] = b"", *, resource_id: str = "",
             fairness_key: str = "", idempotency_key: str = "", max_attempts: int = 0,
             job_timeout: Optional[float] = None, dispatch_deadline: Optional[float] = None,
             not_before: Optional[datetime.datetime] = None,
             labels: Optional[Mapping[str, str]] = None) -> job_pb2.JobSpec:
    """A JobSpec. Durations are seconds (float); `not_before` is an aware datetime; `payload` is
    bytes (a str is encoded as UTF-8)."""
    if isinstance(payload, str):
        payload = payload.encode()
    spec = job_pb2.JobSpec(type=type, payload=payload, resource_id=resource_id,
                           fairness_key=fairness_key, idempotency_key=idempotency_key,
                           max_attempts=max_attempts, labels=labels or {})
    if job_timeout is not None:
        spec.timeout.CopyFrom(_duration(job_timeout))
    if dispatch_deadline is not None:
        spec.dispatch_deadline.CopyFrom(_duration(dispatch_deadline))
    if not_before is not None:
        ts = timestamp_pb2.Timestamp()
        ts.FromDatetime(not_before)
        spec.not_before.CopyFrom(ts)
    return spec


class Client:
    """JobService of one daemon, or of any of several sharing a database
    ("ipv4:10.0.0.5:7411,10.0.0.6:7411"). Thread-safe; close() (or `with`) ends the channel.

    Every call has a deadline: `timeout` seconds (default 10), or `wait` for run and watch.
    `security` (a dispatchd.Security) gives TLS and the bearer token; default none."""

    def __init__(self, address: str = "127.0.0.1:7411", timeout: float = 10.0,
                 security: Optional[Security] = None) -> None:
        if not address:
            raise ValueError("address: required, host:port")
        self._timeout = timeout
        security = security or Security()
        self._metadata = security.metadata()
        self._channel = security.channel(address, [
            ("grpc.max_receive_message_length", -1),
        ])
        self._jobs = job_service_pb2_grpc.JobServiceStub(self._channel)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: Any, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return method(request, timeout=timeout or self._timeout, metadata=self._metadata)
        except grpc.RpcError as e:
            raise DispatchError.from_rpc_error(e) from None

    def submit(self, type: str, payload: Union[bytes, str] = b"", **spec: Any) -> str:
        """Queues a job; returns its id (an idempotency_key repeat returns the existing one's).
        Keyword arguments as job_spec()."""
        r = self._call(self._jobs.Submit,
                       job_service_pb2.SubmitRequest(spec=job_spec(type, payload, **spec)))
        return r.job_id

    def submit_batch(self, specs: Iterable[Union[job_pb2.JobSpec, Dict[str, Any]]]
                     ) -> List[str]:
        """Queues many jobs at once, all or none (INVALID_ARGUMENT names the bad one,
        `specs[3].type`). `specs`: JobSpec messages or dicts of job_spec() arguments. Returns the
        ids in order."""
        messages = [s if isinstance(s, job_pb2.JobSpec) else job_spec(**s) for s in specs]
        r = self._call(self._jobs.SubmitBatch, job_service_pb2.SubmitBatchRequest(specs=messages))
        return [x.job_id for x in r.results]

    def run(self, type: str, payload: Union[bytes, str] = b"", wait: float = 3600.0,
            **spec: Any) -> job_pb2.Job:
        """Queues a job and waits up to `wait` seconds for it to end; returns the final Job,
        whatever its state (see `state`, `result`, `error`). DispatchError DEADLINE_EXCEEDED if
        `wait` passes first (the job keeps going)."""
        r = self._call(self._jobs.RunSync,
                       job_service_pb2.RunSyncRequest(spec=job_spec(type, payload, **spec)),
                       timeout=wait)
        return r.job

    def status(self, job_id: str) -> job_pb2.Job:
        """The job as recorded now; DispatchError NOT_FOUND for an unknown id."""
        return self._call(self._jobs.Status, job_service_pb2.StatusRequest(job_id=job_id)).job

    def cancel(self, job_id: str) -> job_pb2.Job:
        """Cancels a queued or running job; returns it. FAILED_PRECONDITION if it already ended."""
        return self._call(self._jobs.Cancel, job_service_pb2.CancelRequest(job_id=job_id)).job

    def watch(self, job_id: str, wait: float = 86400.0) -> Iterator[job_pb2.Job]:
        """Yields the job at each state change, first as it is when the watch begins, until it
        ends (the last one yielded is terminal) or `wait` seconds pass (DispatchError
        DEADLINE_EXCEEDED)."""
        try:
            for event in self._jobs.Watch(job_service_pb2.WatchRequest(job_id=job_id),
                                          timeout=wait, metadata=self._metadata):
                yield event.job
        except grpc.RpcError as e:
            raise DispatchError.from_rpc_error(e) from None
