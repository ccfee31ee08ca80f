"""The per-partition view of a consumer group: committed offset, log end, lag, messages in
flight and the consumers holding them. One pure function builds it for both the broker's
live ``describe_groups`` and the CLI's offline view (from ``state.db``, no broker running).

It lives in ``broker/`` because a consumer group is the broker's notion (the store only
keeps committed offsets); the CLI sits above the broker and imports it from here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from spoolmq.broker.delivery import Group
from spoolmq.types import TopicPartition


def lag(committed: int, log_end: int) -> int:
    """Messages of a partition the group has not finished: never below zero (a group can
    have committed past the end of a partition that was deleted and created again)."""
    return max(0, log_end - committed)


def partition_rows(
    committed: Mapping[TopicPartition, int],
    log_ends: Mapping[TopicPartition, int],
    in_flight: Mapping[TopicPartition, int] | None = None,
    consumers: Mapping[TopicPartition, Iterable[str]] | None = None,
) -> list[dict[str, Any]]:
    """One row per partition of ``committed``, in topic and partition order; a partition
    missing from ``log_ends`` is empty, from ``in_flight``/``consumers`` idle.

    >>> partition_rows({TopicPartition("orders", 0): 7}, {TopicPartition("orders", 0): 10})
    ... # doctest: +NORMALIZE_WHITESPACE
    [{'topic': 'orders', 'partition': 0, 'committed': 7, 'log_end_offset': 10, 'lag': 3,
      'in_flight': 0, 'consumers': []}]
    """
    rows = []
    for key in sorted(committed):
        topic, partition = key
        position, end = committed[key], log_ends.get(key, 0)
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "committed": position,
                "log_end_offset": end,
                "lag": lag(position, end),
                "in_flight": (in_flight or {}).get(key, 0),
                "consumers": sorted((consumers or {}).get(key, ())),
            }
        )
    return rows


def add_parked(
    groups: Mapping[str, Iterable[dict[str, Any]]],
    parked: Mapping[str, Mapping[TopicPartition, int]],
) -> None:
    """Give every row of ``groups`` its ``parked`` count (``StateDB.parked_by_partition``):
    the group's delayed messages waiting in ``state.db``, past its committed offset, so
    not in its lag."""
    for name, rows in groups.items():
        counts = parked.get(name, {})
        for row in rows:
            row["parked"] = counts.get(TopicPartition(row["topic"], row["partition"]), 0)


def describe_groups(
    groups: Mapping[str, Group], log_ends: Mapping[TopicPartition, int]
) -> dict[str, Any]:
    """The live view of the groups a ConsumerBroker runs: per group its consumers and one
    row per partition (what the admin ``describe_groups`` answers)."""
    described: dict[str, Any] = {}
    for name, group in groups.items():
        rows = partition_rows(
            {key: state.committed() for key, state in group.partitions.items()},
            log_ends,
            group.in_flight_by_partition(),
            group.consumers_by_partition(),
        )
        described[name] = {"consumers": sorted(group.consumers), "partitions": rows}
    return described
