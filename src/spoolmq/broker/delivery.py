"""The delivery model of one consumer group, as pure state with no I/O.

The ConsumerBroker feeds it records it read from the log and the frames consumers sent;
it answers which messages go to which consumer, what to retry when, what to dead-letter,
and how far the group's committed offset may move. Time is passed in (``now`` in ms), so
tests drive it with a fake clock. One cohesive thing (the rules below share one state), so
it stays one module past 500 lines.

Rules it keeps:

- a message goes to one consumer of the group at a time, with a lease;
- messages with the same key (in a partition) are delivered in offset order and never two
  in flight at once: a key's later messages wait until its earliest unfinished one is
  acknowledged, dead-lettered or expired; keyless messages and other keys go in parallel;
- a NACK, an expired lease or a lost consumer makes the message due again (after the NACK's
  delay, or an exponential backoff), until ``max_deliveries`` attempts have failed: then
  it is dead-lettered;
- delayed messages are not delivered before ``deliver_at``; messages past ``expires_at``
  are not delivered at all;
- a due message with a priority above 0 (the reserved header
  :data:`~spoolmq.store.message.PRIORITY_HEADER`) goes before every due message of a lower
  priority the group has read, within a key's order;
- per topic, a group may have limits (``GroupSettings.limits``): at most ``rate``
  deliveries (retries included) in any window of its length, and at most ``concurrency``
  in flight, across all of its consumers;
- the committed offset of a partition is its smallest unfinished offset, so everything
  below it is final;
- a keyless message due more than ``PARK_AFTER_MS`` after it is read (its ``deliver_at``,
  or a retry's backoff) is *parked*: it leaves the window for ``state.db`` (the broker saves
  :attr:`Group.parking`), so the committed offset passes it and memory does not grow with
  the number of delayed messages. When it is nearly due the broker reads it back
  (:meth:`Group.revive`) into the partition's *lane*, a window of its own whose entries
  stand in the order they were revived; the lane's offsets are its own (delivery tags,
  leases and timers use them as a partition's), and what leaves the group (events, dead
  letters, parked rows) carries the record's real offset.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from spoolmq.errors import (
    InvalidArgumentError,
    LeaseExpiredError,
    SpoolError,
    UnknownDeliveryError,
)
from spoolmq.protocol.limits import MAX_DELIVERIES, Limit, check_limits
from spoolmq.store.message import PRIORITY_HEADER, PRIORITY_VALUES, check_extension
from spoolmq.store.record import key_identity, record_offset_and_timestamp
from spoolmq.types import EventType, TopicPartition

# Event types as module constants: looking a member up on an Enum class costs ~70 ns,
# several times per message on the delivery path.
_ACKED = EventType.ACKED
_DEAD_LETTERED = EventType.DEAD_LETTERED
_DELIVERED = EventType.DELIVERED
_EXPIRED = EventType.EXPIRED
_CANCELLED = EventType.CANCELLED
_LEASE_EXPIRED = EventType.LEASE_EXPIRED
_NACKED = EventType.NACKED
_RELEASED = EventType.RELEASED


# A record's key_identity (spoolmq.store.record): text and raw-bytes keys never collide.
Key = str | None
# An ACKed run's figures for the metrics (RunEvent.settled): topic, bytes, age ms, count.
Settled = tuple[str, int, int, int]

#: The reserved header naming the one consumer group a message is for (``dlq replay
#: --to-group`` sets it): every other group passes over it as though it were ACKed, so a
#: redrive for one group does not make the groups that already processed it do it again.
#: docs/FORMAT.md lists the reserved headers.
ONLY_GROUP_HEADER = "x-spoolmq-only-group"
# How the header's name appears in a stored line: a byte search decides, for almost every
# record, that it has no such header without parsing the line.
_ONLY_GROUP_BYTES = orjson.dumps(ONLY_GROUP_HEADER)
_PRIORITY_BYTES = orjson.dumps(PRIORITY_HEADER)

_EXPIRED_TAGS_KEPT = 10_000
#: A keyless message due later than this after it is read (or after it failed) is parked:
#: held in state.db rather than in memory until it is nearly due.
PARK_AFTER_MS = 5_000
_MAX_SETTING = 10 * 365 * 24 * 3600 * 1000  # ten years in ms


@dataclass(frozen=True, slots=True)
class GroupSettings:
    """Per-group delivery settings (set by the first consumer that subscribes).

    Attributes:
        lease_ms: visibility timeout of a delivery (default 30 s).
        max_deliveries: attempts before a message is dead-lettered (default 5).
        retry_backoff_ms: first retry delay after a NACK without a delay; doubles per
            attempt (default 1 s).
        retry_backoff_max_ms: cap of that backoff (default 60 s).
        auto_ack: at-most-once: a message is final once it is sent.
        filter: only messages matching it are delivered (others are skipped and committed).
        limits: per topic, ``{"rate": "50/s", "concurrency": 4}`` (either part optional):
            deliveries in any window of the rate's unit, and in flight, across the group.
    """

    lease_ms: int = 30_000
    max_deliveries: int = 5
    retry_backoff_ms: int = 1_000
    retry_backoff_max_ms: int = 60_000
    auto_ack: bool = False
    filter: Mapping[str, Any] | None = None
    limits: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        # Times are whole numbers that fit state.db's 64-bit columns once added to a clock
        # in ms; max_deliveries fits a delivery tag's attempt bits.
        for name, lowest, highest in (
            ("lease_ms", 1, _MAX_SETTING),
            ("max_deliveries", 1, MAX_DELIVERIES),
            ("retry_backoff_ms", 0, _MAX_SETTING),
            ("retry_backoff_max_ms", 0, _MAX_SETTING),
        ):
            number = getattr(self, name)
            if (
                not isinstance(number, int)
                or isinstance(number, bool)
                or not lowest <= number <= highest
            ):
                raise InvalidArgumentError(
                    f"{name} must be a whole number from {lowest} to {highest}, not {number!r}"
                )
        if not isinstance(self.auto_ack, bool):
            raise InvalidArgumentError(f"auto_ack must be true or false, not {self.auto_ack!r}")
        check_filter(self.filter)
        check_limits(self.limits)


def check_filter(spec: Mapping[str, Any] | None) -> None:
    """A filter is ``{"tags": [...], "headers": {name: value}}``; either part optional."""
    if spec is None:
        return
    if not isinstance(spec, Mapping) or set(spec) - {"tags", "headers"}:
        raise InvalidArgumentError(
            "a filter is an object with 'tags' (a list: any of them matches) and/or "
            "'headers' (an object: all of them must match)"
        )
    tags = spec.get("tags")
    if tags is not None and (
        not isinstance(tags, list) or not all(isinstance(t, str) for t in tags)
    ):
        raise InvalidArgumentError("filter 'tags' must be a list of strings")
    headers = spec.get("headers")
    if headers is not None and (
        not isinstance(headers, Mapping)
        or not all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())
    ):
        raise InvalidArgumentError("filter 'headers' must map header names to string values")


def matches(spec: Mapping[str, Any] | None, tags: Sequence[str], headers: Sequence[Any]) -> bool:
    """Does a record with ``tags`` and stored ``headers`` pass the filter?

    >>> matches({"tags": ["vip", "eu"]}, ["eu"], [])
    True
    >>> matches({"headers": {"kind": "refund"}}, [], [["kind", "order"]])
    False
    """
    if not spec:
        return True
    wanted_tags = spec.get("tags")
    if wanted_tags and not set(wanted_tags) & set(tags):
        return False
    wanted_headers = spec.get("headers")
    if wanted_headers:
        present = {entry[0]: entry[1] for entry in headers if len(entry) == 2}
        if any(present.get(name) != value for name, value in wanted_headers.items()):
            return False
    return True


def backoff_ms(attempt: int, base_ms: int, max_ms: int) -> int:
    """Exponential backoff after failed attempt number ``attempt`` (1-based).

    >>> [backoff_ms(a, 1000, 5000) for a in (1, 2, 3, 4)]
    [1000, 2000, 4000, 5000]
    """
    return int(min(max_ms, base_ms * (2 ** max(0, attempt - 1))))


# -- delivery state ---------------------------------------------------------------------------
#
# A group keeps, per partition, arrays indexed by offset (a window that starts at the
# smallest offset it may still need and grows as records are read) instead of an object per
# message: a status byte, the attempt count, when and to whom it was last sent, the stored
# line (dropped once the message is finished), its key and a link to the next unfinished
# message of the same key. Common work (read a batch, send a run of it, ACK that run) is
# slicing and comparing these arrays in C; Python runs per message only for keys, filters and
# the exceptional cases (NACK, lease expiry, delay, TTL, dead letters), which keep small
# dicts by offset.

WAITING = 0  # read, not due: behind its key, delayed, a retry not due yet, or a dead letter
READY = 1  # due: taken at the fresh cursor or from the partition's ready queue
IN_FLIGHT = 2
DONE = 3
_READY_BYTE = bytes([READY])
_IN_FLIGHT_BYTE = bytes([IN_FLIGHT])
_DONE_BYTE = bytes([DONE])
_NOT_READY = (bytes([WAITING]), _IN_FLIGHT_BYTE, _DONE_BYTE)
_NOT_DONE = (bytes([WAITING]), _READY_BYTE, _IN_FLIGHT_BYTE)

# A delivery tag is one 63-bit integer: the attempt (its low 10 bits), the partition's slot
# in the group (13 bits) and the offset (its low 40 bits). Consecutive offsets sent at one
# attempt have consecutive tags, so ACKs travel as runs; a tag from an earlier attempt no
# longer matches the message's attempt, so a late ACK is refused (an attempt 1,024
# deliveries back would match again: MAX_DELIVERIES keeps every attempt below that).
_OFFSET_BITS = 40
_OFFSET_MASK = (1 << _OFFSET_BITS) - 1
MAX_SLOTS = 1 << 13
_SLOT_MASK = MAX_SLOTS - 1
_ATTEMPT_SHIFT = _OFFSET_BITS + 13
_ATTEMPT_MASK = (1 << 10) - 1
# The "due at" of a delivery row's saved form (PartitionState.saved) while the delivery
# is out with a consumer: one that comes back (its consumer lost, its lease expired) to
# wait for its redelivery differs from it, so its row is written again, with no consumer
# and no lease (checkpoint.py).
IN_FLIGHT_ROW = -1
assert MAX_DELIVERIES <= _ATTEMPT_MASK  # attempts never wrap in a tag
_TRIM_AT = 4096  # finished entries at a window's start before it is cut


def delivery_tag(slot: int, offset: int, attempt: int) -> int:
    """The tag of ``offset`` in the partition at ``slot``, sent at ``attempt``.

    >>> delivery_tag(1, 7, 1) + 1 == delivery_tag(1, 8, 1)
    True
    """
    return (
        ((attempt & _ATTEMPT_MASK) << _ATTEMPT_SHIFT)
        | (slot << _OFFSET_BITS)
        | (offset & _OFFSET_MASK)
    )


def tag_order(tag: int) -> tuple[int, int]:
    """Sorts tags by partition slot, then offset (whatever their attempt).

    >>> sorted([delivery_tag(0, 9, 1), delivery_tag(0, 8, 2)], key=tag_order) == [
    ...     delivery_tag(0, 8, 2), delivery_tag(0, 9, 1)]
    True
    """
    return (tag >> _OFFSET_BITS) & _SLOT_MASK, tag & _OFFSET_MASK


# A run of offsets sent (or ACKed) together at one attempt: [partition, first, count,
# attempt]. A list, so a run grows in place while contiguous offsets are added to it.
Run = list[Any]
# Extras of a record that has any: (deliver_at, expires_at, tags, headers), where headers is
# the stored list, or only whether there are any (a notice says no more).
Extra = tuple[int | None, int | None, Sequence[str] | None, Any]
# A parked message read back: (offset, due at, failed attempts, last reason, stored line,
# its extras).
Revived = tuple[int, int, int, str | None, bytes, Extra | None]


@dataclass(slots=True, eq=False)
class Pending:
    """One message taken out of the arrays for an exceptional path: a dead letter."""

    topic: str
    partition: int
    offset: int
    key: Key
    line: bytes
    published_at: int = 0
    attempt: int = 0
    last_reason: str | None = None
    consumer: str | None = None
    lane_offset: int = -1  # a revived message: its offset in the partition's lane


@dataclass(slots=True)
class Event:
    """A delivery event about one message (every type but ``delivered``/``acked``)."""

    ts: int
    type: EventType
    topic: str
    partition: int
    offset: int
    key: Key
    attempt: int
    line: bytes | None
    consumer: str | None = None
    reason: str | None = None
    processing_ms: float | None = None


@dataclass(slots=True)
class RunEvent:
    """A ``delivered`` (one dispatched frame) or ``acked`` (one ACK frame) event: runs of
    offsets, and for ``acked`` each message's processing time in the runs' order (None
    with auto_ack, whose messages are ACKed as they are sent)."""

    ts: int
    type: EventType
    consumer: str
    runs: list[Run]
    processing_ms: list[int] | None = None
    reason: str | None = None
    # ``acked`` only, for the metrics: per run as it was settled, (topic, bytes of its
    # stored lines, ms from the first record's stored time to the ACK, messages). One
    # entry per run, not per message: a run was published together, give or take a batch.
    settled: list[Settled] | None = None


@dataclass(slots=True, eq=False)
class ConsumerSlot:
    consumer_id: str
    prefetch: int
    topics: frozenset[str]
    held: int = 0  # deliveries in flight
    credit: int = 0  # auto_ack: messages it can still take
    paused: bool = False  # it asked for nothing more (``pause``) until it resumes
    # Tags whose lease expired, so a late answer is told so (LeaseExpiredError) rather than
    # "unknown delivery"; the oldest are forgotten past _EXPIRED_TAGS_KEPT.
    expired: dict[int, str] = field(default_factory=dict)


class Batch:
    """What one dispatch sends one consumer: runs of offsets and their stored lines."""

    __slots__ = ("count", "lines", "runs")

    def __init__(self, runs: list[Run], lines: list[bytes]) -> None:
        self.runs = runs
        self.lines = lines
        self.count = len(lines)

    def tags(self) -> list[int]:
        return [
            delivery_tag(state.slot, offset, attempt)
            for state, first, count, attempt in self.runs
            for offset in range(first, first + count)
        ]


class PartitionState:
    """A group's position in one partition and the delivery state of what it has read."""

    __slots__ = (
        "attempts",
        "base",
        "committed_persisted",
        "delays",
        "expires",
        "extended",
        "fresh",
        "in_flight",
        "key_tail",
        "keys",
        "lane",
        "lines",
        "low",
        "next_fetch",
        "next_same",
        "open_count",
        "owners",
        "partition",
        "positions",
        "priorities",
        "ready",
        "real",
        "retries",
        "saved",
        "sent_at",
        "slot",
        "status",
        "topic",
        "urgent",
    )

    def __init__(self, topic: str, partition: int, slot: int, start: int) -> None:
        self.topic = topic
        self.partition = partition
        self.slot = slot
        self.base = start  # the offset at index 0 of the arrays
        self.low = start  # no unfinished offset below this
        self.next_fetch = start
        self.fresh = start  # dispatch has looked at the offsets below this
        self.status = bytearray()
        self.attempts: list[int] = []
        self.sent_at: list[int] = []
        self.owners: list[ConsumerSlot | None] = []
        self.lines: list[bytes | None] = []
        self.keys: list[Key] = []
        self.next_same: list[int] = []  # the key's next offset read after this one, or -1
        self.key_tail: dict[Key, int] = {}  # a key's newest unfinished offset
        self.ready: deque[int] = deque()  # due again (retries, a key's next), oldest first
        # Due messages of a priority above 0: (-priority, offset), a heap, so the highest
        # priority comes first and the oldest within one.
        self.urgent: list[tuple[int, int]] = []
        self.open_count = 0  # read and not finished
        self.in_flight = 0
        self.committed_persisted = -1
        # The exceptional cases, by offset: a deliver_at (or restored retry time) not yet
        # reached; a TTL; a lease extended; a message that failed at least once and is not in
        # flight, with its retry time (0: due) and why it failed; the row state.db has; a
        # priority above 0.
        self.delays: dict[int, int] = {}
        self.expires: dict[int, int] = {}
        self.extended: dict[int, int] = {}
        self.retries: dict[int, tuple[int, str | None]] = {}
        self.saved: dict[int, tuple[int, int]] = {}
        self.priorities: dict[int, int] = {}
        # A log window's lane (the parked messages it revived), made when first needed.
        self.lane: PartitionState | None = None
        # A lane only: the real offset of each entry, and the lane offset of each real one.
        self.real: list[int] | None = None
        self.positions: dict[int, int] = {}

    def offset_at(self, index: int) -> int:
        """The record's offset at ``index``: in a lane, its real one."""
        return self.base + index if self.real is None else self.real[index]

    def committed(self) -> int:
        """The smallest unfinished offset: everything below it is final."""
        status = self.status
        start = self.low - self.base
        first = len(status)
        for byte in _NOT_DONE:
            found = status.find(byte, start, first)
            if found >= 0:
                first = found
        self.low = self.base + first
        if first >= _TRIM_AT and 2 * first >= len(status):
            self._trim(first)
        return self.low

    def _trim(self, count: int) -> None:
        """Drop the first ``count`` entries (all finished) of the window."""
        del self.status[:count]
        del self.attempts[:count]
        del self.sent_at[:count]
        del self.owners[:count]
        del self.lines[:count]
        del self.keys[:count]
        del self.next_same[:count]
        if self.real is not None:
            del self.real[:count]
        self.base += count
        # Dispatch may not have looked at what was finished without it (filtered out).
        self.fresh = max(self.fresh, self.base)

    def in_flight_indexes(self) -> list[int]:
        """Indexes of the deliveries in flight (a scan in C, as long as there are any)."""
        found: list[int] = []
        status = self.status
        index = status.find(_IN_FLIGHT_BYTE)
        while index >= 0 and len(found) < self.in_flight:
            found.append(index)
            index = status.find(_IN_FLIGHT_BYTE, index + 1)
        return found

    def lease_end(self, index: int, lease_ms: int) -> int:
        if self.extended:
            extended = self.extended.get(self.base + index)
            if extended is not None:
                return extended
        return self.sent_at[index] + lease_ms

    def tag(self, index: int) -> int:
        return delivery_tag(self.slot, self.base + index, self.attempts[index])

    def describe(self, index: int) -> str:
        return f"{self.topic}/{self.partition}@{self.offset_at(index)}"


