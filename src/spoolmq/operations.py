"""What an operator does to a data directory, with or without a broker running: look at
consumer groups, move them (plan, then apply), list dead letters and replay them.

The CLI parses arguments and renders what these functions return, as rq's CLI calls
``requeue``; anything else that operates a queue (a script, a web console) calls the same
functions. While a broker runs, what it holds in memory wins: group views come from it and
resets go through it (refused while the group has live consumers); with no broker, the
files are read and written directly.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
from filelock import FileLock

from spoolmq.broker.dead_letter import (
    PURGED_FILE,
    DeadLetterHeader,
    is_dead_letter_header,
    purged_offsets,
)
from spoolmq.broker.delivery import ONLY_GROUP_HEADER
from spoolmq.broker.group_view import add_parked, partition_rows
from spoolmq.broker.manager import broker_running
from spoolmq.client import Admin
from spoolmq.errors import (
    GroupActiveError,
    InvalidArgumentError,
    StorageError,
    UnknownTopicError,
)
from spoolmq.files import write_durably
from spoolmq.kafka.group_store import (
    kafka_group_members,
    kafka_members_by_group,
    kafka_partition_owners,
)
from spoolmq.store import Message, Record, Store
from spoolmq.store.names import dlq_topic, topic_dir
from spoolmq.tasks.codec import task_id_of
from spoolmq.tasks.results import FILE_NAME as TASKS_FILE
from spoolmq.tasks.results import ResultStore
from spoolmq.types import TopicPartition

# -- consumer groups -------------------------------------------------------------------------


def group_rows(data: Path, group: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """Per group, one row per partition (topic, partition, committed, log end, lag,
    in-flight, consumers, parked): live from the broker when one runs, and from
    ``state.db`` for the groups it does not hold (or all of them when no broker runs); the
    parked counts (delayed messages held in ``state.db`` until they are due, which the lag
    leaves out) always from ``state.db``, as the broker last saved them. ``group`` picks one;
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
        add_parked(result, store.state.parked_by_partition())
    if group is not None:
        if group not in result:
            raise InvalidArgumentError(f"no consumer group {group!r}")
        return {group: result[group]}
    return result


@dataclass(frozen=True, slots=True)
class ResetTo:
    """Where a group reset moves each partition: ``earliest`` (the log start), ``latest``
    (the log end), ``offset`` (``value``, clamped into the log), ``time`` (the first
    record at or after ``value`` ms) or ``shift`` (``value`` from the committed offset, or
    from the log start if the group never committed there; clamped into the log)."""

    kind: Literal["earliest", "latest", "offset", "time", "shift"]
    value: int = 0


@dataclass(frozen=True, slots=True)
class ResetChange:
    """One partition of a planned reset: its committed offset now (None: never
    committed) and the offset it moves to."""

    topic: str
    partition: int
    current: int | None
    target: int


def plan_reset(store: Store, group: str, topic: str | None, to: ResetTo) -> list[ResetChange]:
    """What resetting ``group`` on every partition of ``topic`` (None: of every topic the
    group has committed offsets in) would change; nothing is written (a preview shows
    this, then :func:`apply_reset` applies it)."""
    if topic is None:
        topics = sorted({tp.topic for tp in store.state.committed_offsets(group)})
        if not topics:
            raise InvalidArgumentError(f"consumer group {group!r} has no committed offsets")
        return [c for name in topics for c in plan_reset(store, group, name, to)]
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
        elif to.kind == "shift":
            committed = current.get(TopicPartition(topic, partition))
            target = min(max((start if committed is None else committed) + to.value, start), end)
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


