"""The embedded API over a data directory: topics, appends, readers, retention, compaction.

Works with no broker running and from several processes at once: appends to a partition
are serialised by the partition's file lock, topic settings live in ``state.db``.

    >>> store = Store(tmp)                                     # doctest: +SKIP
    >>> store.create_topic("orders", partitions=2)             # doctest: +SKIP
    >>> store.append("orders", {"order_id": 1})                # doctest: +SKIP
    Position(topic='orders', partition=0, offset=0, ...)
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Unpack

from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.config import StoreConfig, TopicConfig, resolve_data_dir
from spoolmq.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    SpoolError,
    StorageError,
    UnknownPartitionError,
    UnknownTopicError,
)
from spoolmq.files import check_data_dir, make_private_dirs
from spoolmq.store.cleanup import keyed_entries
from spoolmq.store.compaction import keep_record, latest_offsets
from spoolmq.store.message import (
    Acks,
    Message,
    Position,
    PublishOptions,
    message_from_options,
    normalize_acks,
)
from spoolmq.store.names import TRASH_DIR, check_topic, logs_dir, topic_dir
from spoolmq.store.partition import PartitionLog
from spoolmq.store.partitioner import RoundRobin, partition_for_key
from spoolmq.store.reader import Reader, offset_for_timestamp
from spoolmq.store.record import EncodedMessage, encode_message
from spoolmq.store.recovery import RecoveryReport
from spoolmq.store.retention import segments_to_delete
from spoolmq.store.segment import scan_batches
from spoolmq.store.state import StateDB
from spoolmq.types import TopicPartition


@dataclass(slots=True)
class RetentionResult:
    deleted_segments: int = 0
    deleted_bytes: int = 0
    log_start_offsets: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass(slots=True)
class CompactionResult:
    rewritten_segments: int = 0
    removed_records: int = 0
    kept_records: int = 0


@dataclass(frozen=True, slots=True)
class CheckProblem:
    topic: str
    partition: int
    segment: str
    position: int
    problem: str
    offset: int = -1  # the damaged record's offset (its place in its batch)
    #: The damaged record's batch: its first offset, where readers stop (a batch is read
    #: whole or not at all), and the byte it starts at.
    batch_offset: int = -1
    batch_position: int = -1


def _missing(name: str, would_create: bool, data_dir: Path) -> str:
    """Why topic ``name`` is refused: it does not exist, and (where using it would have
    created it) topics are not created on first use here: the command that creates it,
    with this store's directory (the user's shell may not be where the broker runs)."""
    if not would_create:
        return f"topic {name!r} does not exist"
    return (
        f"topic {name!r} does not exist, and topics are not created on first use here "
        f"(auto_create_topics is off): create it with "
        f"`spoolmq topics create {name} --data {data_dir}`"
    )


class Store:
    """A data directory's message store. ``clock`` tells the time for record timestamps,
    delays, segment age, retention and compaction (tests pass a ``ManualClock``)."""

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        config: StoreConfig | Mapping[str, Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.path = resolve_data_dir(path)
        if config is None:
            config = StoreConfig()
        elif isinstance(config, Mapping):
            config = StoreConfig.from_mapping(config)
        self.config = config
        self._clock = clock
        check_data_dir(self.path)  # as the broker: 0700, or refused if others can write it
        make_private_dirs(logs_dir(self.path))
        self.state = StateDB(
            self.path / "state.db", busy_timeout_ms=config.busy_timeout_ms, clock=clock
        )
        # Open (and migrate, or refuse a newer schema) now rather than at first use.
        self.state.connect()
        self.recovery_reports: list[RecoveryReport] = []
        self._partitions: dict[TopicPartition, PartitionLog] = {}
        self._topics: dict[str, TopicConfig] = {}
        self._round_robin = RoundRobin()
        self._lock = threading.Lock()
        # Whether opening a partition records the producer sequences of its last batches
        # in state.db (a crashed writer's): off in the PublisherBroker, which reads them
        # back from the log itself (``spoolmq.broker.producer_ranges``). Set before use.
        self.restore_sequences = True
        self._closed = False

    def _check_open(self) -> None:
        if self._closed:
            raise SpoolError("this Store is closed (close() was called)")

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the partitions' files and state.db; using the store afterwards is a
        SpoolError (it reopened them, quietly, one by one)."""
        self._closed = True
        with self._lock:
            for partition in self._partitions.values():
                partition.close()
            self._partitions.clear()
        self.state.close()

    # -- topics -----------------------------------------------------------------------

    def create_topic(
        self, name: str, *, partitions: int = 1, exist_ok: bool = True, **settings: Any
    ) -> TopicConfig:
        """Create a topic (or return the existing one's settings when ``exist_ok``).

        ``settings`` are TopicConfig fields: ``retention_ms``, ``retention_bytes``,
        ``cleanup_policy``, ``segment_bytes``, ``segment_ms``, ``tombstone_retention_ms``.
        """
        self._check_open()
        check_topic(name)
        config = TopicConfig.from_mapping({"partitions": partitions, **settings})
        created = self.state.create_topic(name, config, exist_ok=exist_ok)
        self._topics[name] = created
        return created

    def topic_config(self, name: str, *, create: bool = False) -> TopicConfig:
        self._check_open()
        return self._topic(name, create=create, allowed=self.config.auto_create_topics)

    def _topic(self, name: str, *, create: bool, allowed: bool) -> TopicConfig:
        """A topic's settings, cached; a missing topic is created with the default
        settings when ``create`` asks and creating is ``allowed``."""
        check_topic(name)
        config = self._topics.get(name)
        if config is not None:
            return config
        config = self.state.topic(name)
        if config is None:
            if not (create and allowed):
                raise UnknownTopicError(_missing(name, create, self.path))
            config = self.state.create_topic(name, self.config.default_topic, exist_ok=True)
        self._topics[name] = config
        return config

    def current_topic_config(self, name: str) -> TopicConfig:
        """:meth:`topic_config` as ``state.db`` has it now: another process (``spoolmq
        topics alter``) may have changed what this one read before."""
        self._check_open()
        check_topic(name)
        config = self.state.topic(name)
        if config is None:
            self._topics.pop(name, None)  # deleted by another process
            raise UnknownTopicError(_missing(name, False, self.path))
        self._take_config(name, config)
        return config

    def own_topic(self, name: str) -> TopicConfig:
        """A topic the broker writes on its own (``<topic>.dlq``): created with the
        default settings when missing, whatever ``auto_create_topics`` says. That setting
        guards against clients' typos; a dead letter that found its DLQ refused would
        hold its partition's committed offset for ever."""
        return self._topic(name, create=True, allowed=True)

    def alter_topic(self, name: str, **settings: Any) -> TopicConfig:
        """Change retention, compaction or segment settings (not the partition count)."""
        self._check_open()
        check_topic(name)
        if "partitions" in settings:
            raise InvalidArgumentError("the partition count of a topic cannot be changed")

        def update(current: TopicConfig) -> TopicConfig:
            return TopicConfig.from_mapping({**current.as_dict(), **settings})

        config = self.state.alter_topic(name, update)
        self._take_config(name, config)
        return config

    def _take_config(self, name: str, config: TopicConfig) -> None:
        """Use ``config`` for topic ``name`` from now on, in its open partitions too."""
        if self._topics.get(name) == config:
            return
        self._topics[name] = config
        with self._lock:
            for tp, partition in self._partitions.items():
                if tp.topic == name:
                    partition.topic_config = config

    def topics(self) -> dict[str, TopicConfig]:
        self._check_open()
        return self.state.topics()

    def delete_topic(self, name: str) -> None:
        """Delete a topic's settings, state rows and files (the broker's PublisherBroker
        does it for a running broker, after the ConsumerBroker stopped serving it).

        Crash-safe in three steps: the topic's directory is renamed into ``trash/`` (the
        point of no return: its files are gone from ``logs/``), then its rows go from
        ``state.db`` in one transaction (settings, committed offsets, deliveries, producer
        sequences), then the directory is removed. A crash after the rename leaves an entry
        in ``trash/`` that :meth:`finish_deletions` completes at the broker's next start;
        one before it leaves the topic whole."""
        self._check_open()
        self.topic_config(name)
        self.forget_topic(name)
        directory = topic_dir(self.path, name)
        trash = self.path / TRASH_DIR
        make_private_dirs(trash)
        doomed = trash / f"{name}.{time.time_ns()}"
        with contextlib.suppress(FileNotFoundError):  # never written to: no directory
            os.replace(directory, doomed)
        self.state.delete_topic(name)
        self.forget_topic(name)
        shutil.rmtree(doomed, ignore_errors=True)

    def finish_deletions(self) -> list[str]:
        """Complete topic deletions a crash interrupted (entries left in ``trash/``); the
        names of the topics finished. Called where no other writer can create a topic of
        the same name meanwhile: the PublisherBroker's start, an offline ``topics delete``."""
        trash = self.path / TRASH_DIR
        finished = []
        for doomed in sorted(trash.iterdir()) if trash.is_dir() else ():
            name = doomed.name.rpartition(".")[0]
            # A topic of that name created again since (its directory is back) keeps its
            # rows; otherwise the rows of the deleted one go now.
            if name and not topic_dir(self.path, name).exists():
                self.state.delete_topic(name)
                self.forget_topic(name)
            shutil.rmtree(doomed, ignore_errors=True)
            finished.append(name)
        return finished

    def forget_topic(self, name: str) -> None:
        """Drop what this Store object keeps of a topic (its open partition logs and cached
        settings), so that a topic deleted by another process, or created again, is read
        afresh from ``state.db`` and ``logs/``."""
        with self._lock:
            for tp in [tp for tp in self._partitions if tp.topic == name]:
                self._partitions.pop(tp).close()
        self._topics.pop(name, None)

    def cancel_message(
        self, topic: str, partition: int, offset: int, reason: str | None = None
    ) -> None:
        """Record in ``state.db`` that the stored message at ``topic``/``partition``@``offset``
        is cancelled (a starting ConsumerBroker reads the table; a running one is asked
        through ``Admin.cancel_message``, which calls this). InvalidArgumentError for an
        offset with no message yet, UnknownTopicError/UnknownPartitionError as usual."""
        self._check_open()
        if type(partition) is not int or type(offset) is not int or partition < 0 or offset < 0:
            raise InvalidArgumentError("a cancel needs a whole partition and offset")
        if reason is not None and (not isinstance(reason, str) or len(reason) > 500):
            raise InvalidArgumentError("a cancel's reason is text of at most 500 characters")
        partitions = self.topic_config(topic).partitions
        if partition >= partitions:
            raise UnknownPartitionError(f"topic {topic!r} has {partitions} partition(s)")
        end = self.log_end_offset(topic, partition)
        if offset >= end:
            raise InvalidArgumentError(
                f"{topic}/{partition} has no message at offset {offset} (its log ends at {end})"
            )
        self.state.add_cancel(topic, partition, offset, reason)

    def partition_log(self, topic: str, partition: int, *, create: bool = False) -> PartitionLog:
        config = self.topic_config(topic, create=create)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise UnknownPartitionError(f"partition must be a whole number, not {partition!r}")
        if not 0 <= partition < config.partitions:
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0 to {config.partitions - 1}; "
                f"there is no partition {partition}"
            )
        tp = TopicPartition(topic, partition)
        with self._lock:
            existing = self._partitions.get(tp)
            if existing is None:
                existing = self._partitions[tp] = PartitionLog(
                    self.path,
                    tp,
                    config,
                    self.config,
                    self.state,
                    self.recovery_reports,
                    clock=self._clock,
                    restore_sequences=self.restore_sequences,
                )
            return existing

    # -- appending -----------------------------------------------------------------------

    def append(
        self,
        topic: str,
        value: Any,
        *,
        producer_id: str | None = None,
        sequence: int | None = None,
        acks: str | int = "all",
        **options: Unpack[PublishOptions],
    ) -> Position:
        """Append one message; ``options`` are the PublishOptions (``key``, ``headers``,
        ``tags``, ``partition``, ``delay``/``ttl`` in seconds, ``deliver_at`` in epoch ms,
        ``priority`` 0-9)."""
        message = message_from_options(
            value, options, now=self._clock.now_ms(), producer_id=producer_id, sequence=sequence
        )
        return self.append_batch(topic, [message], acks=acks)[0]

    def append_batch(
        self, topic: str, messages: Iterable[Message], *, acks: str | int = "all"
    ) -> list[Position]:
        """Append messages to a topic: one write (and one fsync) per partition touched.

        Every message is validated before anything is written, so bad input writes nothing.
        """
        self._check_open()
        level = normalize_acks(acks)
        check_topic(topic)
        batch = list(messages)
        # Validate everything before anything changes: no topic created, no round-robin
        # turn taken, no byte written for a batch with one bad message.
        encoded_batch = [
            encode_message(message, max_bytes=self.config.max_message_bytes) for message in batch
        ]
        config = self._existing_topic(topic)
        if config is None:
            if not self.config.auto_create_topics:
                raise UnknownTopicError(_missing(topic, True, self.path))
            for message in batch:
                self._check_partition(topic, self.config.default_topic, message.partition)
            config = self.topic_config(topic, create=True)
        for message in batch:
            self._check_partition(topic, config, message.partition)
        by_partition: dict[int, list[tuple[int, EncodedMessage]]] = defaultdict(list)
        for index, (message, encoded) in enumerate(zip(batch, encoded_batch, strict=True)):
            number = self.choose_partition(topic, config, message.key, message.partition)
            by_partition[number].append((index, encoded))
        positions: list[Position | None] = [None] * len(batch)
        for number, items in by_partition.items():
            partition_log = self.partition_log(topic, number)
            appended = partition_log.append([encoded for _, encoded in items], level)
            for (index, _), result in zip(items, appended, strict=True):
                positions[index] = Position(
                    topic,
                    number if result.partition is None else result.partition,
                    result.offset,
                    result.timestamp,
                    result.duplicate,
                )
        return [p for p in positions if p is not None]

    def append_encoded(
        self, topic: str, partition: int, messages: Sequence[EncodedMessage], acks: Acks
    ) -> list[Position]:
        """Append already validated messages to one partition (the broker's path)."""
        self._check_open()
        partition_log = self.partition_log(topic, partition)
        return [
            Position(
                topic,
                partition if r.partition is None else r.partition,
                r.offset,
                r.timestamp,
                r.duplicate,
            )
            for r in partition_log.append(messages, acks)
        ]

    def _existing_topic(self, name: str) -> TopicConfig | None:
        config = self._topics.get(name)
        if config is None:
            config = self.state.topic(name)
            if config is not None:
                self._topics[name] = config
        return config

    @staticmethod
    def _check_partition(topic: str, config: TopicConfig, partition: int | None) -> None:
        if partition is not None and (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not (0 <= partition < config.partitions)
        ):
            raise UnknownPartitionError(
                f"topic {topic!r} has partitions 0 to {config.partitions - 1}; "
                f"there is no partition {partition!r}"
            )

    def choose_partition(
        self, topic: str, config: TopicConfig, key: str | bytes | None, partition: int | None
    ) -> int:
        """An explicit partition, else the key's stable hash, else round-robin."""
        if partition is not None:
            self._check_partition(topic, config, partition)
            return partition
        if key is not None and isinstance(key, str | bytes):
            return partition_for_key(key, config.partitions)
        return self._round_robin.next(topic, config.partitions)

    def flush(self) -> None:
        """fsync every partition this process appended to with acks 0 or 1."""
        self._check_open()
        with self._lock:
            partitions = list(self._partitions.values())
        for partition in partitions:
            partition.flush()

    # -- reading -------------------------------------------------------------------------

    def reader(
        self,
        topic: str,
        partition: int = 0,
        *,
        offset: int | str | None = None,
        timestamp: int | None = None,
    ) -> Reader:
        """A reader with its own position: ``offset`` is a number, ``"earliest"`` (the
        default) or ``"latest"``; or ``timestamp`` (ms) for the first record at or after it."""
        self._check_open()
        partition_log = self.partition_log(topic, partition)
        if timestamp is not None:
            if offset is not None:
                raise InvalidArgumentError("give either offset or timestamp, not both")
            return Reader(partition_log, offset_for_timestamp(partition_log, timestamp))
        if offset is None or offset == "earliest":
            return Reader(partition_log, partition_log.log_start_offset())
        if offset == "latest":
            return Reader(partition_log, partition_log.log_end_offset())
        if isinstance(offset, bool) or not isinstance(offset, int):
            raise InvalidArgumentError(
                f"offset must be a whole number, 'earliest' or 'latest', not {offset!r}"
            )
        return Reader(partition_log, offset)

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self.partition_log(topic, partition).log_start_offset()

    def log_end_offset(self, topic: str, partition: int) -> int:
        return self.partition_log(topic, partition).log_end_offset()

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> int:
        return offset_for_timestamp(self.partition_log(topic, partition), timestamp)

    # -- retention and compaction ----------------------------------------------------------

    def enforce_retention(self, topic: str | None = None) -> RetentionResult:
        """Delete closed segments past their topic's time or size retention."""
        self._check_open()
        result = RetentionResult()
        moment = self._clock.now_ms()
        if topic is None:
            # Every topic's settings as state.db has them now: `spoolmq topics alter` in
            # another process (a running broker's store caches them) takes effect here.
            configs = self.topics()
            for name, config in configs.items():
                self._take_config(name, config)
        else:
            configs = {topic: self.topic_config(topic)}
        for name, config in configs.items():
            for number in range(config.partitions):
                partition_log = self.partition_log(name, number)
                infos = partition_log.segment_infos()
                doomed = segments_to_delete(
                    infos,
                    now_ms=moment,
                    retention_ms=config.retention_ms,
                    retention_bytes=config.retention_bytes,
                )
                if doomed:
                    sizes = {info.base: info.size for info in infos}
                    partition_log.delete_segments(doomed)
                    result.deleted_segments += len(doomed)
                    result.deleted_bytes += sum(sizes[base] for base in doomed)
                result.log_start_offsets[TopicPartition(name, number)] = (
                    partition_log.log_start_offset()
                )
        return result

    def compact(self, topic: str) -> CompactionResult:
        """Keep the newest record per key in every closed segment of a compacted topic."""
        self._check_open()
        config = self.topic_config(topic)
        if config.cleanup_policy != "compact":
            raise InvalidArgumentError(
                f"topic {topic!r} has cleanup_policy {config.cleanup_policy!r}; "
                "only 'compact' topics are compacted"
            )
        moment = self._clock.now_ms()
        result = CompactionResult()
        for number in range(config.partitions):
            partition_log = self.partition_log(topic, number)
            bases = partition_log.segment_bases()
            segments = [
                (base, keyed_entries(partition_log.files, base, closed=base != bases[-1]))
                for base in bases
            ]
            latest = latest_offsets(e for _, entries in segments for e, _ in entries)
            for base, entries in segments[:-1]:
                kept = [
                    line
                    for entry, line in entries
                    if keep_record(
                        entry,
                        latest,
                        now_ms=moment,
                        tombstone_retention_ms=config.tombstone_retention_ms,
                    )
                ]
                if len(kept) != len(entries):
                    partition_log.replace_segment(base, kept)
                    result.rewritten_segments += 1
                    result.removed_records += len(entries) - len(kept)
                result.kept_records += len(kept)
        return result

    # -- checking ----------------------------------------------------------------------------

    def check(self, topic: str | None = None) -> list[CheckProblem]:
        """Verify every record's checksum and offset order; report every problem found.
        Safe beside writers in other processes and threads (a torn tail at the end of a
        partition is confirmed under its writer lock), but not from a thread that holds a
        partition's writer lock itself."""
        self._check_open()
        problems: list[CheckProblem] = []
        names = [topic] if topic is not None else list(self.topics())
        for name in names:
            config = self.topic_config(name)
            for number in range(config.partitions):
                partition_log = self.partition_log(name, number)
                expected: int | None = None
                bases = partition_log.segment_bases()
                for base in bases:
                    path = str(partition_log.segment_path(base))
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        size = os.fstat(fd).st_size
                        scan = scan_batches(fd, path, 0, expected, size=size)
                        torn = scan.bad_position >= 0 and not scan.corrupt_inside
                        if torn and base == bases[-1]:
                            # A writer may be mid-batch at the active segment's end (a
                            # write is seen a page at a time, and a busy machine can stop
                            # the writer between two pages for as long as it likes). Under
                            # the writer lock no writer is: a torn tail still there is
                            # what a writer that died mid-batch left.
                            # The scan goes on from the torn batch: what it reports is
                            # all in absolute positions and offsets. A lock not had in
                            # lock_timeout_s leaves the tail reported, saying so.
                            try:
                                with partition_log.writer_lock:
                                    size = os.fstat(fd).st_size
                                    scan = scan_batches(
                                        fd, path, scan.bad_position, scan.next_offset, size=size
                                    )
                            except StorageError as exc:
                                scan.problem += f" (not confirmed: {exc})"
                    except CorruptRecordError as exc:  # pragma: no cover - scan reports instead
                        problems.append(CheckProblem(name, number, path, exc.position, str(exc)))
                        continue
                    finally:
                        os.close(fd)
                    if scan.bad_position >= 0:
                        kind = "damage inside the segment" if scan.corrupt_inside else "torn tail"
                        batch_offset = scan.next_offset if scan.next_offset >= 0 else base
                        problems.append(
                            CheckProblem(
                                name,
                                number,
                                path,
                                scan.bad_line_position,
                                f"{kind}: {scan.problem}",
                                batch_offset + scan.bad_line_index,
                                batch_offset,
                                scan.bad_position,
                            )
                        )
                    elif scan.end != size:  # pragma: no cover - scan reads to ``size``
                        problems.append(
                            CheckProblem(name, number, path, scan.end, "trailing bytes")
                        )
                    if scan.next_offset >= 0:
                        expected = scan.next_offset
        return problems
