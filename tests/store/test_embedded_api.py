"""The embedded API as the README shows it."""

from __future__ import annotations

from spoolmq import Store


def test_round_robin_then_key_then_read(store: Store) -> None:
    store.create_topic("orders", partitions=2)
    partitions = [store.append("orders", {"order_id": i}).partition for i in range(4)]
    assert partitions == [0, 1, 0, 1]
    keyed = {store.append("orders", {"n": i}, key="customer-7").partition for i in range(5)}
    assert len(keyed) == 1
    reader = store.reader("orders", partition=0)
    first = reader.poll()
    assert first is not None
    assert (first.offset, first.value) == (0, {"order_id": 0})
