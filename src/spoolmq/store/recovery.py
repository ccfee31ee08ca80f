"""Opening a partition's active segment for appending, and keeping it caught up.

A writer crashed mid-batch leaves a torn tail: a part of a batch at the end of the active
segment. Opening (or catching up) finds it, moves its bytes to ``quarantine/`` and cuts
the segment back to its last whole batch; nothing before it is lost, and readers never
returned it (they return whole batches only). Damage followed by valid records is not a
torn tail: it is reported and refused, and nothing is changed. Batches another writer
appended are indexed if it did not get to it, and their producer sequences recorded.
Every method here runs under the partition's writer lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from spoolmq.clock import Clock
from spoolmq.errors import CorruptRecordError
from spoolmq.files import (
    FILE_MODE,
    fsync_dir,
    make_private_dirs,
    pread_all,
    write_all,
    write_new_file,
)
from spoolmq.store.segment import (
    INDEX_ENTRY,
    ScanResult,
    SegmentFiles,
    SparseIndex,
    load_index,
    scan_batches,
)
from spoolmq.store.state import SequenceRow, StateDB
from spoolmq.types import TopicPartition

logger = logging.getLogger("spoolmq.store")


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
class Tail:
    """What this process knows of the active (last) segment, open for appending."""

    base: int
    size: int
    next_offset: int
    first_timestamp: int
    last_timestamp: int
    index: SparseIndex
    index_bytes: int
    fd: int
    index_fd: int

    def close(self) -> None:
        """Close both files. Closing again does nothing: the descriptors are forgotten, so
        a number the system has since given to another file is never closed by mistake."""
        for fd in (self.fd, self.index_fd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self.fd = self.index_fd = -1


class TailRecovery:
    """Opens one partition's active segment, recovering a torn tail, and brings an open
    :class:`Tail` up to date with what other processes appended or rolled."""

    def __init__(
        self,
        tp: TopicPartition,
        files: SegmentFiles,
        *,
        quarantine: Path,
        state: StateDB,
        reports: list[RecoveryReport],
        index_interval_bytes: int,
        clock: Clock,
        restore_sequences: bool = True,
    ) -> None:
        self._tp = tp
        # Off in a process that keeps producer sequences itself (the PublisherBroker reads
        # them back from the log on start): then catching up parses no record.
        self._restore_sequences_on = restore_sequences
        self._files = files
        self._quarantine = quarantine
        self._state = state
        self._reports = reports
        self._index_interval_bytes = index_interval_bytes
        self._clock = clock

    def open(self) -> Tail:
        """Open the last segment (creating the first) for appending, recovering a torn tail."""
        bases = self._files.bases()
        if not bases:
            self._files.create(0)
            bases = [0]
        base = bases[-1]
        fd = os.open(self._files.segment_path(base), os.O_RDWR | os.O_APPEND)
        tail = Tail(base, 0, base, -1, -1, SparseIndex(), 0, fd, -1)
        try:
            index_path = self._files.index_path(base)
            tail.index_fd = os.open(index_path, os.O_RDWR | os.O_APPEND | os.O_CREAT, FILE_MODE)
            tail.index, usable = load_index(index_path, fd, os.fstat(fd).st_size)
            tail.index_bytes = usable * INDEX_ENTRY.size
            if os.fstat(tail.index_fd).st_size != tail.index_bytes:
                os.ftruncate(tail.index_fd, tail.index_bytes)
            if tail.index:
                tail.first_timestamp = tail.index.timestamps[0]
            self.catch_up(tail, keep_records=self._restore_sequences_on)
            if tail.last_timestamp < 0 and len(bases) > 1:
                # A fresh segment: timestamps must not go below the previous segment's.
                previous = self._files.info(bases[-2])
                tail.last_timestamp = previous.newest_timestamp if previous else -1
        except BaseException:
            tail.close()
            raise
        return tail

    def refresh(self, tail: Tail | None) -> Tail:
        """``tail`` caught up with other processes' appends and rolls (a new one if
        ``None``). If that fails, ``tail`` is closed: pass ``None`` the next time."""
        if tail is None:
            return self.open()
        try:
            return self._follow(tail)
        except BaseException:
            tail.close()
            raise

    def _follow(self, tail: Tail) -> Tail:
        try:
            size = os.fstat(tail.fd).st_size
        except OSError:
            size = -1
        if size != tail.size:
            if size < 0 or not os.path.exists(self._files.segment_path(tail.base)):
                tail.close()
                return self.open()
            # Others appended: read their new index entries, then scan from the newest.
            self._read_new_index_entries(tail, size)
            self.catch_up(tail, keep_records=self._restore_sequences_on)
        if tail.next_offset != tail.base and self._files.has_segment(tail.next_offset):
            # Another process rolled to a new segment.
            tail.close()
            return self.open()
        return tail

    def _read_new_index_entries(self, tail: Tail, size: int) -> None:
        index_size = os.fstat(tail.index_fd).st_size
        new_entries = SparseIndex.from_bytes(
            os.pread(tail.index_fd, index_size - tail.index_bytes, tail.index_bytes)
        )
        for i in range(len(new_entries)):
            offset = new_entries.offsets[i]
            position = new_entries.positions[i]
            if position < size and (not tail.index or offset > tail.index.offsets[-1]):
                tail.index.add(offset, position, new_entries.timestamps[i])
        tail.index_bytes += len(new_entries) * INDEX_ENTRY.size
        if tail.index_bytes != index_size:
            os.ftruncate(tail.index_fd, tail.index_bytes)

    def catch_up(self, tail: Tail, *, keep_records: bool = False) -> None:
        """Bring ``tail`` up to the file: scan from the newest index entry, index what is new,
        and quarantine a torn tail."""
        start, expected = tail.index.scan_start(tail.base)
        path = str(self._files.segment_path(tail.base))
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
            if batch.position > known_last and tail.index.wants_entry(
                batch.position, self._index_interval_bytes
            ):
                tail.index.add(batch.first_offset, batch.position, batch.timestamp)
        if len(tail.index) > previous_index:
            write_all(tail.index_fd, tail.index.encode_from(previous_index))
            tail.index_bytes = len(tail.index) * INDEX_ENTRY.size
        if tail.index:
            tail.first_timestamp = tail.index.timestamps[0]
        if keep_records:
            self._restore_sequences(scan)

    def _handle_bad_tail(self, tail: Tail, scan: ScanResult, path: str) -> None:
        topic, partition = self._tp
        if scan.corrupt_inside:
            report = RecoveryReport(
                topic, partition, path, scan.bad_position, scan.problem, None, 0
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
        torn = pread_all(tail.fd, size - scan.bad_position, scan.bad_position)
        make_private_dirs(self._quarantine)
        name = f"{tail.base:020d}-{scan.bad_position}-{self._clock.now_ms()}.torn"
        target = self._quarantine / name
        write_new_file(target, torn, exclusive=True)
        fsync_dir(self._quarantine)
        os.ftruncate(tail.fd, scan.bad_position)
        os.fsync(tail.fd)
        self._reports.append(
            RecoveryReport(
                topic, partition, path, scan.bad_position, scan.problem, str(target), len(torn)
            )
        )
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
        topic, partition = self._tp
        rows = [
            SequenceRow(r["producer_id"], r["sequence"], topic, partition, r["offset"])
            for r in scan.records
            if "producer_id" in r and "sequence" in r
        ]
        if rows:
            self._state.record_sequences(rows)
