"""Reading a partition from any offset, with a position of its own and no locks.

A reader returns only whole batches: a batch whose lines are not all in the file yet (a
writer is mid-write, or crashed mid-write) is not returned until it is whole, so nothing a
reader sees can be taken back by recovery. Every line's checksum is verified; damage raises
CorruptRecordError where it is found.
"""

from __future__ import annotations

import bisect
import os
from collections import deque
from collections.abc import Iterator
from typing import Any

from spoolmq.errors import CorruptRecordError, OffsetOutOfRangeError
from spoolmq.store.partition import PartitionLog
from spoolmq.store.record import (
    Record,
    check_line,
    record_from_fields,
    record_offset_and_timestamp,
)

_CHUNK = 256 * 1024


def offset_for_timestamp(partition: PartitionLog, timestamp: int) -> int:
    """The first offset whose timestamp is at or after ``timestamp`` (the log end if none).

    Binary search over the segments' first timestamps, then over the sparse index of one
    segment, then a short scan of record heads: no whole-partition scan.
    """
    bases = partition.segment_bases()
    if not bases:
        return 0
    firsts = [partition.first_timestamp(base) for base in bases]
    # The last segment whose first record is older than the target holds the answer
    # or ends right before it.
    chosen = 0
    low, high = 0, len(bases) - 1
    while low <= high:
        middle = (low + high) // 2
        first = firsts[middle]
        if first is not None and first < timestamp:
            chosen = middle
            low = middle + 1
        else:
            high = middle - 1
    for base in bases[chosen:]:
        found = _scan_segment_for_timestamp(partition, base, timestamp)
        if found is not None:
            return found
    return partition.log_end_offset()


def _scan_segment_for_timestamp(partition: PartitionLog, base: int, timestamp: int) -> int | None:
    index = partition.index_of(base)
    entry = index.floor_for_timestamp(timestamp)
    position = index.positions[entry] if entry >= 0 else 0
    try:
        fd = os.open(partition.segment_path(base), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        while True:
            data = os.pread(fd, _CHUNK, position)
            if not data:
                return None
            cut = data.rfind(b"\n") + 1
            if cut == 0:
                return None
            start = 0
            while start < cut:
                end = data.index(b"\n", start) + 1
                offset, stamp = record_offset_and_timestamp(data[start:end])
                if stamp >= timestamp:
                    return offset
                start = end
            position += cut
    finally:
        os.close(fd)


class Reader:
    """A position in one partition. ``poll()`` returns the next record or ``None``
    when caught up; a caught-up reader sees records appended later."""

    def __init__(self, partition: PartitionLog, offset: int) -> None:
        self._partition = partition
        self._fd = -1
        self._base = -1
        self._byte_position = 0
        self._pending: deque[tuple[dict[str, Any], bytes]] = deque()
        self.position = 0
        self.seek(offset)

    @property
    def topic(self) -> str:
        return self._partition.topic

    @property
    def partition(self) -> int:
        return self._partition.partition

    # -- positioning ----------------------------------------------------------------

    def seek(self, offset: int) -> None:
        """Move to ``offset`` (OffsetOutOfRangeError below the log start or past the end)."""
        self._partition.check_offset(offset)
        bases = self._partition.segment_bases()
        if not bases:  # a partition nobody has appended to yet
            self._close_file()
            self._pending.clear()
            self.position = offset
            return
        slot = bisect.bisect_right(bases, offset) - 1
        base = bases[max(slot, 0)]
        index = self._partition.index_of(base)
        entry = index.floor_for_offset(offset)
        self._open(base, index.positions[entry] if entry >= 0 else 0)
        self.position = offset

    def seek_to_timestamp(self, timestamp: int) -> None:
        """Move to the first record at or after ``timestamp`` (ms)."""
        self.seek(offset_for_timestamp(self._partition, timestamp))

    def seek_to_beginning(self) -> None:
        self.seek(self._partition.log_start_offset())

    def seek_to_end(self) -> None:
        self.seek(self._partition.log_end_offset())

    def _open(self, base: int, byte_position: int) -> None:
        self._close_file()
        self._fd = os.open(self._partition.segment_path(base), os.O_RDONLY)
        self._base = base
        self._byte_position = byte_position
        self._pending.clear()

    def _close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self._close_file()
        self._pending.clear()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- reading -----------------------------------------------------------------------

    def poll(self) -> Record | None:
        """The next record, or ``None`` when there is nothing new yet."""
        entries = self.read_entries(1)
        return record_from_fields(entries[0][0]) if entries else None

    def poll_batch(self, max_records: int = 500) -> list[Record]:
        return [record_from_fields(fields) for fields, _ in self.read_entries(max_records)]

    def __iter__(self) -> Iterator[Record]:
        """Every record from the position to the current end (stops when caught up)."""
        while True:
            batch = self.poll_batch()
            if not batch:
                return
            yield from batch

    def read_entries(self, max_records: int) -> list[tuple[dict[str, Any], bytes]]:
        """Up to ``max_records`` as (parsed fields, stored line): the broker forwards the
        stored line as it is, without re-encoding."""
        if not self._pending:
            self._fill()
        taken: list[tuple[dict[str, Any], bytes]] = []
        while self._pending and len(taken) < max_records:
            taken.append(self._pending.popleft())
        if taken:
            self.position = taken[-1][0]["offset"] + 1
        return taken

    def _fill(self) -> None:
        if self._fd < 0:
            self.seek(self.position)
            if self._fd < 0:
                return
        if self._read_whole_batches():
            return
        # Nothing whole left in this segment: move on if a newer segment exists. The
        # writer finishes a segment before creating the next, so read once more first.
        bases = self._partition.segment_bases()
        later = [base for base in bases if base > self._base]
        if not later or self._read_whole_batches():
            return
        if bases and self.position < bases[0]:
            raise OffsetOutOfRangeError(
                f"{self.topic}/{self.partition}: offset {self.position} was deleted by retention "
                f"while being read; the log now starts at {bases[0]}"
            )
        self._open(later[0], 0)
        self._read_whole_batches()

    def _read_whole_batches(self) -> bool:
        """Parse whole batches after the byte position into ``_pending``. True if any."""
        chunk = _CHUNK
        path = str(self._partition.segment_path(self._base))
        while True:
            data = os.pread(self._fd, chunk, self._byte_position)
            consumed = 0
            position = 0
            while True:
                batch, end = self._parse_batch(data, position, path)
                if batch is None:
                    break
                for fields, line in batch:
                    if fields["offset"] >= self.position:
                        self._pending.append((fields, line))
                position = consumed = end
            self._byte_position += consumed
            if consumed or len(data) < chunk:
                return bool(self._pending)
            chunk *= 4  # one batch larger than the chunk: read more of it

    def _parse_batch(
        self, data: bytes, start: int, path: str
    ) -> tuple[list[tuple[dict[str, Any], bytes]] | None, int]:
        batch: list[tuple[dict[str, Any], bytes]] = []
        count = 1
        position = start
        while len(batch) < count:
            end = data.find(b"\n", position)
            if end < 0:
                return None, start
            line = data[position : end + 1]
            try:
                fields = check_line(line, path=path, position=self._byte_position + position)
            except CorruptRecordError:
                if (
                    data.find(b"\n", end + 1) < 0
                    and os.fstat(self._fd).st_size == len(data) + self._byte_position
                ):
                    # The last line of the file: a writer may be mid-write or crashed
                    # mid-write (recovery will move it aside). Not returned, not skipped.
                    return None, start
                raise
            if not batch:
                count = fields.get("batch_records", 1)
            batch.append((fields, line))
            position = end + 1
        return batch, position
