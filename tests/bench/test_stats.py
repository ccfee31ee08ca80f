"""The pure figures of `spoolmq.stats`, against values worked out by hand."""

from __future__ import annotations

import math

import pytest

from spoolmq.stats import (
    count_ids,
    duplicates_and_missing,
    micros_each,
    per_second,
    percentile,
    ratio,
)


@pytest.mark.parametrize(
    ("fraction", "expected"),
    # The nearest-rank example of the Wikipedia article "Percentile": rank ceil(P/100 * 5).
    [(0.05, 15.0), (0.30, 20.0), (0.40, 20.0), (0.50, 35.0), (1.0, 50.0)],
)
def test_percentile_is_nearest_rank(fraction: float, expected: float) -> None:
    assert percentile([35.0, 20.0, 50.0, 15.0, 40.0], fraction) == expected


def test_percentile_of_one_to_a_hundred() -> None:
    values = [float(v) for v in range(100, 0, -1)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 0.999) == 100.0  # rank ceil(99.9) = 100
    assert percentile(iter(values), 0.01) == 1.0  # any iterable, read once


def test_percentile_edges() -> None:
    assert percentile([3.0], 0.999) == 3.0
    assert percentile([2.0, 1.0], 0.0) == 1.0  # rank 0 is clamped to the smallest
    assert math.isnan(percentile([], 0.5))


def test_rates_costs_and_ratios() -> None:
    assert per_second(500, 0.25) == 2000.0
    assert per_second(3, 0.0) == pytest.approx(
        3e9
    )  # a zero time counts as a nanosecond, not a crash
    assert micros_each(0.5, 1000) == pytest.approx(500.0)  # 0.5 s over 1000 = 500 µs each
    assert ratio(3.0, 4.0) == 0.75
    assert ratio(1.0, 0.0) == pytest.approx(1e9)


def test_count_ids_finds_duplicates_and_missing() -> None:
    assert count_ids([0, 1, 1, 3], 5) == {"received": 4, "duplicates": 1, "missing": 2}
    assert count_ids(iter([2, 2, 2]), 3) == {"received": 3, "duplicates": 2, "missing": 2}
    assert count_ids([], 0) == {"received": 0, "duplicates": 0, "missing": 0}


def test_ids_outside_the_expected_range_are_received_but_fill_no_gap() -> None:
    assert count_ids([5, 6], 2) == {"received": 2, "duplicates": 0, "missing": 2}


def test_duplicates_and_missing_is_the_exactly_once_check() -> None:
    assert duplicates_and_missing([1, 0, 2], 3) == {"duplicates": 0, "missing": 0}
    assert duplicates_and_missing([0, 0, 2], 4) == {"duplicates": 1, "missing": 2}
