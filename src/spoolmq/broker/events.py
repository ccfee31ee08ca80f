"""Appending delivery events to ``events/date=<day>/<start ms>-<pid>.jsonl`` for analytics."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import orjson

from spoolmq.broker.delivery import Event, RunEvent
from spoolmq.broker.group_view import lag
from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.files import FILE_MODE, make_private_dirs, write_all
from spoolmq.store.record import key_fields, record_offset_and_timestamp
from spoolmq.types import EventType

_ROLL_BYTES = 64 * 1024 * 1024
_MAX_UNWRITTEN_BYTES = 16 * 1024 * 1024

logger = logging.getLogger("spoolmq.events")


class EventLog:
    """Buffered, append-only; ``flush()`` writes the buffer with one ``write``."""

    def __init__(self, data_dir: Path, *, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self.root = data_dir / "events"
        self._buffer: list[bytes] = []
        self._fd = -1
        self._day = ""
        self._size = 0
        self._failing = False
        self.dropped = 0

    def add(self, event: Event | RunEvent, group: str) -> None:
        if type(event) is RunEvent:
            self.add_runs(event, group)
            return
        assert isinstance(event, Event)
        line = event.line
        record: dict[str, Any] = {
            "ts": event.ts,
            "type": event.type,
            "group": group,
            "topic": event.topic,
            "partition": event.partition,
            "offset": event.offset,
            **key_fields(event.key),
            "consumer": event.consumer,
            "attempt": event.attempt,
            "published_at": None if line is None else record_offset_and_timestamp(line)[1],
            "bytes": None if line is None else len(line),
            "processing_ms": event.processing_ms,
            "reason": event.reason,
        }
        self._buffer.append(orjson.dumps(record) + b"\n")

    def add_runs(self, event: RunEvent, group: str) -> None:
        """One line for a dispatched frame (``delivered``) or an ACK frame (``acked``):
        runs of ``[topic, partition, first offset, count, attempt]`` (docs/FORMAT.md)."""
        record: dict[str, Any] = {
            "ts": event.ts,
            "type": event.type,
            "group": group,
            "consumer": event.consumer,
            "runs": [
                [state.topic, state.partition, first, count, attempt]
                for state, first, count, attempt in event.runs
            ],
        }
        if event.processing_ms is not None:
            record["processing_ms"] = event.processing_ms
        if event.reason is not None:
            record["reason"] = event.reason
        self._buffer.append(orjson.dumps(record) + b"\n")

    def add_lag(self, group: str, topic: str, partition: int, committed: int, end: int) -> None:
        self._add_partition_event(
            EventType.LAG,
            group,
            topic,
            partition,
            committed=committed,
            log_end_offset=end,
            lag=lag(committed, end),
        )

    def add_skipped(self, group: str, topic: str, partition: int, first: int, begin: int) -> None:
        """Offsets ``[first, begin)`` were deleted by retention before ``group`` read them."""
        self._add_partition_event(
            EventType.SKIPPED,
            group,
            topic,
            partition,
            offset=first,
            committed=begin,
            reason="deleted by retention before the group read them",
        )

    def _add_partition_event(
        self, kind: EventType, group: str, topic: str, partition: int, **fields: Any
    ) -> None:
        """An event about a group's position in a partition rather than about one message."""
        record = {
            "ts": self._clock.now_ms(),
            "type": kind,
            "group": group,
            "topic": topic,
            "partition": partition,
            **fields,
        }
        self._buffer.append(orjson.dumps(record) + b"\n")

    def flush(self, *, sync: bool = False) -> None:
        if not self._buffer:
            return
        data = b"".join(self._buffer)
        self._buffer.clear()
        try:
            day = time.strftime("%Y-%m-%d", time.gmtime(self._clock.now_ms() / 1000))
            if self._fd < 0 or day != self._day or self._size >= _ROLL_BYTES:
                self._open(day)
            write_all(self._fd, data)
            if sync:
                os.fsync(self._fd)
        except OSError as exc:
            # Events are for analytics: a full disk must not stop deliveries. Cut a partial
            # write off (the file keeps whole lines) and keep the events for the next try,
            # up to a bound.
            if self._fd >= 0:
                with contextlib.suppress(OSError):
                    os.ftruncate(self._fd, self._size)
            if len(data) <= _MAX_UNWRITTEN_BYTES:
                self._buffer.append(data)
            else:
                self.dropped += data.count(b"\n")
            if not self._failing:
                logger.error("cannot write delivery events (%s); retrying", exc)
            self._failing = True
            return
        if self._failing:
            logger.warning("delivery events are written again (%d dropped meanwhile)", self.dropped)
        self._failing = False
        self._size += len(data)

    def _open(self, day: str) -> None:
        self.close()
        directory = self.root / f"date={day}"
        make_private_dirs(directory)
        name = f"{self._clock.now_ms()}-{os.getpid()}.jsonl"
        self._fd = os.open(directory / name, os.O_CREAT | os.O_WRONLY | os.O_APPEND, FILE_MODE)
        self._day = day
        self._size = 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
