"""What a ConsumerBroker saves to ``state.db`` at a checkpoint, decided with no I/O.

Per group: the committed offsets that moved, a row for each delivery still open (with its
retry time when one is scheduled), and the rows of deliveries finished since they were
written. A delivery settled within one checkpoint interval was never written, so the common
case costs no SQL at all; one returned unread (attempt 0) has nothing to remember either.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from spoolmq.broker.delivery import Group, Pending
from spoolmq.store.state import DeliveryKey, DeliveryRow, ScheduledRow
from spoolmq.types import TopicPartition


class Checkpoint(NamedTuple):
    """The arguments of :meth:`spoolmq.store.state.StateDB.checkpoint`."""

    committed: dict[str, dict[TopicPartition, int]]
    deliveries: list[DeliveryRow]
    scheduled: list[ScheduledRow]
    finished: list[DeliveryKey]

    def is_empty(self) -> bool:
        return not (self.committed or self.deliveries or self.scheduled or self.finished)


def _keeps_a_row(pending: Pending) -> bool:
    return not pending.finished and pending.attempt > 0


def collect_checkpoint(changed: Iterable[tuple[Group, Iterable[Pending]]], now: int) -> Checkpoint:
    """The checkpoint of groups, each with the deliveries that changed since the last one
    (``now`` decides which retries are still to come)."""
    checkpoint = Checkpoint({}, [], [], [])
    for group, dirty in changed:
        name = group.name
        for key, state in group.partitions.items():
            position = state.committed()
            if position != state.committed_persisted:
                checkpoint.committed.setdefault(name, {})[key] = position
        for p in dirty:
            if not _keeps_a_row(p):
                if p.persisted:
                    checkpoint.finished.append(DeliveryKey(name, p.topic, p.partition, p.offset))
                continue
            checkpoint.deliveries.append(
                DeliveryRow(
                    name,
                    p.topic,
                    p.partition,
                    p.offset,
                    p.consumer or "",
                    p.attempt,
                    p.delivered_at,
                    p.lease_expires_at,
                )
            )
            if p.due_at > now:
                checkpoint.scheduled.append(
                    ScheduledRow(
                        name, p.topic, p.partition, p.offset, p.due_at, p.attempt, p.last_reason
                    )
                )
    return checkpoint


def mark_saved(
    checkpoint: Checkpoint, groups: Mapping[str, Group], dirty: Iterable[Pending]
) -> None:
    """Once ``checkpoint`` is in ``state.db``: remember what is saved, so the next one
    writes only what changes after it."""
    for name, offsets in checkpoint.committed.items():
        partitions = groups[name].partitions
        for key, position in offsets.items():
            partitions[key].committed_persisted = position
    for pending in dirty:
        pending.persisted = _keeps_a_row(pending)
