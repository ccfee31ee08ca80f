"""state.db schema version 4: the ``cancels`` table of cancelled messages, its migration
from version 3, and what deleting a topic or retention does to its rows; and tasks.db
version 2, which records where each task's message is."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from spoolmq import Store
from spoolmq.store import state as state_module
from spoolmq.tasks import results as results_module
from spoolmq.tasks.results import ResultStore
from spoolmq.types import TopicPartition


def test_version_3_gains_the_cancels_table_and_keeps_its_offsets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = sqlite3.connect(data / "state.db")
    for version in (1, 2, 3):
        db.executescript(state_module._MIGRATIONS[version])
    db.execute("INSERT INTO group_offsets VALUES ('g', 't', 0, 7, 0)")
    db.execute("PRAGMA user_version = 3")
    db.commit()
    db.close()
    with Store(data) as store:
        assert store.state.query("PRAGMA user_version") == [(state_module.SCHEMA_VERSION,)]
        assert store.state.committed_offsets("g") == {TopicPartition("t", 0): 7}
        assert store.state.cancels() == {}


def test_cancels_are_kept_until_their_topic_or_message_goes(tmp_path: Path) -> None:
    with Store(tmp_path / "data") as store:
        store.create_topic("a")
        store.create_topic("b")
        store.state.add_cancel("a", 0, 5, "why")
        store.state.add_cancel("a", 0, 9, None)
        store.state.add_cancel("b", 0, 1, None)
        store.state.add_cancel("a", 0, 5, "again")  # a second cancel keeps the first reason
        assert store.state.cancels() == {
            TopicPartition("a", 0): {5: "why", 9: None},
            TopicPartition("b", 0): {1: None},
        }
        assert store.state.prune_cancels({TopicPartition("a", 0): 6}) == 1
        store.delete_topic("b")
        assert store.state.cancels() == {TopicPartition("a", 0): {9: None}}


def test_tasks_db_version_1_gains_the_message_position(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    db = sqlite3.connect(data / results_module.FILE_NAME)
    # Version 1's tasks table: today's without the two position columns.
    added = ",\n    msg_partition INTEGER,\n    msg_offset INTEGER"
    schema = results_module._SCHEMA.replace(added, "")
    assert "msg_offset" not in schema
    db.executescript(schema)
    db.execute(
        "INSERT INTO tasks (id, name, topic, state, args, priority, created_ms) "
        "VALUES ('t1', 'n', 'jobs', 'queued', '{}', 0, 1)"
    )
    db.execute("PRAGMA user_version = 1")
    db.commit()
    db.close()
    store = ResultStore(data)
    try:
        assert store.position("t1") is None
        store.set_position("t1", 2, 41)
        assert store.position("t1") == ("jobs", 2, 41)
        row = store.get("t1")
        assert row is not None and row.state == "queued"
    finally:
        store.close()
    db = sqlite3.connect(data / results_module.FILE_NAME)
    assert db.execute("PRAGMA user_version").fetchone() == (results_module.SCHEMA_VERSION,)
    db.close()
