"""The ConsumerBroker process: reads the log for every consumer group, pushes messages to
registered idle consumers, and takes their ACKs, NACKs and lease extensions.

The delivery rules live in :mod:`spoolmq.broker.delivery` (pure state); this module is the
shell around them: the loop and its timers, dispatch to sockets, consumer and admin frames.
Around it: :mod:`~spoolmq.broker.group_runtime` (a group's log readers),
:mod:`~spoolmq.broker.consumer_frames` (checking frames), :mod:`~spoolmq.broker.dead_letter`,
:mod:`~spoolmq.broker.group_view` (``describe_groups``) and
:mod:`~spoolmq.broker.checkpoint` (what is saved to ``state.db``, through ``StateDB``).
What stays is the loop and what it dispatches (fetch, push, dead letters, each consumer
frame and admin request to the state it changes): one cohesive shell, kept whole at about
500 lines so a reader follows a step from wait to checkpoint in one place.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.broker.checkpoint import Checkpoint, collect_checkpoint, mark_saved
from spoolmq.broker.child import BrokerChild, ChildChannels, ClientConnection, Periodic
from spoolmq.broker.consumer_frames import (
    expand_runs,
    parse_credit,
    parse_extend,
    parse_nack,
    parse_reset_offsets,
    parse_runs,
    parse_seen,
    parse_subscribe,
)
from spoolmq.broker.dead_letter import dead_letter_message
from spoolmq.broker.delivery import Batch, Event, Group, GroupSettings, delivery_tag, tag_order
from spoolmq.broker.events import EventLog
from spoolmq.broker.group_runtime import (
    REVIVE_AHEAD_MS,
    FreshBatch,
    FreshLines,
    GroupRuntime,
    Skip,
    restored_by_partition,
)
from spoolmq.broker.group_view import describe_groups
from spoolmq.broker.metrics import ACK_LATENCY_BOUNDS, Buckets
from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.errors import (
    GroupActiveError,
    InvalidArgumentError,
    ProtocolError,
    SpoolError,
    UnknownTopicError,
)
from spoolmq.store.names import check_topic, dlq_topic
from spoolmq.types import EventType, TopicPartition

logger = logging.getLogger("spoolmq.consumer")

_CHECKPOINT_S = 0.2
_RESCAN_S = 1.0
_LAG_EVENT_S = 5.0
# What the broker's figures count, in this order: deliveries as batches go out, skips as
# ranges, the others one event each.
_COUNTED = (
    EventType.DELIVERED,
    EventType.ACKED,
    EventType.NACKED,
    EventType.DEAD_LETTERED,
    EventType.EXPIRED,
    EventType.SKIPPED,
)
_COUNTED_AS_EVENTS = frozenset(_COUNTED) - {EventType.DELIVERED, EventType.SKIPPED}
# What the bytes of settled records are counted for (the metrics' *_bytes counters).
_SETTLED_KINDS = tuple(
    str(kind)
    for kind in (EventType.ACKED, EventType.NACKED, EventType.DEAD_LETTERED, EventType.EXPIRED)
)
_ACKED = EventType.ACKED


@dataclass(slots=True)
class _Consumer(ClientConnection):
    group: str | None = None
    consumer_id: str = ""
    topics_at_subscribe: tuple[str, ...] = ()
    last_seen_ms: int = 0  # when it last sent a frame (``groups describe --members``)

    @property
    def name(self) -> str:
        return self.consumer_id or self.client_id


class ConsumerBroker(BrokerChild[_Consumer]):
    role = "consumer"

    def __init__(
        self,
        data_dir: Path,
        channels: ChildChannels,
        *,
        store_settings: dict[str, Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        super().__init__(data_dir, channels, store_settings=store_settings, clock=clock)
        if channels.notices is None:
            raise ValueError("the ConsumerBroker reads the PublisherBroker's notices")
        self.notices = protocol.PipeFrames(channels.notices)
        self.events = EventLog(data_dir, clock=clock)
        self.by_id: dict[str, _Consumer] = {}
        self.groups: dict[str, GroupRuntime] = {}
        self.log_ends: dict[TopicPartition, int] = {}
        # Topics being deleted (between the manager's drop_topic and topic_deleted): a
        # subscription to one is refused.
        self._deleting: set[str] = set()
        # Where the newest batch a notice told of ends: (segment base, byte end, end offset).
        self._noticed: dict[TopicPartition, tuple[int, int, int]] = {}
        self._noticed_since_rescan: set[TopicPartition] = set()
        self._counter = 0
        self._checkpoint_timer = Periodic(_CHECKPOINT_S)
        self._saver = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint")
        self._saving: tuple[Checkpoint, Future[None]] | None = None
        self._rescan_timer = Periodic(_RESCAN_S)
        self._lag_timer = Periodic(_LAG_EVENT_S)
        # Messages by what happened to them ("skipped": deleted by retention before their
        # group read them), keyed by the event type's text: they go out as JSON.
        self.counts: dict[str, int] = {str(kind): 0 for kind in _COUNTED}
        # The same per topic (metrics), counted per event and per run, and the bytes of
        # the records delivered per topic, counted per dispatched batch.
        self.by_topic: dict[str, dict[str, int]] = {}
        self.bytes_by_topic: dict[str, int] = {}
        # Bytes of the records ACKed, NACKed, dead-lettered and expired per topic, and per
        # topic a histogram of the time from a record's storing to its ACK (per ACKed run).
        self.settled_bytes_by_topic: dict[str, dict[str, int]] = {}
        self.ack_latency: dict[str, Buckets] = {}
        # Cancelled messages by partition and offset (state.db's ``cancels``), shared by
        # every group: each passes over them as it reads them. Those retention deleted are
        # forgotten as the broker starts.
        self.cancels = self._load_cancels()

    def new_client(self, conn: Connection, client_id: str) -> _Consumer:
        return _Consumer.open(conn, client_id)

    # -- the loop --------------------------------------------------------------------------

    def wait_timeout(self) -> float:
        if any(runtime.behind for runtime in self.groups.values()):
            return 0.0  # more of a backlog to read (GroupRuntime.behind)
        now = self.clock.now_ms()
        timers = [
            t for t in (rt.group.next_timer() for rt in self.groups.values()) if t is not None
        ]
        # Parked messages to look for: not while a look runs or the lanes are full (the
        # checkpoint timer wakes the loop to see the look's answer).
        timers += [
            rt.next_revive
            for rt in self.groups.values()
            if rt.next_revive is not None
            and rt.group.consumers
            and rt.reviving is None
            and rt.lane_room() > 0
        ]
        until = (min(timers) - now) / 1000 if timers else _RESCAN_S
        return max(0.0, min(until, _CHECKPOINT_S if self.groups else _RESCAN_S))

    def loop(self, timeout: float | None) -> None:
        ready = self._wait_step(timeout, () if self.notices.ended else [self.notices])
        if self.notices in ready:
            self._read_notices()
        for conn in ready:
            consumer = self.clients.get(conn)
            if consumer is not None:
                self._read_consumer(consumer)
        monotonic = time.monotonic()
        if self._rescan_timer.due(monotonic):
            # A safety net for notices lost while a process restarted; not the normal path.
            # A partition noticed since the last rescan is live: while the PublisherBroker
            # syncs one batch it has often written the next, so its file is ahead of the
            # last notice, and reading that would parse a second of data in one step (a
            # ~100 ms stall every second at 20,000 msg/s) and could hand out a batch whose
            # sync has not returned yet.
            noticed, self._noticed_since_rescan = self._noticed_since_rescan, set()
            for key in {k for rt in self.groups.values() for k in rt.group.partitions}:
                if key not in noticed and self._grew_unnoticed(key):
                    self.log_ends[key] = self.store.log_end_offset(*key)
        self._pump()
        if self._checkpoint_timer.due(monotonic):
            self._checkpoint()
        if self._lag_timer.due(monotonic):
            self._record_lag()
        self._report_stats_when_due(monotonic)
        self.events.flush()

    def _grew_unnoticed(self, key: TopicPartition) -> bool:
        """Did the partition grow past what the last notice said (a notice lost while a
        process restarted)? Two ``stat`` calls: the size of the segment it wrote to, and
        whether a segment was started after it. True when no notice said where it wrote."""
        noticed = self._noticed.get(key)
        if noticed is None:
            return True
        base, byte_end, end = noticed
        plog = self.store.partition_log(*key)
        try:
            if os.stat(plog.segment_path(base)).st_size != byte_end:
                return True
        except FileNotFoundError:
            return True  # deleted by retention: let the store say where the log is
        return os.path.exists(plog.segment_path(end))

    def _pump(self) -> None:
        """Timers, reading, dead-lettering and dispatch, until nothing more can move."""
        now = self.clock.now_ms()
        for runtime in self.groups.values():
            group = runtime.group
            self._revive(runtime, now)
            group.run_timers(now)
            self._fetch(runtime, now)
            self._dead_letter(runtime, now)
            while group.wants_more():
                sent = self._dispatch(runtime, now)
                self._dead_letter(runtime, now)
                self._fetch(runtime, now)
                if not sent:
                    break
            self._drain_events(runtime)

    def _fetch(self, runtime: GroupRuntime, now: int) -> None:
        for skip in runtime.fetch(self.store, self.log_ends, now):
            self._skipped(runtime.group.name, skip)

    def _revive(self, runtime: GroupRuntime, now: int) -> None:
        """Parked messages: take in what the last look in state.db found (their records
        read from the log), and start the next look when one is due and there is room.
        The look runs on the checkpoint thread, after the checkpoints before it, so it sees
        every row they saved."""
        if runtime.reviving is not None:
            if not runtime.reviving.done():
                return
            looking, runtime.reviving = runtime.reviving, None
            try:
                rows, next_due = looking.result()
            except Exception:
                logger.exception("reading parked messages from state.db failed; will retry")
                runtime.next_revive = now + 1000
                return
            taken = runtime.took_parked(rows, next_due, now)
            for skip in runtime.read_back(self.store, taken, now):
                self._skipped(runtime.group.name, skip)
        if runtime.next_revive is None or now < runtime.next_revive or not runtime.group.consumers:
            return
        if runtime.lane_room() > 0:
            after, room = runtime.looking()
            runtime.reviving = self._saver.submit(
                self.store.state.parked_due, runtime.group.name, now + REVIVE_AHEAD_MS, after, room
            )

    def _skipped(self, group_name: str, skip: Skip) -> None:
        """Record that retention deleted ``skip`` before the group read it."""
        topic, partition, first, begin = skip
        self.counts[EventType.SKIPPED] += begin - first
        self._count_topic(topic, EventType.SKIPPED, begin - first)
        self.events.add_skipped(group_name, topic, partition, first, begin)
        logger.warning(
            "group %s: offsets %d..%d of %s/%d were deleted by retention before the group "
            "read them; it goes on from %d",
            group_name,
            first,
            begin - 1,
            topic,
            partition,
            begin,
        )

    def _dispatch(self, runtime: GroupRuntime, now: int) -> int:
        group = runtime.group
        sent = 0
        for consumer_id, batch in group.dispatch(now).items():
            consumer = self.by_id.get(consumer_id)
            if consumer is None:
                continue
            try:
                for header, lines in delivery_frames(_deliver_header(batch), batch.lines):
                    consumer.writer.send(protocol.encode_delivery(header, lines))
                sent += batch.count
                self.counts[EventType.DELIVERED] += batch.count
                self._count_bytes(batch.runs, batch.lines)
            except OSError:
                # Never handed over, so not an attempt, whatever happens to the consumer.
                for tag in reversed(batch.tags()):
                    with contextlib.suppress(SpoolError):
                        group.release(tag, consumer_id, now)
                self.connection_lost(consumer, "connection lost while delivering")
        return sent

    def _dead_letter(self, runtime: GroupRuntime, now: int) -> None:
        """Write the group's dead letters to their DLQ, in order. One that cannot be written
        stays first in line and is tried again after a backoff (0.5 s doubling to 60 s): it
        holds its partition's committed offset until it is written, never lost."""
        group = runtime.group
        if not group.dead or now < runtime.dead_letter_retry_at:
            return
        while group.dead:
            pending = group.dead[0]
            try:
                dlq = dlq_topic(pending.topic)  # a name too long is an error here, not a crash
                self.store.own_topic(dlq)  # with --auto-create-topics off as well
                self.store.append_batch(dlq, [dead_letter_message(group.name, pending)])
            except SpoolError as exc:
                backoff = min(max(2 * runtime.dead_letter_backoff_ms, 500), 60_000)
                runtime.dead_letter_backoff_ms = backoff
                runtime.dead_letter_retry_at = now + backoff
                logger.error(
                    "could not dead-letter %s/%d@%d (%s); trying again in %.1f s",
                    pending.topic,
                    pending.partition,
                    pending.offset,
                    exc,
                    backoff / 1000,
                )
                return
            group.dead.pop(0)
            runtime.dead_letter_backoff_ms = 0
            group.dead_lettered(pending, now)

    def _count_bytes(self, runs: list[Any], lines: list[bytes]) -> None:
        at = 0
        by_topic = self.bytes_by_topic
        for state, _, count, _ in runs:
            size = sum(map(len, lines[at : at + count]))
            at += count
            by_topic[state.topic] = by_topic.get(state.topic, 0) + size

    def _count_topic(self, topic: str, kind: str, count: int) -> None:
        counts = self.by_topic.get(topic)
        if counts is None:
            counts = self.by_topic[topic] = {str(k): 0 for k in _COUNTED}
        counts[kind] += count

    def _drain_events(self, runtime: GroupRuntime) -> None:
        group = runtime.group
        counts = self.counts
        for event in group.events:
            self.events.add(event, group.name)
            kind = event.type
            if isinstance(event, Event):
                if kind in _COUNTED_AS_EVENTS:
                    counts[kind] += 1
                    self._count_topic(event.topic, kind, 1)
                    if event.line is not None:
                        self._count_settled_bytes(event.topic, kind, len(event.line))
            else:
                for state, _, count, _ in event.runs:
                    self._count_topic(state.topic, kind, count)
                if kind is _ACKED:
                    counts[kind] += sum(run[2] for run in event.runs)
                    for topic, size, age_ms, count in event.settled or ():
                        self._count_settled_bytes(topic, kind, size)
                        latency = self.ack_latency.get(topic)
                        if latency is None:
                            latency = self.ack_latency[topic] = Buckets(ACK_LATENCY_BOUNDS)
                        latency.observe(max(age_ms, 0) / 1000, count)
        group.events.clear()

    def _count_settled_bytes(self, topic: str, kind: str, size: int) -> None:
        sizes = self.settled_bytes_by_topic.get(topic)
        if sizes is None:
            sizes = self.settled_bytes_by_topic[topic] = dict.fromkeys(_SETTLED_KINDS, 0)
        sizes[kind] += size

    # -- consumers ---------------------------------------------------------------------------

    def _read_consumer(self, consumer: _Consumer, limit: int = 64) -> bool:
        """Handle up to ``limit`` frames the consumer has sent; True if more may be waiting."""
        for _ in range(limit):
            try:
                data = consumer.reader.next_frame()
            except (EOFError, OSError):
                self._drop(consumer, "connection closed")
                return False
            if data is None:
                return False
            frame: dict[str, Any] = {}
            try:
                frame = protocol.decode(data)
                op = protocol.check_client_frame(frame)
                self._handle_frame(consumer, op, frame)
            except ProtocolError as exc:
                logger.warning("closing consumer %s: %s", consumer.client_id, exc)
                # With the request's id where it had one, so a client waiting for the
                # answer learns why the connection is closing.
                self._send(consumer, protocol.error_frame(exc, id=frame.get("id")))
                self._drop(consumer, f"bad frame: {exc}")
                return False
            except SpoolError as exc:
                self._send(consumer, protocol.error_frame(exc, id=frame.get("id")))
            except Exception:
                # A bug must cost one connection, not every consumer of the broker.
                logger.exception("failed handling a frame of consumer %s", consumer.client_id)
                self._drop(consumer, "internal error")
                return False
            if consumer.conn not in self.clients:
                return False
        return True

    def _handle_frame(self, consumer: _Consumer, op: str, frame: dict[str, Any]) -> None:
        now = self.clock.now_ms()
        consumer.last_seen_ms = now
        if op == "subscribe":
            self._subscribe(consumer, frame, now)
            return
        if op == "bye":
            self._return_unread(consumer, frame)
            self._drop(consumer, "said bye")
            return
        if op not in ("credit", "ack", "nack", "extend", "pause", "resume"):
            raise ProtocolError(f"a consumer connection cannot send {op!r}")
        if consumer.group is None:
            raise ProtocolError(f"{op!r} before 'subscribe'")
        runtime = self.groups[consumer.group]
        group = runtime.group
        if op == "credit":
            group.add_credit(consumer.consumer_id, parse_credit(frame))
            return
        if op in ("pause", "resume"):
            slot = group.consumers[consumer.consumer_id]
            slot.paused = op == "pause"
            released = self._return_unread(consumer, frame) if slot.paused else 0
            self._send(consumer, {"op": f"{op}d", "id": frame.get("id"), "released": released})
            return
        runs = parse_runs(op, frame)
        refused: list[dict[str, Any]] = []
        leases: dict[str, int] = {}
        if op == "ack":
            for tag, exc in group.ack_runs(runs, consumer.consumer_id, now):
                refused.append({"tag": tag, "code": exc.code, "message": str(exc)})
        for tag in expand_runs(runs) if op != "ack" else ():
            try:
                if op == "nack":
                    delay_ms, reason = parse_nack(frame)
                    group.nack(tag, consumer.consumer_id, now, delay_ms=delay_ms, reason=reason)
                else:
                    seconds = parse_extend(frame)
                    leases[str(tag)] = group.extend(tag, consumer.consumer_id, now, seconds)
            except SpoolError as exc:
                refused.append({"tag": tag, "code": exc.code, "message": str(exc)})
        if frame.get("id") is not None or refused:
            reply: dict[str, Any] = {
                "op": f"{op}_result",
                "id": frame.get("id"),
                "refused": refused,
            }
            if leases:
                reply["leases"] = leases
            self._send(consumer, reply)

    def _return_unread(self, consumer: _Consumer, frame: dict[str, Any]) -> int:
        """A closing (``bye``) or pausing (``pause``) consumer lists in ``seen`` the
        deliveries its application got and did not settle; the rest it never read
        (prefetched, buffered or still in the socket), so they go back without counting an
        attempt. Returns how many went back."""
        if consumer.group is None:
            return 0
        seen = parse_seen(frame)
        if seen is None:
            return 0  # every delivery may have been processed: all count
        group = self.groups[consumer.group].group
        now = self.clock.now_ms()
        unread = set(group.in_flight_tags(consumer.consumer_id)) - set(seen)
        released = 0
        for tag in sorted(unread, key=tag_order, reverse=True):  # each goes to the front
            with contextlib.suppress(SpoolError):  # its lease ran out: that attempt counted
                group.release(tag, consumer.consumer_id, now)
                released += 1
        return released

    def _subscribe(self, consumer: _Consumer, frame: dict[str, Any], now: int) -> None:
        if consumer.group is not None:
            raise InvalidArgumentError("this connection already subscribed")
        group_name, topics, start, settings, prefetch = parse_subscribe(frame)
        deleting = sorted(self._deleting.intersection(topics))
        if deleting:
            raise UnknownTopicError(f"topic {deleting[0]!r} is being deleted")
        runtime = self.groups.get(group_name)
        if runtime is None:
            runtime = self.groups[group_name] = GroupRuntime(
                self._new_group(group_name, settings),
                # Attempts of what was in flight when a broker stopped, so max_deliveries
                # keeps counting across restarts.
                restored=restored_by_partition(self.store.state.open_deliveries(group_name)),
            )
        elif runtime.group.consumers and runtime.group.settings != settings:
            raise InvalidArgumentError(
                f"group {group_name!r} already runs with other settings "
                f"({runtime.group.settings}); consumers of one group must agree"
            )
        else:
            runtime.group.settings = settings
        group = runtime.group
        committed = self.store.state.committed_offsets(group_name)
        for topic in topics:
            config = self.store.topic_config(topic, create=True)
            for partition in range(config.partitions):
                key = TopicPartition(topic, partition)
                if key in group.partitions:
                    continue
                end, skip = runtime.open_partition(self.store, key, start, committed.get(key))
                self.log_ends[key] = end
                if skip is not None:  # it had committed below the log start
                    self._skipped(group_name, skip)
        self._counter += 1
        consumer.consumer_id = f"{consumer.client_id}#{self._counter}"
        consumer.group = group_name
        consumer.topics_at_subscribe = tuple(topics)
        self.by_id[consumer.consumer_id] = consumer
        group.add_consumer(consumer.consumer_id, prefetch, topics)
        if settings.auto_ack:
            group.add_credit(consumer.consumer_id, prefetch)
        self._send(
            consumer,
            {"op": "subscribed", "id": frame.get("id"), "consumer_id": consumer.consumer_id},
        )
        logger.info("consumer %s joined group %s on %s", consumer.consumer_id, group_name, topics)

    def forget(self, client: _Consumer) -> None:
        self.by_id.pop(client.consumer_id, None)
        if client.group is not None:
            runtime = self.groups[client.group]
            runtime.group.remove_consumer(client.consumer_id, self.clock.now_ms())
            self._drain_events(runtime)

    def connection_lost(self, client: _Consumer, reason: str) -> None:
        """A send failed because the client closed its end. What it sent before closing
        (ACKs, then the ``bye`` that lists what it never read) may still wait in the socket:
        handle that first, or settled work comes back and unread prefetches count as
        attempts."""
        if client.lost:
            return
        client.lost = True
        for _ in range(1000):
            if not self._read_consumer(client, limit=1000):
                break
        self._drop(client, reason)

    # -- notices, control, admin -----------------------------------------------------------------

    def _read_notices(self) -> None:
        waiting = self.notices.read()
        if self.notices.ended:
            # No more notices (the manager is gone, or the stream broke): the rescan reads
            # what they would have said.
            logger.error(
                "stopped reading the PublisherBroker's notices: %s",
                self.notices.error or "the pipe was closed",
            )
        for data in waiting:
            try:
                frame = protocol.decode(data)
            except SpoolError:
                logger.warning("ignoring a malformed notice %.200r", data)
                continue
            fresh = frame.get("b")
            if fresh is None:
                # The bare form, "these partitions grew to" (no metadata: a writer that
                # does not describe its batches): their readers read it, fully verified.
                for topic, partition, end in frame.get("a", ()):
                    key = TopicPartition(topic, partition)
                    if end > self.log_ends.get(key, 0):
                        self.log_ends[key] = end
            else:
                self._take_fresh(fresh)

    def _take_fresh(self, entries: list[Any]) -> None:
        """Batches the PublisherBroker just wrote and synced: each group reading right
        there takes them from the notice (CRC-checked, not parsed); the others read them
        later through their readers."""
        now = self.clock.now_ms()
        lines = FreshLines()
        for entry in entries:
            batch = FreshBatch.from_notice(entry)
            if batch is None:
                logger.warning("ignoring a malformed notice entry %.200r", entry)
                continue
            key = TopicPartition(batch.topic, batch.partition)
            end = batch.first + batch.size
            if end > self.log_ends.get(key, 0):
                self.log_ends[key] = end
            self._noticed[key] = (batch.base, batch.position + batch.length, end)
            self._noticed_since_rescan.add(key)
            for runtime in self.groups.values():
                runtime.take_fresh(key, batch, lines, now)

    def admin(self, request: dict[str, Any]) -> dict[str, Any]:
        action = request.get("action")
        if action == "describe_groups":
            groups = {name: runtime.group for name, runtime in self.groups.items()}
            described = describe_groups(groups, self.log_ends)
            for consumer in self.clients.values():
                if consumer.group in described:
                    group = groups[consumer.group]
                    described[consumer.group].setdefault("members", []).append(
                        {
                            "consumer": consumer.consumer_id,
                            "client_id": consumer.client_id,
                            "in_flight": len(group.in_flight_tags(consumer.consumer_id)),
                            "last_seen": consumer.last_seen_ms,
                        }
                    )
            return {"op": "ok", "groups": described}
        if action == "reset_group":
            return {"op": "ok", **self.reset_group(request)}
        if action == "delete_group":
            return {"op": "ok", **self.delete_group(request)}
        if action == "drop_topic":
            return {"op": "ok", **self.drop_topic(check_topic(request.get("topic")))}
        if action == "cancel":
            return {"op": "ok", **self.cancel(request)}
        if action == "topic_deleted":
            topic = check_topic(request.get("topic"))
            self._deleting.discard(topic)
            self._forget_topic(topic)
            return {"op": "ok"}
        if action == "stats":
            return {"op": "ok", "stats": self.figures()}
        raise ProtocolError(f"unknown admin action {str(action)[:40]!r}")

    def reset_group(self, request: dict[str, Any]) -> dict[str, Any]:
        name = request.get("group")
        offsets = request.get("offsets")
        if not isinstance(name, str) or not isinstance(offsets, list):
            raise ProtocolError("reset_group needs 'group' and 'offsets'")
        new = parse_reset_offsets(offsets)
        runtime = self.groups.get(name)
        if runtime is not None and runtime.group.consumers:
            raise GroupActiveError(
                f"group {name!r} has {len(runtime.group.consumers)} live consumer(s); "
                "stop them before resetting its offsets"
            )
        if runtime is not None:
            self._checkpoint(wait=True)
            del self.groups[name]
            runtime.close()  # the group starts afresh with new readers
        self.store.state.reset_group(name, dict(new.items()))
        return {"reset": len(new)}

    def delete_group(self, request: dict[str, Any]) -> dict[str, Any]:
        """Forget a group with no live consumer: its runtime here and its rows in state.db."""
        name = request.get("group")
        if not isinstance(name, str):
            raise ProtocolError("delete_group needs 'group'")
        runtime = self.groups.get(name)
        if runtime is not None and runtime.group.consumers:
            raise GroupActiveError(
                f"group {name!r} has {len(runtime.group.consumers)} live consumer(s); "
                "stop them before deleting it"
            )
        if runtime is None and name not in self.store.state.groups():
            raise InvalidArgumentError(f"no consumer group {name!r}")
        if runtime is not None:
            self._checkpoint(wait=True)
            del self.groups[name]
            runtime.close()
        self.store.state.delete_group(name)
        return {"deleted": name}

    def _new_group(self, name: str, settings: GroupSettings) -> Group:
        group = Group(name, settings)
        group.cancelled = self.cancels
        return group

    def _load_cancels(self) -> dict[TopicPartition, dict[int, str | None]]:
        cancels = self.store.state.cancels()
        starts = {}
        for key in list(cancels):
            try:
                starts[key] = self.store.log_start_offset(*key)
            except SpoolError:  # its topic is gone (deleted offline): nothing to stop
                starts[key] = 1 << 62
        if self.store.state.prune_cancels(starts):
            cancels = self.store.state.cancels()
        return cancels

    def cancel(self, request: dict[str, Any]) -> dict[str, Any]:
        """Cancel one stored message: no group delivers it from now on (one a consumer
        holds is left alone). Saved to state.db before the answer, so a broker restart
        keeps it. Answers per group what happened (``Group.cancel``); a group that has not
        read it yet, or that starts later, passes over it when it reads it."""
        topic = check_topic(request.get("topic"))
        partition, offset = request.get("partition", -1), request.get("offset", -1)
        reason = request.get("reason")
        self.store.cancel_message(topic, partition, offset, reason)  # checks them, then saves
        key = TopicPartition(topic, partition)
        self.cancels.setdefault(key, {}).setdefault(offset, reason)  # the first reason stays
        now = self.clock.now_ms()
        outcomes = {}
        for name, runtime in self.groups.items():
            state = runtime.group.partitions.get(key)
            if state is None:
                if any(held.topic == topic for held in runtime.group.partitions):
                    outcomes[name] = "pending"  # reads the topic, not that partition yet
                continue  # a group that does not read the topic has nothing to say
            outcome = runtime.group.cancel(state, offset, now, reason)
            if (
                outcome == "finished"
                and (topic, partition, offset) not in runtime.group.parking
                and self.store.state.parked_offsets(name, topic, partition, offset, offset)
            ):
                outcome = "pending"  # parked: passed over when it is read back
            outcomes[name] = outcome
            self._drain_events(runtime)
        outcomes.update(self._cancel_outcomes_at_rest(key, offset, outcomes))
        self._pump()
        logger.info("cancelled %s/%d@%d: %s", topic, partition, offset, outcomes)
        return {"groups": outcomes}

    def _cancel_outcomes_at_rest(
        self, key: TopicPartition, offset: int, answered: dict[str, str]
    ) -> dict[str, str]:
        """What a cancel means to the groups that read ``key``'s topic but have no consumer
        in this broker now, from their committed offsets: ``finished`` below the offset,
        ``pending`` from it on (or parked). Kafka consumer groups are left out: Fetch reads
        the log itself, and they still see the message (one that only assigns partitions
        and commits, with no group membership, cannot be told from a spoolmq group)."""
        state = self.store.state
        kafka = {row.group_name for row in state.kafka_groups()}
        readers = state.readers_of(key.topic, key.partition, offset)
        outcomes = {}
        for name in sorted(readers.keys() - kafka - answered.keys()):
            end, parked = readers[name]
            outcomes[name] = "finished" if offset < end and not parked else "pending"
        return outcomes

    def drop_topic(self, topic: str) -> dict[str, Any]:
        """The first step of deleting a topic while the broker runs: stop serving it.
        Subscriptions to it are refused until ``topic_deleted`` (the PublisherBroker
        deletes the files in between); every group reading it drops its partitions, after
        a checkpoint, so no later one writes its offsets back; its consumers are told with
        a ``topic_deleted`` frame (they drop what they hold of it). The other topics of
        those groups and consumers go on as they were."""
        self.store.topic_config(topic)  # UnknownTopicError for a topic that is not there
        self._deleting.add(topic)
        self._checkpoint(wait=True)
        groups = []
        for name, runtime in self.groups.items():
            if runtime.drop_topic(topic):
                groups.append(name)
        told = 0
        for consumer in list(self.clients.values()):
            if consumer.group is not None and topic in consumer.topics_at_subscribe:
                self._send(consumer, {"op": "topic_deleted", "topic": topic})
                told += 1
        self._forget_topic(topic)
        logger.info(
            "stopped serving topic %s (groups %s, %d consumer(s) told)", topic, groups, told
        )
        return {"groups": groups, "consumers": told}

    def _forget_topic(self, topic: str) -> None:
        for table in (self.log_ends, self._noticed, self.cancels):
            for key in [key for key in table if key.topic == topic]:
                del table[key]
        self._noticed_since_rescan = {k for k in self._noticed_since_rescan if k.topic != topic}
        self.store.forget_topic(topic)

    def figures(self) -> dict[str, Any]:
        return {
            **self.counts,
            "consumers": len(self.clients),
            "groups": len(self.groups),
            "in_flight": sum(rt.group.in_flight_count() for rt in self.groups.values()),
            "by_topic": self.by_topic,
            "bytes_by_topic": self.bytes_by_topic,
            "settled_bytes_by_topic": self.settled_bytes_by_topic,
            "ack_latency": {topic: b.figures() for topic, b in self.ack_latency.items()},
        }

    # -- persistence ------------------------------------------------------------------------------

    def _checkpoint(self, *, wait: bool = False) -> None:
        """Committed offsets and open deliveries to state.db, one transaction, written by a
        thread of its own so that the loop never waits on state.db's lock (the
        PublisherBroker and the manager write to it too): what to write is decided here, in
        microseconds; the SQL runs beside the loop, one checkpoint at a time. ``wait``:
        write now and return once it is saved (shutdown, a group reset)."""
        if self._saving is not None:
            if not wait and not self._saving[1].done():
                return  # the last one is still being written; this one waits its turn
            self._saved()
        groups = {name: rt.group for name, rt in self.groups.items()}
        checkpoint = collect_checkpoint(
            groups.values(), self.clock.now_ms(), min_age_ms=int(_CHECKPOINT_S * 1000)
        )
        if checkpoint.is_empty():
            return
        self._saving = (
            checkpoint,
            self._saver.submit(self.store.state.checkpoint, **checkpoint._asdict()),
        )
        if wait:
            self._saved()

    def _saved(self) -> None:
        """Once the thread has written a checkpoint: remember what state.db now has."""
        assert self._saving is not None
        checkpoint, writing = self._saving
        self._saving = None
        try:
            writing.result()
        except Exception:
            # Nothing is marked saved: the next checkpoint writes it all again.
            logger.exception("checkpoint to state.db failed; will retry")
            return
        mark_saved(checkpoint, {name: rt.group for name, rt in self.groups.items()})
        for name, runtime in self.groups.items():
            runtime.saved_parked([row for row in checkpoint.parked if row.group_name == name])
            if runtime.reviving is not None:
                runtime.unparked_meanwhile.update(
                    (gone.topic, gone.partition, gone.offset)
                    for gone in checkpoint.unparked
                    if gone.group_name == name
                )

    def _record_lag(self) -> None:
        for name, runtime in self.groups.items():
            for key, state in runtime.group.partitions.items():
                self.events.add_lag(
                    name, key.topic, key.partition, state.committed(), self.log_ends.get(key, 0)
                )

    def save(self) -> None:
        try:
            self._checkpoint(wait=True)
            self._saver.shutdown()
        finally:
            self.events.flush(sync=True)
            self.events.close()
            for runtime in self.groups.values():
                runtime.close()

    def close(self) -> None:
        for consumer in list(self.clients.values()):
            self._send(consumer, {"op": "closing"})
        super().close()


