"""The last hour, per minute, read back from the files: so a chart survives a restart of
the console (and of the broker) instead of starting empty.

Deliveries, ACKs, NACKs, dead letters and expiries come from ``events/`` (docs/FORMAT.md):
a frame line (``runs``) counts the messages of its runs, a message line (``offset``) counts
one; a torn or foreign line is skipped, as every reader of those files does. Publishes come
from the logs themselves: the offset at each minute boundary (a bisection of the sparse
index, :meth:`Store.offset_for_timestamp`) minus the one before is how many records were
written in that minute, without reading them. Group lag comes from the periodic ``lag``
snapshots.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import orjson

from spoolmq.store import Store

MINUTE_MS = 60_000
COUNTED = ("delivered", "acked", "nacked", "dead_lettered", "expired")


def _event_files(data: Path, since_ms: int) -> list[Path]:
    """The events files that can hold lines at or after ``since_ms``: those of the days
    from then to now, whose start (their name) is not after now."""
    root = data / "events"
    day = dt.datetime.fromtimestamp(since_ms / 1000, dt.UTC).date()
    today = dt.datetime.now(dt.UTC).date()
    files = []
    while day <= today:
        folder = root / f"date={day.isoformat()}"
        if folder.is_dir():
            files += sorted(folder.glob("*.jsonl"))
        day += dt.timedelta(days=1)
    return files


def _lines_since(path: Path, since_ms: int) -> list[dict[str, Any]]:
    """The parsed lines of ``path`` at or after ``since_ms`` (a file is small: the broker
    rolls them by size)."""
    try:
        if os.stat(path).st_mtime * 1000 < since_ms:
            return []  # nothing written to it in the window
        raw = path.read_bytes()
    except OSError:
        return []
    found = []
    for line in raw.splitlines():
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue  # a torn last line
        if isinstance(event, dict) and isinstance(event.get("ts"), int) and event["ts"] >= since_ms:
            found.append(event)
    return found


def _messages_in(event: dict[str, Any]) -> int:
    runs = event.get("runs")
    if isinstance(runs, list):
        return sum(
            r[3]
            for r in runs
            if isinstance(r, list) and len(r) == 5 and isinstance(r[3], int) and r[3] > 0
        )
    return 1


def last_hour(data: Path, *, minutes: int = 60, now_ms: int | None = None) -> dict[str, Any]:
    """Per-minute counts for the overview chart, per-group lag for the groups chart, and
    when each consumer last had a delivery or an ACK in the window: ``{"minutes": [start
    ms...], "series": {name: [count...]}, "lag": {group: [lag|None...]}, "last_seen":
    {consumer: ms}}``."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    first = (now // MINUTE_MS - minutes + 1) * MINUTE_MS
    starts = [first + i * MINUTE_MS for i in range(minutes)]
    series = {name: [0] * minutes for name in ("published", *COUNTED)}
    lag_parts: dict[str, dict[int, dict[tuple[str, int], int]]] = defaultdict(dict)
    last_seen: dict[str, int] = {}
    for path in _event_files(data, first):
        for event in _lines_since(path, first):
            slot = (event["ts"] - first) // MINUTE_MS
            if not 0 <= slot < minutes:
                continue
            kind = event.get("type")
            consumer = event.get("consumer")
            if isinstance(consumer, str) and event["ts"] > last_seen.get(consumer, 0):
                last_seen[consumer] = event["ts"]
            if kind in COUNTED:
                series[str(kind)][slot] += _messages_in(event)
            elif kind == "lag" and isinstance(event.get("lag"), int):
                key = (str(event.get("topic")), int(event.get("partition") or 0))
                lag_parts[str(event.get("group"))].setdefault(slot, {})[key] = event["lag"]
    with Store(data) as store:
        for name, config in store.topics().items():
            for p in range(config.partitions):
                previous = store.offset_for_timestamp(name, p, first)
                for i, start in enumerate(starts):
                    here = store.offset_for_timestamp(name, p, start + MINUTE_MS)
                    series["published"][i] += here - previous
                    previous = here
    lag = {
        group: [sum(slots[i].values()) if i in slots else None for i in range(minutes)]
        for group, slots in sorted(lag_parts.items())
    }
    return {"minutes": starts, "series": series, "lag": lag, "last_seen": last_seen}
