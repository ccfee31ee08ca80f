"""Where the Kafka front's consumer groups meet ``state.db``: committed offsets, recorded
membership, and what ``spoolmq groups`` asks about a Kafka group.

Offsets go in ``group_offsets``, the same table as every spoolmq group's, so
``spoolmq groups list/describe`` shows a Kafka group's position and lag with no special
case, and ``spoolmq groups reset`` moves it (the coordinator reads committed offsets from
the database on each OffsetFetch, never from a cache, so a reset is seen at once).
Membership is recorded in ``kafka_groups``/``kafka_members`` on each rebalance only.

All database work of the coordinator goes through one worker thread: it never blocks the
Kafka child's event loop, and the writes keep the order they were asked in.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka.coordinator import Group
from spoolmq.kafka.wire import Reader
from spoolmq.store.state import KafkaGroupRow, KafkaMemberRow, StateDB
from spoolmq.types import TopicPartition

T = TypeVar("T")
log = logging.getLogger(__name__)

# Partitions listed in one decoded assignment, at most: a display aid, never the truth.
_MAX_ASSIGNED_PARTITIONS = 100_000


def decode_consumer_assignment(data: bytes) -> dict[str, list[int]] | None:
    """The partitions of a ``consumer`` protocol assignment (version, [topic, [partition]],
    user data), or None when the bytes are not one. The broker never needs this (the
    leader's assignment is opaque to it); it is decoded only to show who owns what."""
    if not data:
        return {}
    try:
        r = Reader(data)
        r.int16()  # version
        result: dict[str, list[int]] = {}
        total = 0
        for _ in range(r.array_count(min_size=6)):
            topic = r.string()
            count = r.array_count(min_size=4)
            total += count
            if total > _MAX_ASSIGNED_PARTITIONS:
                return None
            result[topic] = [r.int32() for _ in range(count)]
        return result
    except KafkaDecodeError:
        return None


def group_rows(group: Group, now_ms: int) -> tuple[KafkaGroupRow, list[KafkaMemberRow]]:
    row = KafkaGroupRow(
        group.group_id,
        group.state.value,
        group.generation,
        group.protocol_type,
        group.protocol,
        group.leader_id,
        now_ms,
    )
    members = []
    for m in group.members.values():
        assigned = (
            decode_consumer_assignment(m.assignment) if group.protocol_type == "consumer" else None
        )
        members.append(
            KafkaMemberRow(
                group.group_id,
                m.member_id,
                m.client_id,
                m.client_host,
                None if assigned is None else json.dumps(assigned, sort_keys=True),
            )
        )
    return row, members


def _log_failure(future: Future[None]) -> None:
    # Membership rows are a view for `spoolmq groups`; failing to write one must not
    # stop the coordinator, but it must not pass unseen either.
    exc = future.exception()
    if exc is not None:
        log.error("kafka groups: recording membership in state.db failed: %s", exc)


class GroupStore:
    """The coordinator's handle on ``state.db`` (one per Kafka child)."""

    def __init__(self, data_dir: Path, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self.state = StateDB(Path(data_dir) / "state.db", clock=clock)
        self._clock = clock
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kafka-groups-db")
        # A new child starts with no members: clear what the previous one recorded.
        self._worker.submit(self.state.clear_kafka_members).add_done_callback(_log_failure)

    async def run(self, call: Callable[..., T], *args: Any) -> T:
        """Run ``call`` on the database thread and wait for it without blocking the loop."""
        return await asyncio.get_running_loop().run_in_executor(self._worker, call, *args)

    def record(self, group: Group) -> None:
        """Queue the group's membership for writing (called by the coordinator's
        ``on_change``, which cannot wait); a failure is logged by the executor's future."""
        row, members = group_rows(group, self._clock.now_ms())
        self._worker.submit(self.state.record_kafka_group, row, members).add_done_callback(
            _log_failure
        )

    def partitions(self) -> dict[str, int]:
        return {name: config.partitions for name, config in self.state.topics().items()}

    def commit(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        self.state.commit_offsets(group, offsets)

    def committed(self, group: str) -> dict[TopicPartition, int]:
        return self.state.committed_offsets(group)

    def close(self) -> None:
        self._worker.shutdown(wait=True)
        self.state.close()


def kafka_group_members(data_dir: Path, group: str) -> list[dict[str, Any]]:
    """The members a running Kafka front has joined to ``group`` (member id, client id,
    host, assigned partitions), for ``spoolmq groups describe`` and to refuse a reset while
    any is joined. With no broker running nobody can be joined, whatever was recorded."""
    return kafka_members_by_group(data_dir, group).get(group, [])


def kafka_members_by_group(
    data_dir: Path, group: str | None = None
) -> dict[str, list[dict[str, Any]]]:
    """:func:`kafka_group_members` of ``group``, or of every Kafka group, by group (one
    query)."""
    from spoolmq.broker.manager import broker_running

    if not broker_running(Path(data_dir)):
        return {}
    state = StateDB(Path(data_dir) / "state.db")
    try:
        rows = state.kafka_members(group)
    finally:
        state.close()
    members: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        members.setdefault(r.group_name, []).append(
            {
                "member_id": r.member_id,
                "client_id": r.client_id,
                "client_host": r.client_host,
                "assignment": None if r.assignment is None else json.loads(r.assignment),
            }
        )
    return members


def kafka_partition_owners(data_dir: Path, group: str) -> dict[TopicPartition, list[str]]:
    """Which joined Kafka member of ``group`` owns each partition (the ``consumer`` column
    of ``spoolmq groups describe``); empty for a group with no Kafka members."""
    owners: dict[TopicPartition, list[str]] = {}
    for member in kafka_group_members(data_dir, group):
        for topic, partitions in (member["assignment"] or {}).items():
            for partition in partitions:
                owners.setdefault(TopicPartition(topic, partition), []).append(member["member_id"])
    return owners
