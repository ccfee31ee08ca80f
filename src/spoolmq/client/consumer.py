"""The Consumer client: registers with a group and receives the messages the broker pushes.

Iterate over it, or give it a handler. At-least-once by default: ``msg.ack()`` after the
work is done (``msg.nack()`` to retry, ``msg.extend_lease()`` for long work); with
``auto_ack=True`` every message is final once it is sent (at-most-once). A lost broker
connection is re-established and the subscription renewed; messages received on the old
connection are redelivered by the broker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

from spoolmq import protocol
from spoolmq.client.common import (
    ReconnectClock,
    ack_batch,
    after_topic_deleted,
    amount,
    batch_size,
    check_run_limits,
    check_timeout,
    check_topics_left,
    consumer_topics,
    delivered_messages,
    handler_failure,
    lost_broker,
    pause_frame,
    refusal_error,
    settle_acked,
    settle_frame,
    subscription_settings,
)
from spoolmq.client.connection import Address, Readiness, connect, resolve
from spoolmq.client.delivered import DeliveredRecord
from spoolmq.config import known_settings
from spoolmq.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    SpoolError,
    UnknownDeliveryError,
    error_from_code,
)
from spoolmq.store.message import check_extension

logger = logging.getLogger("spoolmq.client")


class ReceivedMessage(DeliveredRecord):
    """A delivered message (see DeliveredRecord) and the Consumer that settles it."""

    __slots__ = ()
    _consumer: Consumer

    def ack(self, *, wait: bool = True) -> None:
        """Acknowledge: the message is done. With ``wait`` (the default) the broker's answer
        is awaited and a refused ACK (lease expired) raises LeaseExpiredError."""
        consumer = self._consumer
        if wait or not consumer._try_ack_later(self):
            consumer._settle(self, "ack", wait=wait)

    def nack(
        self, delay: float | None = None, reason: str | None = None, *, wait: bool = True
    ) -> None:
        """Give the message back for a retry, after ``delay`` seconds (default: backoff)."""
        self._consumer._settle(self, "nack", wait=wait, delay=delay, reason=reason)

    def extend_lease(self, seconds: float) -> None:
        """Keep the message for ``seconds`` more from now."""
        self._consumer._extend(self, seconds)


class Consumer:
    """A member of a consumer group.

    Args:
        topics: a topic name or a list of them.
        group: the consumer group; every group sees every message.
        data, address, authkey: where the broker is (as for Publisher).
        prefetch: messages the broker may push ahead of ACKs (default 1).
        auto_ack: at-most-once delivery: no ACKs, nothing is redelivered.
        filter: ``{"tags": [...], "headers": {...}}``; only matching messages are delivered.
        limits: per topic, ``{"emails": {"rate": "50/s", "concurrency": 4}}``: the group
            gets at most 50 deliveries of ``emails`` in any one second (``/m``, ``/h``:
            minute, hour) and holds at most 4 in flight, across all its consumers.
        start: where a group with no committed position begins: ``"earliest"`` or ``"latest"``.
        lease: seconds a delivery is reserved for this consumer before it is redelivered.
        max_deliveries: attempts before a message goes to ``<topic>.dlq``.
        retry_backoff, retry_backoff_max: seconds of exponential backoff after a NACK.
        reconnect_timeout: how long to keep trying to reach a broker that went away,
            counted from the loss across ``receive`` calls; then ``receive`` raises
            BrokerUnavailableError.
    """

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
        handler: Callable[[ReceivedMessage], Any] | None = None,
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
        self._buffer: deque[ReceivedMessage] = deque()
        self._frame_ids = 0
        self._generation = 0
        self._taken = 0
        self._closed = False
        self._stop_run = False  # _request_stop(): run() returns after the message in hand
        self._paused = False  # pause(): the broker pushes nothing until resume()
        self.consumer_id = ""
        self.refused: list[dict[str, Any]] = []
        self.deleted_topics: set[str] = set()  # deleted while this consumer ran
        self._acks: list[int] = []  # ACKs made with wait=False, sent as runs 100 to a frame
        self._unsettled: set[int] = set()  # tags handed to the application, not settled
        self._conn: Connection | None = None
        self._reconnects = ReconnectClock()
        # wakeup(): a byte on this pipe ends a wait in receive() (from any thread).
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_read, False)
        os.set_blocking(self._wake_write, False)
        self._woken = False
        self._readiness = Readiness(self._wake_read)
        self._wake_lock = threading.Lock()  # wakeup() never writes to a closed descriptor
        # Connect once in the caller, as Publisher does, so a missing broker or a wrong key
        # fails loudly here instead of after reconnect_timeout; reconnects are for a broker
        # that went away later.
        self._open()

    # -- connection -----------------------------------------------------------------------

    def _open(self) -> None:
        conn, self.client_id = connect(self._address, self._authkey, "consumer", self.name)
        self._conn = conn
        self._generation += 1
        self._buffer.clear()
        self._acks.clear()  # deliveries of the old connection are void
        self._unsettled.clear()
        self._taken = 0
        reply = self._request(
            {
                "op": "subscribe",
                "group": self.group,
                "topics": self.topics,
                "prefetch": self.prefetch,
                "start": self.start,
                "settings": self._settings,
            }
        )
        self.consumer_id = str(reply.get("consumer_id"))
        if self._paused:  # a reconnect keeps a pause: what it pushed meanwhile goes back
            self._request(pause_frame(self.auto_ack, ()))
            if not self.auto_ack:  # (an auto_ack consumer's are final: it keeps them)
                self._buffer.clear()

    def _request_stop(self) -> None:
        """Make ``run`` return after the message in hand is settled (and a waiting
        ``receive`` return now): a gentler stop than close() from another thread."""
        self._stop_run = True
        self.wakeup()

    def _closed_now(self) -> bool:
        """Whether close() has run, maybe in another thread since this one looked."""
        return self._closed

    def _drop(self) -> None:
        """Forget a lost connection; the next ``receive`` reconnects."""
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.close()
        self._conn = None
        self._reconnects.lost()

    def _reconnect(self, until: float | None) -> None:
        """Try to reach the broker again until connected, until ``until`` (monotonic; a
        ``receive``'s timeout), or until ``wakeup`` is called, whichever is first: a
        caller waiting for a broker that is gone can still stop. Raises
        BrokerUnavailableError once ``reconnect_timeout`` has passed since the loss."""
        self._drop()
        while not self._closed_now():  # closed from another thread: no new connection
            try:
                self._open()
            except (BrokerUnavailableError, OSError, EOFError) as exc:
                if self._closed_now():  # closed meanwhile: its wake-up pipe is gone too
                    return
                pause = self._reconnects.pause(exc, until, self.reconnect_timeout)
            else:
                if self._closed_now():  # closed while this one was being made
                    self._drop()
                    return
                self._reconnects.back()
                logger.info("reconnected to the broker as %s", self.consumer_id)
                return
            # Backoff, ended early by wakeup(): there is nothing else to wait on.
            try:
                woken = pause is None or bool(wait([self._wake_read], pause))
            except (OSError, ValueError):  # the pipe closed by close() in another thread
                return
            if woken:
                if pause is not None:
                    self._drain_wakeups()
                return

    def _request(self, frame: dict[str, Any]) -> dict[str, Any]:
        """Send a frame with an id and read until its answer (buffering deliveries)."""
        assert self._conn is not None
        self._flush_acks()
        self._frame_ids += 1
        frame_id = self._frame_ids
        frame["id"] = frame_id
        protocol.send(self._conn, frame)
        while True:
            reply = self._read_frame()
            if reply is not None and reply.get("id") == frame_id:
                protocol.raise_if_error(reply)
                return reply

    def _read_frame(self) -> dict[str, Any] | None:
        """Read one frame (waiting for it); deliveries go to the buffer (and None is
        returned)."""
        conn = self._conn
        if conn is None:  # closed by close() in another thread
            raise EOFError("this Consumer is closed")
        frame, lines = protocol.split_frame(conn.recv_bytes(protocol.MAX_FRAME_BYTES))
        op = frame["op"]
        if op == "deliver":
            self._take_delivery(frame, lines)
            return None
        if op == "closing":
            raise EOFError("the broker is shutting down")
        if op == "topic_deleted":
            self._topic_deleted(str(frame.get("topic")))
            return None
        if op in ("ack_result", "nack_result") and frame.get("id") is None:
            self.refused.extend(frame.get("refused") or [])
            for refusal in frame.get("refused") or []:
                logger.warning(
                    "the broker refused %s: %s", refusal.get("tag"), refusal.get("message")
                )
            return None
        if op == "error" and frame.get("id") is None:
            raise error_from_code(str(frame.get("code")), str(frame.get("message")))
        return frame

    def _topic_deleted(self, topic: str) -> None:
        """The broker deleted ``topic``: what is buffered of it goes, a message of it the
        application holds settles as a no-op (there is nothing left to ACK)."""
        self.deleted_topics.add(topic)
        self.topics, self._buffer = after_topic_deleted(topic, self.topics, self._buffer)

    def _take_delivery(self, frame: dict[str, Any], lines: list[bytes]) -> None:
        """Buffer a ``deliver`` frame's messages: its header has runs ``[topic, partition,
        first offset, count, attempt, first tag]``, its lines follow in the runs' order."""
        self._buffer.extend(
            delivered_messages(ReceivedMessage, self, self._generation, frame, lines)
        )

    # -- receiving -----------------------------------------------------------------------------

    def receive(self, timeout: float | None = None) -> ReceivedMessage | None:
        """The next message, waiting up to ``timeout`` seconds (None: forever; 0: none, a
        look at what has arrived); None when the time is up or ``wakeup`` was called.
        While the broker is away, the wait is spent reconnecting, and it still ends on
        time."""
        if self._closed:
            raise SpoolError("this Consumer is closed")
        check_timeout(timeout)
        if not self._buffer:  # (a buffered message is handed out with no clock read)
            deadline = None if timeout is None else time.monotonic() + timeout
            looked = False
            while not self._buffer:
                if self._closed_now():  # by close() in another thread: as a wakeup
                    return None
                check_topics_left(self.topics, self.deleted_topics)
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    if looked:
                        return None
                    # timeout=0 (or a time already spent): one look at what has arrived,
                    # never none (a receive(0) loop took nothing, ever).
                    remaining = 0.0
                looked = True
                if self._conn is None:
                    self._reconnect(deadline)  # BrokerUnavailableError (an OSError) goes up
                else:
                    try:
                        self._flush_acks()  # about to wait: the broker may be waiting for these
                        self._flush_credit()
                        if self._wait(remaining if remaining is not None else 1.0):
                            self._read_frame()
                    except (EOFError, OSError) as exc:
                        if self._closed_now():  # its connection closed under it, not lost
                            return None
                        lost_broker(logger, exc)
                        self._drop()
                if self._woken:
                    self._woken = False
                    if not self._buffer:
                        return None
        message = self._buffer.popleft()
        if not self.auto_ack:
            self._unsettled.add(message.tag)
        else:
            self._taken += 1
            # Refill ahead while messages are still buffered; with none left, ask only when
            # the application asks for more, or a consumer that stops here would lose the
            # message the broker pushed (final on sending) into a connection about to close.
            if self._buffer and self._taken >= max(1, self.prefetch // 2):
                try:
                    self._flush_credit()
                except (EOFError, OSError) as exc:  # the next receive reconnects
                    lost_broker(logger, exc)
                    self._drop()
        return message

    def receive_many(
        self, max_messages: int = 100, timeout: float | None = None
    ) -> list[ReceivedMessage]:
        """Up to ``max_messages`` messages in one call: waits up to ``timeout`` seconds
        (None: forever) for the first, as ``receive`` does, then takes those the broker
        has already pushed (a ``prefetch`` of at least ``max_messages`` keeps them coming)
        without waiting for more; ``[]`` when the time is up or ``wakeup`` was called.
        Settle them one by one, or all at once with :meth:`ack_many`."""
        count = batch_size(max_messages)
        first = self.receive(timeout)
        if first is None:
            return []
        batch = [first]
        buffer = self._buffer
        while len(batch) < count:
            if not buffer:
                # Frames that have arrived are taken too (a look, not a wait): the broker
                # may have pushed the prefetch window in several.
                if self._conn is None or not self._readiness.wait(self._conn, 0)[0]:
                    break
                try:
                    self._read_frame()
                except (EOFError, OSError) as exc:  # the next receive reconnects
                    lost_broker(logger, exc)
                    self._drop()
                    break
                except BaseException:  # an error frame, or Ctrl-C: none was handed out
                    self._give_back(batch)
                    raise
                continue
            if len(buffer) <= count - len(batch):
                taken = list(buffer)  # all of it (the common case), taken in C
                buffer.clear()
            else:
                popleft = buffer.popleft
                taken = [popleft() for _ in range(count - len(batch))]
            if not self.auto_ack:
                self._unsettled.update([message.tag for message in taken])
            else:
                self._taken += len(taken)
            batch += taken
        if self.auto_ack and buffer and self._taken >= max(1, self.prefetch // 2):  # as receive
            try:
                self._flush_credit()
            except (EOFError, OSError) as exc:
                lost_broker(logger, exc)
                self._drop()
        return batch

    def _give_back(self, batch: list[ReceivedMessage]) -> None:
        """Put messages taken from the buffer back at its front, not handed out: the next
        ``receive`` gives them again."""
        self._buffer.extendleft(reversed(batch))
        if self.auto_ack:
            self._taken -= len(batch)
        else:
            self._unsettled.difference_update([message.tag for message in batch])

    def ack_many(self, messages: Iterable[ReceivedMessage], *, wait: bool = True) -> None:
        """Acknowledge every one of ``messages`` in one frame (runs of delivery tags),
        however many there are. Each must be a message this consumer received and has
        not settled (InvalidArgumentError before any is ACKed otherwise). With ``wait``
        (the default) the broker's answer is awaited: if it refused some (their lease ran
        out and they went to another consumer) the others are still ACKed and the first
        refusal's error is raised (LeaseExpiredError), saying how many. Without, the
        ACKs join the next frame of ACKs, as ``ack(wait=False)``'s do."""
        live, tags = ack_batch(self, messages, connected=self._conn is not None)
        if not tags:
            return
        try:
            if wait:
                reply = self._request({"op": "ack", "runs": tag_runs(tags)})
            else:
                reply = None
                self._acks += tags
                if len(self._acks) >= 100:
                    self._flush_acks()
        except (EOFError, OSError):
            raise UnknownDeliveryError(
                "lost the broker before it confirmed; the messages will be redelivered"
            ) from None
        settle_acked(live, tags, reply, self._unsettled)

    def _wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a frame from the broker: True if one is
        there to read; False when the time is up or ``wakeup`` was called."""
        conn = self._conn
        if conn is None:  # closed by close() in another thread
            raise EOFError("this Consumer is closed")
        conn_ready, woken = self._readiness.wait(conn, timeout)
        if woken:
            self._drain_wakeups()
        return conn_ready

    def _drain_wakeups(self) -> None:
        # OSError: close() in another thread closed the descriptor (BlockingIOError: empty).
        with contextlib.suppress(OSError):
            while os.read(self._wake_read, 4096):
                pass
        self._woken = True

    def wakeup(self) -> None:
        """Make a ``receive`` waiting in another thread return None now (or the next one,
        if none waits), as a worker loop needs when a task it runs finishes. Safe from
        any thread, also after ``close`` (then it does nothing)."""
        with self._wake_lock, contextlib.suppress(OSError):  # full: a byte is waiting
            if self._wake_write >= 0:
                os.write(self._wake_write, b"w")

    def pause(self) -> int:
        """Take nothing more until :meth:`resume`: the messages the broker pushed ahead
        (prefetched) and ``receive`` has not handed out go back to the group at once,
        without counting an attempt, for its other consumers; those the application holds
        stay its own to ACK, NACK or extend. ``receive`` then only waits (an ``auto_ack``
        consumer's buffered messages, already final, are still handed out). A worker
        that stops calls this first, so that nothing waits behind it until its lease runs
        out. Returns how many messages went back."""
        if self._closed:
            raise SpoolError("this Consumer is closed")
        self._paused = True
        if self._conn is None:
            if not self.auto_ack:
                self._buffer.clear()  # the lost connection's deliveries are void
            return 0  # the reconnect pauses the new subscription
        try:
            reply = self._request(pause_frame(self.auto_ack, self._unsettled))
        except (EOFError, OSError) as exc:
            lost_broker(logger, exc)
            self._drop()
            return 0
        if not self.auto_ack:
            self._buffer.clear()  # each of them was given back (and nothing came after)
        return int(reply.get("released") or 0)

    def resume(self) -> None:
        """Take messages again after :meth:`pause`."""
        if self._closed:
            raise SpoolError("this Consumer is closed")
        self._paused = False
        if self._conn is not None:
            try:
                self._request({"op": "resume"})
            except (EOFError, OSError) as exc:
                lost_broker(logger, exc)
                self._drop()  # the reconnect subscribes afresh, unpaused

    def _flush_credit(self) -> None:
        if self._taken:
            self._send({"op": "credit", "n": self._taken})
            self._taken = 0

    def __iter__(self) -> Iterator[ReceivedMessage]:
        while True:
            message = self.receive()
            if message is not None:
                yield message

    def run(
        self,
        handler: Callable[[ReceivedMessage], Any] | None = None,
        *,
        max_messages: int | None = None,
        idle_timeout: float | None = None,
    ) -> int:
        """Call ``handler`` for each message: ACK when it returns, NACK (with the error as the
        reason) when it raises. Stops after ``max_messages`` or ``idle_timeout`` seconds with
        nothing to do. Returns how many messages it handled."""
        handle = handler or self.handler
        if handle is None:
            raise InvalidArgumentError("run() needs a handler")
        check_run_limits(max_messages, idle_timeout)
        handled = 0
        while (max_messages is None or handled < max_messages) and not self._stop_run:
            try:
                message = self.receive(idle_timeout)
            except SpoolError:
                if self._closed_now():  # closed by another thread: the run ends
                    break
                raise
            if message is None:
                break
            failure: Exception | None = None
            try:
                handle(message)
            except Exception as exc:  # the handler's failure is the message's failure
                failure = exc
                # Logged once per failed message, with its traceback: a NACK's reason alone
                # does not say where the handler failed.
                logger.exception(
                    "handler failed on %s/%d@%d (attempt %d)",
                    message.topic,
                    message.partition,
                    message.offset,
                    message.attempt,
                )
            if self._closed_now():  # closed meanwhile: the broker redelivers it
                break
            if not self.auto_ack and not message.settled:
                if failure is None:
                    message.ack(wait=False)
                else:
                    message.nack(reason=handler_failure(failure), wait=False)
            handled += 1
        return handled

    # -- settling --------------------------------------------------------------------------------

    def _try_ack_later(self, message: ReceivedMessage) -> bool:
        """``ack(wait=False)`` in the common case, kept short: the tag joins the next ACK
        frame's runs. False for any other case, which ``_settle`` deals with."""
        if (
            message.settled
            or self.auto_ack
            or message._generation != self._generation
            or self._conn is None
            or self.deleted_topics
        ):
            return False
        self._acks.append(message.tag)
        message.settled = True
        self._unsettled.discard(message.tag)
        if len(self._acks) >= 100:
            try:
                self._flush_acks()
            except (EOFError, OSError):
                raise UnknownDeliveryError(
                    "lost the broker before it confirmed; the message will be redelivered"
                ) from None
        return True

    def _settle(
        self,
        message: ReceivedMessage,
        op: str,
        *,
        wait: bool,
        delay: float | None = None,
        reason: str | None = None,
    ) -> None:
        if self.auto_ack:
            raise InvalidArgumentError("an auto_ack consumer does not ack or nack")
        if message.settled:
            raise InvalidArgumentError(f"{message!r} was already acknowledged or nacked")
        if self._closed_now():
            raise SpoolError("this Consumer is closed: its messages go back to the group")
        if message.topic in self.deleted_topics:
            message.settled = True  # its topic is gone: nothing to settle
            self._unsettled.discard(message.tag)
            return
        if message._generation != self._generation or self._conn is None:
            raise UnknownDeliveryError(
                "the connection this message came on was lost; the broker redelivers it"
            )
        frame = settle_frame(op, message.tag, delay, reason)
        try:
            if wait:
                refusal = refusal_error(self._request(frame))
                if refusal is not None:
                    raise refusal
            else:
                self._send(frame)
        except (EOFError, OSError):
            raise UnknownDeliveryError(
                "lost the broker before it confirmed; the message will be redelivered"
            ) from None
        message.settled = True
        self._unsettled.discard(message.tag)

    def _extend(self, message: ReceivedMessage, seconds: float) -> None:
        check_extension(seconds)
        if message._generation != self._generation or self._conn is None:
            raise UnknownDeliveryError("the connection this message came on was lost")
        try:
            reply = self._request({"op": "extend", "tags": [message.tag], "seconds": seconds})
        except (EOFError, OSError):  # (a BrokenPipeError, after a broker restart)
            raise UnknownDeliveryError("lost the broker before it confirmed") from None
        refusal = refusal_error(reply)
        if refusal is not None:
            raise refusal

    def _flush_acks(self) -> None:
        if self._acks and self._conn is not None:
            tags, self._acks = self._acks, []
            protocol.send(self._conn, {"op": "ack", "runs": tag_runs(tags)})

    def _send(self, frame: dict[str, Any]) -> None:
        if self._conn is not None:
            protocol.send(self._conn, frame)

    def close(self) -> None:
        """Say goodbye to the broker and close the connection. A ``receive`` waiting in
        another thread returns None (as after :meth:`wakeup`), and nothing reconnects."""
        if self._closed:
            return
        self._closed = True
        self.wakeup()  # a receive waiting in another thread returns now
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._flush_acks()
                # What the application got and did not settle; the broker returns the other
                # deliveries unread, without counting an attempt (a consumer that takes one
                # message per connection must not push the ones behind it to the DLQ).
                protocol.send(self._conn, {"op": "bye", "seen": sorted(self._unsettled)})
            self._conn.close()
            self._conn = None
        with self._wake_lock:
            for fd in (self._wake_read, self._wake_write):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._wake_read = self._wake_write = -1

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tag_runs(tags: list[int]) -> list[list[int]]:
    """Delivery tags as runs ``[first tag, count]`` of consecutive ones (protocol 2): the
    tags of one delivered run are consecutive, so 100 ACKs are usually one or two runs.

    >>> tag_runs([5, 6, 7, 9, 3])
    [[5, 3], [9, 1], [3, 1]]
    """
    runs: list[list[int]] = []
    first = previous = tags[0]
    for tag in tags[1:]:
        if tag != previous + 1:
            runs.append([first, previous - first + 1])
            first = tag
        previous = tag
    runs.append([first, previous - first + 1])
    return runs
