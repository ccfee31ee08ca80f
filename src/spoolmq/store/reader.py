"""Reading a partition from any offset, with a position of its own and no locks.

A reader returns only whole batches: a batch whose lines are not all in the file yet (a
writer is mid-write, or crashed mid-write) is not returned until it is whole, so nothing a
reader sees can be taken back by recovery. Every line's checksum is verified; damage raises
CorruptRecordError where it is found.
"""

from __future__ import annotations

import bisect
import io
import os
import zlib
from collections.abc import Iterator
from typing import Any

import orjson

from spoolmq.errors import CorruptRecordError, InvalidArgumentError, OffsetOutOfRangeError
from spoolmq.files import pread_all
from spoolmq.store.partition import PartitionLog
from spoolmq.store.record import (
    Record,
    check_line,
    record_from_fields,
    record_offset,
    record_offset_and_timestamp,
    verified_fields,
)
from spoolmq.store.segment import SparseIndex, first_line_at_or_after

_CHUNK = 1024 * 1024
_FIRST_CHUNK = 16 * 1024  # after a seek: the first poll parses little
_LOOKUP_CHUNK = 4096  # read_at: what is read at a time to find one line


def offset_for_timestamp(partition: PartitionLog, timestamp: int) -> int:
    """The first offset whose timestamp is at or after ``timestamp`` (the log end if none).

    Binary search over the segments' first timestamps, then over the sparse index of one
    segment, then over the line heads between two index entries: no whole-partition scan.
    InvalidArgumentError for a ``timestamp`` that is not a whole number of ms.
    """
    if isinstance(timestamp, bool) or not isinstance(timestamp, int):
        raise InvalidArgumentError(
            f"timestamp must be a whole number of epoch ms, not {timestamp!r:.60}"
        )
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
    end = partition.log_end_offset()
    for base in bases[chosen:]:
        found = _scan_segment_for_timestamp(partition, base, timestamp)
        if found is not None:
            # A batch still being written is not there yet for readers.
            return min(found, end)
    return end


def _timestamp_of(line: bytes) -> int:
    return record_offset_and_timestamp(line)[1]


def _offset_of(line: bytes) -> int:
    return record_offset_and_timestamp(line)[0]


def _first_line_from(data: bytes, offset: int) -> int:
    """Where the first line of ``data`` (whole lines) at or after ``offset`` starts, read
    line by line: a line whose head is not a record's counts as that line unless a line
    after it comes before ``offset`` (then it is not the one looked for)."""
    start, damaged = 0, -1
    while start < len(data):
        end = data.index(b"\n", start) + 1
        try:
            found = _offset_of(data[start:end])
        except ValueError:
            if damaged < 0:
                damaged = start
        else:
            if found >= offset:
                return damaged if damaged >= 0 and found > offset else start
            damaged = -1
        start = end
    return damaged if damaged >= 0 else start


def _whole_lines(fd: int, start: int, stop: int) -> bytes:
    data = pread_all(fd, stop - start, start)
    return data[: data.rfind(b"\n") + 1]


