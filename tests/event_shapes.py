"""Reading events/ lines of both shapes as one event per message, for tests.

A ``delivered``/``acked`` line of the frame shape (``runs``, docs/FORMAT.md) stands for
every message of its runs; a line of the old shape (``offset``) or of any other type is one
message already.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


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
