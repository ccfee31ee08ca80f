"""Helpers shared by the analytics tests."""

from __future__ import annotations

import zlib
from typing import Any

import orjson


def record_line(**fields: Any) -> str:
    """A segment line as the store writes it: the CRC-32 of the bytes before ``,"crc":``
    (docs/FORMAT.md), computed here independently of the store's code."""
    head = orjson.dumps(fields)[:-1]
    return (head + b',"crc":%d}' % zlib.crc32(head)).decode()
