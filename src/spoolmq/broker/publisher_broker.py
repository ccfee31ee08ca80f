"""The PublisherBroker process: receives publish frames, stores them with group commit,
answers each publisher with its positions only once they are stored at the asked ACK level.

Group commit: every frame that arrived while the previous batch was being written is read
in the next ``loop()`` step, and each partition touched gets one write for all of them.
The ``fdatasync`` runs in the sync thread (``spoolmq.broker.sync_thread``): while it waits
for the disk, the loop reads, checks and writes the next commit, and each commit is
answered (and the ConsumerBroker told) as soon as its sync and every older one returned.
A failed sync fails its commit and every later one written meanwhile, whose data is cut off
the log: a publisher is never told "stored" for what the disk did not take.

Per message the broker does one parse (of the frame), a few type checks and a dump of each
record (``spoolmq.protocol.publish``), except in the frames of its own Kafka child, which
come with their records in the store's form already (``decode_checked_frame``).
Idempotence is a comparison per frame against the producer's runs
(``spoolmq.broker.producer_ranges``), which go to ``state.db`` in batches, after the
answers, as do the partitions' figures.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.broker.child import BrokerChild, ChildChannels, ClientConnection, Periodic, receive_fd
from spoolmq.broker.metrics import COMMIT_SIZE_BOUNDS, SECONDS_BOUNDS, Buckets
from spoolmq.broker.producer_ranges import ProducerRanges, StoredAt
from spoolmq.broker.sync_thread import SyncKey, SyncThread, describe
from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.errors import (
    MessageTooLargeError,
    ProtocolError,
    SpoolError,
    StorageError,
    UnknownPartitionError,
)
from spoolmq.protocol.publish import (
    CheckedRecords,
    check_publish_frame,
    check_publish_head,
    check_records,
    decode_checked_frame,
    is_checked_frame,
)
from spoolmq.store.compaction import compaction_due
from spoolmq.store.names import check_topic
from spoolmq.store.partitioner import partition_for_key
from spoolmq.store.record import RECORD_OVERHEAD
from spoolmq.store.state import RunRow
from spoolmq.store.writer import Written

logger = logging.getLogger("spoolmq.publisher")

# How many frames one connection may contribute to one group commit, so one busy
# publisher cannot starve the others.
_FRAMES_PER_CONNECTION = 16
# How often closed segments are checked against each topic's retention (time and size),
# and compacted topics are compacted.
_CLEANUP_S = 5.0
# A compacted topic whose change since its last compaction is too small to compact
# at once is compacted once the change is this old.
_COMPACT_SETTLE_S = 30.0
# How often producer sequences no client can ask about any more are forgotten.
_PRUNE_S = 30.0
# How often the producer runs stored since are written to state.db (after the answers),
# the partitions' figures recorded there, and its WAL checkpointed: all off the path
# between a batch's fdatasync and its answer.
_SAVE_S = 0.5
_FIGURES_S = 1.0
_CHECKPOINT_S = 1.0


class _Batch:
    """What one group commit appends to one partition: the bodies of every frame's
    records bound there, their keys and extras for the ConsumerBroker's notice."""

    __slots__ = (
        "acks",
        "bodies",
        "error",
        "extra",
        "keyed",
        "keys",
        "partition",
        "topic",
        "written",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic, self.partition = topic, partition
        self.bodies: list[bytes] = []
        self.keys: list[str | None] = []
        self.keyed = False
        self.extra: dict[str, list[Any]] | None = None
        self.acks = "0"
        self.written: Written | None = None
        self.error: SpoolError | None = None


# A piece of a frame's answer: ``count`` records from ``start`` (index in the frame), either
# written to a batch (at ``at`` in it, sequences from ``sequence`` or None) or duplicates of
# a stored copy (``StoredAt``) or of a record earlier in this commit (batch, at).
_WRITTEN, _DUPLICATE, _DUPLICATE_HERE = 0, 1, 2


class _Frame:
    __slots__ = ("acks", "client", "errors", "frame_id", "partitions", "pieces", "producer_id")

    def __init__(
        self, client: ClientConnection, frame_id: Any, acks: str, producer_id: str | None
    ) -> None:
        self.client, self.frame_id, self.acks, self.producer_id = (
            client,
            frame_id,
            acks,
            producer_id,
        )
        self.pieces: list[list[Any]] = []
        self.errors: dict[str, dict[str, str]] | None = None
        self.partitions = 0

    def fail(self, index: int, exc: SpoolError) -> None:
        if self.errors is None:
            self.errors = {}
        self.errors[str(index)] = {"code": exc.code, "message": str(exc)}


# A frame read: its connection, the frame (its head, for a pre-checked frame) and, for
# the Kafka child's pre-checked frames, its records as checked.
_Read = tuple[ClientConnection, dict[str, Any], CheckedRecords | None]


class _Commit:
    """One group commit: the frames read in one loop step, their batches (one per
    partition), written together and synced by one job of the sync thread."""

    __slots__ = ("batches", "error", "frames", "fresh", "job", "started")

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.batches: dict[tuple[str, int], _Batch] = {}
        # Per producer, the sequences of this commit: (first, count, batch, index in it).
        self.fresh: dict[str, list[tuple[int, int, _Batch, int]]] = {}
        self.frames: list[_Frame] = []
        self.job = 0  # its sync job; 0: nothing to sync (ACK levels 0 and 1)
        self.error: SpoolError | None = None  # its sync, or an earlier one, failed


@dataclass(slots=True)
class PublisherStats:
    frames: int = 0
    frames_prechecked: int = 0  # of them, the Kafka child's, in the store's form already
    messages: int = 0
    batches: int = 0
    errors: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)
    bytes_by_topic: dict[str, int] = field(default_factory=dict)
    # Observed once per group commit (metrics): its messages, and the time from reading
    # its frames to answering them, counted once per frame.
    commit_size: Buckets = field(default_factory=lambda: Buckets(COMMIT_SIZE_BOUNDS))
    ack_seconds: Buckets = field(default_factory=lambda: Buckets(SECONDS_BOUNDS))


