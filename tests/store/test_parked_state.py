"""state.db schema version 5: the ``parked`` table of messages a group holds outside its
window until they are due: saved with a checkpoint, read back in due order after a
position, never replaced by a record read again, and gone with their group or topic."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from spoolmq import Store
from spoolmq.store import state as state_module
from spoolmq.store.state import DeliveryKey, ParkedRow
from spoolmq.types import TopicPartition


def park(store: Store, *rows: ParkedRow, unparked: tuple[DeliveryKey, ...] = ()) -> None:
    store.state.checkpoint(
        committed={}, deliveries=[], scheduled=[], finished=[], parked=rows, unparked=unparked
    )


def test_version_4_gains_the_parked_table_and_keeps_its_offsets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = sqlite3.connect(data / "state.db")
    for version in (1, 2, 3, 4):
        db.executescript(state_module._MIGRATIONS[version])
    db.execute("INSERT INTO group_offsets VALUES ('g', 't', 0, 7, 0)")
    db.execute("PRAGMA user_version = 4")
    db.commit()
    db.close()
    with Store(data) as store:
        assert store.state.query("PRAGMA user_version") == [(5,)]
        assert store.state.committed_offsets("g") == {TopicPartition("t", 0): 7}
        assert store.state.parked_due("g", 1 << 40, None, 10) == ([], None)


def test_parked_rows_come_back_in_due_order_after_a_position(tmp_path: Path) -> None:
    with Store(tmp_path / "data") as store:
        rows = [
            ParkedRow("g", "t", 0, 5, 3_000, 0, None),
            ParkedRow("g", "t", 1, 2, 1_000, 0, None),
            ParkedRow("g", "t", 0, 9, 1_000, 2, "busy"),
            ParkedRow("g", "t", 0, 1, 9_000, 0, None),
            ParkedRow("other", "t", 0, 3, 500, 0, None),
        ]
        park(store, *rows)
        taken, next_due = store.state.parked_due("g", 3_000, None, 2)
        assert taken == [rows[2], rows[1]]  # due 1,000: ordered by partition then
        assert next_due == 3_000
        after = (1_000, "t", 1, 2)
        assert store.state.parked_due("g", 3_000, after, 10) == ([rows[0]], 9_000)
        assert store.state.parked_due("g", 8_999, (3_000, "t", 0, 5), 10) == ([], 9_000)
        assert store.state.parked_offsets("g", "t", 0, 0, 5) == {1, 5}
        assert store.state.parked_end("g", "t", 0) == 10
        assert store.state.parked_end("g", "t", 7) == 0
        assert store.state.parked_counts() == {"g": 4, "other": 1}


def test_a_record_read_again_never_replaces_its_row_but_a_retry_does(tmp_path: Path) -> None:
    with Store(tmp_path / "data") as store:
        park(store, ParkedRow("g", "t", 0, 5, 9_000, 2, "busy"))
        park(store, ParkedRow("g", "t", 0, 5, 4_000, 0, None))  # read again after a restart
        assert store.state.parked_due("g", 1 << 40, None, 10)[0] == [
            ParkedRow("g", "t", 0, 5, 9_000, 2, "busy")
        ]
        park(store, ParkedRow("g", "t", 0, 5, 20_000, 3, "again"))  # failed once more
        assert store.state.parked_due("g", 1 << 40, None, 10)[0] == [
            ParkedRow("g", "t", 0, 5, 20_000, 3, "again")
        ]
        park(store, unparked=(DeliveryKey("g", "t", 0, 5),))
        assert store.state.parked_counts() == {}


def test_parked_rows_go_with_their_group_topic_or_a_reset(tmp_path: Path) -> None:
    with Store(tmp_path / "data") as store:
        store.create_topic("a", partitions=2)
        store.create_topic("b")
        park(
            store,
            ParkedRow("g", "a", 0, 1, 10, 0, None),
            ParkedRow("g", "a", 1, 1, 10, 0, None),
            ParkedRow("g", "b", 0, 1, 10, 0, None),
            ParkedRow("h", "b", 0, 1, 10, 0, None),
        )
        store.state.reset_group("g", {TopicPartition("a", 0): 0})
        assert store.state.parked_offsets("g", "a", 0, 0, 9) == set()
        assert store.state.parked_offsets("g", "a", 1, 0, 9) == {1}
        store.delete_topic("a")
        assert store.state.parked_counts() == {"g": 1, "h": 1}
        store.state.delete_group("g")
        assert store.state.parked_counts() == {"h": 1}
