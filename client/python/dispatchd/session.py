"""The stream of one WorkerService.Connect call, as the worker writes to it (Session).

Internal to dispatchd.worker: Worker opens one Session per connection attempt.
"""

import collections
import threading

from dispatchd.v1 import worker_service_pb2 as pb
from dispatchd.v1 import worker_service_pb2_grpc as pb_grpc

# Results in one Batch at most (a larger result goes alone), well below the daemon's limit.
_MAX_BATCH_BYTES = 1 << 20

_BATCHABLE = frozenset({"accept", "reject", "result"})


class Session:
    """One WorkerService.Connect call. Messages are written through a queue that gRPC's request
    iterator drains; when the daemon reads Batch messages, the answers and results waiting in
    the queue together go out as one.

    gRPC asks the iterator for the next message only once the last one was sent, and never again
    once the call has ended: a message's `on_sent(True)` runs then, when it has reached the
    transport, as a C++ ClientReaderWriter::Write returning true would say. After the call ends,
    fail_unsent() tells the rest: `on_sent(False)` for messages never handed to gRPC, and
    `on_sent(None)` for the one it was sending, which the daemon may or may not have read.

    Writes never block: a heartbeat written while the previous one still waits in the queue
    replaces it, so a slow stream carries the newest report, not a backlog of stale ones."""

    def __init__(self, target, security):
        self.target = target
        self.metadata = security.metadata()
        self.channel = security.channel(target, [
            ("grpc.max_receive_message_length", -1),
            ("grpc.max_send_message_length", -1),
        ])
        self.stub = pb_grpc.WorkerServiceStub(self.channel)
        self.batching = False  # set from Welcome, before any result is sent
        self.daemon_stopping = False  # the daemon sent Stopping: no new work on this stream
        self._cv = threading.Condition()
        self._out = collections.deque()  # [message, on_sent or None]
        self._queued_heartbeat = None  # the entry of _out holding a heartbeat, if any
        self._in_flight = []  # on_sent callbacks of the message gRPC is sending
        self._closed = False  # no more writes; the request stream ends after what is queued
        self._ended = False  # the call is over: nothing more is sent
        self._call = None
        self._cancelled = False
        # Freeze detection (see Worker._frozen_locked), under the worker's lock: when the session
        # timer last came round, and whether it found it had not for too long.
        self.last_tick = None
        self.suspect = False

    def write(self, message, on_sent=None):
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
            self._cv.notify()
            return True

    def close(self):
        """No more writes: the request stream ends (WritesDone) after what is queued."""
        with self._cv:
            self._closed = True
            self._cv.notify()

    def fail_unsent(self):
        """After the call ended: what it did not send is never sent."""
        with self._cv:
            self._closed = self._ended = True
            in_flight, self._in_flight = self._in_flight, []
            unsent = [cb for _, cb in self._out if cb is not None]
            self._out.clear()
            self._queued_heartbeat = None
            self._cv.notify()
        for cb in in_flight:
            cb(None)
        for cb in unsent:
            cb(False)

    def start(self):
        call = self.stub.Connect(self._requests(), metadata=self.metadata)
        with self._cv:
            self._call = call
            cancel = self._cancelled
        if cancel:
            call.cancel()
        return call

    def cancel(self):
        """Ends the call at once (also before start(): it is then cancelled as it starts)."""
        with self._cv:
            self._cancelled = True
            call = self._call
        if call is not None:
            call.cancel()

    def _requests(self):
        while True:
            # Asked for more: what was yielded last has been sent.
            with self._cv:
                sent, self._in_flight = self._in_flight, []
            for cb in sent:
                cb(True)
            with self._cv:
                self._cv.wait_for(lambda: self._out or self._closed)
                if not self._out or self._ended:
                    parts = []
                else:
                    parts = [self._out.popleft()]
                    if parts[0] is self._queued_heartbeat:
                        self._queued_heartbeat = None
                    kind = parts[0][0].WhichOneof("msg")
                    if self.batching and kind in _BATCHABLE:
                        # Gather the answers and results queued behind it into one Batch of at
                        # most _MAX_BATCH_BYTES (a larger message goes alone).
                        size = parts[0][0].ByteSize()
                        while (self._out and
                               self._out[0][0].WhichOneof("msg") in _BATCHABLE and
                               size + self._out[0][0].ByteSize() <= _MAX_BATCH_BYTES):
                            parts.append(self._out.popleft())
                            size += parts[-1][0].ByteSize()
                    self._in_flight = [cb for _, cb in parts if cb is not None]
            if not parts:
                return
            if len(parts) == 1:
                yield parts[0][0]
                continue
            batch = pb.Batch()
            for message, _ in parts:
                kind = message.WhichOneof("msg")
                if kind == "accept":
                    batch.accepts.append(message.accept)
                elif kind == "reject":
                    batch.rejects.append(message.reject)
                else:
                    batch.results.append(message.result)
            yield pb.WorkerMessage(batch=batch)
