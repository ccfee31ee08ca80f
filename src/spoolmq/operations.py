"""What an operator does to a data directory, with or without a broker running: look at
consumer groups, move them (plan, then apply), list dead letters and replay them.

The CLI parses arguments and renders what these functions return, as rq's CLI calls
``requeue``; anything else that operates a queue (a script, a web console) calls the same
functions. While a broker runs, what it holds in memory wins: group views come from it and
resets go through it (refused while the group has live consumers); with no broker, the
files are read and written directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from spoolmq.broker.dead_letter import DeadLetterHeader, is_dead_letter_header
from spoolmq.broker.group_view import partition_rows
from spoolmq.broker.manager import broker_running
from spoolmq.client import Admin
from spoolmq.errors import GroupActiveError, InvalidArgumentError
from spoolmq.kafka.group_store import kafka_group_members, kafka_partition_owners
from spoolmq.store import Message, Record, Store
from spoolmq.store.names import dlq_topic
from spoolmq.types import TopicPartition

# -- consumer groups -------------------------------------------------------------------------


def group_rows(data: Path, group: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per group, one row per partition (topic, partition, committed, log end, lag,
    in-flight, consumers): live from the broker when one runs, and from ``state.db`` for
    the groups it does not hold (or all of them when no broker runs). ``group`` picks one;
    an unknown one is an :class:`InvalidArgumentError`."""
    result: dict[str, list[dict[str, Any]]] = {}
    if broker_running(data):
        with Admin(data) as admin:
            live = admin.describe_groups()
        result = {name: info["partitions"] for name, info in live.items()}
    with Store(data) as store:
        for name in store.state.groups():
            if name in result:
                continue
            committed = store.state.committed_offsets(name)
            ends = {tp: store.log_end_offset(*tp) for tp in committed}
            result[name] = partition_rows(
                committed, ends, consumers=kafka_partition_owners(data, name)
            )
    if group is not None:
        if group not in result:
            raise InvalidArgumentError(f"no consumer group {group!r}")
        return {group: result[group]}
    return result


@dataclass(frozen=True, slots=True)
class ResetTo:
    """Where a group reset moves each partition: ``earliest`` (the log start), ``latest``
    (the log end), ``offset`` (``value``, clamped into the log) or ``time`` (the first
    record at or after ``value`` ms)."""

    kind: Literal["earliest", "latest", "offset", "time"]
    value: int = 0


@dataclass(frozen=True, slots=True)
class ResetChange:
    """One partition of a planned reset: its committed offset now (None: never
    committed) and the offset it moves to."""

    topic: str
    partition: int
    current: int | None
    target: int


def plan_reset(store: Store, group: str, topic: str, to: ResetTo) -> list[ResetChange]:
    """What resetting ``group`` on every partition of ``topic`` would change; nothing is
    written (a dry run shows this, then :func:`apply_reset` applies it)."""
    config = store.topic_config(topic)
    current = store.state.committed_offsets(group, topic)
    changes = []
    for partition in range(config.partitions):
        start = store.log_start_offset(topic, partition)
        end = store.log_end_offset(topic, partition)
        if to.kind == "earliest":
            target = start
        elif to.kind == "latest":
            target = end
        elif to.kind == "offset":
            target = min(max(to.value, start), end)
        else:
            target = store.offset_for_timestamp(topic, partition, to.value)
        tp = TopicPartition(topic, partition)
        changes.append(ResetChange(topic, partition, current.get(tp), target))
    return changes


def apply_reset(data: Path, group: str, changes: list[ResetChange]) -> None:
    """Move ``group`` to the planned offsets. Through the running broker, which refuses
    while the group has live consumers (:class:`GroupActiveError`); directly in
    ``state.db`` when no broker runs."""
    targets = {TopicPartition(c.topic, c.partition): c.target for c in changes}
    if broker_running(data):
        if kafka_group_members(data, group):  # the Kafka front's members are not the broker's
            raise GroupActiveError(f"group {group!r} has Kafka consumers joined; stop them first")
        with Admin(data) as admin:
            admin.reset_group(group, targets)
    else:
        with Store(data) as store:
            store.state.reset_group(group, targets)


# -- dead letters ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message in ``<topic>.dlq``: where it is, where it came from, why it failed."""

    dlq_partition: int
    dlq_offset: int
    topic: str | None  # the original's topic, partition and offset (x-dlq-* headers)
    partition: str | None
    offset: str | None
    group: str | None  # the group that gave up on it
    attempts: str | None
    reason: str | None
    record: Record


def dead_letters(store: Store, topic: str) -> list[DeadLetter]:
    """Every dead letter of ``topic``, oldest first per DLQ partition (none if the
    topic never dead-lettered anything)."""
    name = dlq_topic(topic)
    if name not in store.topics():
        return []
    found = []
    for partition in range(store.topic_config(name).partitions):
        for record in store.reader(name, partition):
            headers = {h: v for h, v in record.headers if isinstance(v, str)}
            found.append(
                DeadLetter(
                    dlq_partition=partition,
                    dlq_offset=record.offset,
                    topic=headers.get(DeadLetterHeader.TOPIC),
                    partition=headers.get(DeadLetterHeader.PARTITION),
                    offset=headers.get(DeadLetterHeader.OFFSET),
                    group=headers.get(DeadLetterHeader.GROUP),
                    attempts=headers.get(DeadLetterHeader.ATTEMPTS),
                    reason=headers.get(DeadLetterHeader.REASON),
                    record=record,
                )
            )
    return found


@dataclass(frozen=True, slots=True)
class ReplayResult:
    replayed: int  # appended to the topic by this call
    already_replayed: int  # appended by an earlier replay: not again


def replay_dead_letters(store: Store, topic: str) -> ReplayResult:
    """Republish every dead letter of ``topic`` to ``topic``, without its ``x-dlq-*``
    headers. Each DLQ offset is published once however often this runs (idempotent
    publishing, keyed by the DLQ partition and offset), so a replay that was interrupted
    can simply be run again."""
    letters = dead_letters(store, topic)
    replayed = 0
    for letter in letters:
        record = letter.record
        position = store.append_batch(
            topic,
            [
                Message(
                    value=record.value,
                    key=record.key,
                    headers=[(h, v) for h, v in record.headers if not is_dead_letter_header(h)],
                    tags=record.tags,
                    producer_id=f"dlq-replay:{dlq_topic(topic)}:{letter.dlq_partition}",
                    sequence=record.offset,
                )
            ],
        )[0]
        if not position.duplicate:
            replayed += 1
    return ReplayResult(replayed, len(letters) - replayed)
