"""The PublisherBroker process: receives publish frames, stores them with group commit,
answers each publisher with its offsets only once they are stored at the asked ACK level.

Group commit: every frame that arrived while the previous batch was being written is read
in the next ``loop()`` step, and each partition touched gets one write and one fsync for
all of them.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import defaultdict
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.broker.child import BrokerChild, ChildChannels, ClientConnection, Periodic, receive_fd
from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.errors import ProtocolError, SpoolError, StorageError
from spoolmq.protocol.publish import check_publish_frame, decode_publish_message
from spoolmq.store.compaction import compaction_due
from spoolmq.store.record import EncodedMessage

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


@dataclass(slots=True)
class _Frame:
    client: ClientConnection
    frame_id: Any
    acks: str
    results: list[dict[str, Any] | None]


@dataclass(slots=True)
class _Item:
    frame: _Frame
    index: int
    encoded: EncodedMessage


@dataclass(slots=True)
class PublisherStats:
    frames: int = 0
    messages: int = 0
    batches: int = 0
    errors: int = 0
    by_topic: dict[str, int] = field(default_factory=dict)


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
        self.stats = PublisherStats()
        self._cleanup_timer = Periodic(_CLEANUP_S)
        # Per compacted topic: its bytes after its last compaction, and when (monotonic).
        self._compacted: dict[str, tuple[int, float]] = {}
        self._prune_timer = Periodic(_PRUNE_S, first_at=time.monotonic() + _PRUNE_S)

    def new_client(self, conn: Connection, client_id: str) -> ClientConnection:
        return ClientConnection.open(conn, client_id)

    # -- the loop -----------------------------------------------------------------------

    def start(self) -> None:
        # A retry may go to another partition than its first copy (round-robin), so every
        # partition's producer sequences must be known before the first publish is taken.
        for topic, config in self.store.topics().items():
            for partition in range(config.partitions):
                try:
                    self.store.partition_log(topic, partition).recover()
                except SpoolError as exc:  # damage: appends there fail with it, others go on
                    logger.error("cannot recover %s/%d: %s", topic, partition, exc)

    def loop(self, timeout: float | None) -> None:
        ready = self._wait_step(timeout)
        frames: list[tuple[ClientConnection, dict[str, Any]]] = []
        for conn in ready:
            client = self.clients.get(conn)
            if client is not None:
                self._read_frames(client, frames)
        if frames:
            self._commit(frames)
        now = time.monotonic()
        if self._cleanup_timer.due(now):
            self._clean_up()
        if self._prune_timer.due(now):
            try:
                self.store.state.prune_sequences()
            except SpoolError:
                logger.exception("pruning old producer sequences failed; will retry")
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
        frames: list[tuple[ClientConnection, dict[str, Any]]] = []
        for client in list(self.clients.values()):
            self._read_frames(client, frames, limit=1_000_000)
        if frames:
            self._commit(frames)

    def _read_frames(
        self,
        client: ClientConnection,
        frames: list[tuple[ClientConnection, dict[str, Any]]],
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
            try:
                frame = protocol.decode(data)
                op = protocol.check_client_frame(frame)
                if op == "bye":
                    self._drop(client, "said bye")
                    return
                if op != "publish":
                    raise ProtocolError(f"a publisher connection cannot send {op!r}")
                frames.append((client, frame))
            except SpoolError as exc:
                logger.warning("closing publisher %s: bad frame: %s", client.client_id, exc)
                self._send(client, protocol.error_frame(exc))
                self._drop(client, f"bad frame: {exc}")
                return

    def _commit(self, frames: list[tuple[ClientConnection, dict[str, Any]]]) -> None:
        """Validate every message, append per partition (one write + fsync), answer."""
        now = self.clock.now_ms()
        # Keyed by plain (topic, partition) tuples: this runs per message, and building a
        # TopicPartition costs several times what a tuple does.
        batches: dict[tuple[str, int], list[_Item]] = defaultdict(list)
        levels: dict[tuple[str, int], str] = {}
        answered: list[_Frame] = []
        for client, raw in frames:
            try:
                acks, producer_id, messages = check_publish_frame(raw)
            except SpoolError as exc:
                self._send(client, protocol.error_frame(exc, id=raw.get("id")))
                continue
            frame = _Frame(client, raw.get("id"), acks, [None] * len(messages))
            answered.append(frame)
            self.stats.frames += 1
            max_bytes = self.store.config.max_message_bytes
            for index, item in enumerate(messages):
                try:
                    topic, key, asked, encoded = decode_publish_message(
                        item, producer_id, now=now, max_bytes=max_bytes
                    )
                    config = self.store.topic_config(topic, create=True)
                    partition = self.store.choose_partition(topic, config, key, asked)
                except SpoolError as exc:
                    frame.results[index] = {"error": exc.code, "message": str(exc)}
                    self.stats.errors += 1
                    continue
                batches[(topic, partition)].append(_Item(frame, index, encoded))
                if acks == "all" or levels.get((topic, partition)) != "all":
                    levels[(topic, partition)] = acks
        appended: list[list[Any]] = []
        for (topic, partition), items in batches.items():
            level = levels[(topic, partition)]
            try:
                positions = self.store.append_encoded(
                    topic,
                    partition,
                    [item.encoded for item in items],
                    "all" if level == "all" else "1",
                )
            except SpoolError as exc:
                if not isinstance(exc, StorageError):
                    logger.exception("append to %s/%d failed", topic, partition)
                else:
                    logger.error("append to %s/%d failed: %s", topic, partition, exc)
                for item in items:
                    item.frame.results[item.index] = {"error": exc.code, "message": str(exc)}
                self.stats.errors += len(items)
                continue
            self.stats.batches += 1
            self.stats.messages += len(items)
            self.stats.by_topic[topic] = self.stats.by_topic.get(topic, 0) + len(items)
            for item, position in zip(items, positions, strict=True):
                result: dict[str, Any] = {
                    "partition": position.partition,  # a repeat's first copy may be elsewhere
                    "offset": position.offset,
                    "timestamp": position.timestamp,
                }
                if position.duplicate:
                    result["duplicate"] = True
                item.frame.results[item.index] = result
            written = [p.offset for p in positions if not p.duplicate]
            if written:
                appended.append([topic, partition, max(written) + 1])
        if appended:
            self._notify(appended)
        for frame in answered:
            if frame.acks != "0":
                self._send(
                    frame.client,
                    {"op": "published", "id": frame.frame_id, "results": frame.results},
                )

    def _notify(self, appended: list[list[Any]]) -> None:
        """Tell the ConsumerBroker which partitions grew (small frames: atomic pipe writes)."""
        if self.notices is None:
            return
        for start in range(0, len(appended), 20):
            try:
                self.notices.send_bytes(
                    protocol.encode({"op": "appended", "a": appended[start : start + 20]})
                )
            except OSError:
                self.notices = None  # the ConsumerBroker is restarting; it rescans on start
                return

    # -- the manager ---------------------------------------------------------------------

    def on_control(self, op: str, frame: dict[str, Any]) -> None:
        if op == "notices":
            fd = receive_fd(self.control)
            if self.notices is not None:
                self.notices.close()
            self.notices = Connection(fd, readable=False)

    def figures(self) -> dict[str, Any]:
        return {
            "frames": self.stats.frames,
            "messages": self.stats.messages,
            "batches": self.stats.batches,
            "errors": self.stats.errors,
            "by_topic": dict(self.stats.by_topic),
            "publishers": len(self.clients),
        }
