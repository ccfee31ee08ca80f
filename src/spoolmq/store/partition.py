"""One partition's log: appending whole batches under the partition's file lock, rolling,
recovering a torn tail, and the metadata readers need (segments, indexes, start and end).

Every writer, in any process, takes ``<partition dir>/.lock`` (``filelock``) around an
append, so offsets are assigned once and a batch is one ``write``. Between its own appends a
process may have been overtaken by another; under the lock it notices (the segment grew, or
a segment for its next offset exists) and catches up by reading the new tail.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NamedTuple

from filelock import FileLock, Timeout

from spoolmq.clock import now_ms
from spoolmq.config import StoreConfig, TopicConfig
from spoolmq.errors import (
    CorruptRecordError,
    OffsetOutOfRangeError,
    StorageError,
)
from spoolmq.files import FILE_MODE, fsync_dir, make_private_dirs, write_all
from spoolmq.store.names import index_name, segment_name
from spoolmq.store.record import EncodedMessage, as_single_record, check_line, frame_record
from spoolmq.store.segment import (
    INDEX_ENTRY,
    ScanResult,
    SparseIndex,
    entry_matches,
    last_record_fields,
    list_segment_bases,
    load_index,
    scan_batches,
)
from spoolmq.store.state import SequenceRow, StateDB

logger = logging.getLogger("spoolmq.store")

Acks = Literal["0", "1", "all"]


class Appended(NamedTuple):
    """Where one appended message went; ``duplicate`` marks an idempotent repeat
    (its ``timestamp`` is -1 when the first copy came in an earlier batch, and
    ``partition`` says where that copy is when it is not in this partition)."""

    offset: int
    timestamp: int
    duplicate: bool
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class RecoveryReport:
    """A problem found and handled (or refused) while opening a partition."""

    topic: str
    partition: int
    segment: str
    position: int
    problem: str
    quarantined_to: str | None
    quarantined_bytes: int


@dataclass(slots=True)
class _Tail:
    """What this process knows of the active (last) segment."""

    base: int
    size: int
    next_offset: int
    first_timestamp: int
    last_timestamp: int
    index: SparseIndex
    index_bytes: int
    fd: int
    index_fd: int


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


@dataclass(frozen=True, slots=True)
class SegmentInfo:
    base: int
    size: int
    newest_timestamp: int


class PartitionLog:
    def __init__(
        self,
        root: Path,
        topic: str,
        partition: int,
        topic_config: TopicConfig,
        store_config: StoreConfig,
        state: StateDB,
        reports: list[RecoveryReport],
    ) -> None:
        self.root = root
        self.topic = topic
        self.partition = partition
        self.topic_config = topic_config
        self.store_config = store_config
        self.directory = root / "logs" / topic / str(partition)
        self._state = state
        self._reports = reports
        make_private_dirs(self.directory)
        self._file_lock = FileLock(
            str(self.directory / ".lock"), timeout=store_config.lock_timeout_s, mode=FILE_MODE
        )
        self._thread_lock = threading.Lock()
        self._tail: _Tail | None = None
        self._indexes: dict[int, _CachedIndex] = {}
        self._first_timestamps: dict[int, int] = {}
        self._known_end: _KnownEnd | None = None
        self._last_figures_at = 0

    # -- paths ---------------------------------------------------------------------

    def segment_path(self, base: int) -> Path:
        return self.directory / segment_name(base)

    def index_path(self, base: int) -> Path:
        return self.directory / index_name(base)

    def segment_bases(self) -> list[int]:
        return list_segment_bases(self.directory)

    # -- locking --------------------------------------------------------------------

    def _acquire(self) -> None:
        self._thread_lock.acquire()
        try:
            self._file_lock.acquire()
        except Timeout:
            self._thread_lock.release()
            raise StorageError(
                f"timed out after {self.store_config.lock_timeout_s}s waiting for the lock of "
                f"{self.topic}/{self.partition}"
            ) from None
        except BaseException:
            self._thread_lock.release()
            raise

    def _release(self) -> None:
        self._file_lock.release()
        self._thread_lock.release()

    # -- opening and recovery ---------------------------------------------------------

    def _close_tail(self) -> None:
        if self._tail is not None:
            for fd in (self._tail.fd, self._tail.index_fd):
                with contextlib.suppress(OSError):
                    os.close(fd)
            self._tail = None

    def close(self) -> None:
        with self._thread_lock:
            self._close_tail()

    def _create_segment(self, base: int) -> None:
        for path in (self.segment_path(base), self.index_path(base)):
            fd = os.open(path, os.O_CREAT | os.O_WRONLY, FILE_MODE)
            os.close(fd)
        fsync_dir(self.directory)

    def _open_tail(self) -> _Tail:
        """Open the last segment for appending, recovering a torn tail. Caller holds the lock."""
        bases = self.segment_bases()
        if not bases:
            self._create_segment(0)
            bases = [0]
        base = bases[-1]
        path = self.segment_path(base)
        fd = os.open(path, os.O_RDWR | os.O_APPEND)
        try:
            index_fd = os.open(
                self.index_path(base), os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE
            )
        except BaseException:
            os.close(fd)
            raise
        size = os.fstat(fd).st_size
        index, usable = load_index(self.index_path(base), fd, size)
        if os.fstat(index_fd).st_size != usable * INDEX_ENTRY.size:
            os.ftruncate(index_fd, usable * INDEX_ENTRY.size)
        tail = _Tail(
            base=base,
            size=0,
            next_offset=base,
            first_timestamp=index.timestamps[0] if index else -1,
            last_timestamp=-1,
            index=index,
            index_bytes=usable * INDEX_ENTRY.size,
            fd=fd,
            index_fd=index_fd,
        )
        try:
            self._catch_up(tail, keep_records=True)
            if tail.last_timestamp < 0 and len(bases) > 1:
                # A fresh segment: timestamps must not go below the previous segment's.
                tail.last_timestamp = self._newest_timestamp(bases[-2])
        except BaseException:
            os.close(fd)
            os.close(index_fd)
            raise
        return tail

    def _newest_timestamp(self, base: int) -> int:
        try:
            fd = os.open(self.segment_path(base), os.O_RDONLY)
        except FileNotFoundError:
            return -1
        try:
            last = last_record_fields(fd, os.fstat(fd).st_size)
        except CorruptRecordError:
            return -1
        finally:
            os.close(fd)
        return last["timestamp"] if last else -1

    def _catch_up(self, tail: _Tail, *, keep_records: bool = False) -> None:
        """Bring ``tail`` up to the file: scan from the newest index entry, index what is new,
        and quarantine a torn tail. Caller holds the lock."""
        if tail.index:
            start, expected = tail.index.positions[-1], tail.index.offsets[-1]
        else:
            start, expected = 0, tail.base
        path = str(self.segment_path(tail.base))
        scan = scan_batches(tail.fd, path, start, expected, keep_records=keep_records)
        if scan.bad_position >= 0:
            self._handle_bad_tail(tail, scan, path)
        known_last = tail.index.positions[-1] if tail.index else -1
        tail.size = scan.end
        if scan.next_offset >= 0:
            tail.next_offset = scan.next_offset
        if scan.last_timestamp >= 0:
            tail.last_timestamp = scan.last_timestamp
        elif tail.index:
            tail.last_timestamp = tail.index.timestamps[-1]
        # Index whatever batches the previous writer did not get to index.
        previous_index = len(tail.index)
        for batch in scan.batches:
            if batch.position <= known_last:
                continue
            if (
                not tail.index
                or batch.position - tail.index.positions[-1]
                >= self.store_config.index_interval_bytes
            ):
                tail.index.add(batch.first_offset, batch.position, batch.timestamp)
        if len(tail.index) > previous_index:
            write_all(tail.index_fd, tail.index.encode_from(previous_index))
            tail.index_bytes = len(tail.index) * INDEX_ENTRY.size
        if tail.index:
            tail.first_timestamp = tail.index.timestamps[0]
        if keep_records:
            self._restore_sequences(scan)

    def _handle_bad_tail(self, tail: _Tail, scan: ScanResult, path: str) -> None:
        if scan.corrupt_inside:
            report = RecoveryReport(
                self.topic, self.partition, path, scan.bad_position, scan.problem, None, 0
            )
            self._reports.append(report)
            logger.error(
                "corruption inside %s at byte %d: %s", path, scan.bad_position, scan.problem
            )
            raise CorruptRecordError(
                f"{path} is damaged at byte {scan.bad_position} ({scan.problem}) and valid records "
                "follow, so it is not a torn tail; nothing was changed. Run `spoolmq check` and "
                "restore the segment or move it aside.",
                path=path,
                position=scan.bad_position,
            )
        size = os.fstat(tail.fd).st_size
        torn = os.pread(tail.fd, size - scan.bad_position, scan.bad_position)
        quarantine_dir = self.root / "quarantine" / self.topic / str(self.partition)
        make_private_dirs(quarantine_dir)
        target = quarantine_dir / f"{tail.base:020d}-{scan.bad_position}-{now_ms()}.torn"
        qfd = os.open(target, os.O_CREAT | os.O_WRONLY | os.O_EXCL, FILE_MODE)
        try:
            write_all(qfd, torn)
            os.fsync(qfd)
        finally:
            os.close(qfd)
        fsync_dir(quarantine_dir)
        os.ftruncate(tail.fd, scan.bad_position)
        os.fsync(tail.fd)
        report = RecoveryReport(
            self.topic,
            self.partition,
            path,
            scan.bad_position,
            scan.problem,
            str(target),
            len(torn),
        )
        self._reports.append(report)
        logger.warning(
            "torn tail in %s at byte %d (%s): %d bytes moved to %s; nothing before it was lost",
            path,
            scan.bad_position,
            scan.problem,
            len(torn),
            target,
        )

    def _restore_sequences(self, scan: ScanResult) -> None:
        """Producer sequences of the scanned tail: a crash between writing a batch and
        recording its sequences must not let a retried publish store the batch twice."""
        rows = [
            SequenceRow(r["producer_id"], r["sequence"], self.topic, self.partition, r["offset"])
            for r in scan.records
            if "producer_id" in r and "sequence" in r
        ]
        if rows:
            self._state.record_sequences(rows)

    def _current_tail(self) -> _Tail:
        """The tail, caught up with other processes' appends. Caller holds the lock."""
        tail = self._tail
        if tail is None:
            tail = self._tail = self._open_tail()
            return tail
        try:
            size = os.fstat(tail.fd).st_size
        except OSError:
            size = -1
        if size != tail.size:
            if size >= 0 and os.path.exists(self.segment_path(tail.base)):
                # Others appended: read their new index entries, then scan from the newest.
                new_bytes = os.pread(
                    tail.index_fd,
                    os.fstat(tail.index_fd).st_size - tail.index_bytes,
                    tail.index_bytes,
                )
                new_entries = SparseIndex.from_bytes(new_bytes)
                for i in range(len(new_entries)):
                    offset = new_entries.offsets[i]
                    position = new_entries.positions[i]
                    if position < size and (not tail.index or offset > tail.index.offsets[-1]):
                        tail.index.add(offset, position, new_entries.timestamps[i])
                tail.index_bytes += len(new_entries) * INDEX_ENTRY.size
                if tail.index_bytes != os.fstat(tail.index_fd).st_size:
                    os.ftruncate(tail.index_fd, tail.index_bytes)
                self._catch_up(tail, keep_records=True)
            else:
                self._close_tail()
                tail = self._tail = self._open_tail()
                return tail
        if os.path.exists(self.segment_path(tail.next_offset)) and tail.next_offset != tail.base:
            # Another process rolled to a new segment.
            self._close_tail()
            tail = self._tail = self._open_tail()
        return tail

    def recover(self) -> None:
        """Bring the tail up to date now: quarantine a torn last batch and record the
        producer sequences of batches whose writer died before recording them. A writer
        that spreads a producer's retries over partitions must do this for every partition
        first, or a retry sent to another partition is stored twice."""
        if not self.segment_bases():
            return  # nothing was ever written here: no file to create just to recover it
        self._acquire()
        try:
            self._current_tail()
        finally:
            self._release()

    # -- appending ------------------------------------------------------------------------

    def append(self, messages: Sequence[EncodedMessage], acks: Acks = "all") -> list[Appended]:
        """Append ``messages`` as one batch (one write, one fsync for ``acks="all"``).

        A message whose ``(producer_id, sequence)`` is already stored is not written again;
        its first offset comes back with ``duplicate=True``.
        """
        if not messages:
            return []
        self._acquire()
        try:
            tail = self._current_tail()
            results: list[Appended | None] = [None] * len(messages)
            copies: dict[int, int] = {}
            if any(m.producer_id is not None and m.sequence is not None for m in messages):
                pending = self._drop_duplicates(messages, results, copies)
            else:
                pending = list(range(len(messages)))
            if pending:
                written = self._write_batch(tail, [messages[i].body for i in pending], acks)
                rows = []
                for i, (offset, timestamp) in zip(pending, written, strict=True):
                    results[i] = Appended(offset, timestamp, False)
                    message = messages[i]
                    if message.producer_id is not None and message.sequence is not None:
                        rows.append(
                            SequenceRow(
                                message.producer_id,
                                message.sequence,
                                self.topic,
                                self.partition,
                                offset,
                            )
                        )
                try:
                    self._state.record_sequences(rows)
                except BaseException:
                    # The batch is stored but its sequences are not: reopening the tail
                    # before the next append restores them from the segment.
                    self._close_tail()
                    raise
                self._maybe_record_figures(self._tail or tail)
            for copy, first in copies.items():
                stored = results[first]
                assert stored is not None
                results[copy] = Appended(stored.offset, stored.timestamp, True)
            return [r for r in results if r is not None]
        finally:
            self._release()

    def _drop_duplicates(
        self,
        messages: Sequence[EncodedMessage],
        results: list[Appended | None],
        copies: dict[int, int],
    ) -> list[int]:
        """Fill ``results`` for messages already stored, ``copies`` for repeats inside this
        batch, and return the indexes still to write."""
        pairs = {
            (m.producer_id, m.sequence)
            for m in messages
            if m.producer_id is not None and m.sequence is not None
        }
        stored = self._state.find_sequences(pairs)
        if not stored and len(pairs) == len(messages):
            # The common batch: every message numbered, none stored before, none repeated.
            return list(range(len(messages)))
        pending: list[int] = []
        first_in_batch: dict[tuple[str, int], int] = {}
        for i, message in enumerate(messages):
            if message.producer_id is None or message.sequence is None:
                pending.append(i)
                continue
            pair = (message.producer_id, message.sequence)
            row = stored.get(pair)
            if row is not None:
                results[i] = Appended(row.offset, -1, True, row.partition)
            elif pair in first_in_batch:
                copies[i] = first_in_batch[pair]
            else:
                first_in_batch[pair] = i
                pending.append(i)
        return pending

    def _write_batch(
        self, tail: _Tail, bodies: Sequence[bytes], acks: Acks
    ) -> list[tuple[int, int]]:
        now = now_ms()
        timestamp = max(now, tail.last_timestamp)
        offset = tail.next_offset
        count = len(bodies)
        data = b"".join(
            [frame_record(offset, timestamp, bodies[0], count)]
            + [frame_record(offset + i, timestamp, body) for i, body in enumerate(bodies) if i]
        )
        if tail.size > 0 and (
            tail.size + len(data) > self.topic_config.segment_bytes
            or (
                tail.first_timestamp >= 0
                and now - tail.first_timestamp >= self.topic_config.segment_ms
            )
        ):
            try:
                tail = self._roll(tail)
            except OSError as exc:  # no room for a new file, too many open files, EIO...
                self._close_tail()  # re-read the files before the next append
                raise StorageError(
                    f"rolling {self.topic}/{self.partition} to a new segment failed "
                    f"({exc.strerror or exc}); nothing from this batch was stored"
                ) from None
        position = tail.size
        try:
            write_all(tail.fd, data)
            if acks == "all":
                os.fdatasync(tail.fd)
        except OSError as exc:
            self._undo_write(tail, position)
            raise StorageError(
                f"writing {self.topic}/{self.partition} failed ({exc.strerror or exc}); "
                "nothing from this batch was stored"
            ) from None
        if (
            not tail.index
            or position - tail.index.positions[-1] >= self.store_config.index_interval_bytes
        ):
            tail.index.add(offset, position, timestamp)
            if tail.first_timestamp < 0:
                tail.first_timestamp = timestamp
            try:
                write_all(tail.index_fd, INDEX_ENTRY.pack(offset, position, timestamp))
                tail.index_bytes += INDEX_ENTRY.size
            except OSError:
                # The index is derived data; the next open rebuilds the missing entry.
                tail.index.truncate(len(tail.index) - 1)
                self._close_tail()
        tail.size = position + len(data)
        tail.next_offset = offset + count
        tail.last_timestamp = timestamp
        return [(offset + i, timestamp) for i in range(count)]

    def _undo_write(self, tail: _Tail, position: int) -> None:
        try:
            os.ftruncate(tail.fd, position)
        except OSError:
            logger.exception("could not cut a failed batch off %s", self.segment_path(tail.base))
        # Whatever happened, re-read the file before the next append.
        self._close_tail()

    def _roll(self, tail: _Tail) -> _Tail:
        os.fsync(tail.fd)
        os.fsync(tail.index_fd)
        base = tail.next_offset
        self._create_segment(base)
        self._close_tail()
        new_tail = self._open_tail()
        new_tail.last_timestamp = max(new_tail.last_timestamp, tail.last_timestamp)
        self._tail = new_tail
        logger.info("rolled %s/%d to segment %d", self.topic, self.partition, base)
        return new_tail

    def _maybe_record_figures(self, tail: _Tail) -> None:
        now = now_ms()
        if now - self._last_figures_at >= 1000:
            self._last_figures_at = now
            bases = self.segment_bases()
            self._state.record_partition(
                self.topic, self.partition, bases[0] if bases else 0, tail.next_offset
            )

    def flush(self) -> None:
        """fsync the active segment (for appends made with acks 0 or 1)."""
        with self._thread_lock:
            if self._tail is not None:
                os.fsync(self._tail.fd)

    # -- metadata for readers ---------------------------------------------------------------

    def index_of(self, base: int) -> SparseIndex:
        """A segment's index for seeking: loaded once, then extended as the segment grows.

        Entries that point past the segment's current end are left for later; the scan
        that follows a seek checks offsets, so a stale entry can only cost time. A closed
        segment's index is kept until its file changes (compaction replaces it).
        """
        try:
            stat = os.stat(self.segment_path(base))
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
            with open(self.index_path(base), "rb") as handle:
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
        bases = self.segment_bases()
        cached.closed = bool(bases) and base != bases[-1]
        cached.identity = identity
        return index

    def is_closed(self, base: int) -> bool:
        """Has the writer moved on from this segment (so it only holds whole batches)?"""
        bases = self.segment_bases()
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
        bases = self.segment_bases()
        return bases[0] if bases else 0

    def log_end_offset(self) -> int:
        """The offset the next record will get (read-only; no recovery, no lock).

        Reads only what was appended since the last call: the active segment is scanned
        from where the previous call stopped (a batch boundary), so asking often is cheap.
        """
        while True:
            bases = self.segment_bases()
            if not bases:
                return 0
            base = bases[-1]
            try:
                fd = os.open(self.segment_path(base), os.O_RDONLY)
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
                    start, expected = (
                        (index.positions[-1], index.offsets[-1]) if index else (0, base)
                    )
                    if index and not entry_matches(fd, expected, start):
                        start, expected = 0, base
                path = str(self.segment_path(base))
                scan = scan_batches(fd, path, start, expected)
            finally:
                os.close(fd)
            end = scan.next_offset if scan.next_offset >= 0 else base
            self._known_end = _KnownEnd(base, stat.st_ino, scan.end, end)
            return end

    def check_offset(self, offset: int) -> None:
        start, end = self.log_start_offset(), self.log_end_offset()
        if not start <= offset <= end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside {self.topic}/{self.partition}: "
                f"valid offsets are {start} (log start) to {end} (log end)"
            )

    def segment_infos(self) -> list[SegmentInfo]:
        """Size and newest timestamp of every segment, oldest first."""
        infos = []
        for base in self.segment_bases():
            path = self.segment_path(base)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                continue
            try:
                size = os.fstat(fd).st_size
                last = last_record_fields(fd, size) if size else None
            except CorruptRecordError:
                last = None
            finally:
                os.close(fd)
            infos.append(SegmentInfo(base, size, last["timestamp"] if last else -1))
        return infos

    # -- retention and compaction ---------------------------------------------------------------

    def delete_segments(self, bases: Sequence[int]) -> None:
        """Delete closed segments (never the active one). Caller decided which."""
        if not bases:
            return
        self._acquire()
        try:
            active = self.segment_bases()[-1]
            for base in bases:
                if base >= active:
                    raise ValueError("the active segment is never deleted")
                self.segment_path(base).unlink(missing_ok=True)
                self.index_path(base).unlink(missing_ok=True)
                self._indexes.pop(base, None)
                self._first_timestamps.pop(base, None)
            fsync_dir(self.directory)
            tail = self._current_tail()
            self._state.record_partition(
                self.topic, self.partition, self.log_start_offset(), tail.next_offset
            )
        finally:
            self._release()

    def replace_segment(self, base: int, lines: Sequence[bytes]) -> None:
        """Atomically replace a closed segment's records (compaction): write, fsync, rename."""
        self._acquire()
        try:
            if base >= self.segment_bases()[-1]:
                raise ValueError("the active segment is never rewritten")
            tmp = self.directory / (segment_name(base) + ".compacting")
            tmp_index = self.directory / (index_name(base) + ".compacting")
            lines = [as_single_record(line) for line in lines]
            index = SparseIndex()
            position = 0
            for line in lines:
                if (
                    not index
                    or position - index.positions[-1] >= self.store_config.index_interval_bytes
                ):
                    fields = check_line(line)
                    index.add(fields["offset"], position, fields["timestamp"])
                position += len(line)
            chunks = lines
            for path, data in ((tmp, b"".join(chunks)), (tmp_index, index.encode_from(0))):
                fd = os.open(path, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, FILE_MODE)
                try:
                    write_all(fd, data)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(tmp, self.segment_path(base))
            os.replace(tmp_index, self.index_path(base))
            fsync_dir(self.directory)
            stat = os.stat(self.segment_path(base))
            self._indexes[base] = _CachedIndex(
                index, len(index) * INDEX_ENTRY.size, True, (stat.st_ino, stat.st_size)
            )
            self._first_timestamps.pop(base, None)
        finally:
            self._release()
