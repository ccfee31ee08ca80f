"""What the threaded clients (``publisher.py``, ``consumer.py``) and the asyncio clients
(``aio.py``) share: the checks of their settings, the subscription's settings frame, the
unpacking of a ``deliver`` frame, the reading of a publish answer and a consumer's reconnect
clock. Pure functions and state only, no I/O:
each client keeps its own I/O (a thread and blocking sockets, or an event loop), and these
make sure the two kinds accept the same settings, send the same frames and raise the same
errors."""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, Protocol, TypeVar

from spoolmq.client.delivered import DeliveredRecord
from spoolmq.errors import (
    BrokerUnavailableError,
    InvalidArgumentError,
    MessageTooLargeError,
    ProtocolError,
    PublishTimeoutError,
    SerializationError,
    SpoolError,
    TopicDeletedError,
    UnknownDeliveryError,
    error_from_code,
)
from spoolmq.protocol.publish import (
    MAX_FRAME_RECORDS_BYTES,
    bare_body,
    encode_publish_message,
    numbered,
    too_large,
)
from spoolmq.store.message import (
    MAX_DELAY_S,
    MAX_SEQUENCE,
    PublishOptions,
    check_at_most_max_delay,
)
from spoolmq.store.partitioner import partition_for_key

logger = logging.getLogger("spoolmq.client")


class _OfTopic(Protocol):
    topic: str


M = TypeVar("M", bound=_OfTopic)
G = TypeVar("G")
T = TypeVar("T")