# A deliver frame's bytes at most, under the MAX_FRAME_BYTES a client reads: room for its
# header, whose runs are counted at their topic's length and _RUN_BYTES more each.
_DELIVER_BUDGET = protocol.MAX_FRAME_BYTES - 1024 * 1024
_RUN_BYTES = 80


def delivery_frames(
    header: dict[str, Any], lines: list[bytes], budget: int = _DELIVER_BUDGET
) -> list[tuple[dict[str, Any], list[bytes]]]:
    """A dispatch's ``deliver`` header and lines as frames no larger than ``budget`` bytes
    each (one, unless its records are large: a prefetch of 100 records of 1 MiB would make
    a frame no client reads). A run is cut where a frame ends; its tags stay consecutive.

    >>> header = {"op": "deliver", "r": [["t", 0, 5, 3, 1, 100]]}
    >>> [(h["r"], len(ls)) for h, ls in delivery_frames(header, [b"x" * 60] * 3, 250)]
    [([['t', 0, 5, 2, 1, 100]], 2), ([['t', 0, 7, 1, 1, 102]], 1)]
    """
    runs = header["r"]
    if sum(map(len, lines)) + len(runs) * (_RUN_BYTES + len(runs[0][0])) <= budget:
        return [(header, lines)]  # the common case: one frame
    frames: list[tuple[dict[str, Any], list[bytes]]] = []
    frame_runs: list[list[Any]] = []
    frame_lines: list[bytes] = []
    size = 0
    at = 0
    for topic, partition, first, count, attempt, tag in runs:
        run_bytes = _RUN_BYTES + len(topic)
        taken = 0
        while taken < count:
            line = lines[at + taken]
            extra = len(line) + (run_bytes if taken == 0 else 0)  # a run's first line: its run
            if frame_lines and size + extra > budget:
                if taken:
                    frame_runs.append([topic, partition, first, taken, attempt, tag])
                frames.append(({"op": "deliver", "r": frame_runs}, frame_lines))
                first, tag, count, at = first + taken, tag + taken, count - taken, at + taken
                frame_runs, frame_lines, size, taken = [], [], 0, 0
                continue
            frame_lines.append(line)
            size += extra
            taken += 1
        frame_runs.append([topic, partition, first, count, attempt, tag])
        at += count
    frames.append(({"op": "deliver", "r": frame_runs}, frame_lines))
    return frames


def _deliver_header(batch: Batch) -> dict[str, Any]:
    """A ``deliver`` frame's header: per run ``[topic, partition, first offset, count,
    attempt, first tag]``; the run's lines follow in order (docs/PROTOCOL.md). A run of a
    lane (revived parked messages) goes as runs of one: its records' offsets are not
    consecutive, though its tags are."""
    runs: list[list[Any]] = []
    for state, first, count, attempt in batch.runs:
        tag = delivery_tag(state.slot, first, attempt)
        if state.real is None:
            runs.append([state.topic, state.partition, first, count, attempt, tag])
            continue
        at = first - state.base
        for step in range(count):
            offset = state.real[at + step]
            runs.append([state.topic, state.partition, offset, 1, attempt, tag + step])
    return {"op": "deliver", "r": runs}