def _first_of(status: bytearray, bytes_: tuple[bytes, ...], start: int, stop: int) -> int:
    """The first index in ``[start, stop)`` holding one of ``bytes_``, else ``stop``."""
    for byte in bytes_:
        found = status.find(byte, start, stop)
        if found >= 0:
            stop = found
    return stop


def _extend_run(
    runs: list[Run], state: PartitionState, offset: int, count: int, attempt: int
) -> None:
    if runs:
        last = runs[-1]
        if last[0] is state and last[1] + last[2] == offset and last[3] == attempt:
            last[2] += count
            return
    runs.append([state, offset, count, attempt])


def _real_runs(runs: list[Run]) -> list[Run]:
    """Runs as the group's events tell them: a lane's in the records' real offsets, one
    message per run (a lane's consecutive entries are not consecutive records)."""
    if all(run[0].real is None for run in runs):
        return runs
    told: list[Run] = []
    for state, first, count, attempt in runs:
        if state.real is None:
            told.append([state, first, count, attempt])
        else:
            for virtual in range(first, first + count):
                told.append([state, state.real[virtual - state.base], 1, attempt])
    return told


def _settled(topic: str, lines: Sequence[bytes | None], now: int) -> Settled:
    """An ACKed run's metrics entry: its bytes (summed in C) and the age of its first
    record at ``now``, from the stored line's fixed head (no JSON parsing)."""
    first = lines[0]
    try:
        age = now - record_offset_and_timestamp(first)[1] if first is not None else 0
    except ValueError:  # not a record line: no age rather than a broken loop
        age = 0
    return (topic, sum(map(len, lines)), age, len(lines))  # type: ignore[arg-type]


