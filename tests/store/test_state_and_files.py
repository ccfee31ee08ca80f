"""state.db schema and settings, file modes, partition choice."""

from __future__ import annotations

import os
import sqlite3
import stat
from pathlib import Path

import pytest

from spoolmq import Message, Store
from spoolmq.errors import SchemaVersionError, TopicExistsError, UnsafePermissionsError
from spoolmq.store import state as state_module
from spoolmq.store.partitioner import murmur2, partition_for_key
from spoolmq.testing import run_spoolmq


def test_topic_settings_are_kept_in_state_db(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic(
            "orders",
            partitions=3,
            retention_ms="2h",
            retention_bytes="1MiB",
            cleanup_policy="compact",
            segment_bytes=4096,
        )
        with pytest.raises(TopicExistsError, match="other settings"):
            store.create_topic("orders", partitions=4, exist_ok=False)
        store.append("auto", 1)  # created on first append with the defaults
    rows = (
        sqlite3.connect(data_dir / "state.db")
        .execute(
            "SELECT name, partitions, retention_ms, retention_bytes, cleanup_policy, segment_bytes "
            "FROM topics ORDER BY name"
        )
        .fetchall()
    )
    assert rows == [
        ("auto", 1, 14 * 24 * 3600 * 1000, -1, "delete", 64 * 1024 * 1024),
        ("orders", 3, 7_200_000, 1_048_576, "compact", 4096),
    ]
    with Store(data_dir) as store:
        assert store.topic_config("orders").partitions == 3


def test_state_db_runs_in_wal_mode(store: Store) -> None:
    store.append("t", 1)
    assert store.state.query("PRAGMA journal_mode") == [("wal",)]
    assert store.state.query("PRAGMA user_version") == [(state_module.SCHEMA_VERSION,)]


def test_an_older_schema_is_migrated(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(data_dir) as store:
        store.create_topic("kept", partitions=2)
    nxt = state_module.SCHEMA_VERSION + 1
    migrations = {
        **state_module._MIGRATIONS,
        nxt: "ALTER TABLE topics ADD COLUMN description TEXT NOT NULL DEFAULT ''",
    }
    monkeypatch.setattr(state_module, "_MIGRATIONS", migrations)
    monkeypatch.setattr(state_module, "SCHEMA_VERSION", nxt)
    with Store(data_dir) as store:
        assert store.state.query("PRAGMA user_version") == [(nxt,)]
        assert store.state.query("SELECT name, description FROM topics") == [("kept", "")]
        assert store.topic_config("kept").partitions == 2


def test_a_newer_schema_is_refused(data_dir: Path) -> None:
    with Store(data_dir):
        pass
    connection = sqlite3.connect(data_dir / "state.db")
    connection.execute(f"PRAGMA user_version = {state_module.SCHEMA_VERSION + 1}")
    connection.close()
    with pytest.raises(SchemaVersionError, match="newer than this spoolmq"):
        Store(data_dir)


def test_every_file_and_directory_is_private(data_dir: Path) -> None:
    old_umask = os.umask(0o022)
    try:
        with Store(data_dir) as store:
            store.create_topic("c", partitions=2, cleanup_policy="compact", segment_bytes=1024)
            for i in range(40):
                store.append("c", {"i": i, "pad": "x" * 60}, key=f"k{i % 3}", partition=i % 2)
            store.compact("c")
        segment = sorted((data_dir / "logs" / "c" / "0").glob("*.jsonl"))[-1]
        with open(segment, "ab") as handle:
            handle.write(b'{"offset":')  # a torn tail, quarantined on the next open
        with Store(data_dir) as store:
            store.append("c", "after", partition=0)
            assert store.recovery_reports
    finally:
        os.umask(old_umask)
    checked = 0
    for directory, dirs, files in os.walk(data_dir):
        for name in dirs:
            assert stat.S_IMODE(Path(directory, name).stat().st_mode) == 0o700, name
        for name in files:
            assert stat.S_IMODE(Path(directory, name).stat().st_mode) == 0o600, name
            checked += 1
    assert stat.S_IMODE(data_dir.stat().st_mode) == 0o700
    assert (data_dir / "quarantine").is_dir()
    assert checked > 10


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o702])
def test_an_embedded_store_refuses_a_directory_others_can_write(tmp_path: Path, mode: int) -> None:
    """As the broker does: another user could otherwise alter or plant the queue's files."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, mode)
    with pytest.raises(UnsafePermissionsError, match=f"chmod 700 {shared}"):
        Store(shared)
    assert os.listdir(shared) == []  # refused before anything was created
    assert stat.S_IMODE(shared.stat().st_mode) == mode  # and left as it was


def test_an_embedded_store_makes_a_readable_directory_private(tmp_path: Path) -> None:
    """A directory made with the usual umask (0755), as git checks queue_data/ out."""
    checked_out = tmp_path / "checked-out"
    checked_out.mkdir()
    os.chmod(checked_out, 0o755)
    with Store(checked_out) as store:
        store.create_topic("t")
    assert stat.S_IMODE(checked_out.stat().st_mode) == 0o700


def test_the_cli_refuses_a_directory_others_can_write(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    result = run_spoolmq("topics", "create", "t", "--data", str(shared))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "can be written by other users" in lines[0], result.stderr
    assert os.listdir(shared) == []


def test_round_robin_without_a_key(store: Store) -> None:
    store.create_topic("orders", partitions=2)
    assert [store.append("orders", {"i": i}).partition for i in range(4)] == [0, 1, 0, 1]
    batch = store.append_batch("orders", [Message(i) for i in range(3)])
    assert [p.partition for p in batch] == [0, 1, 0]
    # partitions 0 and 1 each hold their own offsets from 0
    assert [r.value for r in store.reader("orders", 0)] == [{"i": 0}, {"i": 2}, 0, 2]
    assert [r.value for r in store.reader("orders", 1)] == [{"i": 1}, {"i": 3}, 1]


# Kafka's own test vectors for its murmur2 (clients' UtilsTest.testMurmur2).
@pytest.mark.parametrize(
    ("data", "expected"),
    [
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_a_key_always_maps_to_the_same_partition(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("orders", partitions=8)
        first = {k: store.append("orders", 1, key=k).partition for k in ("a", "b", "c", b"\x00")}
    with Store(data_dir) as store:  # another process, same answer
        again = {k: store.append("orders", 2, key=k).partition for k in first}
    assert first == again
    assert first == {k: partition_for_key(k, 8) for k in first}
    assert len({partition_for_key(f"key-{i}", 8) for i in range(200)}) == 8
