"""The Publisher client: batches messages into frames, keeps several frames in flight, and
rides through broker restarts by resending un-ACKed messages with the same producer id and
sequence numbers (the broker stores each once).

One background I/O thread owns the connection; ``publish()`` and ``publish_async()`` only
encode the message (so bad input fails in the caller) and queue it.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import socket
import threading
import time
from collections import deque
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures._base import FINISHED, PENDING
from multiprocessing.connection import Connection
from typing import Any, Unpack

import orjson

from spoolmq import protocol
from spoolmq.client.common import (
    add_to_group,
    answer_errors,
    check_next_sequence,
    check_publisher_limits,
    check_timeout,
    encode_many,
    expired_error,
    frame_partition,
    lost_broker,
    numbered_bodies,
    producer_id_or_new,
)
from spoolmq.client.connection import Address, Readiness, connect, resolve
from spoolmq.config import known_settings
from spoolmq.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    ProtocolError,
    PublishTimeoutError,
    SpoolError,
    error_from_code,
)
from spoolmq.protocol.publish import (
    encode_publish_frame,
    encode_publish_message,
    frame_count,
)
from spoolmq.store.message import Position, PublishOptions, normalize_acks

logger = logging.getLogger("spoolmq.client")


# Messages go out in frames of one topic, one ACK level and (when the Publisher knows it)
# one partition: (acks, topic, partition or None).
_Group = tuple[str, str, int | None]


# Guards the moment a _PublishFuture gets its Condition against the moment it is resolved.
_CONDITION_LOCK = threading.Lock()
# What Future.__init__ makes per instance and _PublishFuture makes only when read (every
# Future method that touches one of them reads ``_condition`` first, or with it).
_LAZY = frozenset(("_condition", "_waiters", "_done_callbacks"))


class _PublishFuture(Future[Position]):
    """A Future that builds its Condition only when someone waits on it or adds a callback,
    and its Position only when someone reads it; it is also the queued message itself.

    ``Future()`` builds a Condition (a lock and waiter bookkeeping) per instance, and
    resolving one takes it and notifies: together the largest per-message cost of
    ``publish_async``, whose futures are mostly never looked at. Every method of
    ``Future`` that waits or registers a callback reads ``self._condition``, which makes it
    here (``__getattr__``); ``resolve`` finishes an untouched future without one, and
    :func:`_resolve_stored` a frame's untouched futures with the range of the answer they
    are in (``_where``), from which ``_result`` builds the Position when it is asked for.
    """

    def __init__(
        self,
        sequence: int = 0,
        body: bytes = b"",
        deadline: float = 0.0,
        reader: threading.Thread | None = None,
    ) -> None:
        # Future.__init__ is skipped on purpose: no Condition (nor waiter lists) yet.
        self._state = PENDING
        self._value: Position | None = None
        # Where a stored message is, until someone asks: (topic, partition, timestamp,
        # duplicate) of its range, shared by the range's futures, and its own offset.
        self._where: tuple[str, int, int, bool] | None = None
        self._offset = 0
        self._exception: BaseException | None = None
        # _condition, _waiters and _done_callbacks come together, when first read.
        # The message: its sequence, its record's bytes, when it times out (monotonic).
        self.sequence, self.body, self.deadline = sequence, body, deadline
        # The Publisher's I/O thread, which reads the answer and runs the done callbacks.
        self.reader = reader

    @property
    def _result(self) -> Position | None:  # what Future.result() returns
        where = self._where
        if where is None:
            return self._value
        return Position(where[0], where[1], self._offset, where[2], where[3])

    @_result.setter
    def _result(self, value: Position | None) -> None:
        self._value, self._where = value, None

    def __getattr__(self, name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(name)
        with _CONDITION_LOCK:
            fields = self.__dict__
            if "_condition" not in fields:
                fields["_waiters"] = []
                fields["_done_callbacks"] = []
                fields["_condition"] = threading.Condition()
        return fields[name]

    def result(self, timeout: float | None = None) -> Position:
        try:
            if self._state == FINISHED:  # answered, for good: no Condition to make or take
                if self._exception is not None:
                    raise self._exception
                return self._result  # type: ignore[return-value]
            self._check_may_wait("result()", timeout)
            return super().result(timeout)
        finally:
            # As Future.result: the traceback of a raised error holds this frame, and so
            # this future, which holds the error (a cycle, and the message's bytes kept
            # until the next collection).
            self = None  # type: ignore[assignment]

    def exception(self, timeout: float | None = None) -> BaseException | None:
        if self._state == FINISHED:
            return self._exception
        self._check_may_wait("exception()", timeout)
        return super().exception(timeout)

    def _check_may_wait(self, call: str, timeout: float | None) -> None:
        """Refuse to wait for this future in its Publisher's I/O thread (a done callback
        runs there), which is the thread that would answer it: the wait would never end, or
        only at its timeout. A look with no wait (``timeout=0``) is fine: it raises
        TimeoutError at once, as Future's does."""
        if (
            (timeout is None or timeout > 0)
            and self.reader is threading.current_thread()
            and not self.done()
        ):
            raise InvalidArgumentError(
                f"{call} of a message not answered yet waits for the broker's answer, which "
                "this thread reads: it is the Publisher's I/O thread, running a done "
                "callback, and would wait for good; in a callback, add a done callback to "
                "that future instead"
            )

    def cancel(self) -> bool:
        """False, always: a message once queued is sent (it may be in a frame on the wire
        already) and its future resolves with the broker's answer. A future cancelled
        under the I/O thread as it resolved it would also stop that thread."""
        return False

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


