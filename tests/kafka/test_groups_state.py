"""state.db schema version 3: the Kafka group membership tables, their migration from
version 2, and what ``spoolmq groups`` reads of a Kafka group."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

from spoolmq import Store
from spoolmq.kafka.coordinator import Group, GroupState, Member
from spoolmq.kafka.group_store import decode_consumer_assignment, group_rows, kafka_group_members
from spoolmq.kafka.wire import Writer
from spoolmq.store import state as state_module
from spoolmq.store.state import KafkaGroupRow, KafkaMemberRow
from spoolmq.types import TopicPartition


def make_version_2(data_dir: Path) -> None:
    """A state.db as spoolmq with schema version 2 left it, with a committed group."""
    data_dir.mkdir(parents=True)
    db = sqlite3.connect(data_dir / "state.db")
    db.executescript(state_module._MIGRATIONS[1])
    db.executescript(state_module._MIGRATIONS[2])
    db.execute("INSERT INTO group_offsets VALUES ('native', 't', 0, 7, 0)")
    db.execute("PRAGMA user_version = 2")
    db.commit()
    db.close()


def test_version_2_gains_the_kafka_tables_and_keeps_its_offsets(tmp_path: Path) -> None:
    data = tmp_path / "data"
    make_version_2(data)
    with Store(data) as store:
        assert store.state.query("PRAGMA user_version") == [(state_module.SCHEMA_VERSION,)]
        assert store.state.committed_offsets("native") == {TopicPartition("t", 0): 7}
        assert store.state.kafka_members("native") == []
        assert store.state.kafka_groups() == []
        assert store.state.groups() == ["native"]


def consumer_assignment(topics: dict[str, list[int]]) -> bytes:
    w = Writer().int16(0).int32(len(topics))
    for topic, parts in topics.items():
        w.string(topic).array(parts, Writer.int32)
    return w.bytes_(b"").getvalue()


def test_membership_is_recorded_replaced_and_cleared(tmp_path: Path) -> None:
    with Store(tmp_path / "d") as store:
        group = Group("kg", GroupState.STABLE, 3, "consumer", "range", "m1")
        for name, parts in (("m1", [0, 1]), ("m2", [2])):
            member = Member(name, f"client-{name}", "/127.0.0.1", 10_000, 10_000, "consumer", [])
            member.assignment = consumer_assignment({"orders": parts})
            group.members[name] = member
        row, members = group_rows(group, 1234)
        store.state.record_kafka_group(row, members)
        assert store.state.kafka_group("kg") == KafkaGroupRow(
            "kg", "Stable", 3, "consumer", "range", "m1", 1234
        )
        got = store.state.kafka_members("kg")
        assert [m.member_id for m in got] == ["m1", "m2"]
        assert json.loads(got[0].assignment or "") == {"orders": [0, 1]}
        assert "kg" in store.state.groups(), "a joined group shows before its first commit"
        # A rebalance replaces the member list; it never accumulates.
        store.state.record_kafka_group(
            row._replace(generation=4), [KafkaMemberRow("kg", "m2", "c", "/h", None)]
        )
        assert [m.member_id for m in store.state.kafka_members("kg")] == ["m2"]
        store.state.clear_kafka_members()
        assert store.state.kafka_members("kg") == []
        cleared = store.state.kafka_group("kg")
        assert cleared is not None and cleared.state == "Empty"


def test_no_broker_means_no_joined_members(tmp_path: Path) -> None:
    with Store(tmp_path / "d") as store:
        store.state.record_kafka_group(
            KafkaGroupRow("kg", "Stable", 1, "consumer", "range", "m", 0),
            [KafkaMemberRow("kg", "m", "c", "/h", None)],
        )
    assert kafka_group_members(tmp_path / "d", "kg") == []


def test_assignment_decoding_is_bounded_and_never_raises() -> None:
    assert decode_consumer_assignment(consumer_assignment({"a": [0, 2]})) == {"a": [0, 2]}
    assert decode_consumer_assignment(b"") == {}
    assert decode_consumer_assignment(b"\x00\x00\x7f\xff\xff\xff") is None
    assert decode_consumer_assignment(b"\x00") is None


def test_a_broker_without_kafka_lists_no_kafka_members_left_by_an_earlier_one(
    tmp_path: Path,
) -> None:
    """Rows a killed broker's Kafka child recorded stayed until a Kafka child started
    again, so a broker started without --kafka listed them as joined members."""
    from spoolmq.operations import group_members
    from spoolmq.testing import BrokerProcess

    data = tmp_path / "d"
    with Store(data) as store:
        store.state.record_kafka_group(
            KafkaGroupRow("kg", "Stable", 1, "consumer", "range", "m", 0),
            [KafkaMemberRow("kg", "m", "c", "/h", None)],
        )
    with BrokerProcess(data, log_file=tmp_path / "broker.log"):
        assert group_members(data, "kg") == []
    with Store(data) as store:
        assert store.state.kafka_members() == []
