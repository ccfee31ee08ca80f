"""Retention decisions: which closed segments to delete. Pure functions, no I/O."""

from __future__ import annotations

from collections.abc import Sequence

from spoolmq.store.segment import SegmentInfo


def segments_to_delete(
    segments: Sequence[SegmentInfo], *, now_ms: int, retention_ms: int, retention_bytes: int
) -> list[int]:
    """Base offsets of the segments retention removes, oldest first.

    ``segments`` are oldest first and the last one is the active segment, which is never
    deleted. A segment goes when its newest record is older than ``retention_ms``, or while
    the partition without it would still be at least ``retention_bytes`` (-1 disables
    either rule). Deletion is always a prefix, so the log start only moves forward and
    offsets are never reused.

    >>> old, mid, active = (SegmentInfo(0, 100, 1_000), SegmentInfo(10, 100, 5_000),
    ...                     SegmentInfo(20, 10, 9_000))
    >>> segments_to_delete([old, mid, active], now_ms=10_000, retention_ms=6_000,
    ...                    retention_bytes=-1)
    [0]
    >>> segments_to_delete([old, mid, active], now_ms=10_000, retention_ms=-1,
    ...                    retention_bytes=100)  # 110 bytes left; without `mid`, 10
    [0]
    >>> segments_to_delete([old, mid, active], now_ms=10_000, retention_ms=-1,
    ...                    retention_bytes=10)
    [0, 10]
    """
    closed = list(segments[:-1])
    total = sum(segment.size for segment in segments)
    doomed: list[int] = []
    for segment in closed:
        too_old = retention_ms >= 0 and (
            # an empty closed segment (compaction removed all of it) holds nothing to keep
            segment.size == 0
            or (segment.newest_timestamp >= 0 and now_ms - segment.newest_timestamp > retention_ms)
        )
        too_big = retention_bytes >= 0 and total - segment.size >= retention_bytes
        if not (too_old or too_big):
            break
        doomed.append(segment.base)
        total -= segment.size
    return doomed
