"""A partition's segment files (:class:`SegmentFiles`), their sparse index, and the scan
that finds whole batches.

A segment is ``<base offset, 20 digits>.jsonl``: record lines in offset order. Beside it,
``<base>.index`` holds 24-byte little-endian entries ``(offset, byte position, timestamp)``,
one at the start of the segment's first batch and then at the first batch starting at least
``index_interval_bytes`` after the previous entry. Entries always point at a batch start, so
a scan from any entry reads whole batches. The index is derived data: it is checked against
the segment on load and rebuilt from the segment when it is short or wrong.
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spoolmq.errors import CorruptRecordError
from spoolmq.files import FILE_MODE, fsync_dir, pread_all
from spoolmq.store.names import index_name, segment_name
from spoolmq.store.record import check_line, record_offset

INDEX_ENTRY = struct.Struct("<qqq")


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    """A segment's size and the timestamp of its newest record (-1 if unreadable)."""

    base: int
    size: int
    newest_timestamp: int


class SegmentFiles:
    """The segment and index files of one partition directory."""

    __slots__ = ("_prefix", "directory")

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._prefix = os.path.join(directory, "")

    def has_segment(self, base: int) -> bool:
        """Whether the segment starting at ``base`` exists: a writer asks at each append
        whether another process rolled past its segment, so without a ``Path`` or an
        exception for the usual answer (no)."""
        return os.access(self._prefix + segment_name(base), os.F_OK)

    def segment_path(self, base: int) -> Path:
        return self.directory / segment_name(base)

    def index_path(self, base: int) -> Path:
        return self.directory / index_name(base)

    def bases(self) -> list[int]:
        """Base offsets of the segments, ascending."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return []
        bases = []
        for name in names:
            if len(name) == 26 and name.endswith(".jsonl") and name[:20].isdigit():
                bases.append(int(name[:20]))
        bases.sort()
        return bases

    def create(self, base: int) -> None:
        """Create an empty segment and index starting at offset ``base``, durably."""
        for path in (self.segment_path(base), self.index_path(base)):
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, FILE_MODE)
            os.close(fd)
        fsync_dir(self.directory)

    def info(self, base: int) -> SegmentInfo | None:
        """The segment's size and the timestamp of its last record, read from the end
        backwards (``None`` if the segment is gone)."""
        try:
            fd = os.open(self.segment_path(base), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = os.fstat(fd).st_size
            last = last_record_fields(fd, size) if size else None
        except CorruptRecordError:
            last = None
        finally:
            os.close(fd)
        return SegmentInfo(base, size, last["timestamp"] if last else -1)


class SparseIndex:
    """The entries of one segment's index, as three parallel ascending arrays."""

    __slots__ = ("offsets", "positions", "timestamps")

    def __init__(self) -> None:
        self.offsets = array("q")
        self.positions = array("q")
        self.timestamps = array("q")

    @classmethod
    def from_bytes(cls, data: bytes) -> SparseIndex:
        """Entries from raw index bytes (a torn last entry is ignored)."""
        flat = array("q")
        flat.frombytes(data[: len(data) - len(data) % INDEX_ENTRY.size])
        if sys.byteorder != "little":  # pragma: no cover - the format is little-endian
            flat.byteswap()
        index = cls()
        index.offsets = flat[0::3]
        index.positions = flat[1::3]
        index.timestamps = flat[2::3]
        return index

    def __len__(self) -> int:
        return len(self.offsets)

    def add(self, offset: int, position: int, timestamp: int) -> None:
        self.offsets.append(offset)
        self.positions.append(position)
        self.timestamps.append(timestamp)

    def truncate(self, count: int) -> None:
        del self.offsets[count:], self.positions[count:], self.timestamps[count:]

    def floor_for_offset(self, offset: int) -> int:
        """Index of the last entry at or before ``offset`` (-1 if none)."""
        return bisect.bisect_right(self.offsets, offset) - 1

    def floor_for_timestamp(self, timestamp: int) -> int:
        """Index of the last entry whose timestamp is below ``timestamp`` (-1 if none).

        Timestamps never decrease within a partition, so every record before that
        entry is older than ``timestamp`` and a scan can start there.
        """
        return bisect.bisect_left(self.timestamps, timestamp) - 1

    def wants_entry(self, position: int, interval_bytes: int) -> bool:
        """Does a batch starting at byte ``position`` get an entry? The first batch does,
        then the first one at least ``interval_bytes`` past the newest entry."""
        return not self.positions or position - self.positions[-1] >= interval_bytes

    def scan_start(self, base: int) -> tuple[int, int]:
        """``(byte position, offset)`` a scan to the segment's end starts from: the newest
        entry, or the segment's start."""
        if self.offsets:
            return self.positions[-1], self.offsets[-1]
        return 0, base

    def encode_from(self, start: int) -> bytes:
        return b"".join(
            INDEX_ENTRY.pack(self.offsets[i], self.positions[i], self.timestamps[i])
            for i in range(start, len(self.offsets))
        )


def first_line_at_or_after(data: bytes, target: int, key_of: Callable[[bytes], int]) -> int:
    """Byte position in ``data`` (whole lines) of the first line whose key is at least
    ``target``, or ``len(data)``. Keys must not decrease from line to line (offsets and
    timestamps of a segment don't), so this is a binary search over byte positions that
    reads a handful of line heads instead of every line.
    """
    low, high = 0, len(data)
    while low < high:
        middle = (low + high) // 2
        start = max(data.rfind(b"\n", low, middle) + 1, low)
        end = data.index(b"\n", start) + 1
        if key_of(data[start:end]) < target:
            low = end
        else:
            high = start
    return low


