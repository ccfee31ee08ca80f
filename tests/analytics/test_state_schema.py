"""The analytics job reads state.db without importing the store (it runs on a Spark
cluster), so it keeps its own copy of the schema version it understands: this keeps the two
in step, and shows a newer database is refused with a clear error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from spoolmq.analytics import extract
from spoolmq.errors import SchemaVersionError
from spoolmq.store import Store
from spoolmq.store.state import SCHEMA_VERSION


def test_the_job_understands_the_store_s_current_schema(tmp_path: Path) -> None:
    assert extract._STATE_SCHEMA_VERSION == SCHEMA_VERSION
    with Store(tmp_path) as store:
        store.create_topic("orders", partitions=2)
    tables = extract.read_state(tmp_path)
    assert [row[0] for row in tables.topics] == ["orders"]


def test_a_newer_state_db_is_refused(tmp_path: Path) -> None:
    with Store(tmp_path) as store:
        store.create_topic("orders")
    with sqlite3.connect(tmp_path / "state.db") as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(SchemaVersionError, match="reads up to"):
        extract.read_state(tmp_path)
