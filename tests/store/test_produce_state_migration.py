"""state.db schema version 2: version 1's producer sequences become runs, partitions are
marked where version 1 left them, and an embedded append still sees a broker's runs."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from spoolmq import Store
from spoolmq.store import state as state_module
from spoolmq.store.state import RunRow, SequenceRow


def make_version_1(data_dir: Path) -> None:
    """A state.db as spoolmq with schema version 1 left it."""
    data_dir.mkdir(parents=True)
    db = sqlite3.connect(data_dir / "state.db")
    db.executescript(state_module._MIGRATIONS[1])
    rows = [SequenceRow("a", s, "t", 0, 100 + s) for s in range(5)]  # one run
    rows += [SequenceRow("a", s, "t", 1, 2 + s) for s in range(5, 8)]  # another partition
    rows += [SequenceRow("a", 9, "t", 1, 20), SequenceRow("a", 10, "t", 1, 30)]  # gaps
    rows += [SequenceRow("b", 0, "u", 0, 0)]
    db.executemany("INSERT INTO producer_sequences VALUES (?, ?, ?, ?, ?)", rows)
    db.executemany(
        "INSERT INTO partitions VALUES (?, ?, 0, ?, 0)", [("t", 0, 105), ("t", 1, 31), ("u", 0, 1)]
    )
    db.execute("INSERT INTO producers VALUES ('a', 10, 0)")
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()


def test_version_1_sequences_become_runs_and_partitions_are_marked(data_dir: Path) -> None:
    make_version_1(data_dir)
    with Store(data_dir) as store:
        assert store.state.query("PRAGMA user_version") == [(state_module.SCHEMA_VERSION,)]
        runs = sorted(store.state.load_runs())
        assert runs == [
            RunRow("a", 0, 5, "t", 0, 100, -1),
            RunRow("a", 5, 3, "t", 1, 7, -1),
            RunRow("a", 9, 1, "t", 1, 20, -1),
            RunRow("a", 10, 1, "t", 1, 30, -1),
            RunRow("b", 0, 1, "u", 0, 0, -1),
        ]
        assert store.state.producer_marks() == {("t", 0): 105, ("t", 1): 31, ("u", 0): 1}
        # What version 1 knew is still found by an embedded append's lookup.
        found = store.state.find_sequences([("a", 3), ("a", 6), ("a", 8), ("a", 10)])
        assert found == {
            ("a", 3): SequenceRow("a", 3, "t", 0, 103),
            ("a", 6): SequenceRow("a", 6, "t", 1, 8),
            ("a", 10): SequenceRow("a", 10, "t", 1, 30),
        }
        assert store.state.last_sequence("a") == 10


def test_an_embedded_append_sees_a_brokers_runs(store: Store) -> None:
    store.create_topic("t", partitions=2)
    first = store.append("t", "x", partition=1, producer_id="p", sequence=0)
    store.state.save_runs([RunRow("p", 1, 3, "t", 1, first.offset + 1, 42)], {("t", 1): 4})
    again = store.append("t", "x", partition=0, producer_id="p", sequence=2)
    assert (again.partition, again.offset, again.duplicate) == (1, first.offset + 2, True)
    assert store.state.producer_marks() == {("t", 1): 4}
    store.state.save_runs([], {("t", 1): 2})  # a mark never moves down
    assert store.state.producer_marks() == {("t", 1): 4}
