"""The asyncio clients: ``AsyncPublisher`` and ``AsyncConsumer``.

They speak the same wire protocol as the threaded ``Publisher`` and ``Consumer``
(docs/PROTOCOL.md) on an ``asyncio.Protocol`` (``client/aio_connection.py``): no thread,
no executor; every wait is an await on the event loop. Settings, their checks and the errors
raised are the threaded clients' (``client/common.py`` holds what both use).

``AsyncPublisher`` batches like ``Publisher``: messages queue per frame group (ACK level,
topic, partition when known), a frame of at most ``batch_size`` goes out when a blocking
``publish`` asks, when a group is full, or after ``linger_ms``; at most ``max_in_flight``
frames wait for answers. After a lost connection every unanswered frame is sent again with
the same producer id and sequences, so the broker stores each message once.

Cancellation of ``await pub.publish(...)`` (or of the future ``publish_nowait`` returned)
is decided by one fact, whether the message's frame was written to the connection yet:

* **not yet written** (it waits in the queue: lingering, ``max_in_flight`` frames already
  out, or the broker away): the message is dropped from the queue and is never sent, so it
  is never stored. ``CancelledError`` propagates.
* **written**: it cannot be called back; the publisher keeps it until the broker answers
  (resending it after a reconnect, as any sent message), so it is stored once (or refused,
  e.g. too large) and answered; ``flush()`` and leaving the ``async with`` wait for that
  answer. ``CancelledError`` propagates at once; the caller does not get the Position.
  Callers who need it publish with ``publish_nowait`` and ``asyncio.shield`` the future.

Neither client runs a reader task: the connection is an ``asyncio.Protocol`` that hands
each frame, as it arrives, to the client (answers resolve the publish futures; deliveries
go to the consumer's buffer, answers to its requests). ``async for msg in consumer`` takes
the messages in order; ``await msg.ack()`` waits for the broker's answer (``ack(wait=False)``
batches ACKs 100 to a frame, as the threaded ``run()``).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Any, Unpack

import orjson

from spoolmq import protocol
from spoolmq.client.aio_connection import FrameStream, connect
from spoolmq.client.common import (
    ReconnectClock,
    ack_batch,
    add_to_group,
    after_topic_deleted,
    amount,
    answer_errors,
    answer_ranges,
    batch_size,
    check_publisher_limits,
    check_run_limits,
    check_timeout,
    check_topics_left,
    consumer_topics,
    delivered_messages,
    encode_many,
    expired_error,
    frame_partition,
    handler_failure,
    lost_broker,
    numbered_bodies,
    pause_frame,
    producer_id_or_new,
    refusal_error,
    settle_acked,
    settle_frame,
    subscription_settings,
)
from spoolmq.client.connection import Address, resolve
from spoolmq.client.consumer import tag_runs
from spoolmq.client.delivered import DeliveredRecord
from spoolmq.config import known_settings
from spoolmq.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    PublishTimeoutError,
    SpoolError,
    UnknownDeliveryError,
    error_from_code,
)
from spoolmq.protocol.publish import (
    encode_publish_frame,
    encode_publish_message,
    frame_count,
)
from spoolmq.store.message import Position, PublishOptions, check_extension, normalize_acks

logger = logging.getLogger("spoolmq.client")

# Messages go out in frames of one ACK level, one topic and (when known) one partition.
_Group = tuple[str, str, int | None]

_LOST = (ConnectionError, OSError, EOFError)
"""What a lost connection raises: the broker stopped, restarted or closed it."""


class _Waker:
    """Tasks' waits for "something changed", each with its own bound: cheaper than
    ``asyncio.wait_for`` of an Event (no task per wait), which matters in a loop that
    waits once per frame. A task cancelled while waiting cancels only its own future."""

    __slots__ = ("_futures",)

    def __init__(self) -> None:
        self._futures: list[asyncio.Future[None]] = []

    def poke(self) -> None:
        futures, self._futures = self._futures, []
        for future in futures:
            _wake(future)

    async def wait(self, timeout: float | None) -> None:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._futures.append(future)
        timer = None if timeout is None else loop.call_later(max(0.0, timeout), _wake, future)
        try:
            await future
        finally:
            if timer is not None:
                timer.cancel()
            if not future.done():
                with contextlib.suppress(ValueError):
                    self._futures.remove(future)


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Queued:
    """One message to publish: its sequence, its record's bytes, when it times out
    (monotonic), the future its publisher waits on, and whether its frame was written."""

    __slots__ = ("body", "deadline", "future", "sent", "sequence")

    def __init__(
        self, sequence: int, body: bytes, deadline: float, future: asyncio.Future[Position]
    ) -> None:
        self.sequence, self.body, self.deadline, self.future = sequence, body, deadline, future
        self.sent = False


def _settle(future: asyncio.Future[Position], result: Position | None, error: Any) -> None:
    """Resolve a publish future unless it was cancelled (or already resolved)."""
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
        # Marked retrieved: a publish_nowait whose future nobody awaits must not log
        # "exception was never retrieved" at exit (the threaded Publisher's futures do not).
        future.exception()
    else:
        future.set_result(result)  # type: ignore[arg-type]


class AsyncPublisher:
    """Publishes to a broker from asyncio. ``async with AsyncPublisher(...) as pub`` connects
    and, on leaving, flushes and closes. The settings are the threaded Publisher's (see its
    docstring); ``max_buffered`` bounds the messages ``publish`` lets wait for an answer
    (it waits for room); ``publish_nowait`` never waits, so a caller of it bounds its own
    backlog by awaiting the futures (or ``flush``)."""

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
        self.client_id = ""
        self.reconnects = 0
        self._sequences = itertools.count()
        self._groups: dict[_Group, deque[_Queued]] = {}
        self._queued = 0  # messages in _groups
        self._outstanding = 0  # queued or in flight
        self._partitions: dict[str, int] = {}
        self._urgent = False
        self._frame_ids = 0
        self._in_flight: dict[int, tuple[_Group, list[_Queued]]] = {}
        self._stream: FrameStream | None = None
        self._writer: asyncio.Task[None] | None = None
        self._wake = _Waker()  # the writer task's wait
        self._answered = _Waker()  # flush() and publish() waiting for room
        self._started = False
        self._closed = False

    # -- the public API ----------------------------------------------------------------

    async def start(self) -> AsyncPublisher:
        """Connect (once, here, so a missing broker or a wrong key fails loudly now) and
        start the writer task; ``async with`` calls it."""
        if self._started:
            return self
        self._stream, self.client_id = await connect(
            self._address, self._authkey, "publisher", self.name
        )
        self._started = True
        self._listen(self._stream)
        self._writer = asyncio.create_task(self._write_loop(), name="spoolmq-aio-write")
        return self

    async def publish(
        self,
        topic: str,
        value: Any,
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> Position:
        """Publish one message and wait for its answer (see the module's docstring for what
        cancelling this does). ``options`` are the PublishOptions, as for Publisher."""
        if self._outstanding >= self.max_buffered:
            await self.wait_for_room()
        return await self._enqueue(topic, value, options, acks, urgent=True)

    def publish_nowait(
        self,
        topic: str,
        value: Any,
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> asyncio.Future[Position]:
        """Queue one message (batched with others) and return at once a future that
        resolves to its Position on the broker's answer. Bad input raises here."""
        return self._enqueue(topic, value, options, acks, urgent=False)

    async def publish_many(
        self,
        topic: str,
        values: Iterable[Any],
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> list[Position]:
        """Publish every value of ``values`` (the same ``options`` for each) and wait for
        all their answers: their Positions, in order. Every value is encoded before any is
        queued (a value that cannot be sent raises ``SerializationError`` naming its index,
        with none of them published); they are queued a frame's worth at a time, waiting
        for room in the buffer as ``publish`` does. A message the broker refuses raises its
        error here once all are answered; the others may be stored
        (``publish_many_nowait`` tells each one's fate). Cancelled, or failing to find room
        in time, it is as a cancelled ``publish`` for each message it queued: those not
        written yet are never sent (unlike the threaded ``publish_many_async``, which
        leaves them queued)."""
        group, bodies = self._encode_many(topic, values, options, acks)
        futures: list[asyncio.Future[Position]] = []
        try:
            step = min(self.batch_size, self.max_buffered)
            for start in range(0, len(bodies), step):
                chunk = bodies[start : start + step]
                if self._outstanding + len(chunk) > self.max_buffered:
                    await self._room_for(len(chunk))
                self._check_open()
                items = self._numbered(chunk)
                self._add(group, items, True)
                futures += [item.future for item in items]
            # Awaiting gather's future (not ``asyncio.wait``): cancelling this task cancels
            # it, and with it every message's future at once, as a cancelled ``publish``
            # does, so what is not written yet is never sent.
            answers = await asyncio.gather(*futures, return_exceptions=True)
        except BaseException:
            for future in futures:  # cancelled, timed out or closed while queueing: the same
                future.cancel()
            raise
        positions: list[Position] = []
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            positions.append(answer)
        return positions

    def publish_many_nowait(
        self,
        topic: str,
        values: Iterable[Any],
        *,
        acks: str | int | None = None,
        **options: Unpack[PublishOptions],
    ) -> list[asyncio.Future[Position]]:
        """Queue every value of ``values`` (the same ``options`` for each), as
        ``publish_nowait`` would one by one: a future per message, in order. Checked as
        ``publish_many``; like ``publish_nowait`` it does not wait for room (call
        ``wait_for_room`` now and then)."""
        group, bodies = self._encode_many(topic, values, options, acks)
        items = self._numbered(bodies)
        self._add(group, items, False)
        return [item.future for item in items]

    async def flush(self, timeout: float | None = None) -> None:
        """Wait until every message queued so far is answered (or failed)."""
        check_timeout(timeout)  # also when nothing waits: the mistake is the caller's
        if not self._outstanding:
            return
        self._urgent = True
        self._wake.poke()
        deadline = None if timeout is None else time.monotonic() + timeout
        while self._outstanding:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise PublishTimeoutError(f"{self._outstanding} message(s) still unanswered")
            await self._answered.wait(remaining)

    async def close(self) -> None:
        """Flush (up to ``delivery_timeout``), say bye and close the connection."""
        if self._closed:
            return
        try:
            if self._started:
                await self.flush(self.delivery_timeout)
        finally:
            self._closed = True
            if self._writer is not None:
                self._writer.cancel()
                with contextlib.suppress(asyncio.CancelledError, *_LOST):
                    await self._writer
            stream, self._stream = self._stream, None
            if stream is not None:
                with contextlib.suppress(*_LOST):
                    stream.write(protocol.encode({"op": "bye"}))
                stream.close()
                await stream.wait_closed()

    async def __aenter__(self) -> AsyncPublisher:
        return await self.start()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- queueing -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed or not self._started:
            raise SpoolError(
                "this AsyncPublisher is closed"
                if self._closed
                else "start() it first (or use it in `async with`)"
            )

    def _enqueue(
        self,
        topic: str,
        value: Any,
        options: PublishOptions,
        acks: str | int | None,
        *,
        urgent: bool,
    ) -> asyncio.Future[Position]:
        self._check_open()
        level = self.acks if acks is None else normalize_acks(acks)
        sequence = next(self._sequences)
        body, key, partition = encode_publish_message(
            topic, value, options, sequence=sequence, producer_id=self.producer_id
        )
        partition = frame_partition(topic, key, partition, self._partitions)
        future: asyncio.Future[Position] = asyncio.get_running_loop().create_future()
        deadline = time.monotonic() + self.delivery_timeout
        self._add((level, topic, partition), [_Queued(sequence, body, deadline, future)], urgent)
        return future

    def _encode_many(
        self,
        topic: str,
        values: Iterable[Any],
        options: PublishOptions,
        acks: str | int | None,
    ) -> tuple[_Group, list[bytes]]:
        """A ``publish_many``'s frame group and its record bodies, not numbered yet."""
        self._check_open()
        level = self.acks if acks is None else normalize_acks(acks)
        partition, bodies = encode_many(topic, values, options, self._partitions)
        return (level, topic, partition), bodies

    def _numbered(self, bodies: Sequence[bytes]) -> list[_Queued]:
        """Messages to queue now: the bodies with the next sequences, and their futures."""
        deadline = time.monotonic() + self.delivery_timeout
        loop = asyncio.get_running_loop()
        return [
            _Queued(sequence, body, deadline, loop.create_future())
            for sequence, body in numbered_bodies(
                bodies, self._sequences, orjson.dumps(self.producer_id)
            )
        ]

    def _add(self, group: _Group, items: list[_Queued], urgent: bool) -> None:
        """Queue ``items`` of one frame group, waking the writer if it has something new
        to do: a first message starts its linger clock; a blocking publish or a full batch
        ends it."""
        if not items:
            return  # an empty deque left in ``_groups`` would break ``_oldest``
        queue = add_to_group(self._groups, group, items)
        self._queued += len(items)
        self._outstanding += len(items)
        if urgent or len(queue) >= self.batch_size:
            self._urgent = True
            self._wake.poke()
        elif self._queued == len(items):
            self._wake.poke()

    @property
    def outstanding(self) -> int:
        """Messages queued or sent and not answered yet."""
        return self._outstanding

    async def wait_for_room(self) -> None:
        """Wait while ``max_buffered`` messages are queued or unanswered (at most
        ``delivery_timeout``, then PublishTimeoutError): ``publish`` does, so a caller
        faster than the broker is slowed down; a loop of ``publish_nowait`` calls it now
        and then to bound its backlog the same way. With room it returns at once, but
        after one turn of the event loop, so the writer and reader tasks run."""
        await self._room_for(1)

    async def _room_for(self, count: int) -> None:
        """``wait_for_room`` for ``count`` messages (at most ``max_buffered``)."""
        if self._outstanding + count <= self.max_buffered:
            await asyncio.sleep(0)
            return
        deadline = time.monotonic() + self.delivery_timeout
        self._urgent = True  # what is queued goes out now rather than after its linger
        self._wake.poke()
        while self._outstanding + count > self.max_buffered and not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise PublishTimeoutError(
                    f"no room for another message for {self.delivery_timeout} s: "
                    f"{self._outstanding} queued or unanswered (max_buffered)"
                )
            await self._answered.wait(remaining)

    def _done(self, count: int) -> None:
        """``count`` messages were answered (or dropped): wake who waits for that, and the
        writer, which may send again (fewer frames in flight)."""
        self._outstanding -= count
        self._answered.poke()
        self._wake.poke()

    # -- the writer task ------------------------------------------------------------------

    async def _write_loop(self) -> None:
        while True:
            if self._stream is None:
                await self._reconnect()
                continue
            stream = self._stream
            try:
                self._send_due(stream)
                await stream.drain()
            except _LOST as exc:
                self._lost(stream, exc)
                continue
            self._expire()
            await self._wake.wait(self._next_wait())

    def _next_wait(self) -> float:
        """How long the writer may sleep: until the oldest queued message's linger ends,
        or a second (to expire messages past their timeout)."""
        if self._queued and len(self._in_flight) < self.max_in_flight and not self._urgent:
            return max(0.0, self.linger - (time.monotonic() - self._oldest()))
        return 1.0

    def _oldest(self) -> float:
        """When the oldest group's first message was queued (monotonic)."""
        queue = next(iter(self._groups.values()))
        return queue[0].deadline - self.delivery_timeout

    def _send_due(self, stream: FrameStream) -> None:
        """Write every frame that is due now (into the transport's buffer: no wait)."""
        while self._queued and len(self._in_flight) < self.max_in_flight:
            if (
                not self._urgent
                and self._queued < self.batch_size
                and time.monotonic() - self._oldest() < self.linger
            ):
                return
            frame = self._take_frame()
            if frame is not None:
                stream.write(frame)
        if not self._queued:
            self._urgent = False

    def _take_frame(self) -> bytes | None:
        """The next frame from the oldest group, its messages marked sent; None if every
        message taken had been cancelled before it was sent (they are dropped)."""
        group, queue = next(iter(self._groups.items()))
        batch: list[_Queued] = []
        dropped = 0
        while queue and len(batch) < self.batch_size:
            item = queue.popleft()
            if item.future.cancelled() and not item.sent:
                dropped += 1  # cancelled before it went out: never sent, never stored
                continue
            batch.append(item)
        bodies = [m.body for m in batch]
        count = frame_count(bodies)
        if count < len(batch):  # large records
            queue.extendleft(reversed(batch[count:]))  # the next frame's, first in line
            del batch[count:], bodies[count:]
        if not queue:
            del self._groups[group]
        self._queued -= len(batch) + dropped
        if dropped:
            self._done(dropped)
        if not batch:
            return None
        self._frame_ids += 1
        frame_id = self._frame_ids
        acks, topic, partition = group
        for item in batch:
            item.sent = True
        data = encode_publish_frame(frame_id, acks, self.producer_id, topic, partition, bodies)
        if acks == "0":  # no answer comes: done once written
            for item in batch:
                _settle(item.future, Position(topic, -1, -1, -1), None)
            self._done(len(batch))
        else:
            self._in_flight[frame_id] = (group, batch)
        return data

    def _lost(self, stream: FrameStream, exc: BaseException) -> None:
        if stream is not self._stream:
            return  # an old connection's reader ending late
        lost_broker(logger, exc)
        stream.close()
        self._stream = None
        self._wake.poke()

    async def _reconnect(self) -> None:
        """Connect again (backing off up to a second between tries), then put every
        unanswered frame back at the front of the queue, oldest first: the same producer id
        and sequences, so what the broker stored before it went away is not stored twice."""
        delay = 0.05
        while True:
            self._expire()
            if not self._outstanding:
                await self._wake.wait(1.0)  # nothing to send: reconnect when there is
                continue
            try:
                stream, self.client_id = await connect(
                    self._address, self._authkey, "publisher", self.name
                )
            except (SpoolError, *_LOST) as exc:
                logger.debug("reconnect failed: %s", exc)
                await asyncio.sleep(delay)  # backoff: nothing to wait on until it is back
                delay = min(delay * 2, 1.0)
                continue
            break
        self.reconnects += 1
        groups: dict[_Group, deque[_Queued]] = {}
        for _, (group, items) in sorted(self._in_flight.items()):  # frame order
            groups.setdefault(group, deque()).extend(items)
            self._queued += len(items)
        self._in_flight.clear()
        for group, queue in self._groups.items():
            groups.setdefault(group, deque()).extend(queue)
        self._groups = groups
        self._urgent = True
        self._stream = stream
        self._listen(stream)

    def _expire(self) -> None:
        """Fail messages whose delivery timeout passed (never a false ACK: an error)."""
        now = time.monotonic()
        expired: list[tuple[str, _Queued]] = []
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
            _settle(item.future, None, expired_error(item.sequence, topic, self.delivery_timeout))
        if expired:
            self._done(len(expired))

    # -- answers: called by the event loop as they arrive ---------------------------------

    def _listen(self, stream: FrameStream) -> None:
        stream.take_frames(
            lambda data: self._handle_reply(protocol.decode(data)),
            lambda exc: self._lost(stream, exc),
        )

    def _handle_reply(self, frame: dict[str, Any]) -> None:
        frame_id = frame.get("id")
        sent = self._in_flight.pop(frame_id, None) if isinstance(frame_id, int) else None
        if frame.get("op") == "error":
            error = error_from_code(str(frame.get("code")), str(frame.get("message")))
            if sent is None:
                raise EOFError(f"the broker closed this connection: {error}")
            for item in sent[1]:
                _settle(item.future, None, error)
            self._done(len(sent[1]))
            return
        if sent is None:
            return
        (_, topic, _), batch = sent
        partitions = frame.get("n")
        if type(partitions) is int and partitions > 0:
            self._partitions[topic] = partitions
        failed = answer_errors(frame.get("errors"))
        stored = batch
        if failed:
            stored = []
            for index, item in enumerate(batch):
                refused = failed.get(index)
                if refused is None:
                    stored.append(item)
                else:
                    _settle(item.future, None, refused)
        ranges, missing = answer_ranges(frame, len(batch), len(failed))
        start = 0
        for count, partition, offset, timestamp, duplicate in ranges:
            for step, item in enumerate(stored[start : start + count]):
                position = Position(topic, partition, offset + step, timestamp, duplicate)
                _settle(item.future, position, None)
            start += count
        for item in stored[start:]:  # a broker bug: never left waiting, never taken as stored
            _settle(item.future, None, missing)
        self._done(len(batch))


class AsyncReceivedMessage(DeliveredRecord):
    """A message an AsyncConsumer received; settle it with ``await msg.ack()``,
    ``await msg.nack(...)``, and keep it longer with ``await msg.extend_lease(s)``."""

    __slots__ = ()
    _consumer: AsyncConsumer

    async def ack(self, *, wait: bool = True) -> None:
        """Acknowledge: the message is done. With ``wait`` (the default) the broker's answer
        is awaited and a refused ACK (lease expired) raises LeaseExpiredError; without, the
        ACK joins the next frame of ACKs (100 to a frame, or when the consumer waits)."""
        if wait:
            await self._consumer._settle(self, "ack", wait=True)
        else:
            self._consumer._ack_later(self)  # no second coroutine: the common case

    async def nack(
        self, delay: float | None = None, reason: str | None = None, *, wait: bool = True
    ) -> None:
        """Give the message back for a retry, after ``delay`` seconds (default: backoff)."""
        await self._consumer._settle(self, "nack", wait=wait, delay=delay, reason=reason)

    async def extend_lease(self, seconds: float) -> None:
        """Keep the message for ``seconds`` more from now."""
        await self._consumer._extend(self, seconds)

    extend = extend_lease


AsyncHandler = Callable[[AsyncReceivedMessage], Awaitable[Any] | Any]


class AsyncConsumer:
    """A member of a consumer group, for asyncio. ``async with AsyncConsumer(...) as c``
    connects and subscribes; ``async for msg in c`` receives. The settings are the
    threaded Consumer's (see its docstring)."""

    @known_settings
    def __init__(
        self,
        topics: str | Sequence[str],
        group: str,
        *,
        data: str | os.PathLike[str] | None = None,
        address: Address | None = None,
        authkey: bytes | None = None,
        prefetch: int = 1,
        auto_ack: bool = False,
        filter: Mapping[str, Any] | None = None,
        limits: Mapping[str, Mapping[str, Any]] | None = None,
        start: str = "earliest",
        lease: float = 30.0,
        max_deliveries: int = 5,
        retry_backoff: float = 1.0,
        retry_backoff_max: float = 60.0,
        reconnect_timeout: float = 60.0,
        handler: AsyncHandler | None = None,
        name: str = "",
    ) -> None:
        self.topics = consumer_topics(topics)
        self.group = group
        self.prefetch = prefetch
        self.auto_ack = auto_ack
        self.start = start
        self.handler = handler
        self.name = name
        self.reconnect_timeout = amount(reconnect_timeout, "reconnect_timeout")
        self._settings = subscription_settings(
            lease=lease,
            max_deliveries=max_deliveries,
            retry_backoff=retry_backoff,
            retry_backoff_max=retry_backoff_max,
            auto_ack=auto_ack,
            filter=filter,
            limits=limits,
        )
        self._address, self._authkey, _ = resolve(data, address, authkey)
        self._buffer: deque[AsyncReceivedMessage] = deque()
        self._arrived = _Waker()  # receive()'s wait for deliveries (or a lost connection)
        self._requests: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._frame_ids = 0
        self._generation = 0
        self._taken = 0
        self._paused = False  # pause(): the broker pushes nothing until resume()
        self._closed = False
        self.consumer_id = ""
        self.client_id = ""
        self.refused: list[dict[str, Any]] = []
        self.deleted_topics: set[str] = set()  # deleted while this consumer ran
        self._acks: list[int] = []
        self._unsettled: set[int] = set()
        self._stream: FrameStream | None = None
        self._reconnects = ReconnectClock()

    # -- connection -------------------------------------------------------------------------

    async def open(self) -> AsyncConsumer:
        """Connect and subscribe (``async with`` calls it); errors as Consumer's."""
        if self._stream is None:
            await self._open()
        return self

    async def _open(self) -> None:
        stream, self.client_id = await connect(self._address, self._authkey, "consumer", self.name)
        self._stream = stream
        self._generation += 1
        self._buffer.clear()
        self._acks.clear()  # deliveries of the old connection are void
        self._unsettled.clear()
        self._taken = 0
        stream.take_frames(self._take_frame, lambda exc: self._lost(stream, exc))
        try:
            reply = await self._request(
                {
                    "op": "subscribe",
                    "group": self.group,
                    "topics": self.topics,
                    "prefetch": self.prefetch,
                    "start": self.start,
                    "settings": self._settings,
                }
            )
            if self._paused:  # a reconnect keeps a pause: what it pushed meanwhile goes back
                await self._request(pause_frame(self.auto_ack, ()))
                if not self.auto_ack:  # (an auto_ack consumer's are final: it keeps them)
                    self._buffer.clear()
        except BaseException:
            self._drop(stream)
            raise
        self.consumer_id = str(reply.get("consumer_id"))

    async def _reconnect(self, until: float | None) -> None:
        """Try to reach the broker again until connected or until ``until`` (monotonic; a
        ``receive``'s timeout), as Consumer does. Raises BrokerUnavailableError once
        ``reconnect_timeout`` has passed since the loss."""
        while True:
            try:
                await self._open()
            except (BrokerUnavailableError, *_LOST) as exc:
                pause = self._reconnects.pause(exc, until, self.reconnect_timeout)
            else:
                self._reconnects.back()
                logger.info("reconnected to the broker as %s", self.consumer_id)
                return
            if pause is None:
                return
            await asyncio.sleep(pause)  # backoff: nothing to wait on until it is back

    def _drop(self, stream: FrameStream, error: BaseException | None = None) -> None:
        """Forget a connection: its requests fail, its deliveries are void (the broker
        redelivers them), and a waiting ``receive`` wakes to reconnect."""
        if stream is not self._stream:
            return
        self._stream = None
        self._reconnects.lost()
        stream.close()
        requests, self._requests = self._requests, {}
        for future in requests.values():
            if not future.done():
                future.set_exception(
                    error if isinstance(error, SpoolError) else EOFError("lost the broker")
                )
        self._arrived.poke()

    def _take_frame(self, data: bytes) -> None:
        """Each frame from the broker, as it arrives (the event loop calls this):
        deliveries to the buffer, answers to their requests. What it raises ends the
        connection (``_lost``)."""
        frame, lines = protocol.split_frame(data)
        op = frame["op"]
        if op == "deliver":
            self._buffer.extend(
                delivered_messages(AsyncReceivedMessage, self, self._generation, frame, lines)
            )
            self._arrived.poke()
            return
        if op == "closing":
            raise EOFError("the broker is shutting down")
        if op == "topic_deleted":
            topic = str(frame.get("topic"))
            self.deleted_topics.add(topic)
            self.topics, self._buffer = after_topic_deleted(topic, self.topics, self._buffer)
            self._arrived.poke()  # a receive waiting on that topic alone must hear of it
            return
        frame_id = frame.get("id")
        if frame_id is None:
            if op == "error":
                raise error_from_code(str(frame.get("code")), str(frame.get("message")))
            for refusal in frame.get("refused") or []:
                self.refused.append(refusal)
                logger.warning(
                    "the broker refused %s: %s", refusal.get("tag"), refusal.get("message")
                )
            return
        future = self._requests.pop(frame_id, None)
        if future is not None and not future.done():
            future.set_result(frame)

    def _lost(self, stream: FrameStream, exc: BaseException) -> None:
        if not isinstance(exc, _LOST):  # a broker's error without id, or a bad frame
            logger.warning("the broker connection failed: %s", exc)
        self._drop(stream, exc)

    async def _request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a frame with an id and wait for its answer (EOFError if the connection
        is lost first; the error class of an error answer)."""
        stream = self._stream
        if stream is None:
            raise EOFError("not connected")
        self._flush_acks()
        self._frame_ids += 1
        frame_id = frame["id"] = self._frame_ids
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._requests[frame_id] = future
        stream.write(protocol.encode(frame))
        await stream.drain()
        reply = await future
        protocol.raise_if_error(reply)
        return reply

    # -- receiving ----------------------------------------------------------------------

    async def receive(self, timeout: float | None = None) -> AsyncReceivedMessage | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever; 0: one turn
        of the event loop, for what has arrived); while the broker is away the wait is
        spent reconnecting, and it still ends on time."""
        if self._closed:
            raise SpoolError("this AsyncConsumer is closed")
        check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        looked = False
        # Paused, a buffered message may be one the broker is taking back (auto_ack
        # consumers' are final: those are still handed out).
        while not self._buffer or (self._paused and not self.auto_ack):
            check_topics_left(self.topics, self.deleted_topics)
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                if looked:
                    return None
                # timeout=0: one turn of the event loop, whose reading of the socket
                # comes first, for what has arrived (a receive(0) loop took nothing, and
                # never let the loop read).
                remaining = 0.0
            looked = True  # (a timeout of 0 without a connection: one try to reconnect)
            if self._stream is None:
                await self._reconnect(deadline)
                continue
            try:
                self._flush_acks()  # about to wait: the broker may be waiting for these
                self._flush_credit()
            except _LOST as exc:
                self._drop(self._stream, exc)
                continue
            await self._arrived.wait(remaining)
        message = self._buffer.popleft()
        if not self.auto_ack:
            self._unsettled.add(message.tag)
        else:
            self._taken += 1
            # As Consumer: refill ahead only while messages are still buffered.
            if self._buffer and self._taken >= max(1, self.prefetch // 2):
                self._flush_credit()
        return message

    async def receive_many(
        self, max_messages: int = 100, timeout: float | None = None
    ) -> list[AsyncReceivedMessage]:
        """As :meth:`Consumer.receive_many`: up to ``max_messages`` messages, waiting up to
        ``timeout`` for the first and not for the rest; ``[]`` when the time is up."""
        count = batch_size(max_messages)
        first = await self.receive(timeout)
        if first is None:
            return []
        buffer = self._buffer
        more = min(len(buffer), count - 1)
        if more <= 0 or (self._paused and not self.auto_ack):
            return [first]
        popleft = buffer.popleft
        batch = [first, *[popleft() for _ in range(more)]]
        if not self.auto_ack:
            self._unsettled.update([message.tag for message in batch])
        else:
            self._taken += more
            if buffer and self._taken >= max(1, self.prefetch // 2):  # as receive
                self._flush_credit()
        return batch

    async def ack_many(
        self, messages: Iterable[AsyncReceivedMessage], *, wait: bool = True
    ) -> None:
        """As :meth:`Consumer.ack_many`: every one of ``messages`` ACKed in one frame; with
        ``wait``, refusals raise the first one's error after the rest are ACKed."""
        live, tags = ack_batch(self, messages, connected=self._stream is not None)
        if not tags:
            return
        try:
            if wait:
                reply = await self._request({"op": "ack", "runs": tag_runs(tags)})
            else:
                reply = None
                self._acks += tags
                if len(self._acks) >= 100:
                    self._flush_acks()
        except _LOST:
            raise UnknownDeliveryError(
                "lost the broker before it confirmed; the messages will be redelivered"
            ) from None
        settle_acked(live, tags, reply, self._unsettled)

    async def pause(self) -> int:
        """As :meth:`Consumer.pause`: take nothing more until :meth:`resume`; what was
        pushed ahead and not handed out goes back at once, unattempted. Returns how many
        messages went back."""
        if self._closed:
            raise SpoolError("this AsyncConsumer is closed")
        self._paused = True
        if self._stream is None:
            return 0  # the reconnect pauses the new subscription
        try:
            reply = await self._request(pause_frame(self.auto_ack, self._unsettled))
        except _LOST:
            return 0  # _drop ran: the reconnect pauses the new subscription
        if not self.auto_ack:
            self._buffer.clear()  # each of them was given back (and nothing came after)
        return int(reply.get("released") or 0)

    async def resume(self) -> None:
        """Take messages again after :meth:`pause`."""
        if self._closed:
            raise SpoolError("this AsyncConsumer is closed")
        self._paused = False
        self._arrived.poke()  # a receive waiting out the pause looks at the buffer again
        if self._stream is not None:
            with contextlib.suppress(*_LOST):  # the reconnect subscribes afresh, unpaused
                await self._request({"op": "resume"})

    def __aiter__(self) -> AsyncConsumer:
        return self

    async def __anext__(self) -> AsyncReceivedMessage:
        while True:
            message = await self.receive()
            if message is not None:
                return message

    async def run(
        self,
        handler: AsyncHandler | None = None,
        *,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        """Call ``handler`` (a coroutine function or a plain one) for each message: ACK
        when it returns, NACK with the error as the reason when it raises; as
        Consumer.run. Returns how many messages it handled."""
        handle = handler or self.handler
        if handle is None:
            raise InvalidArgumentError("run() needs a handler")
        check_run_limits(max_messages, idle_timeout)
        handled = 0
        while (max_messages is None or handled < max_messages) and not self._closed_now():
            message = await self.receive(idle_timeout)
            if message is None:
                break
            failure: Exception | None = None
            try:
                result = handle(message)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:  # the handler's failure is the message's failure
                failure = exc
            if self._closed_now():  # closed by another task meanwhile: redelivered
                break
            if not self.auto_ack and not message.settled:
                if failure is None:
                    await message.ack(wait=False)
                else:
                    await message.nack(reason=handler_failure(failure), wait=False)
            handled += 1
        return handled

    def _closed_now(self) -> bool:
        """Whether close() has run, maybe in another task since this one looked."""
        return self._closed

    # -- settling -------------------------------------------------------------------------

    def _check_settle(self, message: AsyncReceivedMessage) -> None:
        if self.auto_ack:
            raise InvalidArgumentError("an auto_ack consumer does not ack or nack")
        if message.settled:
            raise InvalidArgumentError(f"{message!r} was already acknowledged or nacked")
        if self._closed:
            raise SpoolError("this AsyncConsumer is closed: its messages go back to the group")
        if message._generation != self._generation or self._stream is None:
            raise UnknownDeliveryError(
                "the connection this message came on was lost; the broker redelivers it"
            )

    async def _settle(
        self,
        message: AsyncReceivedMessage,
        op: str,
        *,
        wait: bool,
        delay: float | None = None,
        reason: str | None = None,
    ) -> None:
        self._check_settle(message)
        if message.topic in self.deleted_topics:
            message.settled = True  # its topic is gone: nothing to settle
            self._unsettled.discard(message.tag)
            return
        frame = settle_frame(op, message.tag, delay, reason)
        try:
            if wait:
                refusal = refusal_error(await self._request(frame))
                if refusal is not None:
                    raise refusal
            else:
                self._write(frame)
        except _LOST:
            raise UnknownDeliveryError(
                "lost the broker before it confirmed; the message will be redelivered"
            ) from None
        message.settled = True
        self._unsettled.discard(message.tag)

    def _ack_later(self, message: AsyncReceivedMessage) -> None:
        """``ack(wait=False)``: the tag joins the next ACK frame's runs."""
        self._check_settle(message)
        if message.topic not in self.deleted_topics:
            self._acks.append(message.tag)
        message.settled = True
        self._unsettled.discard(message.tag)
        if len(self._acks) >= 100:
            self._flush_acks_or_raise()

    async def _extend(self, message: AsyncReceivedMessage, seconds: float) -> None:
        check_extension(seconds)
        if message._generation != self._generation or self._stream is None:
            raise UnknownDeliveryError("the connection this message came on was lost")
        try:
            reply = await self._request({"op": "extend", "tags": [message.tag], "seconds": seconds})
        except _LOST:
            raise UnknownDeliveryError("lost the broker before it confirmed") from None
        refusal = refusal_error(reply)
        if refusal is not None:
            raise refusal

    def _flush_acks_or_raise(self) -> None:
        try:
            self._flush_acks()
        except _LOST:
            raise UnknownDeliveryError(
                "lost the broker before it confirmed; the message will be redelivered"
            ) from None

    def _flush_acks(self) -> None:
        if self._acks and self._stream is not None:
            tags, self._acks = self._acks, []
            self._write({"op": "ack", "runs": tag_runs(tags)})

    def _flush_credit(self) -> None:
        if self._taken:
            self._write({"op": "credit", "n": self._taken})
            self._taken = 0

    def _write(self, frame: dict[str, Any]) -> None:
        if self._stream is not None:
            self._stream.write(protocol.encode(frame))

    async def close(self) -> None:
        """Send the pending ACKs and ``bye`` (the deliveries handed out and not settled
        are redelivered as failed attempts, the prefetched ones returned unread), close."""
        if self._closed:
            return
        self._closed = True
        stream = self._stream
        if stream is not None:
            with contextlib.suppress(*_LOST):
                self._flush_acks()
                stream.write(protocol.encode({"op": "bye", "seen": sorted(self._unsettled)}))
                await stream.drain()
            self._stream = None
            stream.close()
            await stream.wait_closed()

    async def __aenter__(self) -> AsyncConsumer:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