class Group:
    """One consumer group's delivery state."""

    def __init__(self, name: str, settings: GroupSettings) -> None:
        self.name = name
        self.settings = settings
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.slots: list[PartitionState] = []
        self.consumers: dict[str, ConsumerSlot] = {}
        self.events: list[Event | RunEvent] = []
        self.dead: list[Pending] = []
        # When delayed messages and retries are due: (due at, tie-breaker, partition,
        # offset, attempt); a stale entry (the message moved on) is ignored when it fires.
        self._timers: list[tuple[int, int, PartitionState, int, int]] = []
        # Lease ends, one entry per dispatched batch holding its runs only.
        self._leases: list[tuple[int, int, list[Run]]] = []
        self._sequence = itertools.count()
        self._rotation: deque[str] = deque()
        self._turn = 0  # the partition a dispatch looks at first, in turn
        self._urgent: set[PartitionState] = set()  # partitions with due priority messages
        # Limits: the settings they were parsed from and what they say, by topic; per
        # rate-limited topic, (when, how many) of the deliveries inside its window; when a
        # rate-limited topic may send again (a timer, so the broker wakes up for it).
        self._limits_of: GroupSettings | None = None
        self._limits: dict[str, Limit] = {}
        self._sent: dict[str, deque[tuple[int, int]]] = {}
        self._rate_wake: int | None = None
        # Cancelled messages, per partition by offset with the reason: the ConsumerBroker's
        # one table, shared by its groups; a record in it is finished as it is read.
        self.cancelled: Mapping[TopicPartition, Mapping[int, str | None]] = {}
        self.filtered = 0
        # Parked messages to save to state.db, by (topic, partition, offset): (due at,
        # failed attempts, last reason), or None when a parked one is finished (its row
        # goes). The broker's checkpoint saves them and takes them out (mark_saved).
        self.parking: dict[tuple[str, int, int], tuple[int, int, str | None] | None] = {}
        self._has_lanes = False
        # Slots of partitions whose topic was deleted: an answer for a delivery of one is
        # accepted and does nothing (the consumer may not have heard of the deletion yet).
        self._dropped_slots: set[int] = set()

    # -- membership ----------------------------------------------------------------

    def add_partition(self, topic: str, partition: int, start: int) -> PartitionState:
        key = TopicPartition(topic, partition)
        state = self.partitions.get(key)
        if state is None:
            if len(self.slots) >= MAX_SLOTS:
                raise InvalidArgumentError(
                    f"a group reads at most {MAX_SLOTS} partitions (its delivery tags say "
                    "which in 13 bits)"
                )
            state = self.partitions[key] = PartitionState(topic, partition, len(self.slots), start)
            self.slots.append(state)
        return state

    def add_consumer(self, consumer_id: str, prefetch: int, topics: Iterable[str]) -> None:
        if prefetch < 1:
            raise InvalidArgumentError(f"prefetch must be at least 1, not {prefetch}")
        self.consumers[consumer_id] = ConsumerSlot(consumer_id, prefetch, frozenset(topics))
        self._rotation.append(consumer_id)

    def remove_consumer(self, consumer_id: str, now: int) -> None:
        """A consumer left or died: its in-flight messages are due again at once."""
        slot = self.consumers.pop(consumer_id, None)
        if slot is None:
            return
        self._rotation.remove(consumer_id)
        for state in self.slots:
            # Newest first: each goes to the front of the ready queue, so the oldest ends first.
            for index in reversed(self._held_by(state, slot)):
                self._drop(state, index)
                self._event(now, _RELEASED, state, index, consumer_id, "consumer left")
                self._failed(state, state.base + index, now, "consumer disconnected", delay_ms=0)

    def drop_topic(self, topic: str) -> list[TopicPartition]:
        """Stop serving ``topic`` (it is being deleted): its partitions leave the group,
        what consumers held of it no longer counts against their prefetch, and nothing of
        it is delivered, retried or dead-lettered again. Their states stay in ``slots``
        (emptied), so the delivery tags of the other partitions keep their meaning, and
        timers or a late answer that still name them find nothing there."""
        dropped = [key for key in self.partitions if key.topic == topic]
        for key in dropped:
            state = self.partitions.pop(key)
            self._empty(state)
            if state.lane is not None:
                self._empty(state.lane)
        self.parking = {where: row for where, row in self.parking.items() if where[0] != topic}
        for slot in self.consumers.values():
            if topic in slot.topics:
                slot.topics = slot.topics - {topic}
        self.dead = [pending for pending in self.dead if pending.topic != topic]
        return dropped

    def _empty(self, state: PartitionState) -> None:
        """Forget all a dropped partition (or its lane) holds; its slot stays, unused."""
        self._dropped_slots.add(state.slot)
        for index in state.in_flight_indexes():
            owner = state.owners[index]
            if owner is not None:
                owner.held -= 1
        state.status = bytearray()
        state.attempts, state.sent_at, state.owners = [], [], []
        state.lines, state.keys, state.next_same = [], [], []
        if state.real is not None:
            state.real = []
        state.key_tail.clear()
        state.ready.clear()
        state.urgent.clear()
        self._urgent.discard(state)
        for table in (
            state.delays,
            state.expires,
            state.extended,
            state.retries,
            state.saved,
            state.priorities,
            state.positions,
        ):
            table.clear()
        state.open_count = state.in_flight = 0
        state.fresh = state.next_fetch = state.base

    def _held_by(self, state: PartitionState, slot: ConsumerSlot) -> list[int]:
        owners = state.owners
        return [index for index in state.in_flight_indexes() if owners[index] is slot]

    def in_flight_tags(self, consumer_id: str) -> list[int]:
        """The tags a consumer holds, oldest first per partition."""
        slot = self.consumers.get(consumer_id)
        if slot is None:
            return []
        return [state.tag(index) for state in self.slots for index in self._held_by(state, slot)]

    # -- reading ------------------------------------------------------------------------

    def skip_to(self, state: PartitionState, offset: int) -> None:
        """Offsets from ``state.next_fetch`` up to ``offset`` have no record to deliver
        (removed by compaction or retention): they are final."""
        gap = offset - state.next_fetch
        if gap <= 0:
            return
        if state.committed() == state.next_fetch and not state.ready:
            # Nothing unfinished: the window starts again at ``offset``.
            state._trim(len(state.status))
            state.base = state.low = state.fresh = state.next_fetch = offset
            return
        state.status += _DONE_BYTE * gap
        state.attempts += [0] * gap
        state.sent_at += [0] * gap
        state.owners += [None] * gap
        state.lines += [None] * gap
        state.keys += [None] * gap
        state.next_same += [-1] * gap
        state.next_fetch = offset

    def add_batch(
        self,
        state: PartitionState,
        lines: list[bytes],
        keys: list[Key] | None,
        extras: Mapping[int, Extra] | None,
        now: int,
        restored: dict[int, tuple[int, int]] | None = None,
        parked: Collection[int] = (),
    ) -> None:
        """Take in records read from the partition at ``state.next_fetch``: their stored
        ``lines``, their ``keys`` (each a key_identity; None: no record has one), and
        ``extras`` by index for the few records that have any. ``restored`` holds, by
        offset, (attempts so far, retry due at ms) of deliveries open when an earlier broker
        stopped: they keep counting, and are not delivered before their retry is due.
        ``parked``: offsets an earlier broker parked (read again after a restart): state.db
        has them, so here they are finished, in silence."""
        count = len(lines)
        if not count:
            return
        first = state.next_fetch
        start = first - state.base
        state.next_fetch = first + count
        status = state.status
        status += _READY_BYTE * count
        state.attempts += [0] * count
        state.sent_at += [0] * count
        state.owners += [None] * count
        state.lines += lines
        state.keys += keys if keys is not None else [None] * count
        state.next_same += [-1] * count
        state.open_count += count
        special: list[int] = []  # offsets due later than now, of a priority, or restored
        if self.cancelled:
            cancels = self.cancelled.get(TopicPartition(state.topic, state.partition))
            if cancels:
                for offset in [o for o in cancels if first <= o < first + count]:
                    index = offset - state.base
                    reason = cancels[offset] or "cancelled"
                    self._event(now, _CANCELLED, state, index, None, reason)
                    self._finish_run(state, index, 1, now, link=False)
                    state.keys[index] = None
        for offset in [o for o in parked if first <= o < first + count]:
            index = offset - state.base
            if status[index] != DONE:
                self._finish_run(state, index, 1, now, link=False)
                state.keys[index] = None
        spec = self.settings.filter
        if spec or extras:
            plain_passes = matches(spec, (), ())
            for index in range(count) if spec else sorted(extras or ()):
                if status[start + index] == DONE:
                    continue  # cancelled
                extra = extras.get(index) if extras else None
                if (
                    spec
                    and not (plain_passes if extra is None else _passes(spec, extra, lines[index]))
                ) or (
                    # The byte search first, inline: almost no record has the header.
                    extra is not None
                    and extra[3]
                    and _ONLY_GROUP_BYTES in lines[index]
                    and not _for_group(self.name, extra, lines[index])
                ):
                    self.filtered += 1
                    self._finish_run(state, start + index, 1, now, link=False)
                    state.keys[start + index] = None
                    continue
                if extra is None:
                    continue
                deliver_at, expires_at = extra[0], extra[1]
                if (
                    deliver_at is not None
                    and deliver_at > now + PARK_AFTER_MS
                    and (keys is None or keys[index] is None)
                    and not (restored and first + index in restored)
                ):
                    self._park(state, start + index, deliver_at, 0, None, now)
                    continue
                if expires_at is not None:
                    state.expires[first + index] = expires_at
                priority = (
                    _priority(extra, lines[index])
                    if extra[3] and _PRIORITY_BYTES in lines[index]
                    else 0
                )
                if priority:
                    state.priorities[first + index] = priority
                if deliver_at is not None and deliver_at > now:
                    state.delays[first + index] = deliver_at
                    special.append(first + index)
                elif priority:
                    special.append(first + index)
        if restored:
            for offset in [o for o in restored if first <= o < first + count]:
                attempts, due_at = restored.pop(offset)
                index = offset - state.base
                state.saved[offset] = (attempts, due_at)  # the row state.db has
                if status[index] == DONE:
                    continue  # filtered out now: the next checkpoint deletes its row
                due_at = max(due_at, 0)  # a row that was in flight: due now
                state.attempts[index] = attempts
                state.retries[offset] = (due_at, None)
                if due_at > now:
                    state.delays[offset] = max(due_at, state.delays.get(offset, 0))
                if offset not in special:
                    special.append(offset)
        blocked: set[int] = set()
        if keys is not None:
            tails = state.key_tail
            links = state.next_same
            base = state.base
            for index, key in enumerate(keys):
                if key is None or status[start + index] == DONE:
                    continue
                offset = first + index
                tail = tails.get(key)
                tails[key] = offset
                if tail is not None:
                    links[tail - base] = offset
                    status[start + index] = WAITING  # behind its key's earlier messages
                    blocked.add(offset)
        for offset in special:
            if offset not in blocked:
                state.status[offset - state.base] = WAITING
                self._make_due(state, offset, now)
            else:
                state.status[offset - state.base] = WAITING

    def add_record(
        self,
        state: PartitionState,
        fields: Mapping[str, Any],
        line: bytes,
        now: int,
        *,
        attempts_so_far: int = 0,
        due_at: int = 0,
    ) -> None:
        """Take in one record read at ``state.next_fetch`` (or past it, after a gap) from
        its parsed ``fields``; one in delivery when an earlier broker stopped comes with the
        ``attempts_so_far`` it had and when its retry is due."""
        offset: int = fields["offset"]
        self.skip_to(state, offset)
        key = key_identity(fields)
        extra = record_extra(fields)
        restored = {offset: (attempts_so_far, due_at)} if attempts_so_far else None
        self.add_batch(
            state,
            [line],
            None if key is None else [key],
            None if extra is None else {0: extra},
            now,
            restored,
        )

    # -- parked messages ----------------------------------------------------------------

    def _park(
        self,
        state: PartitionState,
        index: int,
        due_at: int,
        attempt: int,
        reason: str | None,
        now: int,
    ) -> None:
        """Take a keyless message out of the window (or lane) until ``due_at``: finished
        here, with no event, and a row for state.db in :attr:`parking`."""
        offset = state.offset_at(index)
        self._finish_run(state, index, 1, now, link=False)  # a lane's marks its row gone
        self.parking[(state.topic, state.partition, offset)] = (due_at, attempt, reason)

    def revive(self, state: PartitionState, parked: Sequence[Revived], now: int) -> None:
        """Take parked messages of ``state``'s partition back, read from state.db and the
        log: into its lane, due at their time. One the lane holds already is passed over,
        as is one whose row changed since state.db had it (finished, or parked again with
        a later time: :attr:`parking` holds the change until a checkpoint saves it)."""
        lane = state.lane
        if lane is None:
            if len(self.slots) >= MAX_SLOTS:
                raise InvalidArgumentError(
                    f"a group reads at most {MAX_SLOTS} partitions and their parked messages"
                )
            lane = state.lane = PartitionState(state.topic, state.partition, len(self.slots), 0)
            lane.real = []
            self.slots.append(lane)
            self._has_lanes = True
        real = cast(list[int], lane.real)
        lane.committed()  # lets the lane drop what is finished at its start
        cancels = (
            self.cancelled.get(TopicPartition(state.topic, state.partition))
            if self.cancelled
            else None
        )
        for offset, due_at, attempt, reason, line, extra in parked:
            where = (state.topic, state.partition, offset)
            if offset in lane.positions or where in self.parking:
                continue
            index = len(lane.status)
            virtual = lane.base + index
            lane.positions[offset] = virtual
            real.append(offset)
            lane.status += bytes([WAITING])
            lane.attempts.append(attempt)
            lane.sent_at.append(0)
            lane.owners.append(None)
            lane.lines.append(line)
            lane.keys.append(None)
            lane.next_same.append(-1)
            lane.open_count += 1
            lane.next_fetch = lane.fresh = virtual + 1  # a lane hands out its ready queue only
            if cancels and offset in cancels:
                self._event(now, _CANCELLED, lane, index, None, cancels[offset] or "cancelled")
                self._finish_run(lane, index, 1, now, link=False)
                continue
            if attempt:
                lane.retries[virtual] = (0, reason)
            if extra is not None:
                if extra[1] is not None:
                    lane.expires[virtual] = extra[1]
                if extra[3] and _PRIORITY_BYTES in line:
                    priority = _priority(extra, line)
                    if priority:
                        lane.priorities[virtual] = priority
            if due_at > now:
                lane.delays[virtual] = due_at
            self._make_due(lane, virtual, now)

    def _make_due(self, state: PartitionState, offset: int, now: int) -> None:
        """Ready now, or once its ``deliver_at`` or the retry time it was restored with."""
        index = offset - state.base
        if state.delays:
            when = state.delays.get(offset)
            if when is not None:
                if when > now:
                    state.status[index] = WAITING
                    self._schedule(when, state, offset, state.attempts[index])
                    return
                del state.delays[offset]
        state.status[index] = READY
        self._push_ready(state, offset)

    def _push_ready(self, state: PartitionState, offset: int, *, first: bool = False) -> None:
        """Queue a message that has just become READY: by its priority if it has one, else
        on the partition's ready queue (at its front if ``first``: the oldest work)."""
        if state.priorities:
            priority = state.priorities.get(offset)
            if priority:
                heapq.heappush(state.urgent, (-priority, offset))
                self._urgent.add(state)
                return
        if first:
            state.ready.appendleft(offset)
        else:
            state.ready.append(offset)

    def _schedule(self, when: int, state: PartitionState, offset: int, attempt: int) -> None:
        heapq.heappush(self._timers, (when, next(self._sequence), state, offset, attempt))

    def next_timer(self) -> int | None:
        heads = [heap[0][0] for heap in (self._timers, self._leases) if heap]
        if self._rate_wake is not None:
            heads.append(self._rate_wake)
        return min(heads) if heads else None

    def run_timers(self, now: int) -> None:
        """Move due retries and delayed messages to ready; expire leases."""
        if self._rate_wake is not None and self._rate_wake <= now:
            self._rate_wake = None  # the dispatch that follows sets it again if need be
        lease_ms = self.settings.lease_ms
        while self._leases and self._leases[0][0] <= now:
            _, _, runs = heapq.heappop(self._leases)
            for state, first, count, attempt in runs:
                start = max(first - state.base, 0)
                stop = first + count - state.base
                status = state.status
                if stop <= start or status.count(_IN_FLIGHT_BYTE, start, stop) == 0:
                    continue  # answered, or expired already
                # Newest first: each goes to the front of the ready queue, so the oldest
                # ends first.
                for index in range(stop - 1, start - 1, -1):
                    if status[index] != IN_FLIGHT or state.attempts[index] != attempt:
                        continue
                    lease_end = state.lease_end(index, lease_ms)
                    offset = state.base + index
                    if lease_end > now:  # extended meanwhile
                        self._schedule_lease(lease_end, [[state, offset, 1, attempt]])
                        continue
                    owner = state.owners[index]
                    self._remember_expired(owner, state.tag(index), state.describe(index))
                    self._expire(state, index, now, owner.consumer_id if owner else None)
        while self._timers and self._timers[0][0] <= now:
            _, _, state, offset, attempt = heapq.heappop(self._timers)
            index = offset - state.base
            if (
                0 <= index < len(state.status)
                and state.status[index] == WAITING
                and state.attempts[index] == attempt
            ):
                state.delays.pop(offset, None)
                state.status[index] = READY
                self._push_ready(state, offset)

    def _schedule_lease(self, when: int, runs: list[Run]) -> None:
        heapq.heappush(self._leases, (when, next(self._sequence), runs))

    # -- dispatch -----------------------------------------------------------------------

    def _has_ready(self) -> bool:
        return bool(self._urgent) or any(
            state.ready or state.fresh < state.next_fetch for state in self.slots
        )

    def wants_more(self) -> bool:
        if not self._has_ready():
            return False
        return any(self._room(slot) > 0 for slot in self.consumers.values())

    def _room(self, slot: ConsumerSlot) -> int:
        if slot.paused:
            return 0
        if self.settings.auto_ack:
            return slot.credit
        return slot.prefetch - slot.held

    def dispatch(self, now: int) -> dict[str, Batch]:
        """Hand ready messages to consumers with room, round-robin. Returns what to send."""
        out: dict[str, Batch] = {}
        if not self.consumers or not self.slots:
            return out
        for _ in range(len(self._rotation)):
            consumer_id = self._rotation[0]
            self._rotation.rotate(-1)
            slot = self.consumers[consumer_id]
            room = self._room(slot)
            if room > 0:
                batch = self._take(slot, room, now)
                if batch is not None:
                    out[consumer_id] = batch
            if not self._has_ready():
                break  # the next dispatch starts with the consumer after this one
        return out

    def _take(self, slot: ConsumerSlot, room: int, now: int) -> Batch | None:
        runs: list[Run] = []
        lines: list[bytes] = []
        # What each limited topic may still send now (None: no topic of the group has limits).
        allow = self._allowances(slot, now) if self.settings.limits else None
        if self._urgent:
            room = self._take_urgent(slot, room, now, runs, lines, allow)
        slots = self.slots
        first = self._turn % len(slots)
        self._turn = first + 1
        for step in range(len(slots)):
            if room <= 0:
                break
            state = slots[(first + step) % len(slots)]
            if state.topic not in slot.topics:
                continue
            budget = room
            if allow is not None and state.topic in allow:
                budget = min(room, allow[state.topic])
                if budget <= 0:
                    continue
            left = budget
            ready = state.ready
            while left > 0 and ready:
                offset = ready.popleft()
                index = offset - state.base
                if index >= 0 and state.status[index] == READY:
                    left -= self._take_one(state, index, slot, now, runs, lines)
            if left > 0 and state.fresh < state.next_fetch:
                left = self._take_fresh(state, slot, left, now, runs, lines)
            room -= budget - left
            if allow is not None and state.topic in allow:
                allow[state.topic] -= budget - left
        if allow is not None:
            self._count_sent(runs, now)
        if not runs:
            return None
        batch = Batch(runs, lines)
        told = _real_runs(runs) if self._has_lanes else runs
        self.events.append(RunEvent(now, _DELIVERED, slot.consumer_id, told))
        if self.settings.auto_ack:
            slot.credit -= batch.count
            settled = []
            at = 0
            for state, _, count, _ in runs:
                settled.append(_settled(state.topic, lines[at : at + count], now))
                at += count
            self.events.append(
                RunEvent(now, _ACKED, slot.consumer_id, told, None, "auto_ack", settled)
            )
            for state, offset, count, _ in runs:
                state.in_flight -= count
                self._finish_run(state, offset - state.base, count, now)
        else:
            slot.held += batch.count
            self._schedule_lease(now + self.settings.lease_ms, runs)
        return batch

    def _take_urgent(
        self,
        slot: ConsumerSlot,
        room: int,
        now: int,
        runs: list[Run],
        lines: list[bytes],
        allow: dict[str, int] | None,
    ) -> int:
        """Take up to ``room`` due priority messages of the topics ``slot`` reads (within
        what ``allow`` lets them send), the highest priority first across partitions; the
        room left. An entry whose message was taken another way meanwhile (the fresh
        cursor) is dropped here."""
        while room > 0:
            best: PartitionState | None = None
            for state in self._urgent:
                if state.topic not in slot.topics or (
                    allow is not None and allow.get(state.topic, 1) <= 0
                ):
                    continue
                if best is None or state.urgent[0] < best.urgent[0]:
                    best = state
            if best is None:
                break
            _, offset = heapq.heappop(best.urgent)
            if not best.urgent:
                self._urgent.discard(best)
            index = offset - best.base
            if 0 <= index < len(best.status) and best.status[index] == READY:
                taken = self._take_one(best, index, slot, now, runs, lines)
                room -= taken
                if allow is not None and best.topic in allow:
                    allow[best.topic] -= taken
        return room

    # -- limits -------------------------------------------------------------------------

    def _allowances(self, slot: ConsumerSlot, now: int) -> dict[str, int]:
        """How many deliveries each limited topic that ``slot`` reads may send now: its
        concurrency cap less what is in flight, its rate less what was sent inside the
        window. A topic held back by its rate sets the wake-up time it frees at."""
        if self._limits_of is not self.settings:
            self._limits = check_limits(self.settings.limits)
            self._limits_of = self.settings
            self._sent = {t: sent for t, sent in self._sent.items() if t in self._limits}
        allow: dict[str, int] = {}
        for topic, limit in self._limits.items():
            if topic not in slot.topics:
                continue
            left = 1 << 62
            if limit.concurrency is not None:
                in_flight = sum(s.in_flight for s in self.slots if s.topic == topic)
                left = limit.concurrency - in_flight
            if limit.rate is not None:
                sent = self._sent.setdefault(topic, deque())
                while sent and sent[0][0] <= now - limit.window_ms:
                    sent.popleft()
                used = sum(count for _, count in sent)
                if used >= limit.rate and sent:
                    frees = sent[0][0] + limit.window_ms
                    if self._rate_wake is None or frees < self._rate_wake:
                        self._rate_wake = frees
                left = min(left, limit.rate - used)
            allow[topic] = max(0, left)
        return allow

    def _count_sent(self, runs: list[Run], now: int) -> None:
        """Count a dispatch against the rates of the topics it sent from."""
        by_topic: dict[str, int] = {}
        for state, _, count, _ in runs:
            if state.topic in self._sent:
                by_topic[state.topic] = by_topic.get(state.topic, 0) + count
        for topic, count in by_topic.items():
            self._sent[topic].append((now, count))

    def _take_fresh(
        self,
        state: PartitionState,
        slot: ConsumerSlot,
        room: int,
        now: int,
        runs: list[Run],
        lines: list[bytes],
    ) -> int:
        """Take up to ``room`` ready messages from the fresh cursor on; the room left."""
        status = state.status
        index = state.fresh - state.base
        end = state.next_fetch - state.base
        while room > 0 and index < end:
            if status[index] != READY:
                index += 1
                continue
            stop = _first_of(status, _NOT_READY, index, min(end, index + room))
            count = stop - index
            attempts = state.attempts
            if not state.expires and attempts[index:stop].count(0) == count:
                # The common case: a run never sent before, taken in C.
                status[index:stop] = _IN_FLIGHT_BYTE * count
                attempts[index:stop] = [1] * count
                state.sent_at[index:stop] = [now] * count
                state.owners[index:stop] = [slot] * count
                lines += state.lines[index:stop]  # type: ignore[arg-type]
                state.in_flight += count
                _extend_run(runs, state, state.base + index, count, 1)
                room -= count
            else:
                for one in range(index, stop):
                    room -= self._take_one(state, one, slot, now, runs, lines)
            index = stop
        state.fresh = state.base + index
        return room

    def _take_one(
        self,
        state: PartitionState,
        index: int,
        slot: ConsumerSlot,
        now: int,
        runs: list[Run],
        lines: list[bytes],
    ) -> int:
        offset = state.base + index
        if state.expires:
            expires_at = state.expires.get(offset)
            if expires_at is not None and now >= expires_at:
                self._event(now, _EXPIRED, state, index, None, "ttl passed")
                self._finish_run(state, index, 1, now)
                return 0
        attempt = state.attempts[index] + 1
        state.attempts[index] = attempt
        state.status[index] = IN_FLIGHT
        state.sent_at[index] = now
        state.owners[index] = slot
        state.in_flight += 1
        if state.retries:
            state.retries.pop(offset, None)
        lines.append(state.lines[index])  # type: ignore[arg-type]
        _extend_run(runs, state, offset, 1, attempt)
        return 1

    # -- answers from consumers -----------------------------------------------------------

    def _remember_expired(self, slot: ConsumerSlot | None, tag: int, where: str) -> None:
        if slot is None or slot.consumer_id not in self.consumers:
            return
        slot.expired[tag] = where
        if len(slot.expired) > _EXPIRED_TAGS_KEPT:
            del slot.expired[next(iter(slot.expired))]

    def _of_dropped_topic(self, tag: int) -> bool:
        return bool(self._dropped_slots) and (
            (tag >> _OFFSET_BITS) & _SLOT_MASK in self._dropped_slots
        )

    def _find(self, tag: int) -> tuple[PartitionState, int] | None:
        """The partition and index of the delivery ``tag`` names, if it is in flight at
        the tag's attempt."""
        number = (tag >> _OFFSET_BITS) & _SLOT_MASK
        if tag < 0 or number >= len(self.slots):
            return None
        state = self.slots[number]
        index = ((tag & _OFFSET_MASK) - state.base) & _OFFSET_MASK
        if (
            index < len(state.status)
            and state.status[index] == IN_FLIGHT
            and state.attempts[index] & _ATTEMPT_MASK == tag >> _ATTEMPT_SHIFT
        ):
            return state, index
        return None

    def _lookup(self, tag: int, consumer_id: str, now: int) -> tuple[PartitionState, int]:
        found = self._find(tag)
        slot = self.consumers.get(consumer_id)
        if found is None and slot is not None and tag in slot.expired:
            raise LeaseExpiredError(
                f"delivery {tag} ({slot.expired.pop(tag)}) came back after its lease expired; "
                "the message was or will be redelivered"
            )
        if found is None or slot is None or found[0].owners[found[1]] is not slot:
            raise UnknownDeliveryError(
                f"delivery {tag} is not in flight for this consumer: it was already "
                "acknowledged, or its lease expired and it was redelivered"
            )
        state, index = found
        if now > state.lease_end(index, self.settings.lease_ms):
            # The timer has not fired yet, but the lease is over: refuse, then expire it.
            self._expire(state, index, now, consumer_id)
            raise LeaseExpiredError(
                f"delivery {tag} ({state.describe(index)}) came back after its "
                "lease expired; the message will be redelivered"
            )
        return state, index

    def ack_runs(
        self, runs: Iterable[tuple[int, int]], consumer_id: str, now: int
    ) -> list[tuple[int, SpoolError]]:
        """ACK runs of consecutive tags, ``(first tag, count)``; returns the refused tags
        with why. One ``acked`` event covers the frame."""
        slot = self.consumers.get(consumer_id)
        refused: list[tuple[int, SpoolError]] = []
        acked: list[Run] = []
        processing: list[int] = []
        settled: list[Settled] = []
        for first_tag, total in runs:
            tag, left = first_tag, total
            while left > 0:
                # A run never crosses a wrap of the tag's offset bits.
                count = min(left, _OFFSET_MASK + 1 - (tag & _OFFSET_MASK))
                if slot is None or not self._ack_fast(
                    slot, tag, count, now, acked, processing, settled
                ):
                    for one in range(tag, tag + count):
                        try:
                            state, index = self._lookup(one, consumer_id, now)
                        except SpoolError as exc:
                            if not self._of_dropped_topic(one):
                                refused.append((one, exc))
                            continue
                        processing.append(now - state.sent_at[index])
                        settled.append(_settled(state.topic, state.lines[index : index + 1], now))
                        _extend_run(acked, state, state.base + index, 1, state.attempts[index])
                        self._drop(state, index)
                        self._finish_run(state, index, 1, now)
                tag += count
                left -= count
        if acked:
            if self._has_lanes:
                acked = _real_runs(acked)
            self.events.append(RunEvent(now, _ACKED, consumer_id, acked, processing, None, settled))
        return refused

    def _ack_fast(
        self,
        slot: ConsumerSlot,
        tag: int,
        count: int,
        now: int,
        acked: list[Run],
        processing: list[int],
        settled: list[Settled],
    ) -> bool:
        """ACK a whole run in C when every message of it is in flight to ``slot`` at the
        tag's attempt, within its lease; False (nothing done) otherwise."""
        found = self._find(tag)
        if found is None:
            return False
        state, index = found
        stop = index + count
        if stop > len(state.status) or state.status.count(_IN_FLIGHT_BYTE, index, stop) != count:
            return False
        attempts = state.attempts[index:stop]
        attempt = attempts[0]
        sent = state.sent_at[index:stop]
        if (
            attempts.count(attempt) != count
            or state.owners[index:stop].count(slot) != count
            or now > min(sent) + self.settings.lease_ms
        ):
            return False
        if sent.count(sent[0]) == count:
            processing += [now - sent[0]] * count
        else:
            processing += [now - at for at in sent]
        _extend_run(acked, state, state.base + index, count, attempt)
        settled.append(_settled(state.topic, state.lines[index:stop], now))
        slot.held -= count
        state.in_flight -= count
        if state.extended:
            for offset in range(state.base + index, state.base + stop):
                state.extended.pop(offset, None)
        self._finish_run(state, index, count, now)
        return True

    def ack(self, tag: int, consumer_id: str, now: int) -> None:
        refused = self.ack_runs([(tag, 1)], consumer_id, now)
        if refused:
            raise refused[0][1]

    def nack(
        self, tag: int, consumer_id: str, now: int, *, delay_ms: int | None, reason: str | None
    ) -> None:
        if self._of_dropped_topic(tag):
            return  # its topic was deleted: nothing to retry
        state, index = self._lookup(tag, consumer_id, now)
        self._drop(state, index)
        processing = float(now - state.sent_at[index])
        self._event(now, _NACKED, state, index, consumer_id, reason, processing)
        self._failed(state, state.base + index, now, reason or "nacked", delay_ms=delay_ms)

    def cancel(self, state: PartitionState, offset: int, now: int, reason: str | None) -> str:
        """Cancel the message at ``offset`` for this group if it is not with a consumer:
        it is finished with a ``cancelled`` event and never delivered again. Returns
        ``cancelled``, ``pending`` (not read yet: the ``cancelled`` table stops it when it
        is), ``in_flight`` (a consumer holds it: its answer is taken as usual, but if it
        comes back unfinished it is not delivered again) or ``finished``."""
        where = (state.topic, state.partition, offset)
        if state.lane is not None and offset in state.lane.positions:
            state = state.lane  # revived: it is in the lane, at an offset of the lane's
            index = state.positions[offset] - state.base
        elif where in self.parking:  # parked and not saved yet, or finished since it was
            return "pending" if self.parking[where] else "finished"
        elif offset >= state.next_fetch:
            return "pending"
        else:
            index = offset - state.base
        if index < 0 or state.status[index] == DONE:
            return "finished"
        if state.status[index] == IN_FLIGHT:
            return "in_flight"
        if any((p.topic, p.partition, p.offset) == where for p in self.dead):
            return "finished"  # out of attempts: on its way to the DLQ
        if state.keys[index] is not None:
            self._unlink(state, index)
        self._event(now, _CANCELLED, state, index, None, reason or "cancelled")
        self._finish_run(state, index, 1, now)
        return "cancelled"

    def _cancelled_meanwhile(self, state: PartitionState, index: int, now: int) -> bool:
        """A delivery that came back (NACK, lease, release, its consumer gone) of a message
        cancelled while it was out is finished now, not delivered again."""
        if not self.cancelled:
            return False
        cancels = self.cancelled.get(TopicPartition(state.topic, state.partition))
        offset = state.offset_at(index)
        if not cancels or offset not in cancels:
            return False
        self._event(now, _CANCELLED, state, index, None, cancels[offset] or "cancelled")
        self._finish_run(state, index, 1, now)
        return True

    def _unlink(self, state: PartitionState, index: int) -> None:
        """Take a message out of its key's chain before it is finished out of turn: the
        earlier message that links to it links to its next instead (which so stays behind
        the earlier one), and a key whose newest it was ends at the earlier one. A message
        that heads its chain needs none of this (finishing it makes its next due)."""
        key = state.keys[index]
        offset = state.base + index
        for earlier in range(index - 1, -1, -1):
            if (
                state.keys[earlier] == key
                and state.next_same[earlier] == offset
                and state.status[earlier] != DONE
            ):
                state.next_same[earlier] = state.next_same[index]
                if state.key_tail.get(key) == offset:
                    state.key_tail[key] = state.base + earlier
                state.next_same[index] = -1
                return

    def release(self, tag: int, consumer_id: str, now: int) -> None:
        """Take back a delivery its consumer never handed to the application (prefetched,
        not yet read when it closed): not an attempt, and due again at once."""
        state, index = self._lookup(tag, consumer_id, now)
        self._drop(state, index)
        state.attempts[index] -= 1
        offset = state.base + index
        self._event(now, _RELEASED, state, index, consumer_id, "returned unread")
        if self._cancelled_meanwhile(state, index, now):
            return
        if state.attempts[index]:  # an earlier attempt failed: it keeps its row
            state.retries[offset] = (0, state.retries.get(offset, (0, None))[1])
        state.status[index] = READY
        self._push_ready(state, offset, first=True)  # it is the oldest work: first again

    def extend(self, tag: int, consumer_id: str, now: int, seconds: float) -> int:
        check_extension(seconds)
        state, index = self._lookup(tag, consumer_id, now)
        lease_end = max(state.lease_end(index, self.settings.lease_ms), now + int(seconds * 1000))
        state.extended[state.base + index] = lease_end
        return lease_end

    def add_credit(self, consumer_id: str, count: int) -> None:
        slot = self.consumers.get(consumer_id)
        if slot is not None:
            slot.credit = min(slot.credit + max(0, count), slot.prefetch)

    # -- outcomes -------------------------------------------------------------------------

    def _event(
        self,
        now: int,
        kind: EventType,
        state: PartitionState,
        index: int,
        consumer: str | None,
        reason: str | None,
        processing_ms: float | None = None,
    ) -> None:
        self.events.append(
            Event(
                now,
                kind,
                state.topic,
                state.partition,
                state.offset_at(index),
                state.keys[index],
                state.attempts[index],
                state.lines[index],
                consumer,
                reason,
                processing_ms,
            )
        )

    def _drop(self, state: PartitionState, index: int) -> None:
        """No longer in flight (the caller says what it is now); its owner is kept, as the
        last consumer it went to."""
        owner = state.owners[index]
        if owner is not None:
            owner.held -= 1
        state.in_flight -= 1
        if state.extended:
            state.extended.pop(state.base + index, None)

    def _expire(self, state: PartitionState, index: int, now: int, consumer: str | None) -> None:
        self._drop(state, index)
        self._event(now, _LEASE_EXPIRED, state, index, consumer, "lease expired")
        self._failed(state, state.base + index, now, "lease expired", delay_ms=0)

    def _failed(
        self, state: PartitionState, offset: int, now: int, reason: str, *, delay_ms: int | None
    ) -> None:
        index = offset - state.base
        if self._cancelled_meanwhile(state, index, now):
            return
        attempt = state.attempts[index]
        if attempt >= self.settings.max_deliveries:
            state.status[index] = WAITING
            state.retries[offset] = (0, reason)  # its row stays until the DLQ has it
            owner = state.owners[index]
            # The broker writes it to the DLQ, then calls dead_lettered.
            self.dead.append(
                Pending(
                    state.topic,
                    state.partition,
                    state.offset_at(index),
                    state.keys[index],
                    state.lines[index] or b"",
                    attempt=attempt,
                    last_reason=reason,
                    consumer=owner.consumer_id if owner else None,
                    lane_offset=-1 if state.real is None else offset,
                )
            )
            return
        if delay_ms is None:
            delay_ms = backoff_ms(
                attempt, self.settings.retry_backoff_ms, self.settings.retry_backoff_max_ms
            )
        if delay_ms > PARK_AFTER_MS and state.keys[index] is None:
            self._park(state, index, now + delay_ms, attempt, reason, now)
            return
        if state.real is not None:  # a revived message: its row says how often it failed
            where = (state.topic, state.partition, state.real[index])
            self.parking[where] = (now + delay_ms, attempt, reason)
        if delay_ms > 0:
            due_at = now + delay_ms
            state.status[index] = WAITING
            state.retries[offset] = (due_at, reason)
            self._schedule(due_at, state, offset, attempt)
        else:
            state.status[index] = READY
            state.retries[offset] = (0, reason)
            self._push_ready(state, offset, first=True)  # it is the oldest work: first again

    def dead_lettered(self, pending: Pending, now: int) -> None:
        state = self.partitions[cast(TopicPartition, (pending.topic, pending.partition))]
        offset = pending.offset
        if pending.lane_offset >= 0:
            state, offset = cast(PartitionState, state.lane), pending.lane_offset
        index = offset - state.base
        self._event(now, _DEAD_LETTERED, state, index, pending.consumer, pending.last_reason)
        self._finish_run(state, index, 1, now)

    def _finish_run(
        self, state: PartitionState, index: int, count: int, now: int, *, link: bool = True
    ) -> None:
        """Offsets ``index .. index + count - 1`` are final; their keys' next messages
        become due."""
        stop = index + count
        state.status[index:stop] = _DONE_BYTE * count
        state.open_count -= count
        if count == 1:
            state.lines[index] = None
        else:
            state.lines[index:stop] = [None] * count
        offset = state.base + index
        if state.real is not None:  # a revived message: its parked row goes
            for real in state.real[index:stop]:
                del state.positions[real]
                self.parking[(state.topic, state.partition, real)] = None
        for table in (state.retries, state.expires, state.delays, state.priorities):
            if table:
                if count <= len(table):
                    for one in range(offset, offset + count):
                        table.pop(one, None)
                else:
                    for one in [o for o in table if offset <= o < offset + count]:
                        del table[one]
        if not link:
            return
        keys = state.keys[index:stop]
        if keys.count(None) == count:
            return
        for position, key in enumerate(keys, index):
            if key is None:
                continue
            following = state.next_same[position]
            if following >= 0:
                self._make_due(state, following, now)
            elif state.key_tail.get(key) == state.base + position:
                del state.key_tail[key]

    # -- reporting ----------------------------------------------------------------------------

    def in_flight_count(self) -> int:
        return sum(state.in_flight for state in self.slots)

    def in_flight_by_partition(self) -> dict[TopicPartition, int]:
        counts: dict[TopicPartition, int] = {}
        for state in self.slots:  # with the lanes
            if state.in_flight:
                key = TopicPartition(state.topic, state.partition)
                counts[key] = counts.get(key, 0) + state.in_flight
        return counts

    def consumers_by_partition(self) -> dict[TopicPartition, set[str]]:
        """The consumers holding deliveries of each partition."""
        owners: dict[TopicPartition, set[str]] = {}
        for state in self.slots:
            for index in state.in_flight_indexes():
                owner = state.owners[index]
                if owner is not None:
                    key = TopicPartition(state.topic, state.partition)
                    owners.setdefault(key, set()).add(owner.consumer_id)
        return owners