def _scan_segment_for_timestamp(partition: PartitionLog, base: int, timestamp: int) -> int | None:
    index = partition.index_of(base)
    entry = index.floor_for_timestamp(timestamp)
    if entry + 1 < len(index):
        # The next entry is at or after the target: the answer lies between the two.
        start, stop = (index.positions[entry] if entry >= 0 else 0), index.positions[entry + 1]
        if stop == start:
            return index.offsets[entry + 1]
    else:
        start, stop = (index.positions[entry] if entry >= 0 else 0), -1
    try:
        fd = os.open(partition.segment_path(base), os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        if stop < 0:
            stop = os.fstat(fd).st_size
        data = _whole_lines(fd, start, stop)
        try:
            found = first_line_at_or_after(data, timestamp, _timestamp_of)
            if found == len(data):
                return index.offsets[entry + 1] if entry + 1 < len(index) else None
            return _offset_of(data[found : data.index(b"\n", found) + 1])
        except ValueError:
            raise CorruptRecordError(
                f"{partition.segment_path(base)}: a record between bytes {start} and {stop} "
                "has an unreadable head",
                path=str(partition.segment_path(base)),
                position=start,
            ) from None
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
        self._chunk = _FIRST_CHUNK
        self._whole_until = 0
        # Records parsed and not yet returned: those of _pending from _pending_at on (a
        # list and a start, so a call takes its records with one slice).
        self._pending: list[tuple[dict[str, Any], bytes]] = []
        self._pending_at = 0
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
        if not bases:  # nothing appended yet: the first poll that finds a segment opens it
            self._close_file()
            self._clear_pending()
            self.position = offset
            return
        slot = bisect.bisect_right(bases, offset) - 1
        base = bases[max(slot, 0)]
        index = self._partition.index_of(base)
        entry = index.floor_for_offset(offset)
        start = index.positions[entry] if entry >= 0 else 0
        self._open(base, start)
        self.position = offset
        if entry < 0:
            return
        # The bytes up to the next index entry (or the end of a closed segment) are whole
        # batches: the reader may start mid-batch there and need not wait for a batch's
        # last line. Past the newest entry of the active segment it parses forward from
        # the entry instead, so it never returns part of an unfinished batch.
        if entry + 1 < len(index):
            stop = index.positions[entry + 1]
        elif self._partition.is_closed(base):
            stop = os.fstat(self._fd).st_size
        else:
            return
        self._whole_until = max(self._whole_until, stop)
        if index.offsets[entry] == offset:
            return
        data = _whole_lines(self._fd, start, stop)
        try:
            self._byte_position = start + first_line_at_or_after(data, offset, _offset_of)
        except ValueError:
            self._byte_position = start  # a damaged head: let the checked read report it

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
        self._chunk = _FIRST_CHUNK
        # Bytes before this are known to be whole batches (see _parse_whole_batches).
        self._whole_until = (
            os.fstat(self._fd).st_size if self._partition.is_closed(base) else byte_position
        )
        self._clear_pending()

    def _clear_pending(self) -> None:
        self._pending.clear()
        self._pending_at = 0

    def _close_file(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self._close_file()
        self._clear_pending()

    def __del__(self) -> None:
        # A reader dropped without close() (an abandoned iteration, a caller that forgot)
        # gives its descriptor back, as a Python file object does: a long-lived process
        # that opens readers must not run out of descriptors.
        if getattr(self, "_fd", -1) >= 0:
            self._close_file()

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def read_many(
        self, offsets: list[int]
    ) -> tuple[dict[int, tuple[dict[str, Any], bytes]], list[int]]:
        """Look up the records at ``offsets`` (ascending), each alone: found through its
        segment's index and a search of a few line heads, and checked by its CRC, with
        nothing read ahead (parked messages coming due: a line's parse each). Returns the
        records found, as (parsed fields, stored line) by offset, and the offsets retention
        deleted; one in neither was removed by compaction. The reader is left after the
        last one found."""
        found: dict[int, tuple[dict[str, Any], bytes]] = {}
        deleted: list[int] = []
        bases = self._partition.segment_bases()
        indexes: dict[int, SparseIndex] = {}
        for offset in offsets:
            slot = bisect.bisect_right(bases, offset) - 1
            if slot < 0:
                deleted.append(offset)
                continue
            base = bases[slot]
            if base != self._base or self._fd < 0:
                self._close_file()
                self._clear_pending()
                try:
                    self._fd = os.open(self._partition.segment_path(base), os.O_RDONLY)
                except FileNotFoundError:
                    deleted.append(offset)  # retention deleted it meanwhile
                    continue
                self._base = base
            index = indexes.get(base)
            if index is None:
                index = indexes[base] = self._partition.index_of(base)
            entry = self._look_up(index, offset)
            if entry is not None:
                found[offset] = entry
        return found, deleted

    def _look_up(self, index: SparseIndex, offset: int) -> tuple[dict[str, Any], bytes] | None:
        """The record at ``offset`` in the open segment, or None when it has none."""
        entry = index.floor_for_offset(offset)
        position = index.positions[entry] if entry >= 0 else 0
        # The record is before the next entry when there is one: read up to it at once.
        chunk = _LOOKUP_CHUNK
        if 0 <= entry < len(index) - 1 and index.offsets[entry + 1] > offset:
            chunk = max(chunk, index.positions[entry + 1] - position)
        while True:
            data = os.pread(self._fd, chunk, position)
            whole = data[: data.rfind(b"\n") + 1]
            if not whole:
                if len(data) < chunk:
                    return None  # the end of the segment: the record is not in it
                chunk *= 4  # a line longer than what was read
                continue
            try:
                start = first_line_at_or_after(whole, offset, _offset_of)
            except ValueError:  # a damaged line head: line by line, to stop at it
                start = _first_line_from(whole, offset)
            if start == len(whole):
                if len(data) < chunk:
                    return None
                position += len(whole)  # all before it: read on, more at a time
                chunk = min(chunk * 4, _CHUNK)
                continue
            end = whole.index(b"\n", start) + 1
            line = whole[start:end]
            fields = verified_fields(line)
            if fields is None:
                path = str(self._partition.segment_path(self._base))
                check_line(line, path=path, position=position + start)
                return None
            if fields["offset"] != offset:
                return None  # the first record after it: there is none at ``offset``
            self._byte_position = position + end
            self.position = offset + 1
            return fields, line

    # -- fresh batches the writer described ------------------------------------------------

    def at(self, base: int, byte_position: int, offset: int) -> bool:
        """Is the reader exactly at ``offset``, which starts at ``byte_position`` of segment
        ``base`` (or starts that new segment, after the reader read all of the one before),
        with nothing read ahead? Then a batch written there can be taken without reading
        through the reader (:meth:`skip_batch`)."""
        if len(self._pending) > self._pending_at or self.position != offset:
            return False
        if base == self._base:
            return self._byte_position == byte_position
        return byte_position == 0 and base == offset and (self._fd < 0 or base > self._base)

    def read_batch(self, base: int, byte_position: int, byte_length: int) -> bytes:
        """The bytes of a batch the writer said it wrote there (its notice)."""
        if base == self._base and self._fd >= 0:
            return pread_all(self._fd, byte_length, byte_position)
        fd = os.open(self._partition.segment_path(base), os.O_RDONLY)
        try:
            return pread_all(fd, byte_length, byte_position)
        finally:
            os.close(fd)

    def skip_batch(self, base: int, byte_end: int, next_offset: int) -> None:
        """Move past a batch that was taken without this reader (see :meth:`at`)."""
        if base != self._base or self._fd < 0:
            self._open(base, byte_end)
        self._byte_position = byte_end
        self._whole_until = max(self._whole_until, byte_end)
        self.position = next_offset

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

    def read_entries(
        self, max_records: int, *, end: int | None = None
    ) -> list[tuple[dict[str, Any], bytes]]:
        """Up to ``max_records`` as (parsed fields, stored line): the broker forwards the
        stored line as it is, without re-encoding. ``end``: only offsets below it (what
        is known to be durable); records read past it wait for a later call."""
        pending = self._pending
        if self._pending_at >= len(pending):
            self._clear_pending()
            self._fill()
        at = self._pending_at
        stop = min(at + max_records, len(pending))
        if stop > at and end is not None and pending[stop - 1][0]["offset"] >= end:
            # In offset order: those below ``end`` are a prefix.
            stop = bisect.bisect_left(pending, end, lo=at, hi=stop, key=_entry_offset)
        if stop <= at:
            return []
        taken = pending[at:stop]
        if stop == len(pending):
            self._clear_pending()
        else:
            self._pending_at = stop
        self.position = taken[-1][0]["offset"] + 1
        return taken

    def unread(self, entries: list[tuple[dict[str, Any], bytes]]) -> None:
        """Give back the newest entries ``read_entries`` returned (a tail of what it took,
        in order) that the caller did not use: the reader stands at the first of them with
        the rest of what it read kept, where a ``seek`` there would drop it and read and
        verify those records again."""
        if not entries:
            return
        if entries[-1][0]["offset"] + 1 != self.position:
            raise ValueError("unread takes back the newest entries read, in order")
        # In place of what was taken before (the list's start, no longer needed).
        self._pending[: self._pending_at] = entries
        self._pending_at = 0
        self.position = entries[0][0]["offset"]

    def _fill(self) -> None:
        if self._fd < 0:
            self.seek(self.position)
            if self._fd < 0:
                return
        while not self._read_whole_batches():
            # Nothing whole left in this segment: move on if a newer segment exists. The
            # writer finishes a segment before creating the next, so read once more first.
            bases = self._partition.segment_bases()
            later = [base for base in bases if base > self._base]
            if not later or self._read_whole_batches():
                return
            size = os.fstat(self._fd).st_size
            if self._byte_position != size:
                # A closed segment never ends in a partial batch: this is damage, and
                # moving on would skip records in silence.
                path = str(self._partition.segment_path(self._base))
                raise CorruptRecordError(
                    f"{path} ends with {size - self._byte_position} bytes at byte "
                    f"{self._byte_position} that are not a whole batch (a damaged or cut "
                    "record); run `spoolmq check`",
                    path=path,
                    position=self._byte_position,
                )
            if bases and self.position < bases[0]:
                raise OffsetOutOfRangeError(
                    f"{self.topic}/{self.partition}: offset {self.position} was deleted by "
                    f"retention while being read; the log now starts at {bases[0]}"
                )
            try:
                self._open(later[0], 0)
            except FileNotFoundError:
                continue  # deleted by retention meanwhile: list the segments again

    def _read_whole_batches(self) -> bool:
        """Parse whole batches after the byte position into ``_pending``. True if any;
        False only when no whole batch at or past the reader's position is left."""
        chunk = self._chunk
        path = str(self._partition.segment_path(self._base))
        while True:
            data = os.pread(self._fd, chunk, self._byte_position)
            consumed = self._parse_whole_batches(data, path)
            self._byte_position += consumed
            if self._pending:
                # Small reads right after a seek, larger ones while reading on.
                self._chunk = min(chunk * 4, _CHUNK)
                return True
            if consumed:
                continue  # only records before the position so far: read on
            if len(data) < chunk:
                return False  # read to the end of the file: nothing whole is left
            chunk *= 4  # a batch larger than what was read: read more of it

    def _parse_whole_batches(self, data: bytes, path: str) -> int:
        """Verify and parse the whole batches at the start of ``data`` into ``_pending``
        (those at or past the position); return how many bytes they take.

        A batch is taken only when all its lines are in ``data``, except before
        ``_whole_until``, where the file is known to hold whole batches only.
        """
        pending = self._pending
        wanted = self.position
        whole_until = self._whole_until - self._byte_position
        # The chunk's lines at once, newlines kept, split on \n only (JSON may hold a raw
        # \r as whitespace; it never holds a raw \n): BytesIO finds each end with memchr
        # (400 instructions a 300-byte line, where bytes.split looks at every byte, 1,800,
        # and a line was then joined to its newline again). A last part without its
        # newline is not a whole line.
        parts = io.BytesIO(data).readlines()
        last = len(parts) - 1  # the index of the last whole line
        if parts and parts[-1][-1:] != b"\n":
            last -= 1
        crc32, loads, crc_mark = zlib.crc32, _parse_line, _CRC_MARK
        consumed = 0  # the bytes of the whole batches taken so far
        taken = 0  # and how many lines they are
        remaining = 0
        batch: list[tuple[dict[str, Any], bytes]] = []
        for index in range(last + 1):
            line = parts[index]
            # verified_fields, inlined (a call a line less): the CRC of all before
            # `,"crc":`, then the whole parse. The line ends in a newline, so the digits
            # end two bytes before its end; a line whose object does not close right
            # there fails the parse. Of what orjson returns only a dict takes a str
            # index: one whose "offset" is an int is a record's.
            head, mark, tail = line.rpartition(crc_mark)
            try:
                if mark and crc32(head) == int(tail[:-2]):
                    fields = loads(line)
                    good = type(fields["offset"]) is int
                else:
                    good = False
            except (ValueError, TypeError, KeyError):  # a bad checksum or JSON, no offset
                good = False
            if not good:
                if index == last and os.fstat(self._fd).st_size == len(data) + self._byte_position:
                    # The last line of the file: a writer may be mid-write or crashed
                    # mid-write (recovery will move it aside). Not returned, not skipped.
                    return consumed
                if consumed or pending:
                    return consumed  # hand out the good records first; raise next time
                position = self._byte_position + sum(map(len, parts[:index]))
                check_line(line, path=path, position=position)
                raise CorruptRecordError(  # pragma: no cover - check_line raised already
                    f"bad record in {path}", path=path, position=position
                )
            if remaining:
                batch.append((fields, line))
                remaining -= 1
                if not remaining:
                    if batch[0][0]["offset"] >= wanted:  # offsets grow within a batch
                        pending.extend(batch)
                    else:
                        pending.extend(entry for entry in batch if entry[0]["offset"] >= wanted)
                    batch = []
                    # The batch's bytes summed in C, not a len() a line.
                    consumed += sum(map(len, parts[taken : index + 1]))
                    taken = index + 1
                continue
            count = fields.get("batch_records", 1) if consumed >= whole_until else 1
            if count == 1:
                if fields["offset"] >= wanted:
                    pending.append((fields, line))
                consumed += len(line)
                taken = index + 1
                continue
            if last - index < count - 1:
                return consumed  # the rest of the batch is not in ``data`` yet
            remaining = count - 1
            batch = [(fields, line)]
        return consumed


_CRC_MARK = b',"crc":'
# The parse of a line whose CRC is good, in the chunk loop of _parse_whole_batches (which
# does verified_fields' work inline): a module name, so a test can see which lines a
# reader verifies.
_parse_line = orjson.loads


def _entry_offset(entry: tuple[dict[str, Any], bytes]) -> int:
    return entry[0]["offset"]  # type: ignore[no-any-return]


def fresh_lines(data: bytes, count: int, first: int) -> list[bytes] | None:
    """The lines of a batch the writer has just described (offsets ``first`` ..
    ``first + count - 1``), checked by count, CRC and first and last offset only, with no
    JSON parse: the writer made them, so only damage between its write and this read is
    looked for. None if anything does not match: the caller reads them the slow way, where
    full verification says what is wrong."""
    if not data.endswith(b"\n"):
        return None
    # Split on newlines only (JSON may hold a raw \r as whitespace; it never holds a raw
    # \n), newlines kept, each end found with memchr (see _parse_whole_batches).
    lines = io.BytesIO(data).readlines()
    if len(lines) != count:
        return None
    crc32 = zlib.crc32
    try:
        for line in lines:
            head, mark, tail = line.rpartition(_CRC_MARK)  # as verified_fields does
            if not mark or crc32(head) != int(tail[:-2]):
                return None
        if record_offset(lines[0]) != first or record_offset(lines[-1]) != first + count - 1:
            return None
    except ValueError:
        return None
    return lines
