"""Kafka consumer groups end to end: real kafka-python consumers and kcat against a real
broker with ``--kafka``; offsets land in state.db and show in ``spoolmq groups``."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from kafka_helpers import kafka_broker

from kafka import KafkaConsumer, KafkaProducer
from spoolmq import Store
from spoolmq.errors import GroupActiveError
from spoolmq.kafka.group_store import kafka_group_members
from spoolmq.operations import ResetTo, apply_reset, group_rows, plan_reset
from spoolmq.testing import BrokerProcess, run_spoolmq, wait_until
from spoolmq.ui import views

PARTITIONS = 3


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str, Path]]:
    data = tmp_path_factory.mktemp("kgroups") / "queue_data"
    with Store(data) as store:
        for topic in ("orders", "solo", "kcat"):
            store.create_topic(topic, partitions=PARTITIONS)
    with kafka_broker(data, log_file=data.parent / "broker.log") as (broker, address):
        yield broker, address, data


def spoolmq_cli(*args: str) -> str:
    """What ``spoolmq ARGS`` prints, run as a user would (a wide terminal: a Kafka
    member's id alone is some 60 characters)."""
    done = run_spoolmq(*args, env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    return done.stdout


def produce(address: str, topic: str, values: list[bytes]) -> None:
    producer = KafkaProducer(bootstrap_servers=address, acks="all")
    for i, value in enumerate(values):
        producer.send(topic, value, partition=i % PARTITIONS)
    producer.flush(60)
    producer.close()


class Member(threading.Thread):
    """One group member in a thread: polls, records what it got, commits synchronously
    after each batch (so what it processed is committed before it stops)."""

    def __init__(self, address: str, group: str, topic: str, seen: list[tuple[str, int, int]]):
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(
            topic,
            bootstrap_servers=address,
            group_id=group,
            client_id=f"member-{id(self)}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            session_timeout_ms=10_000,
            heartbeat_interval_ms=1_000,
            max_poll_records=3,
        )
        self.name_ = self.consumer.config["client_id"]
        self.seen = seen
        self.stop = threading.Event()
        self.assigned: set[int] = set()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                batches = self.consumer.poll(timeout_ms=200)
                for tp, records in batches.items():
                    self.seen.extend((self.name_, tp.partition, r.offset) for r in records)
                if batches:
                    self.consumer.commit()
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
        except BaseException as exc:  # reported by the test, not lost in the thread
            self.error = exc
        finally:
            self.consumer.close()  # LeaveGroup


def test_two_members_share_rebalance_on_leave_and_the_survivor_resumes_from_commits(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    _, address, data = running
    seen: list[tuple[str, int, int]] = []
    a, b = Member(address, "g1", "orders", seen), Member(address, "g1", "orders", seen)
    a.start()
    b.start()
    try:
        # Each member's view lags a rebalance by one poll; wait for the settled split.
        wait_until(
            lambda: (
                a.assigned
                and b.assigned
                and a.assigned | b.assigned == {0, 1, 2}
                and not a.assigned & b.assigned
            ),
            60,
            "both members to share the partitions",
        )
        members = wait_until(
            lambda: len(m := kafka_group_members(data, "g1")) == 2 and m, 30, "two members"
        )
        assert sorted(p for m in members for p in m["assignment"]["orders"]) == [0, 1, 2]
        # `spoolmq groups describe g1 --members` lists them (with no spoolmq consumer there).
        listed = orjson.loads(
            spoolmq_cli("groups", "describe", "g1", "--members", "--json", "--data", str(data))
        )
        assert sorted((m["kind"], m["consumer"], m["pid"]) for m in listed) == sorted(
            ("kafka", m["member_id"], None) for m in members
        )
        assert sorted(m["name"] for m in listed) == sorted([a.name_, b.name_])
        assert {tuple(sorted(m["assignment"]["orders"])) for m in listed} == {
            tuple(sorted(m["assignment"]["orders"])) for m in members
        }
        table = spoolmq_cli("groups", "describe", "g1", "--members", "--data", str(data))
        assert all(m["member_id"] in table for m in members) and "kafka" in table
        # The console's /api/groups names them too.
        shown = views.groups(data)["g1"]["consumers"]
        assert sorted((c["id"], c["kind"], c["host"]) for c in shown) == sorted(
            (m["member_id"], "kafka", m["client_host"]) for m in members
        )
        produce(address, "orders", [f"first-{i}".encode() for i in range(30)])
        wait_until(lambda: len(seen) >= 30, 60, "the first 30 records to be consumed")
        assert {name for name, _, _ in seen} == {a.name_, b.name_}, "both members consumed"
        wait_until(
            lambda: sum(r["committed"] for r in group_rows(data, "g1").get("g1", [])) == 30,
            30,
            "the commits",
        )
        # `spoolmq groups describe` names each partition's Kafka member.
        owners = {r["partition"]: r["consumers"] for r in group_rows(data, "g1")["g1"]}
        assert sorted(len(o) for o in owners.values()) == [1, 1, 1]
        assert {o[0] for o in owners.values()} == {m["member_id"] for m in members}

        b.stop.set()
        b.join(60)
        assert b.error is None, b.error
        wait_until(lambda: a.assigned == {0, 1, 2}, 60, "the survivor to own every partition")
        before = len(seen)
        produce(address, "orders", [f"second-{i}".encode() for i in range(30)])
        wait_until(lambda: len(seen) >= before + 30, 60, "the next 30 records")
    finally:
        a.stop.set()
        b.stop.set()
        a.join(60)
        b.join(60)
    assert a.error is None, a.error
    consumed = [(p, o) for _, p, o in seen]
    # The survivor resumed each of B's partitions from B's commits: nothing twice, no gap.
    assert len(consumed) == len(set(consumed)) == 60
    assert sorted(consumed) == [(p, o) for p in range(PARTITIONS) for o in range(20)]
    # Offsets are in state.db: `spoolmq groups` shows g1 with no lag once A has left.
    rows = group_rows(data, "g1")["g1"]
    assert {(r["topic"], r["partition"], r["committed"], r["lag"]) for r in rows} == {
        ("orders", p, 20, 0) for p in range(PARTITIONS)
    }


CRASHING_MEMBER = """
import sys
from kafka import KafkaConsumer
c = KafkaConsumer("solo", bootstrap_servers=sys.argv[1], group_id="g2",
                  session_timeout_ms=6000, heartbeat_interval_ms=1000,
                  auto_offset_reset="earliest", enable_auto_commit=False)
while True:
    for tp, records in c.poll(timeout_ms=200).items():
        for r in records:
            print(tp.partition, r.offset, flush=True)
        c.commit()
"""


def test_a_member_that_misses_its_session_timeout_is_removed_and_reset_waits_for_it(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    _, address, data = running
    produce(address, "solo", [b"x"] * 6)
    member = subprocess.Popen(
        [sys.executable, "-u", "-c", CRASHING_MEMBER, address],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert member.stdout is not None
        for _ in range(6):  # it consumed (and committed) all six
            assert member.stdout.readline().strip()
        wait_until(lambda: kafka_group_members(data, "g2"), 30, "the member to be recorded")
        with Store(data) as store:
            changes = plan_reset(store, "g2", "solo", ResetTo("earliest"))
        with pytest.raises(GroupActiveError):
            apply_reset(data, "g2", changes)
        # A SIGKILLed member sends no LeaveGroup: only its session timeout removes it.
        os.kill(member.pid, signal.SIGKILL)
        member.wait(30)
        wait_until(lambda: not kafka_group_members(data, "g2"), 60, "the silent member to expire")
    finally:
        if member.poll() is None:
            member.kill()
            member.wait(30)
    apply_reset(data, "g2", changes)
    rows = group_rows(data, "g2")["g2"]
    assert {r["committed"] for r in rows} == {0}, rows


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_balanced_consumer_reads_a_topic(running: tuple[BrokerProcess, str, Path]) -> None:
    _, address, data = running
    values = [f"k-{i}" for i in range(12)]
    produce(address, "kcat", [v.encode() for v in values])
    done = subprocess.run(
        [
            "kcat",
            "-b",
            address,
            "-G",
            "kcat-group",
            "kcat",
            "-e",
            "-f",
            "%s\n",
            "-X",
            "auto.offset.reset=earliest",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert sorted(done.stdout.split()) == sorted(values)
    rows: list[dict[str, Any]] = group_rows(data, "kcat-group")["kcat-group"]
    assert sum(r["committed"] for r in rows) == len(values)


def test_admin_client_lists_and_describes_a_kafka_group(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    from kafka import KafkaAdminClient

    _, address, _ = running
    seen: list[tuple[str, int, int]] = []
    member = Member(address, "g3", "orders", seen)
    member.start()
    admin = KafkaAdminClient(bootstrap_servers=address, request_timeout_ms=30_000)
    try:
        wait_until(lambda: member.assigned == {0, 1, 2}, 60, "the member's assignment")
        assert {"group_id": "g3", "protocol_type": "consumer"} in admin.list_groups()
        described = admin.describe_groups(["g3", "never-seen"])
        g3 = described["g3"]
        assert (g3["group_state"], g3["protocol_type"], g3["error"]) == ("Stable", "consumer", None)
        assert g3["protocol_data"] in ("range", "roundrobin")
        (m,) = g3["members"]
        assert (m["client_id"], m["client_host"]) == (member.name_, "/127.0.0.1")
        assert m["member_metadata"]["topics"] == ["orders"]
        assert m["member_assignment"]["assigned_partitions"] == [
            {"topic": "orders", "partitions": [0, 1, 2]}
        ]
        assert described["never-seen"]["group_state"] == "Dead"
        member.stop.set()
        member.join(60)
        assert member.error is None, member.error
        # With its one member gone the group is Empty (its offsets remain), not Dead.
        wait_until(
            lambda: admin.describe_groups(["g3"])["g3"]["group_state"] == "Empty",
            60,
            "the group to be empty",
        )
    finally:
        admin.close()
        member.stop.set()
        member.join(60)
