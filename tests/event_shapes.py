"""Reading events/ lines of both shapes as one event per message, for tests.

A ``delivered``/``acked`` line of the frame shape (``runs``, docs/FORMAT.md) stands for
every message of its runs; a line of the old shape (``offset``) or of any other type is one
message already.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import orjson


def per_message(lines: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each event line as one dict per message it covers: a run line's messages get
    ``topic``, ``partition``, ``offset``, ``attempt`` and their own ``processing_ms``."""
    found: list[dict[str, Any]] = []
    for line in lines:
        runs = line.get("runs")
        if runs is None:
            found.append(line)
            continue
        times = line.get("processing_ms")
        position = 0
        for topic, partition, first, count, attempt in runs:
            for offset in range(first, first + count):
                message = {k: v for k, v in line.items() if k not in ("runs", "processing_ms")}
                message.update(topic=topic, partition=partition, offset=offset, attempt=attempt)
                if line["type"] == "acked":
                    message["processing_ms"] = 0 if times is None else times[position]
                found.append(message)
                position += 1
    return found


def events_of(data_dir: Path, kind: str) -> list[dict[str, Any]]:
    """The delivery events of one type the ConsumerBroker wrote (events/), oldest file
    first, one per message (a line of runs stands for each message of its runs)."""
    found = []
    for path in sorted((data_dir / "events").glob("date=*/*.jsonl")):
        lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
        found += [e for e in per_message(lines) if e["type"] == kind]
    return found
