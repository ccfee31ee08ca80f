"""Pruning the idempotence sequences keeps each producer's newest window."""

from __future__ import annotations

from spoolmq import Store
from spoolmq.store.state import SequenceRow


def test_prune_keeps_the_newest_window_per_producer(store: Store) -> None:
    rows = [SequenceRow("a", s, "t", 0, s) for s in range(50)]
    rows += [SequenceRow("b", s, "t", 0, 100 + s) for s in range(5)]
    store.state.record_sequences(rows)
    removed = store.state.prune_sequences(keep=10)
    assert removed == 39  # producer a: sequences more than 10 below its newest (49), 0..38
    found = store.state.find_sequences([("a", s) for s in range(50)] + [("b", s) for s in range(5)])
    assert sorted(s for p, s in found if p == "a") == list(range(39, 50))
    assert sorted(s for p, s in found if p == "b") == list(range(5))
    # a retry inside the window is still answered with its first offset
    assert found[("a", 45)].offset == 45
