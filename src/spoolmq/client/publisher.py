"""The Publisher client: batches messages into frames, keeps several frames in flight, and
rides through broker restarts by resending un-ACKed messages with the same producer id and
sequence numbers (the broker stores each once).

One background I/O thread owns the connection; ``publish()`` and ``publish_async()`` only
encode the message (so bad input fails in the caller) and queue it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
import uuid
from collections import deque
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, PENDING
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any, Unpack

from spoolmq import protocol
from spoolmq.client.connection import Address, connect, resolve
from spoolmq.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    ProtocolError,
    PublishTimeoutError,
    SpoolError,
    error_from_code,
)
from spoolmq.protocol.publish import encode_publish_frame, encode_publish_message
from spoolmq.store.message import Position, PublishOptions, normalize_acks

logger = logging.getLogger("spoolmq.client")


@dataclass(slots=True)
class _Outgoing:
    sequence: int
    topic: str
    body: bytes
    acks: str
    future: _PublishFuture
    deadline: float


# Guards the moment a _PublishFuture gets its Condition against the moment it is resolved.
_CONDITION_LOCK = threading.Lock()


class _PublishFuture(Future[Position]):
    """A Future that builds its Condition only when someone waits on it or adds a callback.

    ``Future()`` builds a Condition (a lock and waiter bookkeeping) per instance, and
    resolving one takes it and notifies: together the largest per-message cost of
    ``publish_async``, whose futures are mostly never looked at. Every method of
    ``Future`` that waits or registers a callback reads ``self._condition``, which makes it
    here (``__getattr__``); ``resolve`` finishes an untouched future without one.
    """

    def __init__(self) -> None:  # Future.__init__ is skipped on purpose: no Condition yet
        self._state = PENDING
        self._result: Position | None = None
        self._exception: BaseException | None = None
        self._waiters: list[Any] = []
        self._done_callbacks: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        if name != "_condition":
            raise AttributeError(name)
        with _CONDITION_LOCK:
            condition = self.__dict__.get("_condition")
            if condition is None:
                condition = self.__dict__["_condition"] = threading.Condition()
        return condition

    def resolve(self, result: Position | None, error: BaseException | None) -> None:
        with _CONDITION_LOCK:
            if "_condition" not in self.__dict__:
                # Nobody waits and no callback is registered: both need the Condition.
                if self._state == PENDING:
                    self._result, self._exception = result, error
                    self._state = FINISHED
                return
        if self.done():
            return
        if error is not None:
            self.set_exception(error)
        else:
            self.set_result(result)  # type: ignore[arg-type]


class Publisher:
    """Publishes to a broker. Use as a context manager; leaving the block flushes.

    Args:
        data: the data directory (default ``$SPOOLMQ_DATA`` or ``./queue_data``).
        address: ``(host, port)`` of a broker's TCP listener instead of the Unix socket.
        authkey: the broker's key (default: read from ``<data>/.authkey``).
        acks: default ACK level, ``"0"``, ``"1"`` or ``"all"`` (fsynced; the default).
        linger_ms: how long ``publish_async`` messages may wait to fill a frame.
        batch_size: messages per frame at most.
        max_in_flight: frames sent and not yet answered at most.
        delivery_timeout: seconds a message may take, reconnects included, before
            ``PublishTimeoutError``.
        producer_id: idempotence id (default: a random one per Publisher).
    """

    def __init__(
        self,
        data: str | os.PathLike[str] | None = None,
        *,
        address: Address | None = None,
        authkey: bytes | None = None,
        acks: str | int = "all",
        linger_ms: float = 1.0,
        batch_size: int = 100,
        max_in_flight: int = 8,
        delivery_timeout: float = 120.0,
        producer_id: str | None = None,
        name: str = "",
    ) -> None:
        if batch_size < 1 or max_in_flight < 1:
            raise InvalidArgumentError("batch_size and max_in_flight must be at least 1")
        self._address, self._authkey, _ = resolve(data, address, authkey)
        self.acks = normalize_acks(acks)
        self.linger = linger_ms / 1000
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.delivery_timeout = delivery_timeout
        self.producer_id = producer_id or f"p-{uuid.uuid4().hex}"
        self.name = name
        self._sequence = 0
        self._queue: deque[_Outgoing] = deque()
        self._urgent = False
        self._in_flight: dict[int, list[_Outgoing]] = {}
        self._frame_ids = 0
        self._outstanding = 0
        self._cond = threading.Condition()
        self._closed = False
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        # Never block while holding the condition: a full wake-up socket already says "wake".
        self._wake_write.setblocking(False)
        self._conn: Connection | None = None
        self.reconnects = 0
        # Connect once in the caller, so a missing broker or a wrong key fails loudly here.
        self._conn, self.client_id = connect(self._address, self._authkey, "publisher", name)
        self._thread = threading.Thread(target=self._io_loop, name="spoolmq-publisher", daemon=True)
        self._thread.start()

    # -- the public API ----------------------------------------------------------------

    def publish(
        self,
        topic: str,
        value: Any,
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> Position:
        """Publish one message and wait for its ACK. ``options`` are the PublishOptions
        (``key``, ``headers``, ``tags``, ``partition``, ``delay``/``ttl`` in seconds,
        ``deliver_at`` in epoch ms)."""
        return self._enqueue(topic, value, options, acks, urgent=True).result()

    def publish_async(
        self,
        topic: str,
        value: Any,
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> Future[Position]:
        """Queue one message (batched with others); the future resolves on its ACK.
        ``options`` as for ``publish``."""
        return self._enqueue(topic, value, options, acks, urgent=False)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message is answered (or failed)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._wake()
            while self._outstanding:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    raise PublishTimeoutError(f"{self._outstanding} message(s) still unanswered")
                self._cond.wait(remaining if remaining is not None else 0.5)

    def close(self) -> None:
        if self._closed:
            return
        try:
            self.flush(self.delivery_timeout)
        finally:
            with self._cond:
                self._closed = True
                self._wake()
            self._thread.join(10)
            if self._conn is not None:
                with contextlib.suppress(OSError):
                    protocol.send(self._conn, {"op": "bye"})
                self._conn.close()
            self._wake_read.close()
            self._wake_write.close()

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- queueing -----------------------------------------------------------------------

    def _enqueue(
        self,
        topic: str,
        value: Any,
        options: PublishOptions,
        acks: str | int | None,
        *,
        urgent: bool,
    ) -> Future[Position]:
        level = self.acks if acks is None else normalize_acks(acks)
        with self._cond:
            if self._closed:
                raise SpoolError("this Publisher is closed")
            sequence = self._sequence
            body = encode_publish_message(topic, value, options, sequence=sequence)
            self._sequence += 1
            future = _PublishFuture()
            # The I/O thread needs a wake-up only when there is something new for it to do:
            # a first message starts its linger clock, a full batch or a blocking publish
            # ends it. Waking it per message cost a syscall and a thread switch each.
            wake = not self._queue
            self._queue.append(
                _Outgoing(
                    sequence, topic, body, level, future, time.monotonic() + self.delivery_timeout
                )
            )
            self._outstanding += 1
            if not self._urgent and (urgent or len(self._queue) >= self.batch_size):
                self._urgent = wake = True
            if wake:
                self._wake()
        return future

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._wake_write.send(b"x")

    # -- the I/O thread -----------------------------------------------------------------------

    def _io_loop(self) -> None:
        while True:
            with self._cond:
                if self._closed and not self._outstanding:
                    return
            try:
                if self._conn is None:
                    self._reconnect()
                    continue
                self._send_ready_frames()
                self._wait_and_read()
            except (EOFError, OSError) as exc:
                logger.warning("lost the broker (%s); reconnecting", exc)
                if self._conn is not None:
                    with contextlib.suppress(OSError):
                        self._conn.close()
                self._conn = None
            self._expire()

    def _reconnect(self) -> None:
        delay = 0.05
        while True:
            self._expire()
            with self._cond:
                if self._closed and not self._outstanding:
                    return
                if not self._outstanding:
                    # Nothing to send: reconnect lazily, when there is.
                    self._cond.wait(1.0)
                    if not self._outstanding:
                        continue
            try:
                self._conn, self.client_id = connect(
                    self._address, self._authkey, "publisher", self.name
                )
            except (BrokerUnavailableError, SpoolError) as exc:
                logger.debug("reconnect failed: %s", exc)
                with self._cond:
                    self._cond.wait(delay)
                delay = min(delay * 2, 1.0)
                continue
            self.reconnects += 1
            # Resend every unanswered frame, oldest first: same producer id and sequences,
            # so whatever the broker stored before it went away is not stored twice.
            with self._cond:
                resend = [m for _, ms in sorted(self._in_flight.items()) for m in ms]
                self._in_flight.clear()
                self._queue.extendleft(reversed(resend))
                self._urgent = True
            return

    def _send_ready_frames(self) -> None:
        assert self._conn is not None
        while True:
            with self._cond:
                if not self._queue or len(self._in_flight) >= self.max_in_flight:
                    return
                if not self._urgent and len(self._queue) < self.batch_size:
                    oldest = self._queue[0].deadline - self.delivery_timeout
                    if time.monotonic() - oldest < self.linger:
                        return
                acks = self._queue[0].acks
                batch: list[_Outgoing] = []
                while self._queue and len(batch) < self.batch_size and self._queue[0].acks == acks:
                    batch.append(self._queue.popleft())
                if not self._queue:
                    self._urgent = False
                self._frame_ids += 1
                frame_id = self._frame_ids
                if acks != "0":
                    self._in_flight[frame_id] = batch
            self._conn.send_bytes(
                encode_publish_frame(frame_id, acks, self.producer_id, [m.body for m in batch])
            )
            if acks == "0":
                for item in batch:
                    item.future.resolve(Position(item.topic, -1, -1, -1), None)
                self._done(len(batch))

    def _wait_and_read(self) -> None:
        assert self._conn is not None
        with self._cond:
            if self._queue and not self._urgent and len(self._in_flight) < self.max_in_flight:
                oldest = self._queue[0].deadline - self.delivery_timeout
                timeout: float | None = max(0.0, self.linger - (time.monotonic() - oldest))
            else:
                timeout = 1.0
        ready = wait([self._conn, self._wake_read], timeout)
        if self._wake_read in ready:
            with contextlib.suppress(BlockingIOError, OSError):
                self._wake_read.recv(4096)
        if self._conn in ready:
            while self._conn.poll(0):
                self._handle_reply(protocol.receive(self._conn))

    def _handle_reply(self, frame: dict[str, Any]) -> None:
        frame_id = frame.get("id")
        with self._cond:
            batch = self._in_flight.pop(frame_id, None) if isinstance(frame_id, int) else None
        if frame.get("op") == "error":
            error = error_from_code(str(frame.get("code")), str(frame.get("message")))
            if batch is None:
                raise OSError(f"the broker closed this connection: {error}")
            for item in batch:
                item.future.resolve(None, error)
            self._done(len(batch))
            return
        if batch is None:
            return
        results = frame.get("results") or []
        answered = 0
        for item, result in zip(batch, results, strict=False):
            answered += 1
            if "error" in result:
                item.future.resolve(
                    None, error_from_code(result["error"], result.get("message", ""))
                )
            else:
                position = Position(
                    item.topic,
                    result["partition"],
                    result["offset"],
                    result.get("timestamp", -1),
                    bool(result.get("duplicate")),
                )
                item.future.resolve(position, None)
        for item in batch[answered:]:  # a broker bug; never left waiting, never ACKed
            item.future.resolve(
                None,
                ProtocolError(f"the broker answered {answered} of the {len(batch)} messages"),
            )
        self._done(len(batch))

    def _done(self, count: int) -> None:
        """``count`` messages were answered: one lock and one notify per frame."""
        with self._cond:
            self._outstanding -= count
            self._cond.notify_all()

    def _expire(self) -> None:
        """Fail messages whose delivery timeout passed (never a false ACK: an error)."""
        now = time.monotonic()
        expired: list[_Outgoing] = []
        with self._cond:
            while self._queue and self._queue[0].deadline <= now:
                expired.append(self._queue.popleft())
            for frame_id in [f for f, ms in self._in_flight.items() if ms[0].deadline <= now]:
                expired.extend(self._in_flight.pop(frame_id))
        for item in expired:
            item.future.resolve(
                None,
                PublishTimeoutError(
                    f"message {item.sequence} to {item.topic!r} was not acknowledged within "
                    f"{self.delivery_timeout:g} s (broker unreachable or overloaded); it may or "
                    "may not have been stored"
                ),
            )
        if expired:
            self._done(len(expired))
