"""browse: reading a topic from the store with no group, with starts, filters and bounds."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolmq import Store
from spoolmq.browse import BrowseCounts, Filters, Start, browse, parse_time
from spoolmq.clock import ManualClock
from spoolmq.errors import InvalidArgumentError, UnknownPartitionError, UnknownTopicError


@pytest.fixture
def clocked(data_dir: Path) -> Iterator[Store]:
    clock = ManualClock(1_000_000)
    store = Store(data_dir, clock=clock)
    store.create_topic("orders", partitions=2)
    # 10 records per partition, one ms apart, alternating partitions: timestamps interleave.
    for i in range(20):
        store.append(
            "orders",
            {"n": i, "customer": {"id": i % 5}, "items": [{"sku": f"S{i}"}]},
            key=f"k{i}",
            headers={"region": "eu" if i % 2 else "us"},
            tags=["big"] if i % 3 == 0 else [],
            partition=i % 2,
        )
        clock.advance(1)
    store.flush()
    yield store
    store.close()


def numbers(found: object) -> list[int]:
    return [f.record.value["n"] for f in found]  # type: ignore[attr-defined]


def test_all_partitions_merge_in_timestamp_order(clocked: Store) -> None:
    found = list(browse(clocked, "orders"))
    assert numbers(found) == list(range(20))
    assert [(f.partition, f.record.offset) for f in found[:4]] == [(0, 0), (1, 0), (0, 1), (1, 1)]


def test_starts(clocked: Store) -> None:
    one = [1]
    assert numbers(browse(clocked, "orders", partitions=one, start=Start("offset", 7))) == [
        15,
        17,
        19,
    ]
    assert numbers(browse(clocked, "orders", partitions=one, start=Start("from_end", 2))) == [
        17,
        19,
    ]
    assert list(browse(clocked, "orders", start=Start("latest"))) == []
    # Past the end or before the start is clamped, as kcat does.
    assert numbers(browse(clocked, "orders", partitions=[0], start=Start("from_end", 99))) == [
        0,
        2,
        4,
        6,
        8,
        10,
        12,
        14,
        16,
        18,
    ]
    assert list(browse(clocked, "orders", start=Start("offset", 1000))) == []
    # Record i was stored at 1_000_000 + i ms.
    assert numbers(browse(clocked, "orders", start=Start("time", 1_000_016))) == [16, 17, 18, 19]
    assert numbers(browse(clocked, "orders", partitions=[0], until=3)) == [0, 2, 4]


def test_filters(clocked: Store) -> None:
    def find(**kwargs: object) -> list[int]:
        return numbers(browse(clocked, "orders", filters=Filters.parse(**kwargs)))  # type: ignore[arg-type]

    assert find(key="k7") == [7]
    assert find(headers=["region=eu"]) == list(range(1, 20, 2))
    assert find(tags=["big"]) == [0, 3, 6, 9, 12, 15, 18]
    assert find(fields=["customer.id=3"]) == [3, 8, 13, 18]
    assert find(fields=["items.0.sku=S4"]) == [4]
    assert find(fields=["customer.id=3"], headers=["region=us"]) == [8, 18]
    assert find(fields=["customer.missing=3"]) == []
    assert find(key="nope") == []


def test_field_matching_is_typed() -> None:
    from spoolmq.browse import _field_equals

    value = {"id": 42, "text": "42", "ok": True, "one": 1, "none": None, "x": 1.5}
    assert _field_equals(value, ["id"], "42")
    assert _field_equals(value, ["text"], "42")
    assert _field_equals(value, ["ok"], "true")
    assert not _field_equals(value, ["one"], "true")
    assert not _field_equals(value, ["ok"], "1")
    assert _field_equals(value, ["none"], "null")
    assert _field_equals(value, ["x"], "1.5")
    assert not _field_equals(value, ["id"], "forty-two")


def test_json_text_values_are_searched(store: Store) -> None:
    store.create_topic("raw")
    store.append("raw", '{"customer": {"id": 42}}')
    store.append("raw", "not json {")
    store.append("raw", b"\x00\x01")
    got = list(browse(store, "raw", filters=Filters.parse(fields=["customer.id=42"])))
    assert [f.record.offset for f in got] == [0]


def test_limits_and_counts(clocked: Store) -> None:
    counts = BrowseCounts()
    got = numbers(
        browse(clocked, "orders", filters=Filters.parse(tags=["big"]), limit=2, counts=counts)
    )
    assert got == [0, 3]
    assert (counts.scanned, counts.matched, counts.truncated) == (4, 2, False)

    counts = BrowseCounts()
    got = numbers(
        browse(clocked, "orders", filters=Filters.parse(key="k15"), scan_limit=10, counts=counts)
    )
    assert got == []
    assert (counts.scanned, counts.matched, counts.truncated) == (10, 0, True)

    counts = BrowseCounts()
    assert numbers(browse(clocked, "orders", filters=Filters.parse(key="k15"), counts=counts)) == [
        15
    ]
    assert (counts.scanned, counts.truncated) == (20, False)


def test_is_lazy(clocked: Store) -> None:
    """A caller that stops early reads only what it took (plus the readers' batches)."""
    counts = BrowseCounts()
    stream = browse(clocked, "orders", counts=counts)
    next(stream)
    assert counts.scanned == 1
    stream.close()


def test_follow_sees_new_records(clocked: Store) -> None:
    waits = 0

    def follow() -> bool:
        nonlocal waits
        waits += 1
        if waits == 1:
            clocked.append("orders", {"n": 100}, partition=1)
            clocked.flush()
            return True
        return False

    got = numbers(browse(clocked, "orders", start=Start("latest"), follow=follow))
    assert got == [100]
    assert waits == 2


def test_bad_input(clocked: Store) -> None:
    with pytest.raises(InvalidArgumentError, match="NAME=VALUE"):
        Filters.parse(headers=["region"])
    with pytest.raises(InvalidArgumentError, match="dots"):
        Filters.parse(fields=["a..b=1"])
    with pytest.raises(InvalidArgumentError):
        Start("offset", -1)
    with pytest.raises(InvalidArgumentError):
        Start("sideways", 0)  # type: ignore[arg-type]
    with pytest.raises(UnknownPartitionError):
        list(browse(clocked, "orders", partitions=[2]))
    with pytest.raises(UnknownTopicError):
        list(browse(clocked, "missing"))
    with pytest.raises(InvalidArgumentError, match="ISO 8601"):
        parse_time("yesterday")


def test_parse_time(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_time("1970-01-01T00:00:01Z") == 1000
    assert parse_time("1970-01-01T01:00:01+01:00") == 1000
    assert parse_time("1969-01-01T00:00:00Z") == 0  # before anything stored: the start
    # A time without a zone: local time for what a person types (every command), UTC where
    # the page says its times are UTC (the console).
    monkeypatch.setenv("TZ", "Asia/Tokyo")  # UTC+9, no daylight saving
    time.tzset()
    try:
        assert parse_time("1970-01-01T09:00:01.5") == 1500
        assert parse_time("1970-01-01T00:00:01.5", zoneless="utc") == 1500
        # Nine hours before year 1 began: a ValueError from astimezone() it was.
        with pytest.raises(InvalidArgumentError, match="out of range"):
            parse_time("0001-01-01")
    finally:
        monkeypatch.undo()
        time.tzset()
