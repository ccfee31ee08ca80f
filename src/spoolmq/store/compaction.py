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


def compaction_due(size: int, kept: int | None, age_s: float, *, settle_s: float) -> bool:
    """Is a compacted topic of ``size`` bytes worth compacting now, when its last
    compaction left ``kept`` bytes ``age_s`` seconds ago (``kept`` None: never)?

    Compaction reads the whole topic, so it runs when what was written since is at least
    half of what was kept (Kafka's default ``min.cleanable.dirty.ratio``: the reading stays
    proportional to the writing), or, for a smaller change, once it is ``settle_s`` old.

    >>> compaction_due(1_000, None, 0, settle_s=30)      # never compacted
    True
    >>> compaction_due(1_400, 1_000, 5, settle_s=30)     # 40 % new, recent: wait
    False
    >>> compaction_due(1_500, 1_000, 5, settle_s=30)     # 50 % new
    True
    >>> compaction_due(1_100, 1_000, 30, settle_s=30)    # a small change, settled
    True
    >>> compaction_due(1_000, 1_000, 300, settle_s=30)   # nothing new
    False
    """
    if kept is None:
        return True
    dirty = size - kept
    return dirty > 0 and (dirty >= kept // 2 or age_s >= settle_s)
