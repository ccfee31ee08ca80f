"""Idempotent appends: one (producer_id, sequence) is stored once."""

from __future__ import annotations

from pathlib import Path

import pytest

from spoolmq import Message, Store
from spoolmq.errors import StorageError
from spoolmq.store.state import StateDB


def test_a_repeat_is_answered_with_the_first_offset(store: Store) -> None:
    store.append("t", "other")
    first = store.append("t", {"n": 1}, producer_id="p1", sequence=7)
    again = store.append("t", {"n": 1}, producer_id="p1", sequence=7)
    other_producer = store.append("t", {"n": 1}, producer_id="p2", sequence=7)
    assert (first.offset, first.duplicate) == (1, False)
    assert (again.offset, again.duplicate) == (1, True)
    assert (other_producer.offset, other_producer.duplicate) == (2, False)
    assert [r.offset for r in store.reader("t", 0)] == [0, 1, 2]
    assert store.state.last_sequence("p1") == 7


def test_a_repeat_sent_to_another_partition_is_answered_with_the_first_copy(store: Store) -> None:
    # A retry goes round-robin, so it may land on another partition than its first copy.
    store.create_topic("two", partitions=2)
    store.append("two", "filler", partition=0)
    first = store.append("two", {"n": 1}, partition=1, producer_id="p", sequence=3)
    again = store.append("two", {"n": 1}, partition=0, producer_id="p", sequence=3)
    assert (first.partition, first.offset, first.duplicate) == (1, 0, False)
    assert (again.partition, again.offset, again.duplicate) == (1, 0, True)
    assert [r.value for r in store.reader("two", 0)] == ["filler"]


def test_repeats_inside_one_batch(store: Store) -> None:
    batch = [Message(i, producer_id="p", sequence=s) for i, s in enumerate([1, 2, 1, 3, 2])]
    positions = store.append_batch("t", batch)
    assert [(p.offset, p.duplicate) for p in positions] == [
        (0, False),
        (1, False),
        (0, True),
        (2, False),
        (1, True),
    ]
    assert [r.value for r in store.reader("t", 0)] == [0, 1, 3]


@pytest.mark.parametrize("reopen", [True, False])
def test_crash_between_segment_write_and_sqlite(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch, reopen: bool
) -> None:
    store = Store(data_dir)
    store.append("t", "before", producer_id="p", sequence=1)

    def crash(self: StateDB, rows: object) -> None:
        raise StorageError("simulated crash before the sequences were recorded")

    with monkeypatch.context() as patch:
        patch.setattr(StateDB, "record_sequences", crash)
        with pytest.raises(StorageError):
            store.append_batch("t", [Message("a", producer_id="p", sequence=s) for s in (2, 3)])
    assert store.state.last_sequence("p") == 1  # SQLite never heard of 2 and 3
    if reopen:
        store.close()
        store = Store(data_dir)
    retried = store.append_batch("t", [Message("a", producer_id="p", sequence=s) for s in (2, 3)])
    assert [(p.offset, p.duplicate) for p in retried] == [(1, True), (2, True)]
    assert [r.offset for r in store.reader("t", 0)] == [0, 1, 2]
    store.close()
