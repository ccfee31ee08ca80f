"""Compaction decisions: which records of a compacted topic survive. Pure functions."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple


class KeyedEntry(NamedTuple):
    offset: int
    timestamp: int
    key: str | None
    tombstone: bool


def latest_offsets(entries: Iterable[KeyedEntry]) -> dict[str, int]:
    """The newest offset of every key."""
    latest: dict[str, int] = {}
    for entry in entries:
        if entry.key is not None:
            latest[entry.key] = entry.offset
    return latest


def keep_record(
    entry: KeyedEntry, latest: dict[str, int], *, now_ms: int, tombstone_retention_ms: int
) -> bool:
    """Does compaction keep this record?

    Keyless records are kept (there is nothing newer to replace them). A keyed record is
    kept only if it is the newest for its key; a tombstone (``None`` value) that is the
    newest is kept until it is older than ``tombstone_retention_ms``, so readers that are
    behind still see the delete.

    >>> latest = {"a": 5, "b": 3}
    >>> keep_record(KeyedEntry(1, 0, "a", False), latest, now_ms=10, tombstone_retention_ms=5)
    False
    >>> keep_record(KeyedEntry(5, 0, "a", False), latest, now_ms=10, tombstone_retention_ms=5)
    True
    >>> keep_record(KeyedEntry(3, 0, "b", True), latest, now_ms=10, tombstone_retention_ms=5)
    False
    >>> keep_record(KeyedEntry(3, 8, "b", True), latest, now_ms=10, tombstone_retention_ms=5)
    True
    """
    if entry.key is None:
        return True
    if latest.get(entry.key) != entry.offset:
        return False
    if entry.tombstone:
        return tombstone_retention_ms < 0 or now_ms - entry.timestamp <= tombstone_retention_ms
    return True
