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
- the committed offset of a partition is its smallest unfinished offset, so everything
  below it is final.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from spoolmq.errors import InvalidArgumentError, LeaseExpiredError, UnknownDeliveryError
from spoolmq.store.record import key_identity
from spoolmq.types import EventType, TopicPartition

# Event types as module constants: looking a member up on an Enum class costs ~70 ns,
# several times per message on the delivery path.
_ACKED = EventType.ACKED
_DEAD_LETTERED = EventType.DEAD_LETTERED
_DELIVERED = EventType.DELIVERED
_EXPIRED = EventType.EXPIRED
_LEASE_EXPIRED = EventType.LEASE_EXPIRED
_NACKED = EventType.NACKED
_RELEASED = EventType.RELEASED


# A record's key_identity (spoolmq.store.record): text and raw-bytes keys never collide.
Key = str | None

_EXPIRED_TAGS_KEPT = 10_000
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
    """

    lease_ms: int = 30_000
    max_deliveries: int = 5
    retry_backoff_ms: int = 1_000
    retry_backoff_max_ms: int = 60_000
    auto_ack: bool = False
    filter: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        for name in ("lease_ms", "max_deliveries", "retry_backoff_ms", "retry_backoff_max_ms"):
            number = getattr(self, name)
            # Whole numbers that fit state.db's 64-bit columns once added to a clock in ms.
            if not isinstance(number, int) or isinstance(number, bool) or number > _MAX_SETTING:
                raise InvalidArgumentError(
                    f"{name} must be a whole number up to {_MAX_SETTING}, not {number!r}"
                )
        if not isinstance(self.auto_ack, bool):
            raise InvalidArgumentError(f"auto_ack must be true or false, not {self.auto_ack!r}")
        if self.lease_ms < 1:
            raise InvalidArgumentError(f"lease must be positive, not {self.lease_ms} ms")
        if self.max_deliveries < 1:
            raise InvalidArgumentError(
                f"max_deliveries must be at least 1, not {self.max_deliveries}"
            )
        if self.retry_backoff_ms < 0 or self.retry_backoff_max_ms < 0:
            raise InvalidArgumentError("retry backoff must not be negative")
        check_filter(self.filter)


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


@dataclass(slots=True, eq=False)
class Pending:
    """A message the group has read and not yet finished."""

    topic: str
    partition: int
    offset: int
    key: Key
    line: bytes
    published_at: int
    deliver_at: int | None = None
    expires_at: int | None = None
    attempt: int = 0  # deliveries made so far
    tag: int = 0  # current delivery tag while in flight
    consumer: str | None = None
    delivered_at: int = 0
    lease_expires_at: int = 0
    last_reason: str | None = None
    due_at: int = 0  # when scheduled for a retry
    finished: bool = False
    persisted: bool = False  # has a row in state.db's deliveries table


@dataclass(slots=True)
class Event:
    """A delivery event for ``events/`` (see docs/FORMAT.md)."""

    ts: int
    type: EventType
    pending: Pending
    consumer: str | None = None
    reason: str | None = None
    processing_ms: float | None = None


@dataclass(slots=True)
class PartitionState:
    """A group's position in one partition."""

    topic: str
    partition: int
    next_fetch: int
    unfinished: list[int] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    keys: dict[Key, deque[Pending]] = field(default_factory=dict)
    committed_persisted: int = -1

    def committed(self) -> int:
        while self.unfinished and self.unfinished[0] in self.finished:
            self.finished.discard(heapq.heappop(self.unfinished))
        return self.unfinished[0] if self.unfinished else self.next_fetch

    @property
    def open_count(self) -> int:
        return len(self.unfinished) - len(self.finished)


@dataclass(slots=True)
class ConsumerSlot:
    consumer_id: str
    prefetch: int
    topics: frozenset[str]
    in_flight: set[int] = field(default_factory=set)
    credit: int = 0  # auto_ack: messages it can still take
    # Tags whose lease expired, so a late answer is told so (LeaseExpiredError) rather than
    # "unknown delivery"; the oldest are forgotten past _EXPIRED_TAGS_KEPT.
    expired: dict[int, str] = field(default_factory=dict)


