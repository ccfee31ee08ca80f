"""Helpers shared by the analytics tests."""

from __future__ import annotations

import os
import shutil
import zlib
from typing import Any

import orjson
import pytest


def record_line(**fields: Any) -> str:
    """A segment line as the store writes it: the CRC-32 of the bytes before ``,"crc":``
    (docs/FORMAT.md), computed here independently of the store's code."""
    head = orjson.dumps(fields)[:-1]
    return (head + b',"crc":%d}' % zlib.crc32(head)).decode()


def need(program: str, package: str) -> str:
    """The program's path; skip when it is missing, but fail in CI (.ci/run installs it)."""
    found = shutil.which(program)
    if found is None:
        message = f"{program} is not installed (apt-get install {package})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: .ci/run installs it")
        pytest.skip(message)
    return found


_FRAMED_TYPES = ("delivered", "acked")


def _frame_line(events: list[dict[str, Any]]) -> dict[str, Any]:
    """One ``delivered`` or ``acked`` line of the frame shape for per-message events that
    share ts, type, group, consumer and reason: runs split where the topic, partition,
    attempt or contiguity changes; ``processing_ms`` in run order, left out for auto-ACKs;
    no key, published_at or bytes (the record has them)."""
    first = events[0]
    runs: list[list[Any]] = []
    for e in events:
        where = [e["topic"], e["partition"]]
        last = runs[-1] if runs else None
        if (
            last is not None
            and last[:2] == where
            and last[4] == e["attempt"]
            and last[2] + last[3] == e["offset"]
        ):
            last[3] += 1
        else:
            runs.append([*where, e["offset"], 1, e["attempt"]])
    line: dict[str, Any] = {
        "ts": first["ts"],
        "type": first["type"],
        "group": first["group"],
        "consumer": first["consumer"],
        "runs": runs,
    }
    if first.get("reason") is not None:
        line["reason"] = first["reason"]
    if first["type"] == "acked" and first.get("reason") != "auto_ack":
        line["processing_ms"] = [e["processing_ms"] for e in events]
    return line


def event_file(events: list[dict[str, Any]], shape: str = "old") -> bytes:
    """An events file (docs/FORMAT.md) holding ``events``, given one per message with the
    fields of the per-message shape, in the order written.

    ``shape`` "old" writes one line per event, as brokers before issue 10 do. "new" writes
    each stretch of consecutive ``delivered`` (or ``acked``) events with the same ts,
    group, consumer and reason as one frame line, as a broker writes a dispatched frame or
    an ACK frame; every other type stays one line per message. "mixed" writes every other
    such stretch in each shape.
    """
    if shape not in ("old", "new", "mixed"):
        raise ValueError(f"shape must be old, new or mixed, not {shape!r}")
    lines: list[dict[str, Any]] = []
    stretch: list[dict[str, Any]] = []
    stretches = 0

    def close() -> None:
        nonlocal stretches
        if stretch:
            framed = shape == "new" or (shape == "mixed" and stretches % 2 == 0)
            lines.extend([_frame_line(stretch)] if framed else stretch)
            stretches += 1
            stretch.clear()

    def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return all(a.get(k) == b.get(k) for k in ("ts", "type", "group", "consumer", "reason"))

    for e in events:
        if stretch and not same(stretch[0], e):
            close()
        if e["type"] in _FRAMED_TYPES:
            stretch.append(e)
        else:
            close()
            lines.append(e)
    close()
    return b"".join(orjson.dumps(line) + b"\n" for line in lines)