def record_extra(fields: Mapping[str, Any]) -> Extra | None:
    """A parsed record's extras (deliver_at, expires_at, tags, headers), None without any."""
    deliver_at = fields.get("deliver_at")
    expires_at = fields.get("expires_at")
    tags = fields.get("tags")
    headers = fields.get("headers")
    if deliver_at is None and expires_at is None and not tags and not headers:
        return None
    return (deliver_at, expires_at, tags, headers or [])


def _for_group(group: str, extra: Extra, line: bytes) -> bool:
    """Is a record with these extras for ``group``: true unless it has an
    :data:`ONLY_GROUP_HEADER` naming another group.

    >>> line = b'{"headers":[["x-spoolmq-only-group","billing"]]}'
    >>> extra = (None, None, None, [["x-spoolmq-only-group", "billing"]])
    >>> _for_group("billing", extra, line), _for_group("audit", extra, line)
    (True, False)
    """
    if _ONLY_GROUP_BYTES not in line:
        return True
    named = _header(extra, line, ONLY_GROUP_HEADER)
    return named is None or named == group


def _priority(extra: Extra, line: bytes) -> int:
    """The priority of a record with these extras: its :data:`PRIORITY_HEADER` digit, 0
    without one (or with a value that is not one digit, as a Kafka producer may send).

    >>> line = b'{"headers":[["x-spoolmq-priority","7"]]}'
    >>> _priority((None, None, None, True), line), _priority((None, None, None, []), line)
    (7, 0)
    """
    value = _header(extra, line, PRIORITY_HEADER)
    return int(value) if value is not None and value in PRIORITY_VALUES else 0


def _header(extra: Extra, line: bytes, name: str) -> str | None:
    """The text value of the first header ``name`` of a record with these extras, None
    without one."""
    headers = extra[3]
    if not headers:
        return None
    if headers is True:  # a notice says only that there are headers: read them
        headers = orjson.loads(line).get("headers") or []
    for entry in headers:
        if len(entry) == 2 and entry[0] == name:
            return cast(str, entry[1])
    return None


def _passes(spec: Mapping[str, Any], extra: Extra, line: bytes) -> bool:
    headers = extra[3]
    if headers is True:  # a notice says only that there are headers: read them
        headers = orjson.loads(line).get("headers") or []
    return matches(spec, extra[2] or (), headers or ())