def delete_group(data: Path, group: str) -> None:
    """Forget ``group``: its committed offsets, open deliveries and scheduled retries.
    Through the running broker, which refuses while the group has live consumers
    (:class:`GroupActiveError`); directly in ``state.db`` when no broker runs. An unknown
    group is an :class:`InvalidArgumentError`."""
    if broker_running(data):
        with Admin(data) as admin:
            admin.delete_group(group)
        return
    with Store(data) as store:
        if group not in store.state.groups():
            raise InvalidArgumentError(f"no consumer group {group!r}")
        store.state.delete_group(group)


def group_members(data: Path, group: str) -> list[dict[str, Any]]:
    """The consumers in ``group`` now, from the running broker (none when no broker runs):
    see :func:`members_by_group`."""
    return members_by_group(data, group).get(group, [])


def members_by_group(data: Path, group: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The consumers in ``group`` (or in every group) now, by group, from the running
    broker; none when no broker runs. Each is a dict with ``kind`` ``"spoolmq"``, a
    consumer connected to the broker (consumer id, client id, pid, name, connected since and
    last seen in epoch ms, in-flight), or ``"kafka"``, a member the Kafka front
    has joined to the group (its member id as ``consumer``, its client id as ``name``, its
    ``host`` and ``assignment``; what the broker does not know of it is None)."""
    if not broker_running(data):
        return {}
    with Admin(data) as admin:
        described = admin.describe_groups()
    members = {
        name: [{**m, "kind": "spoolmq"} for m in info.get("members", [])]
        for name, info in described.items()
        if group is None or name == group
    }
    for name, joined in kafka_members_by_group(data, group).items():
        members.setdefault(name, []).extend(
            {
                "consumer": m["member_id"],
                "kind": "kafka",
                "client_id": m["client_id"],
                "pid": None,
                "name": m["client_id"],
                "since": None,
                "last_seen": None,
                "in_flight": None,
                "host": m["client_host"],
                "assignment": m["assignment"],
            }
            for m in joined
        )
    return members


# -- dead letters ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """A message in ``<topic>.dlq``: where it is, where it came from, why it failed.
    ``partition``, ``offset`` and ``attempts`` are numbers (None if a header is missing or
    not a number: a message written to the DLQ by hand)."""

    dlq_partition: int
    dlq_offset: int
    topic: str | None  # the original's topic, partition and offset (x-dlq-* headers)
    partition: int | None
    offset: int | None
    group: str | None  # the group that gave up on it
    attempts: int | None
    reason: str | None
    record: Record


def _number(text: str | None) -> int | None:
    """A header's decimal number, None when absent or not one.

    >>> _number("12"), _number(None), _number("x")
    (12, None, None)
    """
    return int(text) if text is not None and text.isascii() and text.isdecimal() else None


def dead_letter_topic(store: Store, topic: str) -> str:
    """``topic``'s DLQ name, after making sure one of the two exists: a DLQ command on a
    mistyped topic is an error, not an empty success."""
    name = dlq_topic(topic)
    topics = store.topics()
    if topic not in topics and name not in topics:
        raise UnknownTopicError(f"topic {topic!r} does not exist")
    return name


def dead_letters(store: Store, topic: str) -> list[DeadLetter]:
    """Every dead letter of ``topic`` not purged, oldest first per DLQ partition (none if
    the topic never dead-lettered anything; :class:`UnknownTopicError` if neither ``topic``
    nor its DLQ exists)."""
    name = dead_letter_topic(store, topic)
    if name not in store.topics():
        return []
    purged = purged_offsets(store, name)
    found = []
    for partition in range(store.topic_config(name).partitions):
        gone = purged.get(partition, set())
        for record in store.reader(name, partition):
            if record.offset in gone:
                continue
            headers = {h: v for h, v in record.headers if isinstance(v, str)}
            found.append(
                DeadLetter(
                    dlq_partition=partition,
                    dlq_offset=record.offset,
                    topic=headers.get(DeadLetterHeader.TOPIC),
                    partition=_number(headers.get(DeadLetterHeader.PARTITION)),
                    offset=_number(headers.get(DeadLetterHeader.OFFSET)),
                    group=headers.get(DeadLetterHeader.GROUP),
                    attempts=_number(headers.get(DeadLetterHeader.ATTEMPTS)),
                    reason=headers.get(DeadLetterHeader.REASON),
                    record=record,
                )
            )
    return found


def _select(
    letters: list[DeadLetter],
    *,
    offsets: Iterable[tuple[int, int]] | None = None,
    reason: str | None = None,
    before_ms: int | None = None,
) -> list[DeadLetter]:
    """The letters every given criterion picks: at one of ``offsets`` ((DLQ partition,
    DLQ offset) pairs, each of which must be a dead letter), with a reason matching the
    regular expression ``reason``, stored before ``before_ms``."""
    chosen = letters
    if offsets is not None:
        wanted = set()
        for pair in offsets:
            if not (
                isinstance(pair, tuple)
                and len(pair) == 2
                and all(type(n) is int and n >= 0 for n in pair)
            ):
                raise InvalidArgumentError(
                    f"a dead letter is picked by (partition, offset), not {pair!r}"
                )
            wanted.add(pair)
        present = {(d.dlq_partition, d.dlq_offset) for d in letters}
        missing = sorted(wanted - present)
        if missing:
            shown = ", ".join(f"{p}@{o}" for p, o in missing[:5])
            raise InvalidArgumentError(f"no dead letter at partition@offset {shown}")
        chosen = [d for d in chosen if (d.dlq_partition, d.dlq_offset) in wanted]
    if reason is not None:
        try:
            pattern = re.compile(reason)
        except re.error as exc:
            raise InvalidArgumentError(f"--reason is not a regular expression: {exc}") from None
        chosen = [d for d in chosen if pattern.search(d.reason or "")]
    if before_ms is not None:
        chosen = [d for d in chosen if d.record.timestamp < before_ms]
    return chosen


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """What a replay did: ``replayed`` appended by this call, ``already_replayed`` appended
    by an earlier replay (not again). ``letters`` are the dead letters selected; with
    ``dry_run`` nothing was appended and both counts are 0."""

    replayed: int
    already_replayed: int
    letters: tuple[DeadLetter, ...] = ()
    to_group: str | None = None
    dry_run: bool = False
    tasks_queued: int = 0  # dead-lettered tasks in tasks.db made ``queued`` again


def replay_dead_letters(
    store: Store,
    topic: str,
    *,
    offsets: Iterable[tuple[int, int]] | None = None,
    reason: str | None = None,
    to_group: str | None = None,
    dry_run: bool = False,
) -> ReplayResult:
    """Republish dead letters of ``topic`` to ``topic``, without their ``x-dlq-*`` headers:
    all of them, or those at ``offsets`` ((DLQ partition, DLQ offset) pairs) and/or whose
    reason matches the regular expression ``reason``. With ``to_group`` only that consumer
    group is given them (the :data:`ONLY_GROUP_HEADER` header); ``dry_run`` selects and
    returns them without appending anything.

    ``to_group`` must be a group that reads ``topic``: one that gave up on one of its dead
    letters, or has a committed offset in it. Another name is a mistake (a typo would
    otherwise store messages that no group is ever given).

    Each DLQ offset is published once per destination however often this runs
    (idempotent publishing, keyed by the DLQ partition and offset, and the group), so a
    replay that was interrupted can simply be run again.

    A replayed task message (``spoolmq.tasks``) that reaches the group that gave up on
    it makes its task ``queued`` again in ``tasks.db``, if it was ``dead_lettered``:
    ``result()`` then waits for the new run."""
    if to_group is not None and (not isinstance(to_group, str) or not to_group.strip()):
        raise InvalidArgumentError(f"--to-group needs a group name, not {to_group!r}")
    every = dead_letters(store, topic)
    if to_group is not None:
        readers = {d.group for d in every if d.group} | set(store.state.groups_reading(topic))
        if to_group not in readers:
            raise InvalidArgumentError(
                f"--to-group {to_group!r}: no group of that name reads {topic!r} (none has "
                f"dead-lettered its messages or committed an offset in it); groups that do: "
                f"{', '.join(sorted(readers)) or 'none'}"
            )
    letters = _select(every, offsets=offsets, reason=reason)
    if dry_run:
        return ReplayResult(0, 0, tuple(letters), to_group, dry_run=True)
    producer = f"dlq-replay:{dlq_topic(topic)}"
    extra: list[tuple[str, str | bytes]] = []
    if to_group is not None:
        producer += f":group={to_group}"
        extra = [(ONLY_GROUP_HEADER, to_group)]
    replayed = 0
    for letter in letters:
        record = letter.record
        kept = [
            (h, v)
            for h, v in record.headers
            if not is_dead_letter_header(h) and h != ONLY_GROUP_HEADER
        ]
        position = store.append_batch(
            topic,
            [
                Message(
                    value=record.value,
                    key=record.key,
                    headers=[*kept, *extra],
                    tags=record.tags,
                    producer_id=f"{producer}:{letter.dlq_partition}",
                    sequence=record.offset,
                )
            ],
        )[0]
        if not position.duplicate:
            replayed += 1
    return ReplayResult(
        replayed,
        len(letters) - replayed,
        tuple(letters),
        to_group,
        tasks_queued=_requeue_tasks(store.path, letters, to_group),
    )


def _requeue_tasks(data: Path, letters: list[DeadLetter], to_group: str | None) -> int:
    """The dead-lettered tasks of replayed ``letters`` queued again in ``tasks.db``
    (where there is one): those whose copy reaches the group that gave up on them."""
    if not (data / TASKS_FILE).exists():
        return 0
    task_ids = [
        task_id
        for letter in letters
        if (task_id := task_id_of(letter.record.value)) is not None
        and (to_group is None or to_group == letter.group)
    ]
    if not task_ids:
        return 0
    results = ResultStore(data)
    try:
        return results.redriven(task_ids)
    except sqlite3.Error as exc:
        raise StorageError(
            f"replayed the dead letters, but could not queue their tasks again in "
            f"{results.path}: {exc} (run the replay again to retry)"
        ) from None
    finally:
        results.close()


def purge_dead_letters(
    store: Store,
    topic: str,
    *,
    before_ms: int | None = None,
    offsets: Iterable[tuple[int, int]] | None = None,
) -> int:
    """Purge dead letters of ``topic``: all of them, or those stored before ``before_ms``
    (epoch ms) and/or at ``offsets`` ((DLQ partition, DLQ offset) pairs). Returns how many.

    A log is append-only and a broker may be appending to the DLQ's active segment, so a
    purge does not cut records out of files: it records the purged offsets in
    ``logs/<topic>.dlq/purged.json`` (durably, under a file lock, so concurrent purges
    add up), and every DLQ reader here (``dlq list``, ``dlq replay``, the console) skips
    them. The bytes go when the DLQ topic's retention deletes their segments; offsets
    below the log start are dropped from the file then."""
    name = dead_letter_topic(store, topic)
    chosen = _select(dead_letters(store, topic), offsets=offsets, before_ms=before_ms)
    if not chosen:
        return 0
    directory = topic_dir(store.path, name)
    with FileLock(str(directory / f".{PURGED_FILE}.lock"), mode=0o600):
        purged = purged_offsets(store, name)
        for letter in chosen:
            purged.setdefault(letter.dlq_partition, set()).add(letter.dlq_offset)
        for partition, marks in purged.items():
            start = store.log_start_offset(name, partition)
            purged[partition] = {o for o in marks if o >= start}
        text = {str(p): sorted(marks) for p, marks in sorted(purged.items()) if marks}
        write_durably([(directory / PURGED_FILE, orjson.dumps(text))])
    return len(chosen)
