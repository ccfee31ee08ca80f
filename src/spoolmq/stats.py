"""The figures ``spoolmq bench`` and ``spoolmq demo`` report, as pure functions: percentiles,
rates, cost per message, ratios, and exact counts of duplicated and missing message ids."""

from __future__ import annotations

import math
from collections.abc import Iterable


def percentile(values: Iterable[float], fraction: float) -> float:
    """Nearest-rank percentile (0 < fraction <= 1) of unsorted values; NaN for none.

    >>> percentile([4.0, 1.0, 3.0, 2.0], 0.5)
    2.0
    """
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))]


def per_second(count: float, seconds: float) -> float:
    """``count`` things in ``seconds``, per second (a zero time counts as a nanosecond)."""
    return count / max(1e-9, seconds)


def micros_each(seconds: float, count: int) -> float:
    """``seconds`` spent on ``count`` things, in microseconds per thing (CPU per message)."""
    return seconds / count * 1e6


def ratio(numerator: float, denominator: float) -> float:
    """``numerator / denominator``, with a zero denominator counted as 1e-9."""
    return numerator / max(1e-9, denominator)


def count_ids(ids: Iterable[int], expected: int) -> dict[str, int]:
    """How many ids arrived, how many of them were duplicates, and how many of the ids
    ``0 .. expected-1`` never arrived.

    >>> count_ids([0, 2, 2], 4)
    {'received': 3, 'duplicates': 1, 'missing': 2}
    """
    seen: set[int] = set()
    received = duplicates = 0
    for message_id in ids:
        received += 1
        if message_id in seen:
            duplicates += 1
        seen.add(message_id)
    missing = sum(1 for i in range(expected) if i not in seen)
    return {"received": received, "duplicates": duplicates, "missing": missing}


def duplicates_and_missing(ids: Iterable[int], expected: int) -> dict[str, int]:
    """The two figures of :func:`count_ids` that say whether delivery was exactly once.

    >>> duplicates_and_missing([1, 1], 2)
    {'duplicates': 1, 'missing': 1}
    """
    counted = count_ids(ids, expected)
    return {"duplicates": counted["duplicates"], "missing": counted["missing"]}
