"""What readers need to know about one partition, read without the writer's lock.

Each segment's sparse index (cached, and extended as the active segment grows), the first
timestamp of each segment, the log start and end offsets, and segment sizes for retention.
Nothing here writes a file: readers in any process ask while writers append, so every
answer comes from what the files hold now.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from spoolmq.store.segment import (
    INDEX_ENTRY,
    SegmentFiles,
    SegmentInfo,
    SparseIndex,
    entry_matches,
    scan_batches,
)


@dataclass(slots=True)
class _CachedIndex:
    index: SparseIndex
    bytes_read: int
    closed: bool
    identity: tuple[int, int]  # (inode, size) of the segment when it was closed


@dataclass(slots=True)
class _KnownEnd:
    """How far ``log_end_offset`` has read the active segment: the next scan starts here."""

    base: int
    inode: int
    size: int
    next_offset: int


class PartitionMetadata:
    """Lock-free views of one partition's segments, cached per process."""

    def __init__(self, files: SegmentFiles) -> None:
        self._files = files
        self._indexes: dict[int, _CachedIndex] = {}
        self._first_timestamps: dict[int, int] = {}
        self._known_end: _KnownEnd | None = None

    def index_of(self, base: int) -> SparseIndex:
        """A segment's index for seeking: loaded once, then extended as the segment grows.

        Entries that point past the segment's current end are left for later; the scan
        that follows a seek checks offsets, so a stale entry can only cost time. A closed
        segment's index is kept until its file changes (compaction replaces it).
        """
        try:
            stat = os.stat(self._files.segment_path(base))
        except FileNotFoundError:
            self._indexes.pop(base, None)
            return SparseIndex()
        identity = (stat.st_ino, stat.st_size)
        cached = self._indexes.get(base)
        if cached is not None and cached.closed:
            if cached.identity == identity:
                return cached.index
            cached = None
        try:
            with open(self._files.index_path(base), "rb") as handle:
                handle.seek(cached.bytes_read if cached else 0)
                data = handle.read()
        except FileNotFoundError:
            return SparseIndex()
        if cached is None:
            cached = self._indexes[base] = _CachedIndex(SparseIndex(), 0, False, identity)
        new = SparseIndex.from_bytes(data)
        index = cached.index
        for i in range(len(new)):
            if new.positions[i] >= stat.st_size:
                break
            if index and new.offsets[i] <= index.offsets[-1]:
                break
            index.add(new.offsets[i], new.positions[i], new.timestamps[i])
            cached.bytes_read += INDEX_ENTRY.size
        bases = self._files.bases()
        cached.closed = bool(bases) and base != bases[-1]
        cached.identity = identity
        return index

    def is_closed(self, base: int) -> bool:
        """Has the writer moved on from this segment (so it only holds whole batches)?"""
        bases = self._files.bases()
        return bool(bases) and base < bases[-1]

    def first_timestamp(self, base: int) -> int | None:
        """The timestamp of a segment's first record (from its first index entry)."""
        known = self._first_timestamps.get(base)
        if known is not None:
            return known
        index = self.index_of(base)
        if not index:
            return None
        self._first_timestamps[base] = index.timestamps[0]
        return index.timestamps[0]

    def log_start_offset(self) -> int:
        bases = self._files.bases()
        return bases[0] if bases else 0

    def log_end_offset(self) -> int:
        """The offset the next record will get (read-only; no recovery, no lock).

        Reads only what was appended since the last call: the active segment is scanned
        from where the previous call stopped (a batch boundary), so asking often is cheap.
        """
        while True:
            bases = self._files.bases()
            if not bases:
                return 0
            base = bases[-1]
            path = self._files.segment_path(base)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue  # rolled or deleted meanwhile: look again
            try:
                stat = os.fstat(fd)
                known = self._known_end
                if (
                    known is not None
                    and (known.base, known.inode) == (base, stat.st_ino)
                    and known.size <= stat.st_size
                ):
                    if known.size == stat.st_size:
                        return known.next_offset
                    start, expected = known.size, known.next_offset
                else:
                    index = self.index_of(base)
                    start, expected = index.scan_start(base)
                    if index and not entry_matches(fd, expected, start):
                        start, expected = 0, base
                scan = scan_batches(fd, str(path), start, expected)
            finally:
                os.close(fd)
            end = scan.next_offset if scan.next_offset >= 0 else base
            self._known_end = _KnownEnd(base, stat.st_ino, scan.end, end)
            return end

    def segment_infos(self) -> list[SegmentInfo]:
        """Size and newest timestamp of every segment, oldest first."""
        infos = (self._files.info(base) for base in self._files.bases())
        return [info for info in infos if info is not None]

    def forget(self, base: int) -> None:
        """A segment was deleted."""
        self._indexes.pop(base, None)
        self._first_timestamps.pop(base, None)

    def replaced(self, base: int, index: SparseIndex) -> None:
        """A closed segment was rewritten (compaction) with ``index`` as its new index."""
        stat = os.stat(self._files.segment_path(base))
        self._indexes[base] = _CachedIndex(
            index, len(index) * INDEX_ENTRY.size, True, (stat.st_ino, stat.st_size)
        )
        self._first_timestamps.pop(base, None)
