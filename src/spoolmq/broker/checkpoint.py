"""What a ConsumerBroker saves to ``state.db`` at a checkpoint, decided with no I/O.

Per group: the committed offsets that moved, a row for each delivery still open that
``state.db`` does not have as it is now (with its retry time when one is scheduled), and the
rows of deliveries finished since they were written; and the messages the group parked
(:attr:`Group.parking`) or finished after they were revived, in the same transaction as the
committed offset that passes them. A delivery younger than ``min_age_ms``
(one checkpoint interval) that never failed is not written yet: most are settled within
milliseconds, so the common case costs no SQL at all; if the broker dies first, that
delivery's attempt is not counted after the restart (the message itself is redelivered,
since the committed offset never passes an unfinished one).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import NamedTuple

from spoolmq.broker.delivery import IN_FLIGHT_ROW, Group, PartitionState
from spoolmq.store.state import DeliveryKey, DeliveryRow, ParkedRow, ScheduledRow
from spoolmq.types import TopicPartition


class Checkpoint(NamedTuple):
    """The arguments of :meth:`spoolmq.store.state.StateDB.checkpoint`."""

    committed: dict[str, dict[TopicPartition, int]]
    deliveries: list[DeliveryRow]
    scheduled: list[ScheduledRow]
    finished: list[DeliveryKey]
    parked: list[ParkedRow]
    unparked: list[DeliveryKey]

    def is_empty(self) -> bool:
        return not (
            self.committed
            or self.deliveries
            or self.scheduled
            or self.finished
            or self.parked
            or self.unparked
        )


def _open_deliveries(
    group: Group, state: PartitionState, now: int, min_age_ms: int
) -> tuple[dict[int, tuple[int, int]], list[int]]:
    """The partition's open deliveries that keep a row, by offset as (attempt, retry due
    at: ``IN_FLIGHT_ROW`` for one out with a consumer), and the indexes of those to write
    (new or changed since their row was written)."""
    open_: dict[int, tuple[int, int]] = {}
    write: list[int] = []
    base = state.base
    saved = state.saved
    attempts = state.attempts
    for index in state.in_flight_indexes():
        offset = base + index
        row = (attempts[index], IN_FLIGHT_ROW)
        open_[offset] = row
        if saved.get(offset) != row and (
            now - state.sent_at[index] >= min_age_ms or offset in saved
        ):
            write.append(index)
    for offset, (due_at, _) in state.retries.items():
        index = offset - base
        if attempts[index] > 0:
            row = (attempts[index], due_at if due_at > now else 0)
            open_[offset] = row
            if saved.get(offset) != row:
                write.append(index)
    return open_, write


def collect_checkpoint(groups: Iterable[Group], now: int, min_age_ms: int = 0) -> Checkpoint:
    """The checkpoint of ``groups`` (``now`` decides which retries are still to come and
    which deliveries are old enough to write)."""
    checkpoint = Checkpoint({}, [], [], [], [], [])
    for group in groups:
        name = group.name
        lease_ms = group.settings.lease_ms
        for (topic, partition, offset), row in group.parking.items():
            if row is None:
                checkpoint.unparked.append(DeliveryKey(name, topic, partition, offset))
            else:
                checkpoint.parked.append(ParkedRow(name, topic, partition, offset, *row))
        for key, state in group.partitions.items():
            position = state.committed()
            if position != state.committed_persisted:
                checkpoint.committed.setdefault(name, {})[key] = position
            if not (state.in_flight or state.retries or state.saved):
                continue
            open_, write = _open_deliveries(group, state, now, min_age_ms)
            for offset in state.saved.keys() - open_.keys():
                checkpoint.finished.append(DeliveryKey(name, state.topic, state.partition, offset))
            for index in write:
                offset = state.base + index
                attempt, due_at = open_[offset]
                out = due_at == IN_FLIGHT_ROW
                owner = state.owners[index] if out else None  # a waiting one: nobody's
                checkpoint.deliveries.append(
                    DeliveryRow(
                        name,
                        state.topic,
                        state.partition,
                        offset,
                        owner.consumer_id if owner is not None else "",
                        attempt,
                        state.sent_at[index],
                        state.lease_end(index, lease_ms) if out else 0,
                    )
                )
                if due_at > now:
                    reason = state.retries.get(offset, (0, None))[1]
                    checkpoint.scheduled.append(
                        ScheduledRow(
                            name, state.topic, state.partition, offset, due_at, attempt, reason
                        )
                    )
    return checkpoint


def mark_saved(checkpoint: Checkpoint, groups: Mapping[str, Group]) -> None:
    """Once ``checkpoint`` is in ``state.db``: remember what is saved, so the next one
    writes only what changes after it."""
    where: tuple[str, int, int]
    for parked in checkpoint.parked:
        group = groups.get(parked.group_name)
        if group is not None:
            where = (parked.topic, parked.partition, parked.offset)
            if group.parking.get(where) == (parked.due_at, parked.attempt, parked.reason):
                del group.parking[where]  # unless it changed while the thread wrote
    for gone in checkpoint.unparked:
        group = groups.get(gone.group_name)
        if group is not None:
            where = (gone.topic, gone.partition, gone.offset)
            if where in group.parking and group.parking[where] is None:
                del group.parking[where]
    # A group reset meanwhile starts afresh, and a topic deleted meanwhile left its group:
    # what they no longer have is skipped.
    for name, offsets in checkpoint.committed.items():
        if name in groups:
            partitions = groups[name].partitions
            for key, position in offsets.items():
                if key in partitions:
                    partitions[key].committed_persisted = position
    # What was written, not the state now: it may have moved on while a thread wrote.
    due = {(s.group_name, s.topic, s.partition, s.offset): s.due_at for s in checkpoint.scheduled}
    for row in checkpoint.deliveries:
        group = groups.get(row.group_name)
        state = (
            None
            if group is None
            else group.partitions.get(TopicPartition(row.topic, row.partition))
        )
        if state is None:
            continue
        state.saved[row.offset] = (
            row.attempt,
            IN_FLIGHT_ROW if row.lease_expires_at else due.get(DeliveryKey(*row[:4]), 0),
        )
    for gone in checkpoint.finished:
        group = groups.get(gone.group_name)
        state = (
            None
            if group is None
            else group.partitions.get(TopicPartition(gone.topic, gone.partition))
        )
        if state is not None:
            state.saved.pop(gone.offset, None)