def entry_matches(fd: int, offset: int, position: int) -> bool:
    """Does the segment have the record ``offset`` starting at byte ``position``?"""
    head = os.pread(fd, 40, position)
    try:
        return (position == 0 or os.pread(fd, 1, position - 1) == b"\n") and record_offset(
            head + b","
        ) == offset
    except ValueError:
        return False


def load_index(index_path: Path, segment_fd: int, segment_size: int) -> tuple[SparseIndex, int]:
    """Load and check an index against its segment.

    Returns the index and how many entries of the file were usable: entries past the
    segment's size, out of order, or not pointing at their record are dropped (they can
    exist after a crash or a lost write-back), so the caller can cut the file to match.
    """
    try:
        data = index_path.read_bytes()
    except FileNotFoundError:
        data = b""
    index = SparseIndex.from_bytes(data)
    usable = len(index)
    # Entries are appended in order, so the usable ones are a prefix.
    for i in range(len(index)):
        if index.positions[i] >= segment_size or (
            i
            and (
                index.offsets[i] <= index.offsets[i - 1]
                or index.positions[i] <= index.positions[i - 1]
            )
        ):
            usable = i
            break
    index.truncate(usable)
    # Entries are written after their batch, so only the newest few can be wrong.
    while index.offsets and not entry_matches(segment_fd, index.offsets[-1], index.positions[-1]):
        index.truncate(len(index) - 1)
    return index, len(index)


@dataclass(slots=True)
class BatchInfo:
    position: int
    first_offset: int
    timestamp: int


@dataclass(slots=True)
class ScanResult:
    """What a scan from a batch start found.

    ``end`` is the byte after the last whole batch; ``next_offset`` the offset after it.
    ``bad_position`` is where the first incomplete or corrupt batch starts (-1 if none);
    ``corrupt_inside`` says that whole valid records follow the bad spot, so it is damage
    inside the segment rather than a torn tail. ``bad_line_position`` is where the line
    that failed starts, ``bad_line_index`` how many lines of its batch come before it.
    """

    end: int
    next_offset: int
    last_timestamp: int
    batches: list[BatchInfo]
    records: list[dict[str, Any]]
    bad_position: int = -1
    problem: str = ""
    bad_line_position: int = -1
    bad_line_index: int = 0
    corrupt_inside: bool = False


def _any_valid_line(data: bytes, start: int) -> bool:
    position = data.find(b"\n", start)
    while position >= 0:
        next_end = data.find(b"\n", position + 1)
        if next_end < 0:
            return False
        try:
            check_line(data[position + 1 : next_end + 1])
            return True
        except CorruptRecordError:
            position = next_end
    return False


def scan_batches(
    fd: int,
    path: str,
    start: int,
    expected_offset: int | None,
    *,
    keep_records: bool = False,
    size: int | None = None,
) -> ScanResult:
    """Read every whole batch from byte ``start`` (a batch start) to the end of the file,
    or to byte ``size`` (what the file held when a writer was known to be between
    batches)."""
    if size is None:
        size = os.fstat(fd).st_size
    data = pread_all(fd, size - start, start)
    result = ScanResult(
        end=start,
        next_offset=expected_offset if expected_offset is not None else -1,
        last_timestamp=-1,
        batches=[],
        records=[],
    )
    position = 0
    while position < len(data):
        batch_start = position
        fields: list[dict[str, Any]] = []
        count = 1
        problem = ""
        while len(fields) < count:
            line_end = data.find(b"\n", position)
            if line_end < 0:
                problem = "incomplete last line"
                break
            try:
                record = check_line(
                    data[position : line_end + 1], path=path, position=start + position
                )
            except CorruptRecordError as exc:
                problem = str(exc)
                break
            if not fields:
                count = record.get("batch_records", 1)
                if result.next_offset >= 0 and record["offset"] < result.next_offset:
                    problem = (
                        f"offset {record['offset']} at byte {start + position} is below the "
                        f"expected {result.next_offset}"
                    )
                    break
            elif record["offset"] != fields[-1]["offset"] + 1:
                problem = f"offsets jump inside a batch at byte {start + position}"
                break
            fields.append(record)
            position = line_end + 1
        if problem:
            result.bad_position = start + batch_start
            result.problem = problem
            result.bad_line_position = start + position
            result.bad_line_index = len(fields)
            result.corrupt_inside = _any_valid_line(data, position)
            return result
        first = fields[0]
        result.batches.append(BatchInfo(start + batch_start, first["offset"], first["timestamp"]))
        if keep_records:
            result.records.extend(fields)
        result.end = start + position
        result.next_offset = fields[-1]["offset"] + 1
        result.last_timestamp = fields[-1]["timestamp"]
    return result


def last_record_fields(fd: int, size: int) -> dict[str, Any] | None:
    """The last whole record of a closed segment, read from the end backwards."""
    if size == 0:
        return None
    window = 4096
    while True:
        start = max(0, size - window)
        data = os.pread(fd, size - start, start)
        cut = data.rfind(b"\n", 0, len(data) - 1)
        if cut >= 0 or start == 0:
            return check_line(data[cut + 1 :], position=start + cut + 1)
        window *= 4