class PublisherBroker(BrokerChild[ClientConnection]):
    """One ``loop()`` step: wait for frames, read every ready one, store, answer."""

    role = "publisher"

    def __init__(
        self,
        data_dir: Path,
        channels: ChildChannels,
        *,
        store_settings: dict[str, Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(data_dir, channels, store_settings=store_settings, clock=clock)
        self.notices: Connection | None = None
        self.store.restore_sequences = False  # _rebuild_ranges reads them back instead
        self.stats = PublisherStats()
        self._cleanup_timer = Periodic(_CLEANUP_S)
        # Per compacted topic: its bytes after its last compaction, and when (monotonic).
        self._compacted: dict[str, tuple[int, float]] = {}
        self._prune_timer = Periodic(_PRUNE_S, first_at=time.monotonic() + _PRUNE_S)
        self.ranges = ProducerRanges()
        # Per partition appended to: the end offset of the last batch whose runs are in
        # ``ranges``, and the marks last saved with the runs.
        self._ends: dict[tuple[str, int], int] = {}
        self._saved_marks: dict[tuple[str, int], int] = {}
        # state.db's writes that are not figures (runs, WAL checkpoints, pruning): one
        # thread, so the loop never sleeps in SQLite's busy handler (measured: stalls of
        # ~300 ms at 20,000 msg/s while they ran in the loop).
        self._state_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="state")
        self._saving_runs: tuple[list[RunRow], dict[tuple[str, int], int], Future[None]] | None = (
            None
        )
        self._unsaved_since: float | None = None
        self._figures_timer = Periodic(_FIGURES_S)
        self._figures_due: set[tuple[str, int]] = set()
        self._checkpoint_timer = Periodic(_CHECKPOINT_S)
        # Commits written and not finished, oldest first: each waits for its sync and
        # for every older one (answers, runs and notices go out in commit order).
        self._unsynced: deque[_Commit] = deque()
        self._sync: SyncThread | None = None
        self._jobs = itertools.count(1)
        self.sync_inline = True  # see _write; tests of the sync thread turn it off
        self._results: dict[int, OSError | None] = {}
        self._abandoned: set[int] = set()  # jobs of failed commits, results ignored

    def new_client(self, conn: Connection, client_id: str) -> ClientConnection:
        return ClientConnection.open(conn, client_id)

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        # A topic deletion a crash interrupted is finished before anything reads the topics.
        for name in self.store.finish_deletions():
            logger.warning("finished deleting topic %s (interrupted before)", name)
        # A retry may go to another partition than its first copy (round-robin), so every
        # partition's producer sequences must be known before the first publish is taken.
        for topic, config in self.store.topics().items():
            for partition in range(config.partitions):
                try:
                    self.store.partition_log(topic, partition).recover()
                except SpoolError as exc:  # damage: appends there fail with it, others go on
                    logger.error("cannot recover %s/%d: %s", topic, partition, exc)
        self._rebuild_ranges()
        # Commits must not checkpoint the WAL on the publish path: a timer does it.
        self.store.state.set_wal_autocheckpoint(0)
        self._sync = SyncThread()

    def _rebuild_ranges(self) -> None:
        """The producers' runs: those saved in state.db, and those of every record stored
        after its partition's mark (a crash between an answer and the save), read back
        from the log. Records carry their producer id and sequence."""
        self.ranges.add_all(self.store.state.load_runs())
        marks = self.store.state.producer_marks()
        for topic, config in self.store.topics().items():
            for partition in range(config.partitions):
                try:
                    self._read_back(topic, partition, marks.get((topic, partition)))
                except SpoolError as exc:
                    logger.error("cannot read back %s/%d: %s", topic, partition, exc)
        self._save_runs(wait=True)

    def _read_back(self, topic: str, partition: int, mark: int | None) -> None:
        partition_log = self.store.partition_log(topic, partition)
        end = partition_log.log_end_offset()
        # At most the last `keep` records (the idempotence window): a partition with no mark
        # (written by the embedded Store before any broker ran, say) would otherwise be read
        # whole at start-up (34 s for 10M records, against a 2 s target for a reopen).
        start = max(mark or 0, partition_log.log_start_offset(), end - self.ranges.keep)
        if start < end:
            found = 0
            with self.store.reader(topic, partition, offset=start) as reader:
                while entries := reader.read_entries(1000):
                    for fields, _ in entries:
                        pid, sequence = fields.get("producer_id"), fields.get("sequence")
                        if pid is None or sequence is None or self.ranges.find(pid, sequence):
                            continue
                        offset, timestamp = fields["offset"], fields["timestamp"]
                        self.ranges.add(
                            RunRow(pid, sequence, 1, topic, partition, offset, timestamp)
                        )
                        found += 1
            if found:
                logger.info(
                    "%s/%d: %d producer sequence(s) read back from offset %d",
                    topic,
                    partition,
                    found,
                    start,
                )
        if end > 0 or mark is not None:
            self._ends[(topic, partition)] = end

    def wait_timeout(self) -> float | None:
        return 1.0 if self._unsaved_since is None else _SAVE_S

    def loop(self, timeout: float | None) -> None:
        ready = self._wait_step(timeout, [self._sync] if self._unsynced else [])
        if self._unsynced:
            self._settle()  # answers for what the disk synced meanwhile go out first
        frames: list[_Read] = []
        for conn in ready:
            client = self.clients.get(conn)
            if client is not None:
                self._read_frames(client, frames)
        if frames:
            self._commit(frames)
        now = time.monotonic()
        if self._cleanup_timer.due(now):
            self._clean_up()
        if self.ranges.unsaved_count() or self._ends != self._saved_marks:
            # Batched: saved once the oldest unsaved run is _SAVE_S old, so a busy broker
            # writes one transaction per _SAVE_S, and never between a sync and its answer.
            if self._unsaved_since is None:
                self._unsaved_since = now
            elif now - self._unsaved_since >= _SAVE_S:
                self._save_runs()
                self._unsaved_since = None
        if self._figures_timer.due(now) and self._figures_due:
            self._record_figures()
        if self._checkpoint_timer.due(now):
            self._in_state_thread(self.store.state.checkpoint_wal, "checkpointing state.db")
        if self._prune_timer.due(now):
            self._in_state_thread(self.store.state.prune_sequences, "pruning old sequences")
        self._report_stats_when_due(now)

    def _clean_up(self) -> None:
        """Delete closed segments past their topic's retention (without this a running
        broker's disk use would only grow), and compact the topics that ask for it."""
        try:
            result = self.store.enforce_retention()
        except (SpoolError, OSError):
            logger.exception("enforcing retention failed; will retry")
        else:
            if result.deleted_segments:
                logger.info(
                    "retention deleted %d segment(s), %d bytes",
                    result.deleted_segments,
                    result.deleted_bytes,
                )
        try:
            topics = self.store.topics()
        except SpoolError:
            logger.exception("reading the topics to compact failed; will retry")
            return
        for topic, config in topics.items():
            if config.cleanup_policy == "compact":
                self._compact(topic, config.partitions)

    def _compact(self, topic: str, partitions: int) -> None:
        """Keep only the newest record per key in the closed segments of ``topic``, when
        :func:`~spoolmq.store.compaction.compaction_due` says it pays."""
        try:
            size = self._topic_bytes(topic, partitions)
            kept, at = self._compacted.get(topic, (None, 0.0))
            if not compaction_due(size, kept, time.monotonic() - at, settle_s=_COMPACT_SETTLE_S):
                return
            result = self.store.compact(topic)
            self._compacted[topic] = (self._topic_bytes(topic, partitions), time.monotonic())
        except (SpoolError, OSError):
            logger.exception("compacting %s failed; will retry", topic)
            return
        if result.rewritten_segments:
            logger.info(
                "compacted %s: %d segment(s) rewritten, %d record(s) removed",
                topic,
                result.rewritten_segments,
                result.removed_records,
            )

    def _topic_bytes(self, topic: str, partitions: int) -> int:
        """The bytes of every segment of ``topic`` (file sizes: no record is read)."""
        total = 0
        for number in range(partitions):
            partition_log = self.store.partition_log(topic, number)
            for base in partition_log.segment_bases():
                with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                    total += partition_log.segment_path(base).stat().st_size
        return total

    def drain(self) -> None:
        """On stop: store and answer every publish already received."""
        frames: list[_Read] = []
        for client in list(self.clients.values()):
            self._read_frames(client, frames, limit=1_000_000)
        if frames:
            self._commit(frames)
        self._settle_all()

    def save(self) -> None:
        self._settle_all()
        if self._sync is not None:
            self._sync.close()
            self._sync = None
        self._save_runs(wait=True)
        self._state_thread.shutdown()
        if self._figures_due:
            self._record_figures()

    def _read_frames(
        self,
        client: ClientConnection,
        frames: list[_Read],
        limit: int = _FRAMES_PER_CONNECTION,
    ) -> None:
        for _ in range(limit):
            try:
                data = client.reader.next_frame()
            except (EOFError, OSError) as exc:
                self._drop(client, f"connection closed ({type(exc).__name__}: {exc})")
                return
            if data is None:
                return
            frame: dict[str, Any] = {}
            try:
                if client.trusted and is_checked_frame(data):
                    # The Kafka child's records, in the store's form already.
                    frame, checked = decode_checked_frame(data)
                    frames.append((client, frame, checked))
                    continue
                frame = protocol.decode(data)
                op = protocol.check_client_frame(frame)
                if op == "bye":
                    self._drop(client, "said bye")
                    return
                if op != "publish":
                    raise ProtocolError(f"a publisher connection cannot send {op!r}")
                frames.append((client, frame, None))
            except SpoolError as exc:
                logger.warning("closing publisher %s: bad frame: %s", client.client_id, exc)
                # With the frame's id where it had one: the error answers it.
                self._send(client, protocol.error_frame(exc, id=frame.get("id")))
                self._drop(client, f"bad frame: {exc}")
                return

    def _commit(self, frames: list[_Read]) -> None:
        """Check every frame and write each partition's batch (one write); the sync thread
        syncs them while the loop goes on, and :meth:`_settle` answers once it has."""
        now = self.clock.now_ms()
        commit = _Commit()
        for client, raw, prechecked in frames:
            frame = self._plan(client, raw, prechecked, now, commit)
            if frame is not None:
                commit.frames.append(frame)
        self._unsynced.append(commit)
        self._write(commit)
        self._settle()

    def _write(self, commit: _Commit) -> None:
        """Write each batch of ``commit`` and hand the sync thread the files to sync."""
        files: dict[SyncKey, int] = {}
        for (topic, partition), batch in commit.batches.items():
            if commit.error is not None:
                break  # a write failed in a way that fails this whole commit
            sync_later = batch.acks == "all" and self._sync is not None
            try:
                written = self.store.partition_log(topic, partition).append_bodies(
                    batch.bodies, "all" if batch.acks == "all" else "1", sync_later=sync_later
                )
            except SpoolError as exc:
                if not isinstance(exc, StorageError):
                    logger.exception("append to %s/%d failed", topic, partition)
                else:
                    logger.error("append to %s/%d failed: %s", topic, partition, exc)
                batch.error = exc
                # A failed roll fsynced (and failed) the segment older batches still wait
                # to sync, and an fsync error is reported once: they cannot be trusted.
                older = next(
                    (
                        i
                        for i, c in enumerate(self._unsynced)
                        if c.job and (topic, partition) in c.batches and c is not commit
                    ),
                    None,
                )
                if older is not None and isinstance(exc, StorageError):
                    self._fail_from(older, exc)
                continue
            batch.written = written
            if written.sync_fd >= 0:
                files[(topic, partition, written.segment_base)] = written.sync_fd
        if commit.error is not None or not files:
            for fd in files.values():
                os.close(fd)
            return
        commit.job = next(self._jobs)
        assert self._sync is not None
        if (
            self.sync_inline
            and len(files) == 1
            and len(self._unsynced) == 1
            and not self._waiter.readable_now()
        ):
            # Nothing else syncing and nothing to read meanwhile (a low or bursty rate):
            # sync here. Handing the thread the job would only add a thread switch, its
            # wait for the GIL and a pipe round trip to the answer (2,000 msg/s: p99
            # 7.3-11.6 -> 5.6-7.3 ms). The result goes the same way as the thread's.
            [fd] = files.values()
            self._results[commit.job] = self._sync.sync_here(fd)
            return
        self._sync.submit(commit.job, files)

    def _settle(self) -> None:
        """Finish, in order, the commits whose syncs are done (or need none)."""
        if self._sync is not None:
            for job, error in self._sync.results():
                if job in self._abandoned:
                    self._abandoned.discard(job)
                else:
                    self._results[job] = error
        while self._unsynced:
            commit = self._unsynced[0]
            if commit.error is None and commit.job:
                if commit.job not in self._results:
                    return
                error = self._results.pop(commit.job)
                if error is not None:
                    logger.error("fdatasync failed: %s", describe(error))
                    self._fail_from(
                        0,
                        StorageError(
                            f"syncing the log to disk failed ({describe(error)}); nothing "
                            "from this batch was stored"
                        ),
                    )
            self._unsynced.popleft()
            if commit.error is not None and commit.job and commit.job not in self._results:
                self._abandoned.add(commit.job)
            self._results.pop(commit.job, None)
            self._finish(commit)

    def _settle_all(self) -> None:
        """Wait until every written commit is synced and answered (on stop)."""
        while self._unsynced:
            if self._sync is not None:
                self._sync.wait(1.0)
            self._settle()

    def _fail_from(self, first: int, error: SpoolError) -> None:
        """An fsync failed: the commit ``first`` in line and every later one fail (their
        data may not be on disk, and may come after data that is not), and each partition
        they wrote to is cut back to where the earliest of them began writing."""
        earliest: dict[tuple[str, int], tuple[int, int]] = {}
        for commit in list(self._unsynced)[first:]:
            if commit.error is None:
                commit.error = error
            for key, batch in commit.batches.items():
                written = batch.written
                if written is None:
                    continue
                at = (written.segment_base, written.position)
                if key not in earliest or at < earliest[key]:
                    earliest[key] = at
        for (topic, partition), (segment_base, position) in earliest.items():
            try:
                self.store.partition_log(topic, partition).cut_back(segment_base, position)
            except (OSError, SpoolError):
                logger.exception("could not cut back %s/%d after a failed sync", topic, partition)

    def _finish(self, commit: _Commit) -> None:
        """Answer a commit's frames, remember its runs and tell the ConsumerBroker."""
        error = commit.error
        written_batches = []
        stored = 0
        for (topic, partition), batch in commit.batches.items():
            count = len(batch.bodies)
            if error is not None and batch.error is None:
                batch.written, batch.error = None, error
            written = batch.written
            if written is None:
                self.stats.errors += count
                continue
            written_batches.append(batch)
            self.stats.batches += 1
            self.stats.messages += count
            self.stats.by_topic[topic] = self.stats.by_topic.get(topic, 0) + count
            stored_bytes = written.length  # the lines as stored: offsets, CRCs and all
            self.stats.bytes_by_topic[topic] = (
                self.stats.bytes_by_topic.get(topic, 0) + stored_bytes
            )
            stored += count
            self._ends[(topic, partition)] = written.base_offset + written.records
            self._figures_due.add((topic, partition))
        self._remember(commit.frames)
        self._notify(written_batches)
        if stored:
            self.stats.commit_size.observe(stored)
        if commit.frames:
            self.stats.ack_seconds.observe(time.monotonic() - commit.started, len(commit.frames))
        for frame in commit.frames:
            if frame.acks != "0":
                self._send(frame.client, self._answer(frame))

    def _plan(
        self,
        client: ClientConnection,
        raw: dict[str, Any],
        prechecked: CheckedRecords | None,
        now: int,
        commit: _Commit,
    ) -> _Frame | None:
        """Check one frame's records (unless ``prechecked``: the Kafka child's, in the
        store's form already) and put them in their partitions' batches."""
        max_bytes = self.store.config.max_message_bytes
        try:
            if prechecked is None:
                acks, producer_id, topic, asked, records = check_publish_frame(raw)
            else:
                acks, producer_id, topic, asked = check_publish_head(raw)
                # Checked by the child against the same limit, unless it changed since.
                if max(map(len, prechecked.bodies)) + 2 > max_bytes - RECORD_OVERHEAD:  # type: ignore[arg-type]
                    raise MessageTooLargeError(
                        f"a record is over the limit of {max_bytes} bytes (max_message_bytes)"
                    )
            config = self.store.topic_config(topic, create=True)
            if asked is not None and asked >= config.partitions:
                raise UnknownPartitionError(
                    f"topic {topic!r} has partitions 0 to {config.partitions - 1}; "
                    f"there is no partition {asked}"
                )
        except SpoolError as exc:
            self._send(client, protocol.error_frame(exc, id=raw.get("id")))
            return None
        frame = _Frame(client, raw.get("id"), acks, producer_id)
        frame.partitions = partitions = config.partitions
        self.stats.frames += 1
        if prechecked is not None:
            self.stats.frames_prechecked += 1
        try:
            checked = prechecked or check_records(records, producer_id, now, max_bytes)
        except Exception as exc:  # a bug must cost one frame, not every publisher
            logger.exception("checking a publish frame failed")
            self._send(
                client,
                protocol.error_frame(
                    SpoolError(f"internal error: {exc!r}"[:300]), id=frame.frame_id
                ),
            )
            return None
        bodies, keys, sequences = checked.bodies, checked.keys, checked.sequences
        if checked.errors is not None:
            for index, refused in checked.errors.items():
                frame.fail(index, refused)
            self.stats.errors += len(checked.errors)
        count = len(bodies)
        keyless = asked
        if checked.errors is None and checked.extras is None:
            # The common frame: every record good, one partition, sequences consecutive
            # and above any this producer stored: one piece, no lookup.
            target = asked
            if target is None:
                if partitions == 1:
                    target = 0
                elif keys.count(None) == count:
                    target = keyless = self.store.choose_partition(topic, config, None, None)
            first = sequences[0]
            if target is not None and (
                (first is None and sequences.count(None) == count)
                or (
                    first is not None
                    and producer_id is not None
                    and first > self._last_sequence(producer_id, commit)
                    and sequences == list(range(first, first + count))
                )
            ):
                batch = self._batch(commit.batches, topic, target, acks)
                start = len(batch.bodies)
                frame.pieces.append([_WRITTEN, 0, count, batch, start, first])
                batch.bodies += bodies  # type: ignore[arg-type]
                batch.keys += checked.identities
                if not batch.keyed and keys.count(None) != count:
                    batch.keyed = True
                if first is not None:
                    assert producer_id is not None
                    commit.fresh.setdefault(producer_id, []).append((first, count, batch, start))
                return frame
        # Any other frame: record by record.
        piece: list[Any] | None = None
        extras = checked.extras or {}
        for index in range(count):
            body = bodies[index]
            if body is None:
                piece = None
                continue
            sequence = sequences[index]
            if sequence is not None and producer_id is not None:
                copy = self._find(producer_id, sequence, commit)
                if copy is not None:
                    frame.pieces.append([*copy[:1], index, 1, *copy[1:]])
                    piece = None
                    continue
            key = keys[index]
            if asked is not None:
                partition = asked
            elif key is not None:
                partition = partition_for_key(key, partitions)
            else:
                if keyless is None:
                    keyless = self.store.choose_partition(topic, config, None, None)
                partition = keyless
            batch = self._batch(commit.batches, topic, partition, acks)
            at = len(batch.bodies)
            if (
                piece is not None
                and piece[3] is batch
                and piece[1] + piece[2] == index
                and piece[4] + piece[2] == at
                and (
                    (sequence is None and piece[5] is None)
                    or (piece[5] is not None and sequence == piece[5] + piece[2])
                )
            ):
                piece[2] += 1
            else:
                piece = [_WRITTEN, index, 1, batch, at, sequence]
                frame.pieces.append(piece)
            batch.bodies.append(body)
            identity = checked.identities[index]
            batch.keys.append(identity)
            if identity is not None:
                batch.keyed = True
            extra = extras.get(index)
            if extra is not None:
                if batch.extra is None:
                    batch.extra = {}
                batch.extra[str(at)] = extra
            if sequence is not None and producer_id is not None:
                commit.fresh.setdefault(producer_id, []).append((sequence, 1, batch, at))
        return frame

    def _pending(self, commit: _Commit) -> list[_Commit]:
        """Commits not finished: their runs are not in ``ranges`` yet."""
        return [*self._unsynced, commit] if self._unsynced else [commit]

    def _last_sequence(self, producer_id: str, commit: _Commit) -> int:
        """The highest sequence of ``producer_id`` stored or on its way."""
        last = self.ranges.last(producer_id)
        for pending in self._pending(commit):
            for first, count, _, _ in pending.fresh.get(producer_id, ()):
                last = max(last, first + count - 1)
        return last

    def _find(self, producer_id: str, sequence: int, commit: _Commit) -> list[Any] | None:
        """A duplicate piece's kind and target if ``sequence`` is stored or on its way."""
        for pending in self._pending(commit):
            for first, count, batch, at in pending.fresh.get(producer_id, ()):
                if first <= sequence < first + count:
                    return [_DUPLICATE_HERE, batch, at + sequence - first]
        stored = self.ranges.find(producer_id, sequence)
        return None if stored is None else [_DUPLICATE, stored]

    @staticmethod
    def _batch(
        batches: dict[tuple[str, int], _Batch], topic: str, partition: int, acks: str
    ) -> _Batch:
        batch = batches.get((topic, partition))
        if batch is None:
            batch = batches[(topic, partition)] = _Batch(topic, partition)
        if acks == "all" or (acks == "1" and batch.acks == "0"):
            batch.acks = acks
        return batch

    def _remember(self, frames: list[_Frame]) -> None:
        """Add the runs of every stored piece to the producers' ranges."""
        ranges = self.ranges
        for frame in frames:
            producer_id = frame.producer_id
            if producer_id is None:
                continue
            for piece in frame.pieces:
                if piece[0] != _WRITTEN or piece[5] is None:
                    continue
                batch: _Batch = piece[3]
                written = batch.written
                if written is None:
                    continue
                ranges.add(
                    RunRow(
                        producer_id,
                        piece[5],
                        piece[2],
                        batch.topic,
                        batch.partition,
                        written.base_offset + piece[4],
                        written.timestamp,
                    ),
                )

    @staticmethod
    def _answer(frame: _Frame) -> dict[str, Any]:
        """The ``published`` answer: ranges in record order, errors by index."""
        ranges: list[list[int]] = []
        errors = frame.errors
        for piece in frame.pieces:
            kind = piece[0]
            if kind == _DUPLICATE:
                stored: StoredAt = piece[3]
                entry = [stored.partition, stored.offset, stored.timestamp, 1, 1]
            else:
                batch: _Batch = piece[3]
                if batch.error is not None:
                    if errors is None:
                        errors = frame.errors = {}
                    for index in range(piece[1], piece[1] + piece[2]):
                        errors[str(index)] = {
                            "code": batch.error.code,
                            "message": str(batch.error),
                        }
                    continue
                written = batch.written
                assert written is not None
                entry = [batch.partition, written.base_offset + piece[4], written.timestamp]
                entry += [piece[2], 1] if kind == _DUPLICATE_HERE else [piece[2]]
            if ranges:
                last = ranges[-1]
                if (
                    len(last) == len(entry)
                    and last[0] == entry[0]
                    and last[1] + last[3] == entry[1]
                    and last[2] == entry[2]
                ):
                    last[3] += entry[3]
                    continue
            ranges.append(entry)
        answer: dict[str, Any] = {
            "op": "published",
            "id": frame.frame_id,
            "r": ranges,
            "n": frame.partitions,
        }
        if errors:
            answer["errors"] = errors
        return answer

    def _notify(self, batches: list[_Batch]) -> None:
        """Tell the ConsumerBroker what was appended (interfaces.md §1): small notices,
        each one atomic pipe write, never one batch split over two."""
        if self.notices is None or not batches:
            return
        b: list[list[Any]] = []
        size = 0
        for batch in batches:
            written = batch.written
            assert written is not None
            entry = [
                batch.topic,
                batch.partition,
                written.segment_base,
                written.position,
                written.length,
                written.base_offset,
                written.records,
                written.timestamp,
                batch.keys if batch.keyed else None,
                batch.extra,
            ]
            cost = 120 + (sum(len(k) + 3 for k in batch.keys if k) if batch.keyed else 0)
            if batch.extra is not None:
                cost += 4096  # rare: a notice of its own
            if b and size + cost > 3500:
                if not self._send_notice(b):
                    return
                b, size = [], 0
            b.append(entry)
            size += cost
        if b:
            self._send_notice(b)

    def _send_notice(self, b: list[list[Any]]) -> bool:
        assert self.notices is not None
        try:
            self.notices.send_bytes(protocol.encode({"op": "appended", "b": b}))
        except OSError:
            self.notices = None  # the ConsumerBroker is restarting; it rescans on start
            return False
        return True

    # -- off the path: producer runs, partition figures, the WAL ----------------------

    def _save_runs(self, *, wait: bool = False) -> None:
        """Write the runs added since the last save, and each partition's mark (every
        record below it has its run saved), in one transaction, after the answers, by the
        state thread: the loop never waits on state.db's lock (the ConsumerBroker's
        checkpoints take it too), one save at a time. ``wait``: return once it is saved
        (start-up and stop)."""
        if self._saving_runs is not None:
            if not wait and not self._saving_runs[2].done():
                return  # the last save is still being written; this one waits its turn
            self._runs_saved()
        unsaved = self.ranges.unsaved()
        marks = dict(self._ends)
        if not unsaved and marks == self._saved_marks:
            return
        writing = self._state_thread.submit(self.store.state.save_runs, unsaved, marks)
        self._saving_runs = (unsaved, marks, writing)
        if wait:
            self._runs_saved()

    def _runs_saved(self) -> None:
        """Once the state thread has written a save: remember what state.db now has, or
        put the runs back first in line for the next save."""
        assert self._saving_runs is not None
        unsaved, marks, writing = self._saving_runs
        self._saving_runs = None
        try:
            writing.result()
        except Exception:
            logger.exception("saving producer runs failed; will retry")
            self.ranges.requeue(unsaved)
            return
        self._saved_marks = marks

    def _in_state_thread(self, work: Callable[[], object], what: str) -> None:
        """Housekeeping of state.db (WAL checkpoints, pruning) beside the loop."""

        def run() -> None:
            try:
                work()
            except Exception:
                logger.exception("%s failed; will retry", what)

        self._state_thread.submit(run)

    def _record_figures(self) -> None:
        for topic, partition in list(self._figures_due):
            try:
                self.store.partition_log(topic, partition).record_figures()
            except SpoolError:
                logger.exception("recording the figures of %s/%d failed", topic, partition)
        self._figures_due.clear()

    # -- the manager ---------------------------------------------------------------------

    def admin(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("action") == "delete_topic":
            return {"op": "ok", **self.delete_topic(check_topic(request.get("topic")))}
        return super().admin(request)

    def delete_topic(self, topic: str) -> dict[str, Any]:
        """Delete ``topic`` (the manager asks once the ConsumerBroker stopped serving it).
        Runs in the loop, between frames: every publish to it already received is written,
        synced and answered first; then the producer runs stored in it are forgotten, here
        and in state.db, so that a retry after the topic is created again is never answered
        with an offset of the deleted log; then the files go (:meth:`Store.delete_topic`).
        A publish to it after this creates it anew (with auto-creation on)."""
        partitions = self.store.topic_config(topic).partitions
        self._settle_all()
        self._save_runs(wait=True)  # no save of its runs still on its way to state.db
        self.ranges.drop_topic(topic)
        for table in (self._ends, self._saved_marks):
            for key in [k for k in table if k[0] == topic]:
                del table[key]
        self._figures_due = {key for key in self._figures_due if key[0] != topic}
        self.store.delete_topic(topic)
        logger.info("deleted topic %s (%d partition(s))", topic, partitions)
        return {"deleted": topic, "partitions": partitions}

    def on_control(self, op: str, frame: dict[str, Any]) -> None:
        if op == "notices":
            try:
                fd = receive_fd(self.control)
            except (OSError, RuntimeError) as exc:  # the descriptor did not come with it
                logger.error(
                    "the ConsumerBroker's notice pipe did not arrive (%s): it learns of new "
                    "messages from its rescan (within a second) until the next restart",
                    exc,
                )
                return
            if self.notices is not None:
                self.notices.close()
            self.notices = Connection(fd, readable=False)

    def figures(self) -> dict[str, Any]:
        return {
            "frames": self.stats.frames,
            "frames_prechecked": self.stats.frames_prechecked,
            "messages": self.stats.messages,
            "batches": self.stats.batches,
            "errors": self.stats.errors,
            "by_topic": dict(self.stats.by_topic),
            "bytes_by_topic": dict(self.stats.bytes_by_topic),
            "publishers": len(self.clients),
            "commit_size": self.stats.commit_size.figures(),
            "ack_seconds": self.stats.ack_seconds.figures(),
            "fsync_seconds": None if self._sync is None else self._sync.fsync_seconds.figures(),
        }