def check_publisher_limits(
    batch_size: int,
    max_in_flight: int,
    max_buffered: int,
    linger_ms: float,
    delivery_timeout: float,
) -> None:
    """A publisher's settings: InvalidArgumentError for one it cannot work with."""
    for name, value in (
        ("batch_size", batch_size),
        ("max_in_flight", max_in_flight),
        ("max_buffered", max_buffered),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise InvalidArgumentError(
                f"{name} must be a whole number of at least 1, not {value!r}"
            )
    amount(linger_ms, "linger_ms", "milliseconds")
    amount(delivery_timeout, "delivery_timeout", "seconds", positive=True)


def amount(value: Any, name: str, unit: str = "seconds", *, positive: bool = False) -> float:
    """``value`` as a float: a finite number, not less than 0 (more than 0 if
    ``positive``); InvalidArgumentError otherwise (a bool, NaN and infinity included)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or (isinstance(value, float) and not math.isfinite(value))  # (an int is finite)
        or value < 0
        or (positive and value == 0)
    ):
        kind = "more than 0" if positive else "0 or more"
        raise InvalidArgumentError(
            f"{name} must be a finite number of {unit}, {kind}: not {value!r}"
        )
    try:
        return float(value)
    except OverflowError:  # an int past 1e308
        raise InvalidArgumentError(f"{name} is too large: {value!r}") from None


def producer_id_or_new(producer_id: str | None) -> str:
    """A publisher's idempotence id: the one given (a non-empty str that UTF-8 can hold:
    it goes into every numbered record), else a random one."""
    if producer_id is None:
        return f"p-{uuid.uuid4().hex}"
    if not isinstance(producer_id, str) or not producer_id:
        raise InvalidArgumentError(f"producer_id must be a non-empty str, not {producer_id!r}")
    try:
        producer_id.encode()
    except UnicodeEncodeError:
        raise InvalidArgumentError(
            f"producer_id {producer_id!r} has characters UTF-8 cannot hold"
        ) from None
    return producer_id


def check_next_sequence(sequence: int) -> int:
    """A sequence a caller asks a publisher to number from (``set_next_sequence``)."""
    if (
        isinstance(sequence, bool)
        or not isinstance(sequence, int)
        or not 0 <= sequence <= MAX_SEQUENCE
    ):
        raise InvalidArgumentError(f"a sequence is an int from 0 to 2**63 - 1, not {sequence!r}")
    return sequence


def encode_many(
    topic: str, values: Iterable[Any], options: PublishOptions, partitions: Mapping[str, int]
) -> tuple[int | None, list[bytes]]:
    """A ``publish_many``'s values as record bodies without their sequence (``numbered``
    adds it as a frame's worth is queued, so the sequences go out in order however long the
    queueing waits for room), and the partition they all go to (the same ``options`` for
    every one: the partition asked for, the key's when the topic's partition count is
    known, else None: the broker's choice). Every value is encoded before any is queued:
    one that cannot be sent raises ``SerializationError`` naming its index, and nothing is
    published."""
    if isinstance(values, str | bytes | bytearray | memoryview | Mapping):
        raise InvalidArgumentError(
            f"values must be a list (or another iterable) of values, not a "
            f"{type(values).__name__}: publish one value with publish()"
        )
    try:
        values = iter(values)
    except TypeError:
        raise InvalidArgumentError(
            f"values must be a list (or another iterable) of values, not a {type(values).__name__}"
        ) from None
    # The topic and the options are checked (a null value encoded with them) even when
    # there are no values.
    encode_publish_message(topic, None, options, sequence=None)
    bodies: list[bytes] = []
    partition: int | None = None
    key: Any = None
    index = 0
    try:
        if options:
            for index, value in enumerate(values):  # noqa: B007 - read in the except
                body, key, partition = encode_publish_message(topic, value, options, sequence=None)
                bodies.append(body)
        else:
            # No options: each value's record alone (the topic was checked above).
            for index, value in enumerate(values):  # noqa: B007 - read in the except
                bodies.append(bare_body(value))
            # Once for them all, in C (a call a value was ~3 % of a publisher's CPU).
            if bodies and max(map(len, bodies)) > MAX_FRAME_RECORDS_BYTES:
                index = next(
                    i for i, body in enumerate(bodies) if len(body) > MAX_FRAME_RECORDS_BYTES
                )
                raise too_large(bodies[index])
    except (SerializationError, MessageTooLargeError) as exc:
        raise type(exc)(f"values[{index}]: {exc}") from None
    return frame_partition(topic, key, partition, partitions), bodies


def frame_partition(
    topic: str, key: Any, partition: int | None, partitions: Mapping[str, int]
) -> int | None:
    """The partition a message's frame goes to: the one asked for, else its key's when the
    topic's partition count is known (from the broker's answers; the broker's murmur2), else
    None: the broker's choice."""
    if partition is None and key is not None:
        count = partitions.get(topic)
        if count is not None:
            return partition_for_key(key, count)
    return partition


def add_to_group(groups: dict[G, deque[T]], group: G, items: Sequence[T]) -> deque[T]:
    """Append ``items`` to the queue of frame group ``group`` (made if there is none), which
    is returned: a publisher's queues of messages by (acks, topic, partition)."""
    queue = groups.get(group)
    if queue is None:
        queue = groups[group] = deque()
    queue.extend(items)
    return queue


def numbered_bodies(
    bodies: Sequence[bytes], sequences: Iterator[int], producer_id: bytes
) -> list[tuple[int, bytes]]:
    """``encode_many``'s bodies with the next sequences (and ``producer_id``, its JSON
    string): (sequence, body) each, taken as they are queued."""
    # ``bodies`` first: zip stops at their end without taking one more sequence.
    return [
        (sequence, numbered(body, sequence, producer_id))
        for body, sequence in zip(bodies, sequences, strict=False)
    ]


def consumer_topics(topics: str | Sequence[str]) -> list[str]:
    """A consumer's topics as a list (one name or several); at least one."""
    names = [topics] if isinstance(topics, str) else list(topics)
    if not names:
        raise InvalidArgumentError("a consumer needs at least one topic")
    return names


def subscription_settings(
    *,
    lease: float,
    max_deliveries: int,
    retry_backoff: float,
    retry_backoff_max: float,
    auto_ack: bool,
    filter: Mapping[str, Any] | None,
    limits: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """The ``settings`` of a ``subscribe`` frame (docs/PROTOCOL.md): seconds become ms; the
    numbers in seconds are checked here (NaN has no ms), the rest by the broker, which
    answers a bad one with an error frame."""
    if filter is not None and not isinstance(filter, Mapping):
        raise InvalidArgumentError(f"filter must be a mapping (a dict), not {filter!r}"[:200])
    return {
        "lease_ms": int(amount(lease, "lease", positive=True) * 1000),
        "max_deliveries": max_deliveries,
        "retry_backoff_ms": int(amount(retry_backoff, "retry_backoff") * 1000),
        "retry_backoff_max_ms": int(amount(retry_backoff_max, "retry_backoff_max") * 1000),
        "auto_ack": auto_ack,
        "filter": dict(filter) if filter else None,
        "limits": {topic: dict(limit) for topic, limit in limits.items()} if limits else None,
    }


def delivered_messages(
    make: Callable[[Any, int, str, int, int, int, int, bytes], M],
    consumer: Any,
    generation: int,
    frame: Mapping[str, Any],
    lines: list[bytes],
) -> list[M]:
    """The messages of a ``deliver`` frame, each ``make(consumer, generation, topic,
    partition, offset, tag, attempt, line)``: its header has runs ``[topic, partition,
    first offset, count, attempt, first tag]`` and its record lines follow in the runs'
    order. ProtocolError (before any is made) if the header and the lines do not match.
    A run's messages are made in one comprehension (no generator resumed per message)."""
    runs = frame.get("r")
    try:
        counts = [run[3] for run in runs]  # type: ignore[union-attr]
        # Each run at least one message: a count of 0 or less would step back over the
        # lines and hand one out twice.
        if sum(counts) != len(lines) or (counts and min(counts) < 1):
            raise ProtocolError("a deliver frame's header and records do not match")
    except (TypeError, IndexError, KeyError, ValueError):
        raise ProtocolError("a deliver frame's header has no valid runs") from None
    messages: list[M] = []
    position = 0
    try:
        for topic, partition, first, count, attempt, tag in runs:  # type: ignore[union-attr]
            messages += [
                make(consumer, generation, topic, partition, offset, tag_, attempt, line)
                for offset, tag_, line in zip(
                    range(first, first + count),
                    range(tag, tag + count),
                    lines[position : position + count],
                    strict=True,  # a negative count cannot balance another run's
                )
            ]
            position += count
    except (TypeError, ValueError):  # a run of the wrong shape, or not numbers
        raise ProtocolError("a deliver frame's header has no valid runs") from None
    return messages


def refusal_error(reply: Mapping[str, Any]) -> SpoolError | None:
    """The error of the first delivery an ``ack_result``/``nack_result``/``extend_result``
    refuses (e.g. LeaseExpiredError), or None when it refused nothing."""
    refused = reply.get("refused") or []
    if not refused:
        return None
    return error_from_code(str(refused[0].get("code")), str(refused[0].get("message", "")))


def check_run_limits(max_messages: Any, idle_timeout: Any) -> None:
    """``run``'s (and ``run_workers``') ``max_messages`` (None or a whole number from 1)
    and ``idle_timeout`` (None or seconds, 0 or more); InvalidArgumentError otherwise."""
    if max_messages is not None and (
        isinstance(max_messages, bool) or not isinstance(max_messages, int) or max_messages < 1
    ):
        raise InvalidArgumentError(
            f"max_messages must be None or a whole number from 1, not {max_messages!r:.60}"
        )
    if idle_timeout is not None:
        amount(idle_timeout, "idle_timeout")
        check_timeout(idle_timeout)


def check_timeout(timeout: Any) -> None:
    """A ``receive``'s ``timeout``: None or a finite number of seconds (one already past,
    0 or less, means "only what is there"); InvalidArgumentError otherwise."""
    if timeout is not None and (
        isinstance(timeout, bool)
        or not isinstance(timeout, int | float)
        or not -MAX_DELAY_S <= timeout <= MAX_DELAY_S  # False for NaN
    ):
        raise InvalidArgumentError(
            f"timeout must be None or a number of seconds up to {MAX_DELAY_S} (a thousand "
            f"years), not {timeout!r}"
        )


def batch_size(max_messages: Any) -> int:
    """``receive_many``'s ``max_messages``: a whole number of at least 1."""
    if type(max_messages) is not int or max_messages < 1:
        raise InvalidArgumentError(
            f"max_messages must be a whole number of at least 1, not {max_messages!r}"
        )
    return max_messages


def ack_batch(
    consumer: Any, messages: Any, *, connected: bool
) -> tuple[list[DeliveredRecord], list[int]]:
    """The messages of an ``ack_many`` to send and their tags, all checked before any is
    settled, so that a wrong one leaves the others as they were: each received by
    ``consumer`` (a Consumer or an AsyncConsumer), not settled, not given twice
    (InvalidArgumentError), on the connection it came on (UnknownDeliveryError: the
    broker redelivers it). A message of a topic deleted meanwhile is settled here, as
    ``ack`` settles it: nothing is left to ACK."""
    auto_ack, generation = consumer.auto_ack, consumer._generation
    unsettled, deleted_topics = consumer._unsettled, consumer.deleted_topics
    if auto_ack:
        raise InvalidArgumentError("an auto_ack consumer does not ack or nack")
    if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
        raise InvalidArgumentError(
            f"ack_many takes a list of received messages, not {type(messages).__name__}"
        )
    batch = list(messages)
    if connected and not deleted_topics:
        # The common case checked in one pass: every message this consumer's, unsettled,
        # of this connection, none given twice (a set of the objects themselves: a
        # message is hashed by identity). Any doubt: the checks below say what is wrong.
        try:
            fine = len(set(batch)) == len(batch)
            for message in batch:
                if (
                    message._consumer is not consumer
                    or message.settled
                    or message._generation != generation
                ):
                    fine = False
                    break
        except (AttributeError, TypeError):  # not a message at all, or unhashable
            fine = False
        if fine:
            return batch, [message.tag for message in batch]
    seen: set[int] = set()
    for message in batch:
        if getattr(message, "_consumer", None) is not consumer:
            raise InvalidArgumentError(f"{message!r} was not received by this consumer")
        if message.settled:
            raise InvalidArgumentError(f"{message!r} was already acknowledged or nacked")
        if id(message) in seen:
            raise InvalidArgumentError(f"{message!r} is given twice")
        seen.add(id(message))
    live: list[DeliveredRecord] = []
    for message in batch:
        if message.topic in deleted_topics:
            continue
        if message._generation != generation or not connected:
            raise UnknownDeliveryError(
                "the connection this message came on was lost; the broker redelivers it"
            )
        live.append(message)
    for message in batch:
        if message.topic in deleted_topics:
            message.settled = True
            unsettled.discard(message.tag)
    return live, [message.tag for message in live]


def settle_acked(
    live: list[DeliveredRecord],
    tags: list[int],
    reply: Mapping[str, Any] | None,
    unsettled: set[int],
) -> None:
    """Mark what an ``ack_many`` ACKed settled (``reply``: the broker's answer, None when
    not waited for); the deliveries it refused stay unsettled, as a refused ``ack`` leaves
    its message, and the first refusal's error is raised naming how many there were."""
    refused = (reply or {}).get("refused") or []
    if not refused:
        for message in live:
            message.settled = True
        unsettled.difference_update(tags)
        return
    refused_tags = {entry.get("tag") for entry in refused}
    for message in live:
        if message.tag not in refused_tags:
            message.settled = True
    unsettled.difference_update([tag for tag in tags if tag not in refused_tags])
    first = refused[0]
    raise error_from_code(
        str(first.get("code")),
        f"{len(refused)} of {len(tags)} ACKs refused; the first: {first.get('message', '')}",
    )


def settle_frame(op: str, tag: int, delay: float | None, reason: str | None) -> dict[str, Any]:
    """An ``ack`` or ``nack`` frame for one delivery (a NACK's delay in seconds)."""
    frame: dict[str, Any] = {"op": op, "tags": [tag]}
    if op == "nack":
        if delay is not None:
            check_at_most_max_delay(amount(delay, "delay"), "delay")
            frame["delay_ms"] = int(delay * 1000)
        if reason is not None:
            frame["reason"] = reason
    return frame


def pause_frame(auto_ack: bool, unsettled: Iterable[int]) -> dict[str, Any]:
    """A ``pause`` frame: ``seen`` lists the deliveries the application holds (the broker
    takes the others back unattempted). An ``auto_ack`` consumer holds none in the
    broker's sense: what it was sent is final, so it says nothing."""
    frame: dict[str, Any] = {"op": "pause"}
    if not auto_ack:
        frame["seen"] = sorted(unsettled)
    return frame


def lost_broker(logger: logging.Logger, exc: BaseException) -> None:
    """Log a connection lost, saying why: an EOFError says nothing by itself."""
    reason = str(exc) or (
        "it closed the connection" if isinstance(exc, EOFError) else type(exc).__name__
    )
    logger.warning("lost the broker (%s); reconnecting", reason)


def handler_failure(exc: BaseException) -> str:
    """The NACK reason ``run()`` gives when the handler raised: the error, shortened."""
    return f"{type(exc).__name__}: {exc}"[:500]


def answer_errors(errors: Mapping[str, Any] | None) -> dict[int, SpoolError]:
    """A ``published`` answer's per-record ``errors`` (by index in the frame, as strings)
    as the errors to raise for those records."""
    if not errors:
        return {}
    return {
        int(index): error_from_code(str(error.get("code")), str(error.get("message", "")))
        for index, error in errors.items()
    }


def answer_ranges(
    frame: Mapping[str, Any], records: int, failed: int
) -> tuple[list[tuple[int, int, int, int, bool]], ProtocolError | None]:
    """A ``published`` answer's ranges as ``(count, partition, first offset, timestamp,
    duplicate)`` in record order (the failed records left out), and a ProtocolError if they
    cover fewer records than the frame had: a broker bug, whose records must fail rather
    than wait or be taken as stored."""
    ranges = [
        (entry[3], entry[0], entry[1], entry[2], len(entry) > 4 and entry[4] == 1)
        for entry in frame.get("r") or ()
    ]
    covered = sum(entry[0] for entry in ranges)
    missing = None
    if covered < records - failed:
        missing = ProtocolError(f"the broker answered {covered} of the {records} messages")
    return ranges, missing


def expired_error(sequence: int, topic: str, timeout: float) -> PublishTimeoutError:
    """The error of a message not answered within the publisher's ``delivery_timeout``."""
    return PublishTimeoutError(
        f"message {sequence} to {topic!r} was not acknowledged within {timeout:g} s (broker "
        "unreachable or overloaded); it may or may not have been stored"
    )


def after_topic_deleted(
    topic: str, topics: Sequence[str], buffered: Iterable[M]
) -> tuple[list[str], deque[M]]:
    """A ``topic_deleted`` frame: the consumer's topics without it (a reconnection no longer
    subscribes to it) and its buffer without that topic's messages."""
    logger.warning("topic %s was deleted; this consumer no longer reads it", topic)
    return [name for name in topics if name != topic], deque(
        message for message in buffered if message.topic != topic
    )


def check_topics_left(topics: Sequence[str], deleted: Iterable[str]) -> None:
    """Nothing more can come once every topic a consumer read was deleted."""
    if not topics:
        raise TopicDeletedError(
            f"every topic this consumer read was deleted ({', '.join(sorted(deleted))})"
        )


class ReconnectClock:
    """When a consumer's reconnect attempts pause and when they give up: from the loss
    of the connection (``lost``) until it is back (``back``), across ``receive`` calls."""

    def __init__(self) -> None:
        self.lost_at: float | None = None
        self._backoff = 0.05

    def lost(self) -> None:
        if self.lost_at is None:
            self.lost_at = time.monotonic()
            self._backoff = 0.05

    def back(self) -> None:
        self.lost_at = None

    def pause(self, failure: BaseException, until: float | None, timeout: float) -> float | None:
        """After a failed attempt: seconds to wait before the next one (a backoff that
        doubles up to 1 s), or None when ``until`` (monotonic) has come. Raises
        BrokerUnavailableError once ``timeout`` seconds have passed since the loss."""
        self.lost()
        assert self.lost_at is not None
        now = time.monotonic()
        give_up = self.lost_at + timeout
        if now >= give_up:
            self.lost_at = None  # a later receive starts a new period
            raise BrokerUnavailableError(
                f"lost the broker and could not reconnect in {timeout:g} s: {failure}"
            ) from None
        pause = min(self._backoff, give_up - now)
        if until is not None:
            if now >= until:
                return None
            pause = min(pause, until - now)
        self._backoff = min(self._backoff * 2, 1.0)
        return pause
