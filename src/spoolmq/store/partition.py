"""One partition of a topic: the object the store, readers and brokers use.

:class:`PartitionLog` holds the pieces that do the work and keeps them to one writer lock:

- :mod:`~spoolmq.store.writer`: appending batches and rolling segments, under the lock;
- :mod:`~spoolmq.store.recovery`: opening the active segment, catching up with other
  writers, and moving a torn tail to ``quarantine/``;
- :mod:`~spoolmq.store.metadata`: what readers need (indexes, log start and end), no lock;
- :mod:`~spoolmq.store.cleanup`: deleting and rewriting closed segments for retention and
  compaction;
- :class:`~spoolmq.store.segment.SegmentFiles`: where the segment and index files are.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.config import StoreConfig, TopicConfig
from spoolmq.errors import OffsetOutOfRangeError
from spoolmq.files import fsync_dir, make_private_dirs
from spoolmq.store import cleanup
from spoolmq.store.message import Acks
from spoolmq.store.metadata import PartitionMetadata
from spoolmq.store.names import partition_dir, quarantine_dir
from spoolmq.store.record import EncodedMessage
from spoolmq.store.recovery import RecoveryReport, TailRecovery
from spoolmq.store.segment import SegmentFiles, SegmentInfo, SparseIndex
from spoolmq.store.state import StateDB
from spoolmq.store.writer import Appended, PartitionLock, PartitionWriter, Written
from spoolmq.types import TopicPartition


class PartitionLog:
    """One partition's segments: appends, recovery, readers' metadata and cleanup."""

    def __init__(
        self,
        root: Path,
        tp: TopicPartition,
        topic_config: TopicConfig,
        store_config: StoreConfig,
        state: StateDB,
        reports: list[RecoveryReport],
        *,
        clock: Clock = SYSTEM_CLOCK,
        restore_sequences: bool = True,
    ) -> None:
        self.topic, self.partition = tp
        directory = partition_dir(root, tp)
        make_private_dirs(directory)
        self.files = SegmentFiles(directory)
        self._metadata = PartitionMetadata(self.files)
        self._index_interval_bytes = store_config.index_interval_bytes
        recovery = TailRecovery(
            tp,
            self.files,
            quarantine=quarantine_dir(root, tp),
            state=state,
            reports=reports,
            index_interval_bytes=store_config.index_interval_bytes,
            clock=clock,
            restore_sequences=restore_sequences,
        )
        lock = PartitionLock(
            directory / ".lock",
            timeout_s=store_config.lock_timeout_s,
            name=f"{tp.topic}/{tp.partition}",
        )
        self._writer = PartitionWriter(
            tp,
            self.files,
            recovery,
            lock=lock,
            state=state,
            topic_config=topic_config,
            index_interval_bytes=store_config.index_interval_bytes,
            clock=clock,
        )

    @property
    def topic_config(self) -> TopicConfig:
        return self._writer.topic_config

    @topic_config.setter
    def topic_config(self, config: TopicConfig) -> None:
        self._writer.topic_config = config

    # -- files ---------------------------------------------------------------------

    def segment_path(self, base: int) -> Path:
        return self.files.segment_path(base)

    def segment_bases(self) -> list[int]:
        return self.files.bases()

    # -- writing ---------------------------------------------------------------------

    @property
    def writer_lock(self) -> PartitionLock:
        """The partition's writer lock. While it is held no writer, in this process or
        another, is in the middle of a batch: what the active segment holds then ends
        where a batch ends, unless a writer died mid-batch."""
        return self._writer.lock

    def append(self, messages: Sequence[EncodedMessage], acks: Acks = "all") -> list[Appended]:
        """Append ``messages`` as one batch (one write, one fsync for ``acks="all"``).

        A message whose ``(producer_id, sequence)`` is already stored is not written again;
        its first offset comes back with ``duplicate=True``.
        """
        return self._writer.append(messages, acks)

    def append_bodies(
        self, bodies: Sequence[bytes], acks: Acks = "all", *, sync_later: bool = False
    ) -> Written:
        """Append record bodies (``EncodedMessage.body``) as one batch, with no idempotence
        check and no ``state.db`` write: for a writer that keeps producer sequences itself
        and calls :meth:`record_figures` on a timer (the PublisherBroker). With
        ``sync_later`` nothing is synced: ``Written.sync_fd`` is a duplicate descriptor of
        the segment for the caller to ``fdatasync`` and close, and if that fails, to
        :meth:`cut_back` what it wrote."""
        return self._writer.append_bodies(bodies, acks, sync_later=sync_later)

    def cut_back(self, segment_base: int, position: int) -> None:
        """Remove everything from byte ``position`` of segment ``segment_base`` on, newer
        segments included: what a writer wrote and could not sync (its fdatasync failed),
        so that nothing it was not told is stored stays readable. The tail is re-read on
        the next append."""
        with self._writer.lock:
            self._writer.forget_tail()
            newer = [base for base in self.files.bases() if base > segment_base]
            for base in newer:
                self.files.segment_path(base).unlink(missing_ok=True)
                self.files.index_path(base).unlink(missing_ok=True)
                self._metadata.forget(base)
            try:
                fd = os.open(self.files.segment_path(segment_base), os.O_RDWR)
            except FileNotFoundError:
                return
            try:
                os.ftruncate(fd, position)
            finally:
                os.close(fd)
            self._metadata.forget(segment_base)
            if newer:
                fsync_dir(self.files.directory)

    def record_figures(self) -> None:
        """Record the log start and end in ``state.db`` now (``partitions``)."""
        self._writer.record_figures(locked=False)

    def recover(self) -> None:
        """Bring the tail up to date now: quarantine a torn last batch and record the
        producer sequences of batches whose writer died before recording them. A writer
        that spreads a producer's retries over partitions must do this for every partition
        first, or a retry sent to another partition is stored twice."""
        self._writer.recover()

    def flush(self) -> None:
        """fsync the active segment (for appends made with acks 0 or 1)."""
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()

    # -- metadata for readers ---------------------------------------------------------

    def index_of(self, base: int) -> SparseIndex:
        return self._metadata.index_of(base)

    def is_closed(self, base: int) -> bool:
        return self._metadata.is_closed(base)

    def first_timestamp(self, base: int) -> int | None:
        return self._metadata.first_timestamp(base)

    def log_start_offset(self) -> int:
        return self._metadata.log_start_offset()

    def log_end_offset(self) -> int:
        return self._metadata.log_end_offset()

    def segment_infos(self) -> list[SegmentInfo]:
        return self._metadata.segment_infos()

    def check_offset(self, offset: int) -> None:
        start, end = self.log_start_offset(), self.log_end_offset()
        if not start <= offset <= end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside {self.topic}/{self.partition}: "
                f"valid offsets are {start} (log start) to {end} (log end)"
            )

    # -- retention and compaction ---------------------------------------------------------

    def delete_segments(self, bases: Sequence[int]) -> None:
        """Delete closed segments (never the active one). Caller decided which."""
        if not bases:
            return
        with self._writer.lock:
            cleanup.delete_segments(self.files, bases)
            for base in bases:
                self._metadata.forget(base)
            self._writer.record_figures()

    def replace_segment(self, base: int, lines: Sequence[bytes]) -> None:
        """Atomically replace a closed segment's records (compaction)."""
        with self._writer.lock:
            index = cleanup.rewrite_segment(
                self.files, base, lines, index_interval_bytes=self._index_interval_bytes
            )
            self._metadata.replaced(base, index)
