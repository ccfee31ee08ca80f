"""Appending to one partition: the single writer at a time that assigns offsets.

Every writer, in any process, takes the partition's lock (:class:`PartitionLock`) around
an append, so offsets are assigned once and a batch is one ``write``. Between its own
appends a process may have been overtaken by another; under the lock it notices (the
segment grew, or a segment for its next offset exists) and catches up by reading the new
tail (:mod:`spoolmq.store.recovery`). The writer also rolls to a new segment when the
active one is full or old, and skips messages whose producer sequence is already stored.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

from spoolmq.clock import Clock
from spoolmq.config import TopicConfig
from spoolmq.errors import StorageError
from spoolmq.files import FILE_MODE, write_all
from spoolmq.store.message import Acks
from spoolmq.store.record import EncodedMessage, frame_batch
from spoolmq.store.recovery import Tail, TailRecovery
from spoolmq.store.segment import INDEX_ENTRY, SegmentFiles
from spoolmq.store.state import SequenceRow, StateDB
from spoolmq.types import TopicPartition

logger = logging.getLogger("spoolmq.store")


_FIGURES_INTERVAL_MS = 1000  # how often appends refresh the partition's row in state.db


class Appended(NamedTuple):
    """Where one appended message went; ``duplicate`` marks an idempotent repeat
    (its ``timestamp`` is -1 when the first copy came in an earlier batch, and
    ``partition`` says where that copy is when it is not in this partition)."""

    offset: int
    timestamp: int
    duplicate: bool
    partition: int | None = None


class Written(NamedTuple):
    """Where one batch went: offsets ``base_offset`` .. ``+ records - 1``, all with
    ``timestamp``, at bytes ``position`` .. ``+ length`` of segment ``segment_base``."""

    base_offset: int
    timestamp: int
    records: int
    segment_base: int
    position: int
    length: int
    sync_fd: int = -1  # a duplicate of the segment's descriptor, when asked for: caller closes


class PartitionLock:
    """A partition's writer lock: an exclusive ``flock`` on ``.lock`` in its directory keeps
    other processes out; a thread lock, taken first, keeps this process's threads in line.

    The lock file stays open (one descriptor per partition): opening, locking, unlocking
    and closing it per append, as ``filelock`` does, cost ~90 us of CPU per batch, which
    one group commit pays once per partition it writes to. Other processes may still lock
    it with ``filelock`` (it uses ``flock`` on the same file).
    """

    def __init__(self, path: Path, *, timeout_s: float, name: str) -> None:
        self.threads = threading.Lock()
        self._path = path
        self._fd = -1
        self._pid = -1  # the process that opened _fd: a descriptor is never used across fork
        self._timeout_s = timeout_s
        self._name = name

    def __enter__(self) -> None:
        self.threads.acquire()
        try:
            self._lock_file()
        except BaseException:
            self.threads.release()
            raise

    def _lock_file(self) -> None:
        if self._pid != os.getpid():
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, FILE_MODE)
            self._pid = os.getpid()
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        # Another process holds it (an embedded writer, a compaction): wait, polling as
        # filelock does, up to the timeout.
        deadline = time.monotonic() + self._timeout_s
        while True:
            time.sleep(0.005)
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise StorageError(
                        f"timed out after {self._timeout_s}s waiting for the lock of {self._name}"
                    ) from None

    def __exit__(self, *exc: object) -> None:
        try:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            self.threads.release()

    def close(self) -> None:
        """Close the lock file (not held)."""
        with self.threads:
            if self._fd >= 0 and self._pid == os.getpid():
                os.close(self._fd)
            self._fd, self._pid = -1, -1


class PartitionWriter:
    """Appends batches to one partition and rolls its segments, under its lock."""

    def __init__(
        self,
        tp: TopicPartition,
        files: SegmentFiles,
        recovery: TailRecovery,
        *,
        lock: PartitionLock,
        state: StateDB,
        topic_config: TopicConfig,
        index_interval_bytes: int,
        clock: Clock,
    ) -> None:
        self.topic_config = topic_config  # replaced when the topic is altered
        self.lock = lock
        self._tp = tp
        self._files = files
        self._recovery = recovery
        self._state = state
        self._index_interval_bytes = index_interval_bytes
        self._clock = clock
        self._tail: Tail | None = None
        self._last_figures_at = 0

    # -- the tail --------------------------------------------------------------------

    def _current_tail(self) -> Tail:
        """The tail, caught up with other processes' appends. Caller holds the lock."""
        tail, self._tail = self._tail, None
        self._tail = self._recovery.refresh(tail)
        return self._tail

    def _close_tail(self) -> None:
        if self._tail is not None:
            self._tail.close()
            self._tail = None

    def close(self) -> None:
        with self.lock.threads:
            self._close_tail()
        self.lock.close()

    def flush(self) -> None:
        """fsync the active segment (for appends made with acks 0 or 1)."""
        with self.lock.threads:
            if self._tail is not None:
                os.fsync(self._tail.fd)

    def recover(self) -> None:
        """Bring the tail up to date now (see :meth:`PartitionLog.recover`)."""
        if not self._files.bases():
            return  # nothing was ever written here: no file to create just to recover it
        with self.lock:
            self._current_tail()

    # -- partition figures -------------------------------------------------------------

    def record_figures(self, *, locked: bool = True) -> None:
        """Record the log start and end in ``state.db`` now. The caller holds the lock
        unless ``locked`` is False."""
        if not locked:
            with self.lock:
                self._record_figures(self._current_tail())
            return
        self._record_figures(self._current_tail())

    def _record_figures(self, tail: Tail) -> None:
        bases = self._files.bases()
        topic, partition = self._tp
        self._state.record_partition(topic, partition, bases[0] if bases else 0, tail.next_offset)

    def _maybe_record_figures(self, tail: Tail) -> None:
        now = self._clock.now_ms()
        if now - self._last_figures_at >= _FIGURES_INTERVAL_MS:
            self._last_figures_at = now
            self._record_figures(tail)

    # -- appending ------------------------------------------------------------------------

    def append(self, messages: Sequence[EncodedMessage], acks: Acks = "all") -> list[Appended]:
        """Append ``messages`` as one batch (see :meth:`PartitionLog.append`)."""
        if not messages:
            return []
        with self.lock:
            tail = self._current_tail()
            results: list[Appended | None] = [None] * len(messages)
            copies: dict[int, int] = {}
            if any(m.producer_id is not None and m.sequence is not None for m in messages):
                pending = self._drop_duplicates(messages, results, copies)
            else:
                pending = list(range(len(messages)))
            if pending:
                batch = self._write_batch(tail, [messages[i].body for i in pending], acks)
                topic, partition = self._tp
                rows = []
                for k, i in enumerate(pending):
                    offset, timestamp = batch.base_offset + k, batch.timestamp
                    results[i] = Appended(offset, timestamp, False)
                    message = messages[i]
                    if message.producer_id is not None and message.sequence is not None:
                        rows.append(
                            SequenceRow(
                                message.producer_id, message.sequence, topic, partition, offset
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

    def append_bodies(
        self, bodies: Sequence[bytes], acks: Acks = "all", *, sync_later: bool = False
    ) -> Written:
        """Append record bodies as one batch, with no idempotence check and nothing written
        to ``state.db``: the PublisherBroker's path, which keeps producer sequences itself
        (``spoolmq.broker.producer_ranges``) and records the partition's figures on a timer.
        ``sync_later``: write only, and return a duplicate descriptor of the segment for
        the caller to ``fdatasync`` (and close) in another thread."""
        with self.lock:
            return self._write_batch(
                self._current_tail(), bodies, "1" if sync_later else acks, sync_later
            )

    def forget_tail(self) -> None:
        """Close the tail, so the next append re-reads the files. Caller holds the lock."""
        self._close_tail()

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
        first_in_batch: dict[tuple[str, int], int] = {}  # (producer id, sequence) -> index
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
        self, tail: Tail, bodies: Sequence[bytes], acks: Acks, keep_fd: bool = False
    ) -> Written:
        now = self._clock.now_ms()
        timestamp = max(now, tail.last_timestamp)
        offset = tail.next_offset
        count = len(bodies)
        data = frame_batch(offset, timestamp, bodies)
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
                    f"rolling {self._tp.topic}/{self._tp.partition} to a new segment failed "
                    f"({exc.strerror or exc}); nothing from this batch was stored"
                ) from None
        position = tail.size
        sync_fd = -1
        try:
            write_all(tail.fd, data)
            if acks == "all":
                os.fdatasync(tail.fd)
            if keep_fd:
                sync_fd = os.dup(tail.fd)
        except OSError as exc:
            self._undo_write(tail, position)
            raise StorageError(
                f"writing {self._tp.topic}/{self._tp.partition} failed ({exc.strerror or exc}); "
                "nothing from this batch was stored"
            ) from None
        if tail.index.wants_entry(position, self._index_interval_bytes):
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
        return Written(offset, timestamp, count, tail.base, position, len(data), sync_fd)

    def _undo_write(self, tail: Tail, position: int) -> None:
        try:
            os.ftruncate(tail.fd, position)
        except OSError:
            logger.exception(
                "could not cut a failed batch off %s", self._files.segment_path(tail.base)
            )
        # Whatever happened, re-read the file before the next append.
        self._close_tail()

    def _roll(self, tail: Tail) -> Tail:
        os.fsync(tail.fd)
        os.fsync(tail.index_fd)
        base = tail.next_offset
        self._files.create(base)
        self._close_tail()
        new_tail = self._tail = self._recovery.open()
        new_tail.last_timestamp = max(new_tail.last_timestamp, tail.last_timestamp)
        logger.info("rolled %s/%d to segment %d", self._tp.topic, self._tp.partition, base)
        return new_tail
