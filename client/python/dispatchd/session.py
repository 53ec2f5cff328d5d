"""The stream of one WorkerService.Connect call, as the worker writes to it: Session (threads,
grpc) and AsyncSession (asyncio, grpc.aio), over one Outbox of messages waiting to go.

Internal to dispatchd.worker and dispatchd.aio: a worker opens one session per connection
attempt.
"""

from __future__ import annotations

import asyncio
import collections
import threading
from typing import Any, Callable, List, Optional

import grpc

from dispatchd.security import Security
from dispatchd.v1 import worker_service_pb2 as pb
from dispatchd.v1 import worker_service_pb2_grpc as pb_grpc

# Results in one Batch at most (a larger result goes alone), well below the daemon's limit.
_MAX_BATCH_BYTES = 1 << 20

_BATCHABLE = frozenset({"accept", "reject", "result"})

_CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]

OnSent = Callable[[Optional[bool]], None]


class Outbox:
    """The messages a session writes, in order, until its call takes them. When the daemon reads
    Batch messages, the answers and results waiting together go out as one.

    The transport takes one message at a time (next_message()) and reports it sent (sent()) when
    the call would take the next: a message's `on_sent(True)` runs then, when it has reached the
    transport, as a C++ ClientReaderWriter::Write returning true would say. After the call ends,
    fail_unsent() tells the rest: `on_sent(False)` for messages never handed to gRPC, and
    `on_sent(None)` for the one it was sending, which the daemon may or may not have read.

    Writes never block: a heartbeat written while the previous one still waits in the queue
    replaces it, so a slow stream carries the newest report, not a backlog of stale ones.
    Thread-safe; `_wake()` tells the transport that something changed (under `_cv`)."""

    def __init__(self) -> None:
        self.batching = False  # set from Welcome, before any result is sent
        self.daemon_stopping = False  # the daemon sent Stopping: no new work on this stream
        self._cv = threading.Condition()
        self._out: collections.deque = collections.deque()  # [message, on_sent or None]
        self._queued_heartbeat: Optional[list] = None  # the entry of _out holding a heartbeat
        self._in_flight: List[OnSent] = []  # on_sent callbacks of the message gRPC is sending
        self._closed = False  # no more writes; the request stream ends after what is queued
        self._ended = False  # the call is over: nothing more is sent
        # Freeze detection (see the worker's _frozen_locked), under the worker's lock: when the
        # session timer last came round, and whether it found it had not for too long.
        self.last_tick: Optional[float] = None
        self.suspect = False

    def write(self, message: pb.WorkerMessage, on_sent: Optional[OnSent] = None) -> bool:
        """Queues a message; False once the session is closed (the caller relies on a resend
        after the next reconnect). `on_sent(bool)` learns whether it was sent."""
        with self._cv:
            if self._closed:
                return False
            if message.HasField("heartbeat"):
                if self._queued_heartbeat is not None:
                    self._queued_heartbeat[0] = message
                    return True
                self._queued_heartbeat = [message, on_sent]
                self._out.append(self._queued_heartbeat)
            else:
                self._out.append([message, on_sent])
            self._wake()
            return True

    def close(self) -> None:
        """No more writes: the request stream ends (WritesDone) after what is queued."""
        with self._cv:
            self._closed = True
            self._wake()

    def fail_unsent(self) -> None:
        """After the call ended: what it did not send is never sent."""
        with self._cv:
            self._closed = self._ended = True
            in_flight, self._in_flight = self._in_flight, []
            unsent = [cb for _, cb in self._out if cb is not None]
            self._out.clear()
            self._queued_heartbeat = None
            self._wake()
        for cb in in_flight:
            cb(None)
        for cb in unsent:
            cb(False)

    def _wake(self) -> None:
        self._cv.notify()

    def sent(self) -> None:
        """The transport took what next_message() gave last: it has been sent."""
        with self._cv:
            sent, self._in_flight = self._in_flight, []
        for cb in sent:
            cb(True)

    def _ready_locked(self) -> bool:
        return bool(self._out) or self._closed

    def _next_locked(self) -> Optional[pb.WorkerMessage]:
        """The next message to send, or None when the request stream ends.
        REQUIRES: _ready_locked()."""
        if not self._out or self._ended:
            return None
        parts = [self._out.popleft()]
        if parts[0] is self._queued_heartbeat:
            self._queued_heartbeat = None
        kind = parts[0][0].WhichOneof("msg")
        if self.batching and kind in _BATCHABLE:
            # Gather the answers and results queued behind it into one Batch of at most
            # _MAX_BATCH_BYTES (a larger message goes alone).
            size = parts[0][0].ByteSize()
            while (self._out and self._out[0][0].WhichOneof("msg") in _BATCHABLE and
                   size + self._out[0][0].ByteSize() <= _MAX_BATCH_BYTES):
                parts.append(self._out.popleft())
                size += parts[-1][0].ByteSize()
        self._in_flight = [cb for _, cb in parts if cb is not None]
        if len(parts) == 1:
            return parts[0][0]
        batch = pb.Batch()
        for message, _ in parts:
            kind = message.WhichOneof("msg")
            if kind == "accept":
                batch.accepts.append(message.accept)
            elif kind == "reject":
                batch.rejects.append(message.reject)
            else:
                batch.results.append(message.result)
        return pb.WorkerMessage(batch=batch)


