"""The ConsumerBroker process: reads the log for every consumer group, pushes messages to
registered idle consumers, and takes their ACKs, NACKs and lease extensions.

The delivery rules live in :mod:`spoolmq.broker.delivery` (pure state); this module is the
shell around them: sockets, log readers, timers, the DLQ, events and ``state.db``.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from spoolmq import protocol
from spoolmq.broker.child import BrokerChild, ChildChannels, ClientConnection, Periodic
from spoolmq.broker.delivery import Group, GroupSettings, PartitionState, Pending
from spoolmq.broker.events import EventLog
from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.errors import (
    CorruptRecordError,
    GroupActiveError,
    InvalidArgumentError,
    OffsetOutOfRangeError,
    ProtocolError,
    SpoolError,
)
from spoolmq.store import Message, Reader
from spoolmq.store.names import check_topic, dlq_topic

logger = logging.getLogger("spoolmq.consumer")

_READ_AHEAD = 20_000  # unfinished messages per group partition held in memory at most
_CHECKPOINT_S = 0.2
_RESCAN_S = 1.0
_LAG_EVENT_S = 5.0


@dataclass(slots=True)
class _Consumer(ClientConnection):
    group: str | None = None
    consumer_id: str = ""

    @property
    def name(self) -> str:
        return self.consumer_id or self.client_id


@dataclass(slots=True)
class _GroupRuntime:
    group: Group
    readers: dict[tuple[str, int], Reader] = field(default_factory=dict)
    restored: dict[tuple[str, int, int], tuple[int, int]] = field(default_factory=dict)
    dirty: dict[tuple[str, int, int], Pending] = field(default_factory=dict)


def parse_reset_offsets(offsets: list[Any]) -> dict[tuple[str, int], int]:
    """``[[topic, partition, offset], ...]`` from an admin frame, checked before any of it
    is applied.

    >>> parse_reset_offsets([["orders", 0, 120]])
    {('orders', 0): 120}
    """
    parsed: dict[tuple[str, int], int] = {}
    for entry in offsets:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry[1:])
        ):
            raise InvalidArgumentError(
                "each offset is [topic, partition, offset] with whole numbers >= 0"
            )
        parsed[(check_topic(entry[0]), entry[1])] = entry[2]
    return parsed


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
        super().__init__(data_dir, channels, store_settings=store_settings)
        self.clock = clock  # leases, retries and delays; tests pass a ManualClock
        if channels.notices is None:
            raise ValueError("the ConsumerBroker reads the PublisherBroker's notices")
        self.notices = channels.notices
        self.events = EventLog(data_dir)
        self.by_id: dict[str, _Consumer] = {}
        self.groups: dict[str, _GroupRuntime] = {}
        self.log_ends: dict[tuple[str, int], int] = {}
        self._counter = 0
        self._checkpoint_timer = Periodic(_CHECKPOINT_S)
        self._rescan_timer = Periodic(_RESCAN_S)
        self._lag_timer = Periodic(_LAG_EVENT_S)
        self.counts = {"delivered": 0, "acked": 0, "nacked": 0, "dead_lettered": 0, "expired": 0}
        self.counts["skipped"] = 0  # deleted by retention before their group read them

    def new_client(self, conn: Connection, client_id: str) -> _Consumer:
        return _Consumer.open(conn, client_id)

    # -- the loop --------------------------------------------------------------------------

    def wait_timeout(self) -> float:
        now = self.clock.now_ms()
        timers = [
            t for t in (rt.group.next_timer() for rt in self.groups.values()) if t is not None
        ]
        until = (min(timers) - now) / 1000 if timers else _RESCAN_S
        return max(0.0, min(until, _CHECKPOINT_S if self._has_dirty() else _RESCAN_S))

    def _has_dirty(self) -> bool:
        return any(rt.dirty for rt in self.groups.values())

    def loop(self, timeout: float | None) -> None:
        ready = self._wait_step(timeout, [self.notices])
        if self.notices in ready:
            self._read_notices()
        for conn in ready:
            consumer = self.clients.get(conn)
            if consumer is not None:
                self._read_consumer(consumer)
        monotonic = time.monotonic()
        if self._rescan_timer.due(monotonic):
            # A safety net for notices lost while a process restarted; not the normal path.
            for key in {k for rt in self.groups.values() for k in rt.group.partitions}:
                self.log_ends[key] = self.store.log_end_offset(*key)
        self._pump()
        if self._checkpoint_timer.due(monotonic):
            self._checkpoint()
        if self._lag_timer.due(monotonic):
            self._record_lag()
        self._report_stats_when_due(monotonic)
        self.events.flush()

    def _pump(self) -> None:
        """Timers, reading, dead-lettering and dispatch, until nothing more can move."""
        now = self.clock.now_ms()
        for runtime in self.groups.values():
            group = runtime.group
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

    def _fetch(self, runtime: _GroupRuntime, now: int) -> None:
        group = runtime.group
        if not group.consumers:
            return
        for key, state in group.partitions.items():
            end = self.log_ends.get(key, 0)
            if state.next_fetch >= end or state.open_count >= _READ_AHEAD:
                continue
            reader = runtime.readers.get(key)
            if reader is None:
                continue
            room = _READ_AHEAD - state.open_count
            try:
                entries = reader.read_entries(min(room, 1000))
            except OffsetOutOfRangeError:
                # Retention deleted records this group had not read yet (it lagged more
                # than the topic keeps): go on from the log start, and say so.
                begin = self.store.partition_log(*key).log_start_offset()
                self._skipped(runtime, state, begin, now)
                with contextlib.suppress(OffsetOutOfRangeError):  # moved again: next time
                    reader.seek(begin)
                continue
            except CorruptRecordError as exc:
                # Never skipped in silence: this partition stops for the group until the
                # damage is dealt with (`spoolmq check`); the others go on.
                logger.error("group %s stops reading %s/%d: %s", group.name, *key, exc)
                del runtime.readers[key]
                continue
            for fields, line in entries:
                restored = runtime.restored.pop((key[0], key[1], fields["offset"]), None)
                if restored is not None:
                    attempts, due_at = restored
                    group.add_record(state, fields, line, now, attempts_so_far=attempts)
                    if due_at > now:
                        pass  # retried on the next due check; counted attempts are kept
                else:
                    group.add_record(state, fields, line, now)

    def _skipped(self, runtime: _GroupRuntime, state: PartitionState, begin: int, now: int) -> None:
        """The group's next record is below the log start ``begin``: retention deleted
        ``[state.next_fetch, begin)`` before the group read it. Record that and go on."""
        first = state.next_fetch
        if begin <= first:
            return
        state.next_fetch = begin
        self.counts["skipped"] += begin - first
        self.events.add_skipped(runtime.group.name, state.topic, state.partition, first, begin)
        logger.warning(
            "group %s: offsets %d..%d of %s/%d were deleted by retention before the group "
            "read them; it goes on from %d",
            runtime.group.name,
            first,
            begin - 1,
            state.topic,
            state.partition,
            begin,
        )

    def _dispatch(self, runtime: _GroupRuntime, now: int) -> int:
        group = runtime.group
        sent = 0
        for consumer_id, pendings in group.dispatch(now).items():
            consumer = self.by_id.get(consumer_id)
            if consumer is None:
                continue
            header = {
                "op": "deliver",
                "m": [[p.topic, p.partition, p.tag, p.attempt] for p in pendings],
            }
            for pending in pendings:
                runtime.dirty[(pending.topic, pending.partition, pending.offset)] = pending
            try:
                consumer.writer.send(protocol.encode_delivery(header, [p.line for p in pendings]))
                sent += len(pendings)
                self.counts["delivered"] += len(pendings)
            except OSError:
                # Never handed over, so not an attempt, whatever happens to the consumer.
                for pending in reversed(pendings):
                    with contextlib.suppress(SpoolError):
                        group.release(pending.tag, consumer_id, now)
                self.connection_lost(consumer, "connection lost while delivering")
        return sent

    def _dead_letter(self, runtime: _GroupRuntime, now: int) -> None:
        group = runtime.group
        while group.dead:
            pending = group.dead.pop(0)
            try:
                self.store.append_batch(
                    dlq_topic(pending.topic), [self._dlq_message(group, pending)]
                )
            except SpoolError:
                logger.exception(
                    "could not dead-letter %s/%d@%d; it stays unfinished",
                    pending.topic,
                    pending.partition,
                    pending.offset,
                )
                continue
            group.dead_lettered(pending, now)
            runtime.dirty[(pending.topic, pending.partition, pending.offset)] = pending

    @staticmethod
    def _dlq_message(group: Group, pending: Pending) -> Message:
        fields = orjson.loads(pending.line)
        value: Any = (
            base64.b64decode(fields["value_b64"]) if "value_b64" in fields else fields.get("value")
        )
        key: Any = base64.b64decode(fields["key_b64"]) if "key_b64" in fields else fields.get("key")
        headers: list[tuple[str, str | bytes]] = []
        for entry in fields.get("headers") or ():
            if len(entry) == 3:
                headers.append((entry[0], base64.b64decode(entry[1])))
            else:
                headers.append((entry[0], entry[1]))
        headers += [
            ("x-dlq-reason", pending.last_reason or "unknown"),
            ("x-dlq-attempts", str(pending.attempt)),
            ("x-dlq-group", group.name),
            ("x-dlq-topic", pending.topic),
            ("x-dlq-partition", str(pending.partition)),
            ("x-dlq-offset", str(pending.offset)),
        ]
        return Message(
            value=value,
            key=key,
            headers=headers,
            tags=fields.get("tags"),
            producer_id=f"dlq:{group.name}:{pending.topic}:{pending.partition}",
            sequence=pending.offset,
        )

    def _drain_events(self, runtime: _GroupRuntime) -> None:
        group = runtime.group
        for event in group.events:
            self.events.add(event, group.name)
            if event.type in self.counts and event.type != "delivered":
                self.counts[event.type] += 1
            if event.type in ("acked", "nacked", "lease_expired", "released", "expired"):
                pending = event.pending
                runtime.dirty[(pending.topic, pending.partition, pending.offset)] = pending
        group.events.clear()

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
            try:
                frame = protocol.decode(data)
                op = protocol.check_client_frame(frame)
                self._handle_frame(consumer, op, frame)
            except ProtocolError as exc:
                logger.warning("closing consumer %s: %s", consumer.client_id, exc)
                self._send(consumer, protocol.error_frame(exc))
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
        if op == "subscribe":
            self._subscribe(consumer, frame, now)
            return
        if op == "bye":
            self._return_unread(consumer, frame)
            self._drop(consumer, "said bye")
            return
        if consumer.group is None:
            raise ProtocolError(f"{op!r} before 'subscribe'")
        runtime = self.groups[consumer.group]
        group = runtime.group
        if op == "credit":
            count = frame.get("n")
            if not isinstance(count, int):
                raise ProtocolError("'credit' needs an integer 'n'")
            group.add_credit(consumer.consumer_id, count)
            return
        tags = frame.get("tags")
        if not isinstance(tags, list) or not all(isinstance(t, int) for t in tags):
            raise ProtocolError(f"{op!r} needs 'tags', a list of delivery tags")
        refused: list[dict[str, Any]] = []
        leases: dict[str, int] = {}
        for tag in tags:
            try:
                if op == "ack":
                    group.ack(tag, consumer.consumer_id, now)
                elif op == "nack":
                    delay = frame.get("delay_ms")
                    if delay is not None and (not isinstance(delay, int) or delay < 0):
                        raise InvalidArgumentError("delay_ms must be a non-negative integer")
                    reason = frame.get("reason")
                    group.nack(
                        tag,
                        consumer.consumer_id,
                        now,
                        delay_ms=delay,
                        reason=str(reason)[:1000] if reason is not None else None,
                    )
                elif op == "extend":
                    seconds = frame.get("seconds")
                    if not isinstance(seconds, int | float) or isinstance(seconds, bool):
                        raise InvalidArgumentError("'extend' needs a number of seconds")
                    leases[str(tag)] = group.extend(tag, consumer.consumer_id, now, seconds)
                else:
                    raise ProtocolError(f"a consumer connection cannot send {op!r}")
            except ProtocolError:
                raise
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

    def _return_unread(self, consumer: _Consumer, frame: dict[str, Any]) -> None:
        """A closing consumer lists in ``seen`` the deliveries its application got and did
        not settle; the rest it never read (prefetched, buffered or still in the socket),
        so they go back without counting an attempt."""
        seen = frame.get("seen")
        if consumer.group is None or seen is None:
            return  # no list: every delivery may have been processed, all count
        if not isinstance(seen, list) or not all(isinstance(t, int) for t in seen):
            raise ProtocolError("'seen' must be a list of delivery tags")
        group = self.groups[consumer.group].group
        slot = group.consumers.get(consumer.consumer_id)
        if slot is None:
            return
        now = self.clock.now_ms()
        for tag in sorted(slot.in_flight - set(seen), reverse=True):  # each goes to the front
            with contextlib.suppress(SpoolError):  # its lease ran out: that attempt counted
                group.release(tag, consumer.consumer_id, now)

    def _subscribe(self, consumer: _Consumer, frame: dict[str, Any], now: int) -> None:
        if consumer.group is not None:
            raise InvalidArgumentError("this connection already subscribed")
        group_name = frame.get("group")
        topics = frame.get("topics")
        if not isinstance(group_name, str) or not group_name or len(group_name) > 200:
            raise InvalidArgumentError("'group' must be a non-empty string of at most 200 chars")
        if not isinstance(topics, list) or not topics:
            raise InvalidArgumentError("'topics' must be a non-empty list of topic names")
        for topic in topics:
            check_topic(topic)
        start = frame.get("start", "earliest")
        if start not in ("earliest", "latest"):
            raise InvalidArgumentError("'start' must be 'earliest' or 'latest'")
        raw_settings = frame.get("settings") or {}
        if not isinstance(raw_settings, dict):
            raise InvalidArgumentError("'settings' must be an object")
        try:
            settings = GroupSettings(**raw_settings)
        except TypeError as exc:
            raise InvalidArgumentError(f"unknown group setting: {exc}") from None
        prefetch = frame.get("prefetch", 1)
        if not isinstance(prefetch, int) or not 1 <= prefetch <= 100_000:
            raise InvalidArgumentError("'prefetch' must be a whole number from 1 to 100000")
        runtime = self.groups.get(group_name)
        if runtime is None:
            runtime = self.groups[group_name] = _GroupRuntime(Group(group_name, settings))
            self._restore(runtime)
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
                key = (topic, partition)
                if key in group.partitions:
                    continue
                plog = self.store.partition_log(topic, partition)
                end = plog.log_end_offset()
                self.log_ends[key] = end
                begin = plog.log_start_offset()
                position = committed.get(key)
                if position is None:
                    position = end if start == "latest" else begin
                state = group.add_partition(topic, partition, min(position, end))
                state.committed_persisted = committed.get(key, -1)
                self._skipped(runtime, state, begin, now)  # committed below the log start
                runtime.readers[key] = Reader(plog, state.next_fetch)
        self._counter += 1
        consumer.consumer_id = f"{consumer.client_id}#{self._counter}"
        consumer.group = group_name
        self.by_id[consumer.consumer_id] = consumer
        group.add_consumer(consumer.consumer_id, prefetch, topics)
        if settings.auto_ack:
            group.add_credit(consumer.consumer_id, prefetch)
        self._send(
            consumer,
            {"op": "subscribed", "id": frame.get("id"), "consumer_id": consumer.consumer_id},
        )
        logger.info("consumer %s joined group %s on %s", consumer.consumer_id, group_name, topics)

    def _restore(self, runtime: _GroupRuntime) -> None:
        """Attempt counts of messages that were in flight when a broker stopped, so
        max_deliveries keeps counting across restarts."""
        rows = self.store.state.query(
            "SELECT topic, partition, offset, attempt FROM deliveries WHERE group_name = ?",
            (runtime.group.name,),
        )
        scheduled = {
            (t, p, o): due
            for t, p, o, due in self.store.state.query(
                "SELECT topic, partition, offset, due_at FROM scheduled WHERE group_name = ?",
                (runtime.group.name,),
            )
        }
        for topic, partition, offset, attempt in rows:
            runtime.restored[(topic, partition, offset)] = (
                attempt,
                scheduled.get((topic, partition, offset), 0),
            )

    def forget(self, client: _Consumer) -> None:
        self.by_id.pop(client.consumer_id, None)
        if client.group is not None:
            runtime = self.groups[client.group]
            for tag in list(runtime.group.consumers.get(client.consumer_id, _EMPTY).in_flight):
                pending = runtime.group.in_flight.get(tag)
                if pending is not None:
                    runtime.dirty[(pending.topic, pending.partition, pending.offset)] = pending
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
        for _ in range(1000):
            try:
                if not self.notices.poll(0):
                    return
                frame = protocol.decode(self.notices.recv_bytes(protocol.MAX_FRAME_BYTES))
            except (EOFError, OSError, SpoolError):
                return
            for topic, partition, end in frame.get("a", ()):
                key = (topic, partition)
                if end > self.log_ends.get(key, 0):
                    self.log_ends[key] = end

    def admin(self, request: dict[str, Any]) -> dict[str, Any]:
        action = request.get("action")
        if action == "describe_groups":
            return {"op": "ok", "groups": self.describe_groups()}
        if action == "reset_group":
            return {"op": "ok", **self.reset_group(request)}
        if action == "stats":
            return {"op": "ok", "stats": self.figures()}
        raise ProtocolError(f"unknown admin action {str(action)[:40]!r}")

    def describe_groups(self) -> dict[str, Any]:
        """Live view: per group, per partition: committed, log end, lag, in-flight, consumers."""
        described: dict[str, Any] = {}
        for name, runtime in self.groups.items():
            group = runtime.group
            in_flight = group.in_flight_by_partition()
            owners: dict[tuple[str, int], set[str]] = {}
            for pending in group.in_flight.values():
                if pending.consumer:
                    owners.setdefault((pending.topic, pending.partition), set()).add(
                        pending.consumer
                    )
            rows = []
            for key, state in sorted(group.partitions.items()):
                end = self.log_ends.get(key, 0)
                committed = state.committed()
                rows.append(
                    {
                        "topic": key[0],
                        "partition": key[1],
                        "committed": committed,
                        "log_end_offset": end,
                        "lag": max(0, end - committed),
                        "in_flight": in_flight.get(key, 0),
                        "consumers": sorted(owners.get(key, set())),
                    }
                )
            described[name] = {"consumers": sorted(group.consumers), "partitions": rows}
        return described

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
            self._checkpoint()
            del self.groups[name]
            for reader in runtime.readers.values():
                reader.close()  # the group starts afresh with new readers
        self.store.state.reset_group(name, new)
        return {"reset": len(new)}

    def figures(self) -> dict[str, Any]:
        return {
            **self.counts,
            "consumers": len(self.clients),
            "groups": len(self.groups),
            "in_flight": sum(len(rt.group.in_flight) for rt in self.groups.values()),
        }

    # -- persistence ------------------------------------------------------------------------------

    def _checkpoint(self) -> None:
        """Committed offsets and in-flight attempts to state.db, one transaction."""
        commits: list[tuple[str, dict[tuple[str, int], int]]] = []
        for name, runtime in self.groups.items():
            changed: dict[tuple[str, int], int] = {}
            for key, state in runtime.group.partitions.items():
                committed = state.committed()
                if committed != state.committed_persisted:
                    changed[key] = committed
                    state.committed_persisted = committed
            if changed:
                commits.append((name, changed))
        if not commits and not self._has_dirty():
            return
        timestamp = self.clock.now_ms()
        try:
            with self.store.state.write() as db:
                for name, changed in commits:
                    db.executemany(
                        "INSERT INTO group_offsets VALUES (?, ?, ?, ?, ?) "
                        "ON CONFLICT (group_name, topic, partition) DO UPDATE SET "
                        "committed_offset = excluded.committed_offset, "
                        "updated_at = excluded.updated_at",
                        [(name, t, p, o, timestamp) for (t, p), o in changed.items()],
                    )
                for name, runtime in self.groups.items():
                    upserts, deletes, schedules = [], [], []
                    for (topic, partition, offset), pending in runtime.dirty.items():
                        if pending.finished or pending.attempt == 0:
                            # Acked within one checkpoint interval: never written, so
                            # nothing to delete (the common case costs no SQL at all).
                            # Returned unread (attempt 0): nothing to remember either.
                            if pending.persisted:
                                deletes.append((name, topic, partition, offset))
                                pending.persisted = False
                            continue
                        pending.persisted = True
                        upserts.append(
                            (
                                name,
                                topic,
                                partition,
                                offset,
                                pending.consumer or "",
                                pending.attempt,
                                pending.delivered_at,
                                pending.lease_expires_at,
                            )
                        )
                        if pending.due_at > timestamp:
                            schedules.append(
                                (
                                    name,
                                    topic,
                                    partition,
                                    offset,
                                    pending.due_at,
                                    pending.attempt,
                                    pending.last_reason,
                                )
                            )
                    runtime.dirty.clear()
                    for table in ("deliveries", "scheduled"):
                        db.executemany(
                            f"DELETE FROM {table} WHERE group_name = ? AND topic = ? "
                            "AND partition = ? AND offset = ?",
                            deletes,
                        )
                    db.executemany(
                        "INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?)", upserts
                    )
                    db.executemany(
                        "INSERT OR REPLACE INTO scheduled VALUES (?, ?, ?, ?, ?, ?, ?)", schedules
                    )
        except SpoolError:
            logger.exception("checkpoint to state.db failed; will retry")
            for _, runtime in self.groups.items():
                for state in runtime.group.partitions.values():
                    state.committed_persisted = -1

    def _record_lag(self) -> None:
        for name, runtime in self.groups.items():
            for key, state in runtime.group.partitions.items():
                self.events.add_lag(
                    name, key[0], key[1], state.committed(), self.log_ends.get(key, 0)
                )

    def save(self) -> None:
        try:
            self._checkpoint()
        finally:
            self.events.flush(sync=True)
            self.events.close()
            for runtime in self.groups.values():
                for reader in runtime.readers.values():
                    reader.close()

    def close(self) -> None:
        for consumer in list(self.clients.values()):
            self._send(consumer, {"op": "closing"})
        super().close()


class _NoSlot:
    in_flight: frozenset[int] = frozenset()


_EMPTY = _NoSlot()
