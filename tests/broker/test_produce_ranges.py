"""The PublisherBroker's producer ranges: a retry is found wherever its first copy went,
runs merge as they go on, what is saved is each run once, and old runs are forgotten."""

from __future__ import annotations

from spoolmq.broker.producer_ranges import ProducerRanges, StoredAt
from spoolmq.store.state import RunRow


def test_a_sequence_is_found_in_its_run_on_any_partition() -> None:
    ranges = ProducerRanges()
    ranges.add(RunRow("p", 0, 10, "t", 1, 100, 5))
    ranges.add(RunRow("p", 10, 5, "t", 0, 7, 6))
    ranges.add(RunRow("q", 0, 3, "u", 2, 0, 7))
    assert ranges.find("p", 3) == StoredAt("t", 1, 103, 5)
    assert ranges.find("p", 14) == StoredAt("t", 0, 11, 6)
    assert ranges.find("p", 15) is None
    assert ranges.find("q", 2) == StoredAt("u", 2, 2, 7)
    assert ranges.find("r", 0) is None
    assert (ranges.last("p"), ranges.last("q"), ranges.last("r")) == (14, 2, -1)


def test_runs_stored_out_of_order_are_kept_sorted() -> None:
    """Frames of one producer can be stored out of their order (a failed partition's frame
    retried later): lookups still find each."""
    ranges = ProducerRanges()
    ranges.add(RunRow("p", 20, 10, "t", 0, 0, 1))
    ranges.add(RunRow("p", 0, 10, "t", 1, 0, 1))
    ranges.add(RunRow("p", 10, 10, "t", 0, 10, 2))
    assert [ranges.find("p", s) for s in (5, 15, 25)] == [
        StoredAt("t", 1, 5, 1),
        StoredAt("t", 0, 15, 2),
        StoredAt("t", 0, 5, 1),
    ]
    assert ranges.last("p") == 29


def test_records_read_back_one_by_one_make_one_run_saved_once() -> None:
    ranges = ProducerRanges()
    for sequence in range(5):
        ranges.add(RunRow("p", sequence, 1, "t", 0, 40 + sequence, 9))
    assert ranges.unsaved() == [RunRow("p", 0, 5, "t", 0, 40, 9)]
    assert len(ranges) == 1
    # A run saved before, then going on: saved again whole (same first sequence: a row
    # replaced), not as a second row.
    ranges.add(RunRow("p", 5, 2, "t", 0, 45, 9))
    assert ranges.unsaved() == [RunRow("p", 0, 7, "t", 0, 40, 9)]
    # Not contiguous in offsets: a new run.
    ranges.add(RunRow("p", 7, 1, "t", 0, 50, 9))
    assert ranges.unsaved() == [RunRow("p", 7, 1, "t", 0, 50, 9)]


def test_saved_runs_are_not_saved_again_and_a_failed_save_is_retried() -> None:
    ranges = ProducerRanges()
    ranges.add_all([RunRow("p", 0, 4, "t", 0, 0, 1)])
    assert ranges.unsaved() == []
    assert ranges.find("p", 3) == StoredAt("t", 0, 3, 1)
    ranges.add(RunRow("p", 10, 1, "t", 0, 10, 2))
    failed = ranges.unsaved()
    ranges.add(RunRow("p", 11, 1, "t", 1, 0, 3))
    ranges.requeue(failed)
    assert ranges.unsaved() == [RunRow("p", 10, 1, "t", 0, 10, 2), RunRow("p", 11, 1, "t", 1, 0, 3)]


def test_runs_far_below_the_newest_sequence_are_forgotten() -> None:
    ranges = ProducerRanges(keep=100)
    for n in range(200):
        ranges.add(RunRow("p", n * 10, 10, "t", n % 2, n * 10, n))
    assert ranges.find("p", 0) is None  # more than 2 x keep below the newest
    assert ranges.find("p", 1_990) == StoredAt("t", 1, 1_990, 199)
    assert ranges.find("p", 1_900) is not None  # within keep
    assert len(ranges) < 200