class Session(Outbox):
    """One WorkerService.Connect call on a grpc channel: gRPC's request iterator drains the
    outbox, and asks for the next message only once the last one was sent."""

    def __init__(self, target: str, security: Security) -> None:
        super().__init__()
        self.target = target
        self.metadata = security.metadata()
        self.channel = security.channel(target, _CHANNEL_OPTIONS)
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        self._call: Any = None
        self._cancelled = False

    def start(self) -> Any:
        call = self.stub.Connect(self._requests(), metadata=self.metadata)
        with self._cv:
            self._call = call
            cancel = self._cancelled
        if cancel:
            call.cancel()
        return call

    def cancel(self) -> None:
        """Ends the call at once (also before start(): it is then cancelled as it starts)."""
        with self._cv:
            self._cancelled = True
            call = self._call
        if call is not None:
            call.cancel()

    def _requests(self):
        while True:
            # Asked for more: what was yielded last has been sent.
            self.sent()
            with self._cv:
                self._cv.wait_for(self._ready_locked)
                message = self._next_locked()
            if message is None:
                return
            yield message


class AsyncSession(Outbox):
    """One WorkerService.Connect call on a grpc.aio channel, in the event loop that creates it:
    a writer task drains the outbox, and a message counts as sent once the call's write() of it
    returns. write(), close() and cancel() may be called from any thread."""

    def __init__(self, target: str, security: Security) -> None:
        super().__init__()
        self.target = target
        self.metadata = security.metadata()
        self.channel = security.aio_channel(target, _CHANNEL_OPTIONS)
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        self._loop = asyncio.get_running_loop()
        self._changed = asyncio.Event()
        self._call: Any = None
        self._writer: Optional[asyncio.Task] = None
        self._cancelled = False

    def _wake(self) -> None:
        super()._wake()
        self._call_in_loop(self._changed.set)

    def _call_in_loop(self, fn: Callable[[], Any]) -> None:
        try:
            if asyncio.get_running_loop() is self._loop:
                fn()
                return
        except RuntimeError:  # no loop in this thread
            pass
        try:
            self._loop.call_soon_threadsafe(fn)
        except RuntimeError:  # the loop is closed: nothing waits any more
            pass

    def start(self) -> Any:
        """Starts the call and its writer task; returns the call, to read from."""
        self._call = self.stub.Connect(metadata=self.metadata)
        self._writer = self._loop.create_task(self._write_all(self._call))
        with self._cv:
            cancel = self._cancelled
        if cancel:
            self._call.cancel()
        return self._call

    def cancel(self) -> None:
        """Ends the call at once (also before start(): it is then cancelled as it starts)."""
        with self._cv:
            self._cancelled = True
            call = self._call
        if call is not None:
            self._call_in_loop(call.cancel)

    @property
    def cancelled(self) -> bool:
        """Whether cancel() was called."""
        with self._cv:
            return self._cancelled

    async def stop(self) -> None:
        """After the call ended: stops the writer and closes the channel."""
        self.cancel()
        if self._writer is not None:
            self._writer.cancel()
            try:
                await self._writer
            except (asyncio.CancelledError, Exception):  # noqa: BLE001  (it ended either way)
                pass
        await self.channel.close()

    async def _write_all(self, call: Any) -> None:
        try:
            while True:
                with self._cv:
                    self._changed.clear()
                    ready = self._ready_locked()
                    message = self._next_locked() if ready else None
                if not ready:
                    await self._changed.wait()
                    continue
                if message is None:
                    await call.done_writing()
                    return
                await call.write(message)
                self.sent()
        except (grpc.RpcError, asyncio.InvalidStateError):
            # The call ended; the reader sees why, and fail_unsent() tells what was not sent.
            return