def _resolve_stored(
    futures: list[_PublishFuture], where: tuple[str, int, int, bool], offset: int
) -> None:
    """Resolve ``futures`` as stored at consecutive offsets from ``offset`` of the range
    ``where`` (topic, partition, timestamp, duplicate): one lock for them all, and no
    Position built for a future nobody reads."""
    waited: list[tuple[_PublishFuture, int]] = []
    with _CONDITION_LOCK:
        for future in futures:
            if "_condition" in future.__dict__:
                waited.append((future, offset))
            elif future._state == PENDING:
                future._where, future._offset = where, offset
                future._state = FINISHED
            offset += 1
    for future, at in waited:
        if not future.done():
            topic, partition, timestamp, duplicate = where
            future.set_result(Position(topic, partition, at, timestamp, duplicate))


class Publisher:
    """Publishes to a broker. Use as a context manager; leaving the block flushes.

    Args:
        data: the data directory (default ``$SPOOLMQ_DATA`` or ``./queue_data``).
        address: ``(host, port)`` or ``"host:port"`` of a broker's TCP listener instead of
            the Unix socket.
        authkey: the broker's key (default: read from ``<data>/.authkey``).
        acks: default ACK level, ``"0"``, ``"1"`` or ``"all"`` (fsynced; the default).
        linger_ms: how long ``publish_async`` messages may wait to fill a frame.
        batch_size: messages per frame at most.
        max_in_flight: frames sent and not yet answered at most.
        max_buffered: messages queued or unanswered at most; ``publish_async`` waits for
            room beyond it (up to ``delivery_timeout``, then ``PublishTimeoutError``), so
            a caller faster than the broker is slowed down instead of filling memory.
        delivery_timeout: seconds a message may take, reconnects included, before
            ``PublishTimeoutError``.
        producer_id: idempotence id (default: a random one per Publisher).
    """

    @known_settings
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
        max_buffered: int = 20_000,
        delivery_timeout: float = 120.0,
        producer_id: str | None = None,
        name: str = "",
    ) -> None:
        check_publisher_limits(batch_size, max_in_flight, max_buffered, linger_ms, delivery_timeout)
        self._address, self._authkey, _ = resolve(data, address, authkey)
        self.acks = normalize_acks(acks)
        self.linger = linger_ms / 1000
        self.batch_size = batch_size
        self.max_in_flight = max_in_flight
        self.max_buffered = max_buffered
        self.delivery_timeout = delivery_timeout
        self.producer_id = producer_id_or_new(producer_id)
        self.name = name
        self._sequences = itertools.count()
        # Queued messages by frame group, oldest group first; ``_queued`` counts them all.
        self._groups: dict[_Group, deque[_PublishFuture]] = {}
        self._queued = 0
        # Each topic's partition count, from the broker's answers: keyed messages are then
        # grouped by partition here (the broker's murmur2), so a frame has one partition.
        self._partitions: dict[str, int] = {}
        self._urgent = False
        self._flushing = 0  # callers waiting in flush(): what is queued is urgent
        self._in_flight: dict[int, tuple[_Group, list[_PublishFuture]]] = {}
        # Taken around taking a frame from the queue and sending it, by the I/O thread or
        # by a caller that sends its own message while the I/O thread is idle: frames go
        # out in the order they were taken.
        self._send_lock = threading.Lock()
        self._frame_ids = 0
        self._outstanding = 0
        self._cond = threading.Condition()
        self._closed = False
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        # Never block while holding the condition: a full wake-up socket already says "wake".
        self._wake_write.setblocking(False)
        self._readiness = Readiness(self._wake_read.fileno())
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
        ``deliver_at`` in epoch ms, ``priority`` 0-9)."""
        self._check_may_wait("publish")
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

    def publish_many(
        self,
        topic: str,
        values: Iterable[Any],
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> list[Position]:
        """Publish every value of ``values`` (the same ``options`` for each) and wait for
        all their ACKs: their Positions, in order. Every value is encoded before any is
        queued, so a value that cannot be sent raises (``SerializationError`` naming its
        index) with none of them published. A message the broker refuses raises its error
        here once all are answered; the others may be stored (``publish_many_async``
        tells each one's fate)."""
        self._check_may_wait("publish_many")
        futures = self._enqueue_many(topic, values, options, acks, urgent=True)
        # Every answer first (a failed message does not cut the wait short), one future at
        # a time: once one is answered its frame's are too, and an answered future is read
        # without a Condition, where concurrent.futures.wait() made one per future and
        # hung a waiter on each (publish_many cost 9 µs a message, against 2.5 µs async).
        for future in futures:
            future.exception()
        return [future.result() for future in futures]

    def publish_many_async(
        self,
        topic: str,
        values: Iterable[Any],
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> list[Future[Position]]:
        """Queue every value of ``values`` (the same ``options`` for each), as
        ``publish_async`` would one by one, under one lock instead of one each: a future
        per message, in order. Checked as ``publish_many``. If a frame finds no room in
        time (or the Publisher closes), the error says how many values were queued before
        it: those stay queued and may still be stored."""
        return list(self._enqueue_many(topic, values, options, acks, urgent=False))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every queued message is answered (or failed)."""
        check_timeout(timeout)
        self._check_may_wait("flush")
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._urgent = True
            self._wake()
            # What is queued meanwhile (by another thread, or a done callback) goes out
            # at once too, rather than after its linger: this waits for it.
            self._flushing += 1
            try:
                while self._outstanding:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        raise PublishTimeoutError(
                            f"{self._outstanding} message(s) still unanswered"
                        )
                    self._cond.wait(remaining if remaining is not None else 0.5)
            finally:
                self._flushing -= 1

    def close(self) -> None:
        if self._closed:
            return
        self._check_may_wait("close")
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

    def _check_may_wait(self, call: str) -> None:
        """A call that waits for answers cannot be made from the I/O thread, which reads
        them (a done callback runs there): it would hold that thread until its timeout,
        or for good. Raise instead."""
        if threading.current_thread() is self._thread:
            raise InvalidArgumentError(
                f"{call}() waits for the broker's answers, which this thread reads: it is "
                "the Publisher's I/O thread, running a done callback, and would stop "
                "reading them; in a callback use publish_async() or publish_many_async()"
            )

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
        if self._closed:
            raise SpoolError("this Publisher is closed")
        # Numbered and encoded outside the lock the I/O thread takes (next() of a count is
        # atomic), so a caller's encoding never waits for the I/O thread or stalls it.
        sequence = next(self._sequences)
        body, key, partition = encode_publish_message(
            topic, value, options, sequence=sequence, producer_id=self.producer_id
        )
        partition = frame_partition(topic, key, partition, self._partitions)
        future = _PublishFuture(
            sequence, body, time.monotonic() + self.delivery_timeout, self._thread
        )
        with self._cond:
            idle = self._add((level, topic, partition), [future], urgent)
        if idle and not self._send_from_caller():
            with self._cond:
                self._wake()
        return future

    def _enqueue_many(
        self,
        topic: str,
        values: Iterable[Any],
        options: PublishOptions,
        acks: str | int | None,
        *,
        urgent: bool,
    ) -> list[_PublishFuture]:
        level = self.acks if acks is None else normalize_acks(acks)
        if self._closed:
            raise SpoolError("this Publisher is closed")
        partition, bodies = encode_many(topic, values, options, self._partitions)
        group = (level, topic, partition)
        producer_id = orjson.dumps(self.producer_id)
        futures: list[_PublishFuture] = []
        # A frame's worth at a time: room for it first, then numbered and timed from the
        # moment it is queued (so the sequences go out in order, and a wait for room does
        # not eat into its delivery timeout).
        step = min(self.batch_size, self.max_buffered)
        for start in range(0, len(bodies), step):
            frame = bodies[start : start + step]
            try:
                with self._cond:
                    if self._outstanding + len(frame) > self.max_buffered:
                        self._wait_for_room(len(frame))
                    deadline = time.monotonic() + self.delivery_timeout
                    chunk = [
                        _PublishFuture(sequence, body, deadline, self._thread)
                        for sequence, body in numbered_bodies(frame, self._sequences, producer_id)
                    ]
                    self._add(group, chunk, urgent, alone=False)
            except SpoolError as exc:  # no room in time, or closed meanwhile
                if not futures:
                    raise
                raise type(exc)(
                    f"{exc} (the first {len(futures)} values were queued before it and may "
                    "still be stored)"
                ) from None
            futures += chunk
        return futures

    def _add(
        self, group: _Group, items: list[_PublishFuture], urgent: bool, *, alone: bool = True
    ) -> bool:
        """Queue ``items`` (of one frame group; the caller holds the condition), waking the
        I/O thread if it has something new to do. True when the caller should send them
        itself: one message (``alone``) with nothing else queued or in flight and nothing
        to wait for (a blocking publish, or no linger)."""
        if self._outstanding + len(items) > self.max_buffered:
            self._wait_for_room(len(items))
        if self._closed:
            raise SpoolError("this Publisher is closed")
        # The I/O thread needs a wake-up only when there is something new for it to do:
        # a first message starts its linger clock, a full batch or a blocking publish
        # ends it. Waking it per message cost a syscall and a thread switch each.
        wake = not self._queued
        urgent = urgent or self._flushing > 0
        queue = add_to_group(self._groups, group, items)
        self._queued += len(items)
        self._outstanding += len(items)
        idle = (
            alone
            and (urgent or not self.linger)
            and self._queued == 1
            and not self._in_flight
            and self._conn is not None
        )
        if not self._urgent and (urgent or len(queue) >= self.batch_size):
            self._urgent = wake = True
        if idle:
            wake = False
        if wake:
            self._wake()
        return idle

    def set_next_sequence(self, sequence: int) -> None:
        """Give the next message published the idempotence sequence ``sequence`` (the
        Publisher numbers from 0 on its own). For a caller that numbers its own messages
        under a fixed ``producer_id``, such as a periodic job whose tick number is the
        sequence: the broker then stores each number once, whichever process sends it and
        however often. Messages published after it continue from ``sequence + 1``."""
        self._sequences = itertools.count(check_next_sequence(sequence))

    def _wait_for_room(self, count: int = 1) -> None:
        """Called with the condition held while the buffer has no room for ``count`` more
        messages (at most ``max_buffered``): wait until answers make room. Besides
        bounding memory, this keeps the objects a fast caller has queued few, which is
        what the garbage collector walks (an unbounded queue made it a fifth of a
        publishing process's CPU). Never waits in the I/O thread (a done
        callback that publishes), which is what makes the room."""
        if threading.current_thread() is self._thread:
            return
        deadline = time.monotonic() + self.delivery_timeout
        self._urgent = True  # what is queued goes out now rather than after its linger
        self._wake()
        while self._outstanding + count > self.max_buffered and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishTimeoutError(
                    f"no room for another message for {self.delivery_timeout} s: "
                    f"{self._outstanding} queued or unanswered (max_buffered)"
                )
            self._cond.wait(remaining)

    def _send_from_caller(self) -> bool:
        """Send the queue's frame from the caller's thread: a blocking ``publish``, or a
        ``publish_async`` with no linger, while the I/O thread has nothing in flight goes
        out without waking it (a thread switch and a wake-up byte less on the way to the
        broker; the I/O thread still reads the answer). False if it did not go (the I/O
        thread sends it then)."""
        conn = self._conn
        if conn is None or not self._send_lock.acquire(blocking=False):
            return False
        try:
            taken = self._take_frame(force=True)
            if taken is None:
                return True
            try:
                conn.send_bytes(taken)
            except OSError:
                return False  # the I/O thread finds the connection gone and resends
        finally:
            self._send_lock.release()
        return True

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
                lost_broker(logger, exc)
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
                groups: dict[_Group, deque[_PublishFuture]] = {}
                for _, (group, items) in sorted(self._in_flight.items()):  # frame order
                    groups.setdefault(group, deque()).extend(items)
                    self._queued += len(items)
                self._in_flight.clear()
                for group, queue in self._groups.items():
                    groups.setdefault(group, deque()).extend(queue)
                self._groups = groups
                self._urgent = True
            return

    def _oldest(self) -> float:
        """When the first message of the oldest group was queued (monotonic)."""
        queue = next(iter(self._groups.values()))
        return queue[0].deadline - self.delivery_timeout

    def _send_ready_frames(self) -> None:
        assert self._conn is not None
        while True:
            with self._send_lock:
                data = self._take_frame()
                if data is None:
                    return
                self._conn.send_bytes(data)

    def _take_frame(self, *, force: bool = False) -> bytes | None:
        """The next frame to send, taken from the queue, if one is due (``force``: even
        if it could linger). Caller holds the send lock."""
        with self._cond:
            if not self._queued or len(self._in_flight) >= self.max_in_flight:
                return None
            if (
                not force
                and not self._urgent
                and self._queued < self.batch_size
                and time.monotonic() - self._oldest() < self.linger
            ):
                return None
            group, queue = next(iter(self._groups.items()))
            count = min(len(queue), self.batch_size)
            bodies = [m.body for m in itertools.islice(queue, count)]
            count = frame_count(bodies)
            del bodies[count:]  # large records: the rest go in the next frame
            if count == len(queue):
                batch = list(queue)
                del self._groups[group]
            else:
                batch = [queue.popleft() for _ in range(count)]
            self._queued -= len(batch)
            if not self._queued:
                self._urgent = False
            self._frame_ids += 1
            frame_id = self._frame_ids
            acks, topic, partition = group
            if acks != "0":
                self._in_flight[frame_id] = (group, batch)
        data = encode_publish_frame(frame_id, acks, self.producer_id, topic, partition, bodies)
        if acks == "0":
            for item in batch:
                item.resolve(Position(topic, -1, -1, -1), None)
            self._done(len(batch))
        return data

    def _wait_and_read(self) -> None:
        assert self._conn is not None
        with self._cond:
            if self._queued and not self._urgent and len(self._in_flight) < self.max_in_flight:
                timeout: float | None = max(0.0, self.linger - (time.monotonic() - self._oldest()))
            else:
                timeout = 1.0
        conn_ready, woken = self._readiness.wait(self._conn, timeout)
        if woken:
            with contextlib.suppress(BlockingIOError, OSError):
                self._wake_read.recv(4096)
        while conn_ready:
            self._handle_reply(protocol.receive(self._conn))
            conn_ready, _ = self._readiness.wait(self._conn, 0)

    def _handle_reply(self, frame: dict[str, Any]) -> None:
        frame_id = frame.get("id")
        with self._cond:
            sent = self._in_flight.pop(frame_id, None) if isinstance(frame_id, int) else None
        if frame.get("op") == "error":
            error = error_from_code(str(frame.get("code")), str(frame.get("message")))
            if sent is None:
                raise OSError(f"the broker closed this connection: {error}")
            for item in sent[1]:
                item.resolve(None, error)
            self._done(len(sent[1]))
            return
        if sent is None:
            return
        (_, topic, _), batch = sent
        total = len(batch)
        partitions = frame.get("n")
        if type(partitions) is int and partitions > 0:
            self._partitions[topic] = partitions
        errors = frame.get("errors")
        ranges = frame.get("r") or ()
        if errors:
            batch = self._fail_errors(batch, errors)
        start = 0
        for entry in ranges:
            count = entry[3]
            where = (topic, entry[0], entry[2], len(entry) > 4 and entry[4] == 1)
            _resolve_stored(batch[start : start + count], where, entry[1])
            start += count
        if start < len(batch):  # a broker bug; never left waiting, never ACKed
            error = ProtocolError(f"the broker answered {start} of the {len(batch)} messages")
            for rest in batch[start:]:
                rest.resolve(None, error)
        self._done(total)

    @staticmethod
    def _fail_errors(batch: list[_PublishFuture], errors: dict[str, Any]) -> list[_PublishFuture]:
        """Fail the messages ``errors`` names (by index); the others, which the ranges
        cover in order."""
        left = []
        failed = answer_errors(errors)
        for index, item in enumerate(batch):
            error = failed.get(index)
            if error is None:
                left.append(item)
            else:
                item.resolve(None, error)
        return left

    def _done(self, count: int) -> None:
        """``count`` messages were answered: one lock and one notify per frame."""
        with self._cond:
            self._outstanding -= count
            self._cond.notify_all()

    def _expire(self) -> None:
        """Fail messages whose delivery timeout passed (never a false ACK: an error)."""
        now = time.monotonic()
        expired: list[tuple[str, _PublishFuture]] = []
        with self._cond:
            for group, queue in list(self._groups.items()):
                while queue and queue[0].deadline <= now:
                    expired.append((group[1], queue.popleft()))
                    self._queued -= 1
                if not queue:
                    del self._groups[group]
            for frame_id in [f for f, (_, ms) in self._in_flight.items() if ms[0].deadline <= now]:
                group, items = self._in_flight.pop(frame_id)
                expired.extend((group[1], item) for item in items)
        for topic, item in expired:
            item.resolve(None, expired_error(item.sequence, topic, self.delivery_timeout))
        if expired:
            self._done(len(expired))
