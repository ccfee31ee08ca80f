"""Pruning the idempotence sequences keeps each producer's newest window and forgets idle
producers."""

from __future__ import annotations

from spoolmq import Store
from spoolmq.clock import ManualClock
from spoolmq.store.state import SequenceRow

HOUR_MS = 3_600_000


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


def test_prune_forgets_producers_idle_longer_than_idle_ms(store: Store, clock: ManualClock) -> None:
    """Idleness is measured on the store's clock: a producer last heard from more than
    ``idle_ms`` ago is forgotten with all its sequences; one heard from since is kept."""
    store.state.record_sequences([SequenceRow("idle", 1, "t", 0, 0)])
    clock.advance(HOUR_MS)
    store.state.record_sequences([SequenceRow("busy", 1, "t", 0, 1)])
    clock.advance(HOUR_MS)
    assert store.state.prune_sequences(idle_ms=HOUR_MS + 1) == 0  # none below any window
    assert store.state.last_sequence("idle") is None
    assert store.state.last_sequence("busy") == 1
    assert set(store.state.find_sequences([("idle", 1), ("busy", 1)])) == {("busy", 1)}
