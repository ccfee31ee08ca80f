"""A consumer group as the ConsumerBroker runs it: its delivery state (:class:`Group`), a
log reader per partition it reads, and the deliveries to save at the next checkpoint.

Reading is bounded (at most ``READ_AHEAD`` unfinished messages per partition in memory) and
never skips in silence: records retention deleted before the group read them come back as
:class:`Skip` ranges for the broker to report, and a damaged partition stops for the group.

Messages the group parked (due later than ``PARK_AFTER_MS``, see :mod:`delivery`) are read
back by due time from ``state.db``, ``REVIVE_AHEAD_MS`` before they are due and at most
``LANE_SIZE`` at a time, and their records one by one by offset (:meth:`GroupRuntime.read_back`).
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass, field
from typing import Any, Literal, NamedTuple

from spoolmq.broker.delivery import (
    IN_FLIGHT_ROW,
    Extra,
    Group,
    Key,
    PartitionState,
    Revived,
    record_extra,
)
from spoolmq.errors import CorruptRecordError, OffsetOutOfRangeError, SpoolError
from spoolmq.store import Reader, Store
from spoolmq.store.reader import fresh_lines
from spoolmq.store.record import key_identity
from spoolmq.store.state import OpenDelivery, ParkedRow
from spoolmq.types import TopicPartition

logger = logging.getLogger("spoolmq.consumer")

READ_AHEAD = 20_000  # unfinished messages per group partition held in memory at most
_READ_BATCH = 1000
REVIVE_AHEAD_MS = 2_000  # parked messages are read back this long before they are due
LANE_SIZE = 5_000  # revived messages a group holds in memory at most (all its lanes)
REVIVE_BATCH = 500  # parked messages read back in one step at most
# Looks for due parked messages come at most this often unless one filled its batch: each
# takes all due in the next REVIVE_AHEAD_MS, so a steady flow costs a few looks a second.
LOOK_EVERY_MS = REVIVE_AHEAD_MS // 4


class Skip(NamedTuple):
    """Offsets ``[first, begin)`` of a partition were deleted by retention before the
    group read them; it goes on from ``begin``."""

    topic: str
    partition: int
    first: int
    begin: int


class FreshBatch(NamedTuple):
    """One entry ``b`` of an ``appended`` notice: a batch the PublisherBroker wrote and
    synced, where it is, and the little the ConsumerBroker needs of its records."""

    topic: str
    partition: int
    base: int  # the segment's base offset
    position: int  # where the batch's lines start in the segment, and their bytes
    length: int
    first: int  # its offsets: first .. first + size - 1
    size: int  # how many records
    keys: list[Key] | None  # key_identity per record; None: no record has a key
    extras: dict[int, Extra] | None  # by index in the batch, for the records that have any

    @classmethod
    def from_notice(cls, entry: Any) -> FreshBatch | None:
        """An entry as the notice sends it, or None when it is not one (then the partition
        is read the slow way, since the entry's end offset is unknown)."""
        try:
            topic, partition, base, position, length, first, count, _, keys, extra = entry
            extras = (
                None
                if extra is None
                else {int(i): (d, e, t, h) for i, (d, e, t, h) in extra.items()}
            )
        except (TypeError, ValueError, AttributeError):
            return None
        if keys is not None and len(keys) != count:
            return None
        return cls(topic, partition, base, position, length, first, count, keys, extras)


class FreshLines:
    """The checked lines of the fresh batches of one notice, read once for every group."""

    def __init__(self) -> None:
        self._lines: dict[tuple[str, int, int], list[bytes] | None] = {}

    def get(self, reader: Reader, batch: FreshBatch) -> list[bytes] | None:
        where = (batch.topic, batch.partition, batch.first)
        if where not in self._lines:
            try:
                data = reader.read_batch(batch.base, batch.position, batch.length)
            except OSError:
                data = b""
            self._lines[where] = fresh_lines(data, batch.size, batch.first)
        return self._lines[where]


@dataclass(slots=True)
class GroupRuntime:
    group: Group
    readers: dict[TopicPartition, Reader] = field(default_factory=dict)
    # Deliveries open at the last checkpoint of an earlier broker, per partition by
    # offset, as (attempts so far, retry due at): taken up as their records are read again.
    restored: dict[TopicPartition, dict[int, tuple[int, int]]] = field(default_factory=dict)
    # A dead letter that could not be written (disk full, say) is tried again from then
    # (ms), after a backoff that doubles while it keeps failing.
    dead_letter_retry_at: int = 0
    dead_letter_backoff_ms: int = 0
    # The last fetch stopped at _READ_BATCH with more below the log end: the broker loops
    # again at once, so a backlog is read into the window in steps without waiting for
    # consumers to make room (a priority message further on is then seen).
    behind: bool = False
    # Parked messages: when to look for due ones next (None: none known), where the last
    # look stopped (due_at, topic, partition, offset), and the look running on the
    # broker's state.db thread with the rows its checkpoints deleted meanwhile.
    next_revive: int | None = 0
    revive_after: tuple[int, str, int, int] | None = None
    reviving: Any = None
    start_over: bool = False  # the next look starts from the first row (see look_again)
    look_limit: int = 0  # the rows the running look may return
    unparked_meanwhile: set[tuple[str, int, int]] = field(default_factory=set)
    revive_readers: dict[TopicPartition, Reader] = field(default_factory=dict)
    # After a restart, per partition: one past the highest offset parked when it opened
    # (the reader reads parked records again below it: passed over) and those below it
    # revived since (their rows may be gone by the time the reader gets there).
    parked_below: dict[TopicPartition, int] = field(default_factory=dict)
    revived_early: dict[TopicPartition, set[int]] = field(default_factory=dict)

    def open_partition(
        self,
        store: Store,
        key: TopicPartition,
        start: Literal["earliest", "latest"],
        committed: int | None,
    ) -> tuple[int, Skip | None]:
        """Start reading a partition the group did not read yet: from ``committed``, else
        from its ``start``. Returns the partition's log end, and the range retention deleted
        if the group had committed below the log start."""
        plog = store.partition_log(*key)
        end = plog.log_end_offset()
        begin = plog.log_start_offset()
        position = committed
        if position is None:
            position = end if start == "latest" else begin
        state = self.group.add_partition(key.topic, key.partition, min(position, end))
        state.committed_persisted = -1 if committed is None else committed
        skip = _skip_to(self.group, state, begin)
        self.readers[key] = Reader(plog, state.next_fetch)
        parked_end = store.state.parked_end(self.group.name, *key)
        if parked_end > state.next_fetch:
            self.parked_below[key] = parked_end
        self.look_again()  # rows of a partition the group did not read were passed over
        return end, skip

    def fetch(self, store: Store, log_ends: dict[TopicPartition, int], now: int) -> list[Skip]:
        """Read what the group has room for from every partition below its log end."""
        group = self.group
        skips: list[Skip] = []
        self.behind = False
        if not group.consumers:
            return skips
        for key, state in group.partitions.items():
            end = log_ends.get(key, 0)
            if state.next_fetch >= end or state.open_count >= READ_AHEAD:
                continue
            reader = self.readers.get(key)
            if reader is None:
                continue
            # Up to _READ_BATCH records in one go (a reader parses one chunk per call, and a
            # dispatch in between would not see a priority message further on).
            want = min(READ_AHEAD - state.open_count, _READ_BATCH)
            entries: list[tuple[dict[str, Any], bytes]] = []
            try:
                while len(entries) < want:
                    # Never past `end`: the file may already hold the next batch while its
                    # fdatasync runs, and a failed sync cuts it off the log.
                    read = reader.read_entries(want - len(entries), end=end)
                    if not read:
                        break
                    entries += read
            except OffsetOutOfRangeError:
                self._add_entries(store, state, entries, now)  # what was read before is good
                # Retention deleted records this group had not read yet (it lagged more
                # than the topic keeps): go on from the log start, and say so.
                begin = store.partition_log(*key).log_start_offset()
                if (skip := _skip_to(group, state, begin)) is not None:
                    skips.append(skip)
                with contextlib.suppress(OffsetOutOfRangeError):  # moved again: next time
                    reader.seek(begin)
                continue
            except CorruptRecordError as exc:
                self._add_entries(store, state, entries, now)
                # Never skipped in silence: this partition stops for the group until the
                # damage is dealt with (`spoolmq check`); the others go on.
                logger.error("group %s stops reading %s/%d: %s", group.name, *key, exc)
                del self.readers[key]
                continue
            self._add_entries(store, state, entries, now)
            if len(state.status) > READ_AHEAD:
                state.committed()  # lets the window drop what is finished
            if len(entries) == want and state.next_fetch < end:
                self.behind = True  # stopped at the batch size, not at the end
        return skips

    def _add_entries(
        self,
        store: Store,
        state: PartitionState,
        entries: list[tuple[dict[str, Any], bytes]],
        now: int,
    ) -> None:
        """Hand fully parsed records to the group as batches of contiguous offsets (a
        compacted log has gaps)."""
        group = self.group
        key = TopicPartition(state.topic, state.partition)
        restored = self.restored.get(key)
        parked: set[int] = set()
        below = self.parked_below.get(key)
        if below is not None and entries:
            first, last = entries[0][0]["offset"], entries[-1][0]["offset"]
            if first < below:
                parked = store.state.parked_offsets(group.name, *key, first, last)
                parked |= self.revived_early.get(key, set())
            if last + 1 >= below:
                del self.parked_below[key]
                self.revived_early.pop(key, None)
        if not entries:
            return
        expected = state.next_fetch
        if (
            entries[0][0]["offset"] == expected
            and entries[-1][0]["offset"] == expected + len(entries) - 1
        ):
            # The common case: no gap (a log's offsets grow, so first and last tell). Each
            # record's extras and key are looked for with `in` tests and no call: almost
            # no record has any (record_extra and key_identity say which when one may).
            lines = [line for _, line in entries]
            keys: list[Key] = []
            append_key = keys.append
            extras: dict[int, Extra] = {}
            for index, (fields, _) in enumerate(entries):
                if (
                    "deliver_at" in fields
                    or "expires_at" in fields
                    or "tags" in fields
                    or fields.get("headers")
                ) and (extra := record_extra(fields)) is not None:
                    extras[index] = extra
                append_key(
                    None
                    if fields.get("key") is None and "key_b64" not in fields
                    else key_identity(fields)
                )
            group.add_batch(
                state, lines, keys if any(keys) else None, extras, now, restored, parked
            )
            return
        lines = []
        keys = []
        extras = {}
        for fields, line in entries:
            offset = fields["offset"]
            if offset != expected + len(lines):
                group.add_batch(
                    state, lines, keys if any(keys) else None, extras, now, restored, parked
                )
                group.skip_to(state, offset)
                lines, keys, extras, expected = [], [], {}, offset
            extra = record_extra(fields)
            if extra is not None:
                extras[len(lines)] = extra
            keys.append(key_identity(fields))
            lines.append(line)
        group.add_batch(state, lines, keys if any(keys) else None, extras, now, restored, parked)

    def take_fresh(
        self, key: TopicPartition, batch: FreshBatch, lines: FreshLines, now: int
    ) -> bool:
        """Take a batch the PublisherBroker has just written, from its notice, if the group
        is reading right there (caught up, with room): its lines are checked by CRC only
        (``lines`` reads them once for every group) and the notice's keys and extras are
        trusted. False when it is not taken: the group's reader reads it, fully verified."""
        group = self.group
        state = group.partitions.get(key)
        reader = self.readers.get(key)
        if (
            state is None
            or reader is None
            or not group.consumers
            or state.next_fetch != batch.first
            or state.open_count + batch.size > READ_AHEAD
            or not reader.at(batch.base, batch.position, batch.first)
        ):
            return False
        checked = lines.get(reader, batch)
        if checked is None:
            return False
        group.add_batch(state, checked, batch.keys, batch.extras, now, self.restored.get(key))
        reader.skip_batch(batch.base, batch.position + batch.length, batch.first + batch.size)
        return True

    def drop_topic(self, topic: str) -> list[TopicPartition]:
        """Stop reading ``topic`` (it is being deleted); the partitions dropped."""
        dropped = self.group.drop_topic(topic)
        for key in [key for key in self.readers if key.topic == topic]:
            self.readers.pop(key).close()
        for key in [key for key in self.revive_readers if key.topic == topic]:
            self.revive_readers.pop(key).close()
        for table in (self.restored, self.parked_below, self.revived_early):
            for key in [key for key in table if key.topic == topic]:
                del table[key]
        return dropped

    # -- parked messages --------------------------------------------------------------------

    def lane_room(self) -> int:
        """How many more parked messages the group may read back now."""
        held = sum(state.open_count for state in self.group.slots if state.real is not None)
        return LANE_SIZE - held

    def look_again(self) -> None:
        """The next look for parked messages starts from the first row (the lanes pass
        over those they hold), also when one is running now."""
        self.revive_after = None
        self.next_revive = 0
        self.start_over = True

    def looking(self) -> tuple[tuple[int, str, int, int] | None, int]:
        """A look starts: after which row, and how many rows at most."""
        self.start_over = False
        self.look_limit = min(self.lane_room(), REVIVE_BATCH)
        return self.revive_after, self.look_limit

    def took_parked(self, rows: list[ParkedRow], next_due: int | None, now: int) -> list[ParkedRow]:
        """A look for due parked messages returned ``rows`` (and the next one is due at
        ``next_due``): move past them, set when to look next, and return those to read
        back (not deleted by a checkpoint while the look ran)."""
        if not self.start_over:  # else: asked to look from the first row again meanwhile
            if rows:
                last = rows[-1]
                self.revive_after = (last.due_at, last.topic, last.partition, last.offset)
            if len(rows) >= self.look_limit:
                self.next_revive = now  # a full batch: more may be due at once
            elif next_due is None:
                self.next_revive = None
            else:
                self.next_revive = max(next_due - REVIVE_AHEAD_MS, now + LOOK_EVERY_MS)
        gone, self.unparked_meanwhile = self.unparked_meanwhile, set()
        return [row for row in rows if (row.topic, row.partition, row.offset) not in gone]

    def saved_parked(self, rows: list[ParkedRow]) -> None:
        """A checkpoint saved these parked rows: look for them in time. One due before
        where the last look stopped (saved late) makes the next look start over."""
        if not rows:
            return
        first = min(row.due_at for row in rows) - REVIVE_AHEAD_MS
        self.next_revive = first if self.next_revive is None else min(self.next_revive, first)
        after = self.revive_after
        if after is not None and any(
            (row.due_at, row.topic, row.partition, row.offset) <= after for row in rows
        ):
            self.look_again()

    def read_back(self, store: Store, rows: list[ParkedRow], now: int) -> list[Skip]:
        """Read the records of parked ``rows`` (due soon) and hand them to the group. A
        record retention deleted meanwhile is reported as skipped, one compaction removed
        is final; either way its row goes."""
        group = self.group
        skips: list[Skip] = []
        by_partition: dict[TopicPartition, list[ParkedRow]] = {}
        for row in rows:
            by_partition.setdefault(TopicPartition(row.topic, row.partition), []).append(row)
        for key, found in by_partition.items():
            state = group.partitions.get(key)
            if state is None:
                continue  # not read by the group now: found again once it is (open_partition)
            found.sort(key=lambda row: row.offset)
            reader = self.revive_readers.get(key)
            if reader is None:
                plog = store.partition_log(*key)
                reader = self.revive_readers[key] = Reader(plog, plog.log_start_offset())
            try:
                records, deleted = reader.read_many([row.offset for row in found])
            except (CorruptRecordError, SpoolError, OSError) as exc:
                # Left in state.db: found again after a restart, once it is mended.
                logger.error(
                    "group %s cannot read parked messages of %s/%d: %s", group.name, *key, exc
                )
                continue
            for offset in deleted:
                skips.append(Skip(key.topic, key.partition, offset, offset + 1))
            revived: list[Revived] = []
            below = self.parked_below.get(key)
            for row in found:
                entry = records.get(row.offset)
                if entry is None:  # deleted by retention or removed by compaction
                    group.parking[(key.topic, key.partition, row.offset)] = None
                    continue
                fields, line = entry
                revived.append(
                    (row.offset, row.due_at, row.attempt, row.reason, line, record_extra(fields))
                )
                if below is not None and row.offset < below:
                    self.revived_early.setdefault(key, set()).add(row.offset)
            group.revive(state, revived, now)
        return skips

    def close(self) -> None:
        for reader in self.readers.values():
            reader.close()
        for reader in self.revive_readers.values():
            reader.close()


def _skip_to(group: Group, state: PartitionState, begin: int) -> Skip | None:
    """Move a group's reading position up to the log start ``begin`` if it was below."""
    first = state.next_fetch
    if begin <= first:
        return None
    group.skip_to(state, begin)
    return Skip(state.topic, state.partition, first, begin)


def restored_by_partition(
    rows: dict[tuple[str, int, int], OpenDelivery],
) -> dict[TopicPartition, dict[int, tuple[int, int]]]:
    """``StateDB.open_deliveries`` grouped per partition, as a GroupRuntime keeps them:
    (attempts, due at), where a row of a delivery that was out with a consumer (the
    broker stopped or died meanwhile) is due at ``IN_FLIGHT_ROW``, as its saved form
    says: its next checkpoint writes it again as waiting for a consumer."""
    grouped: dict[TopicPartition, dict[int, tuple[int, int]]] = {}
    for (topic, partition, offset), (attempt, due_at, out) in rows.items():
        due = IN_FLIGHT_ROW if out and not due_at else due_at
        grouped.setdefault(TopicPartition(topic, partition), {})[offset] = (attempt, due)
    return grouped