class Group:
    """One consumer group's delivery state."""

    def __init__(self, name: str, settings: GroupSettings) -> None:
        self.name = name
        self.settings = settings
        self.partitions: dict[TopicPartition, PartitionState] = {}
        self.consumers: dict[str, ConsumerSlot] = {}
        self.ready: deque[Pending] = deque()
        self.in_flight: dict[int, Pending] = {}
        self.events: list[Event] = []
        self.dead: list[Pending] = []
        # When delayed messages and retries are due: (due at, tie-breaker, message).
        self._timers: list[tuple[int, int, Pending]] = []
        # Lease ends, one entry per dispatched batch holding delivery tags only: a message
        # ACKed long before its lease would end must not stay in memory until then (at
        # 50k msg/s and a 30 s lease, that held 1.5M delivered records).
        self._leases: list[tuple[int, int, tuple[int, ...]]] = []
        self._sequence = itertools.count()
        self._tags = itertools.count(1)
        self._rotation: deque[str] = deque()
        self.filtered = 0

    # -- membership ----------------------------------------------------------------

    def add_partition(self, topic: str, partition: int, start: int) -> PartitionState:
        key = TopicPartition(topic, partition)
        state = self.partitions.get(key)
        if state is None:
            state = self.partitions[key] = PartitionState(topic, partition, start)
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
        # Newest first: each goes to the front of the ready queue, so the oldest ends first.
        for tag in sorted(slot.in_flight, reverse=True):
            pending = self.in_flight.pop(tag, None)
            if pending is not None:
                self.events.append(Event(now, _RELEASED, pending, consumer_id, "consumer left"))
                self._failed(pending, now, "consumer disconnected", delay_ms=0)

    # -- reading ------------------------------------------------------------------------

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
        """Take in a record the broker read from the partition at ``state.next_fetch``.

        A record that was in delivery when an earlier broker stopped comes with the
        ``attempts_so_far`` it had, and the time ``due_at`` its scheduled retry is due
        (ms; 0: at once): it is not delivered again before then.
        """
        offset: int = fields["offset"]
        state.next_fetch = offset + 1
        if not matches(self.settings.filter, fields.get("tags") or (), fields.get("headers") or ()):
            self.filtered += 1
            return
        key = key_identity(fields)
        pending = Pending(
            topic=state.topic,
            partition=state.partition,
            offset=offset,
            key=key,
            line=line,
            published_at=fields["timestamp"],
            deliver_at=fields.get("deliver_at"),
            expires_at=fields.get("expires_at"),
            attempt=attempts_so_far,
            due_at=due_at,
            persisted=attempts_so_far > 0,
        )
        heapq.heappush(state.unfinished, offset)
        if key is None:
            self._make_due(pending, now)
            return
        queue = state.keys.get(key)
        if queue is None:
            state.keys[key] = deque([pending])
            self._make_due(pending, now)
        else:
            queue.append(pending)  # waits behind the key's earlier messages

    def _make_due(self, pending: Pending, now: int) -> None:
        """Ready now, or once its ``deliver_at`` or a retry time it was restored with."""
        when = pending.deliver_at or 0
        if pending.due_at > when:  # (not max(): this runs per message)
            when = pending.due_at
        if when > now:
            self._schedule(when, pending)
        else:
            self.ready.append(pending)

    def _schedule(self, when: int, pending: Pending) -> None:
        heapq.heappush(self._timers, (when, next(self._sequence), pending))

    def next_timer(self) -> int | None:
        heads = [heap[0][0] for heap in (self._timers, self._leases) if heap]
        return min(heads) if heads else None

    def run_timers(self, now: int) -> None:
        """Move due retries and delayed messages to ready; expire leases."""
        while self._leases and self._leases[0][0] <= now:
            _, _, tags = heapq.heappop(self._leases)
            for tag in tags:
                pending = self.in_flight.get(tag)
                if pending is None:
                    continue  # answered, or expired already
                if pending.lease_expires_at > now:  # extended meanwhile
                    self._schedule_lease(pending.lease_expires_at, (tag,))
                    continue
                self._remember_expired(pending)
                self._drop_in_flight(pending)
                self.events.append(
                    Event(now, _LEASE_EXPIRED, pending, pending.consumer, "lease expired")
                )
                self._failed(pending, now, "lease expired", delay_ms=0)
        while self._timers and self._timers[0][0] <= now:
            _, _, pending = heapq.heappop(self._timers)
            if not pending.finished:
                self.ready.append(pending)

    def _schedule_lease(self, when: int, tags: tuple[int, ...]) -> None:
        heapq.heappush(self._leases, (when, next(self._sequence), tags))

    # -- dispatch -----------------------------------------------------------------------

    def wants_more(self) -> bool:
        return bool(self.ready) and any(self._room(slot) > 0 for slot in self.consumers.values())

    def _room(self, slot: ConsumerSlot) -> int:
        if self.settings.auto_ack:
            return slot.credit
        return slot.prefetch - len(slot.in_flight)

    def dispatch(self, now: int) -> dict[str, list[Pending]]:
        """Hand ready messages to consumers with room, round-robin. Returns what to send."""
        out: dict[str, list[Pending]] = {}
        if not self.ready or not self.consumers:
            return out
        for _ in range(len(self._rotation)):
            consumer_id = self._rotation[0]
            self._rotation.rotate(-1)
            slot = self.consumers[consumer_id]
            room = self._room(slot)
            taken = self._take(slot, room, now) if room > 0 else []
            if taken:
                out.setdefault(consumer_id, []).extend(taken)
            if not self.ready:
                break
        return out

    def _take(self, slot: ConsumerSlot, room: int, now: int) -> list[Pending]:
        taken: list[Pending] = []
        skipped: list[Pending] = []
        tags: list[int] = []
        lease_end = now + self.settings.lease_ms
        while self.ready and len(taken) < room:
            pending = self.ready.popleft()
            if pending.finished:
                continue
            if pending.topic not in slot.topics:
                skipped.append(pending)
                continue
            if pending.expires_at is not None and now >= pending.expires_at:
                self.events.append(Event(now, _EXPIRED, pending, None, "ttl passed"))
                self._finish(pending, now)
                continue
            pending.attempt += 1
            pending.consumer = slot.consumer_id
            pending.delivered_at = now
            self.events.append(Event(now, _DELIVERED, pending, slot.consumer_id))
            if self.settings.auto_ack:
                slot.credit -= 1
                self.events.append(Event(now, _ACKED, pending, slot.consumer_id, "auto_ack", 0.0))
                self._finish(pending, now)
            else:
                pending.tag = next(self._tags)
                pending.lease_expires_at = lease_end
                self.in_flight[pending.tag] = pending
                slot.in_flight.add(pending.tag)
                tags.append(pending.tag)
            taken.append(pending)
        if tags:
            self._schedule_lease(lease_end, tuple(tags))
        self.ready.extendleft(reversed(skipped))
        return taken

    # -- answers from consumers -----------------------------------------------------------

    def _remember_expired(self, pending: Pending) -> None:
        slot = self.consumers.get(pending.consumer or "")
        if slot is None:
            return
        slot.expired[pending.tag] = f"{pending.topic}/{pending.partition}@{pending.offset}"
        if len(slot.expired) > _EXPIRED_TAGS_KEPT:
            del slot.expired[next(iter(slot.expired))]

    def _lookup(self, tag: int, consumer_id: str, now: int) -> Pending:
        pending = self.in_flight.get(tag)
        slot = self.consumers.get(consumer_id)
        if pending is None and slot is not None and tag in slot.expired:
            raise LeaseExpiredError(
                f"delivery {tag} ({slot.expired.pop(tag)}) came back after its lease expired; "
                "the message was or will be redelivered"
            )
        if pending is None or pending.consumer != consumer_id:
            raise UnknownDeliveryError(
                f"delivery {tag} is not in flight for this consumer: it was already "
                "acknowledged, or its lease expired and it was redelivered"
            )
        if now > pending.lease_expires_at:
            # The timer has not fired yet, but the lease is over: refuse, then expire it.
            self._drop_in_flight(pending)
            self.events.append(Event(now, _LEASE_EXPIRED, pending, consumer_id, "lease expired"))
            self._failed(pending, now, "lease expired", delay_ms=0)
            raise LeaseExpiredError(
                f"delivery {tag} ({pending.topic}/{pending.partition}@{pending.offset}) came "
                f"back after its lease expired; the message will be redelivered"
            )
        return pending

    def ack(self, tag: int, consumer_id: str, now: int) -> None:
        pending = self._lookup(tag, consumer_id, now)
        self._drop_in_flight(pending)
        self.events.append(
            Event(now, _ACKED, pending, consumer_id, None, float(now - pending.delivered_at))
        )
        self._finish(pending, now)

    def nack(
        self, tag: int, consumer_id: str, now: int, *, delay_ms: int | None, reason: str | None
    ) -> None:
        pending = self._lookup(tag, consumer_id, now)
        self._drop_in_flight(pending)
        self.events.append(
            Event(
                now,
                _NACKED,
                pending,
                consumer_id,
                reason,
                float(now - pending.delivered_at),
            )
        )
        self._failed(pending, now, reason or "nacked", delay_ms=delay_ms)

    def release(self, tag: int, consumer_id: str, now: int) -> None:
        """Take back a delivery its consumer never handed to the application (prefetched,
        not yet read when it closed): not an attempt, and due again at once."""
        pending = self._lookup(tag, consumer_id, now)
        self._drop_in_flight(pending)
        pending.attempt -= 1
        self.events.append(Event(now, _RELEASED, pending, consumer_id, "returned unread"))
        self.ready.appendleft(pending)  # it is the oldest work: first again

    def extend(self, tag: int, consumer_id: str, now: int, seconds: float) -> int:
        if seconds <= 0:
            raise InvalidArgumentError(f"a lease extension must be positive, not {seconds}")
        pending = self._lookup(tag, consumer_id, now)
        pending.lease_expires_at = max(pending.lease_expires_at, now + int(seconds * 1000))
        return pending.lease_expires_at

    def add_credit(self, consumer_id: str, count: int) -> None:
        slot = self.consumers.get(consumer_id)
        if slot is not None:
            slot.credit = min(slot.credit + max(0, count), slot.prefetch)

    # -- outcomes -------------------------------------------------------------------------

    def _drop_in_flight(self, pending: Pending) -> None:
        self.in_flight.pop(pending.tag, None)
        if pending.consumer is not None:
            slot = self.consumers.get(pending.consumer)
            if slot is not None:
                slot.in_flight.discard(pending.tag)
        pending.tag = 0

    def _failed(self, pending: Pending, now: int, reason: str, *, delay_ms: int | None) -> None:
        pending.last_reason = reason
        if pending.attempt >= self.settings.max_deliveries:
            self.dead.append(pending)  # the broker writes it to the DLQ, then calls dead_lettered
            return
        if delay_ms is None:
            delay_ms = backoff_ms(
                pending.attempt, self.settings.retry_backoff_ms, self.settings.retry_backoff_max_ms
            )
        if delay_ms > 0:
            pending.due_at = now + delay_ms
            self._schedule(pending.due_at, pending)
        else:
            self.ready.appendleft(pending)  # it is the oldest work: first again

    def dead_lettered(self, pending: Pending, now: int) -> None:
        self.events.append(
            Event(now, _DEAD_LETTERED, pending, pending.consumer, pending.last_reason)
        )
        self._finish(pending, now)

    def _finish(self, pending: Pending, now: int) -> None:
        pending.finished = True
        # Runs per message: a plain tuple finds the TopicPartition key (equal and of equal
        # hash) without building a NamedTuple, which costs several times more.
        state = self.partitions[cast(TopicPartition, (pending.topic, pending.partition))]
        state.finished.add(pending.offset)
        if pending.key is None:
            return
        queue = state.keys.get(pending.key)
        if not queue:
            return
        if queue[0] is pending:
            queue.popleft()
        else:  # pragma: no cover - only a key's head can be in delivery
            queue.remove(pending)
        if queue:
            self._make_due(queue[0], now)
        else:
            del state.keys[pending.key]

    # -- reporting ----------------------------------------------------------------------------

    def in_flight_by_partition(self) -> dict[TopicPartition, int]:
        counts: dict[TopicPartition, int] = {}
        for pending in self.in_flight.values():
            key = TopicPartition(pending.topic, pending.partition)
            counts[key] = counts.get(key, 0) + 1
        return counts

    def consumers_by_partition(self) -> dict[TopicPartition, set[str]]:
        """The consumers holding deliveries of each partition."""
        owners: dict[TopicPartition, set[str]] = {}
        for pending in self.in_flight.values():
            if pending.consumer:
                key = TopicPartition(pending.topic, pending.partition)
                owners.setdefault(key, set()).add(pending.consumer)
        return owners
