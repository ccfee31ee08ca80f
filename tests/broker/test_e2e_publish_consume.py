"""Publishing and consuming through a real broker subprocess, with clients in other processes:
every message delivered and ACKed once per group, ACKs only after storage, errors to the
publisher that caused them, idempotent retries, and bad frames costing one connection."""

from __future__ import annotations

import collections
import os
import struct
from pathlib import Path
from typing import Any

import pytest
from e2e_workers import (
    SPAWN,
    client_processes,
    consume_worker,
    join_all,
    publish_worker,
    read_lines,
    start,
)

from event_shapes import per_message
from spoolmq import Consumer, Publisher, Store, protocol
from spoolmq.client.connection import connect
from spoolmq.errors import InvalidTopicError, MessageTooLargeError
from spoolmq.testing import BrokerProcess, wait_until


def event_lines(data_dir: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted((data_dir / "events").glob("date=*/*.jsonl")):
        events += per_message(read_lines(path))
    return events


def stored_values(data_dir: Path, topic: str) -> dict[tuple[int, int], Any]:
    """Every record of a topic, read from the files with the store's own reader (none
    while the topic does not exist yet)."""
    found = {}
    with Store(data_dir) as store:
        if topic not in store.topics():
            return found
        for partition in range(store.topic_config(topic).partitions):
            for record in store.reader(topic, partition):
                found[(partition, record.offset)] = record.value
    return found


def test_publishers_and_consumers_in_separate_processes(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path
) -> None:
    publishers, per_publisher = 3, 40
    with Store(data_dir) as store:
        store.create_topic("orders", partitions=3)
    subscribed = SPAWN.Barrier(4)
    with client_processes() as processes:
        processes += [
            start(
                publish_worker, str(data_dir), "orders", w, per_publisher, str(tmp_path / f"p{w}")
            )
            for w in range(publishers)
        ]
        processes += [
            start(
                consume_worker,
                str(data_dir),
                ["orders"],
                group,
                str(tmp_path / f"{group}-{n}"),
                10.0,  # idle this long: done (generous, as on a busy machine)
                {"prefetch": 5},
                0.0,
                None,
                subscribed,
            )
            for group in ("billing", "shipping")
            for n in range(2)
        ]
        join_all(processes, 120)

    sent = {}
    for w in range(publishers):
        for line in read_lines(tmp_path / f"p{w}"):
            assert "error" not in line, line
            sent[(line["partition"], line["offset"])] = {"w": line["w"], "i": line["i"]}
    assert sorted((v["w"], v["i"]) for v in sent.values()) == [
        (w, i) for w in range(publishers) for i in range(per_publisher)
    ]
    # What each publisher was told is what the files hold.
    assert stored_values(data_dir, "orders") == sent

    for group in ("billing", "shipping"):
        seen = read_lines(tmp_path / f"{group}-0") + read_lines(tmp_path / f"{group}-1")
        positions = collections.Counter((m["partition"], m["offset"]) for m in seen)
        assert positions == collections.Counter(sent.keys()), group
        for message in seen:
            assert message["value"] == sent[(message["partition"], message["offset"])]
        # Both consumers of the group took part.
        assert len({m["pid"] for m in seen}) == 2, group

    def acked_events() -> collections.Counter[tuple[str, int, int]] | None:
        acked = collections.Counter(
            (e["group"], e["partition"], e["offset"])
            for e in event_lines(data_dir)
            if e["type"] == "acked"
        )
        return acked if sum(acked.values()) >= 2 * len(sent) else None

    # The broker appends events in its loop; give it a moment after the clients left.
    acked = wait_until(acked_events, 30, "the acked events")
    expected = {(g, p, o) for g in ("billing", "shipping") for p, o in sent}
    assert set(acked) == expected
    assert set(acked.values()) == {1}, "a message was ACKed twice in one group"


@pytest.mark.parametrize("acks", ["1", "all"])
def test_publish_returns_only_once_the_record_is_readable(
    broker: BrokerProcess, data_dir: Path, acks: str
) -> None:
    with Store(data_dir) as store, Publisher(data=data_dir, acks=acks) as publisher:
        for n in range(20):
            position = publisher.publish("stored", {"n": n}, key=f"k{n % 3}")
            # Read right after the ACK, in this process, from the files themselves.
            record = store.reader("stored", position.partition, offset=position.offset).poll()
            assert record is not None, f"ACKed offset {position.offset} is not in the store"
            assert (record.offset, record.value, record.key) == (
                position.offset,
                {"n": n},
                f"k{n % 3}",
            )
        futures = [publisher.publish_async("stored", {"batch": n}, acks=acks) for n in range(30)]
        for n, future in enumerate(futures):
            position = future.result(60)
            record = store.reader("stored", position.partition, offset=position.offset).poll()
            assert record is not None and record.value == {"batch": n}


def test_errors_go_to_the_publisher_that_caused_them(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher, Publisher(data=data_dir) as bystander:
        publisher.publish("limits", "small")
        futures = [
            publisher.publish_async("limits", "before"),
            publisher.publish_async("limits", "x" * (2 * 1024 * 1024)),  # over the 1 MiB limit
            publisher.publish_async("limits", "after"),
        ]
        other = bystander.publish_async("limits", "unaffected")
        assert futures[0].result(60).offset >= 1
        with pytest.raises(MessageTooLargeError):
            futures[1].result(60)
        assert futures[2].result(60).offset >= 1
        assert other.result(60).offset >= 1
        with pytest.raises(InvalidTopicError):
            publisher.publish("../escape", "no")
        # The same connection still works after its errors.
        last = publisher.publish("limits", "last")
    stored = stored_values(data_dir, "limits")
    assert sorted(stored.values(), key=str) == sorted(
        ["small", "before", "after", "unaffected", "last"], key=str
    )
    assert last.offset == 4
    assert not (data_dir / "logs" / "escape").exists()


def raw_publisher(data_dir: Path) -> Any:
    conn, _ = connect(
        str(data_dir / protocol.SOCKET_FILE), protocol.read_authkey(data_dir), "publisher"
    )
    return conn


def record(value: Any, sequence: int | None = None, **fields: Any) -> dict[str, Any]:
    """A record of a publish frame in the store's form, as the Publisher sends it."""
    body: dict[str, Any] = {"key": None, "value": value, "headers": [], **fields}
    if sequence is not None:
        body["sequence"] = sequence
        body["producer_id"] = "p-retry-test"
    return body


def test_broker_refuses_a_bad_topic_sent_past_the_client(
    broker: BrokerProcess, data_dir: Path
) -> None:
    conn = raw_publisher(data_dir)
    try:
        frame = {"op": "publish", "id": 1, "acks": "all", "topic": "../../etc"}
        protocol.send(conn, {**frame, "records": [record(1)]})
        refused = protocol.receive(conn)
        protocol.send(
            conn,
            {**frame, "id": 2, "topic": "fine", "records": [record(2), record(3, unknown_field=1)]},
        )
        reply = protocol.receive(conn)
    finally:
        conn.close()
    # A bad topic fails its whole frame; a bad record only itself.
    assert refused["op"] == "error" and refused["code"] == "invalid_topic" and refused["id"] == 1
    assert reply["op"] == "published" and reply["id"] == 2
    assert reply["r"] == [[0, 0, reply["r"][0][2], 1]]
    assert reply["errors"]["1"]["code"] == "protocol"
    assert stored_values(data_dir, "fine") == {(0, 0): 2}
    assert not any(p.name == "etc" for p in data_dir.rglob("etc"))


def test_a_retried_publish_is_stored_once_with_the_first_offset(
    broker: BrokerProcess, data_dir: Path
) -> None:
    frame = {
        "op": "publish",
        "id": 7,
        "acks": "all",
        "producer_id": "p-retry-test",
        "topic": "idem",
        "records": [record({"n": 0}, 0), record({"n": 1}, 1)],
    }
    answers = []
    # The retry comes on a new connection, as it does after a broker restart.
    for _ in range(2):
        conn = raw_publisher(data_dir)
        try:
            protocol.send(conn, frame)
            answers.append(protocol.receive(conn)["r"])
        finally:
            conn.close()
    first, second = answers
    timestamp = first[0][2]
    assert first == [[0, 0, timestamp, 2]]
    assert second == [[0, 0, timestamp, 2, 1]]  # duplicates of the first copies
    # A new sequence from the same producer is a new message.
    conn = raw_publisher(data_dir)
    try:
        protocol.send(conn, {**frame, "id": 8, "records": [record({"n": 2}, 2)]})
        third = protocol.receive(conn)["r"]
    finally:
        conn.close()
    assert third[0][:2] == [0, 2]
    assert stored_values(data_dir, "idem") == {(0, 0): {"n": 0}, (0, 1): {"n": 1}, (0, 2): {"n": 2}}


def test_repeats_inside_one_frame_and_one_commit_are_stored_once(
    broker: BrokerProcess, data_dir: Path
) -> None:
    frame = {"op": "publish", "acks": "all", "producer_id": "p-retry-test", "topic": "twice"}
    frames = [
        protocol.encode({**frame, "id": 1, "records": [record(s, s) for s in (0, 1, 0, 2)]}),
        protocol.encode({**frame, "id": 2, "records": [record(s, s) for s in (2, 3)]}),
    ]
    conn = raw_publisher(data_dir)
    try:
        # Both frames in one socket write: one group commit.
        os.write(conn.fileno(), b"".join(struct.pack("!i", len(f)) + f for f in frames))
        replies = [protocol.receive(conn) for _ in range(2)]
    finally:
        conn.close()
    timestamp = replies[0]["r"][0][2]
    assert replies[0]["r"] == [[0, 0, timestamp, 2], [0, 0, timestamp, 1, 1], [0, 2, timestamp, 1]]
    assert replies[1]["r"] == [[0, 2, timestamp, 1, 1], [0, 3, timestamp, 1]]
    assert stored_values(data_dir, "twice") == {(0, 0): 0, (0, 1): 1, (0, 2): 2, (0, 3): 3}


@pytest.mark.parametrize("role", ["publisher", "consumer"])
@pytest.mark.parametrize(
    "garbage",
    [b"not json", b'{"op": "ack", "tags": [1]}'],
)
def test_a_bad_frame_closes_only_its_own_connection(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path, role: str, garbage: bytes
) -> None:
    with (
        Publisher(data=data_dir) as publisher,
        Consumer("frames", group="g", data=data_dir) as consumer,
    ):
        publisher.publish("frames", "before")
        conn, _ = connect(
            str(data_dir / protocol.SOCKET_FILE), protocol.read_authkey(data_dir), role
        )
        try:
            conn.send_bytes(garbage)
            reply = protocol.receive(conn)
            assert reply["op"] == "error" and reply["code"] == "protocol"
            # Then the broker closed this connection: end of file, not another frame.
            assert conn.poll(30)
            with pytest.raises((EOFError, ConnectionResetError)):
                conn.recv_bytes()
        finally:
            conn.close()
        # The other clients of both broker processes carry on.
        assert publisher.publish("frames", "after").offset == 1
        for expected in ("before", "after"):
            message = consumer.receive(timeout=30)
            assert message is not None and message.value == expected
            message.ack()
    assert broker.stats()["restarts"] == {"publisher": 0, "consumer": 0}
    # The reason is logged.
    assert f"closing {role}" in (tmp_path / "broker.log").read_text()


def test_acks_0_does_not_wait_and_the_message_is_stored(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir, acks="0") as publisher:
        positions = [publisher.publish("fire", n) for n in range(5)]
    # No answer means no position to report.
    assert {(p.partition, p.offset) for p in positions} == {(-1, -1)}
    wait_until(lambda: len(stored_values(data_dir, "fire")) == 5, 30, "the acks=0 messages")
    assert sorted(stored_values(data_dir, "fire").values()) == [0, 1, 2, 3, 4]


def test_frames_that_arrive_together_are_stored_with_one_write(
    broker: BrokerProcess, data_dir: Path
) -> None:
    def publisher_stats() -> dict[str, Any]:
        stats: dict[str, Any] = broker.stats()["publisher"]
        return stats

    conn = raw_publisher(data_dir)
    try:
        protocol.send(conn, {"op": "publish", "id": 0, "topic": "group", "records": [record("w")]})
        assert protocol.receive(conn)["r"][0][:2] == [0, 0]
        before = wait_until(
            lambda: (s := publisher_stats())["frames"] == 1 and s, 30, "the first figures"
        )
        # Five frames in one socket write: they are all there when the broker wakes up.
        frames = [
            protocol.encode(
                {"op": "publish", "id": n, "topic": "group", "records": [record(n)] * 2}
            )
            for n in range(1, 6)
        ]
        os.write(conn.fileno(), b"".join(struct.pack("!i", len(f)) + f for f in frames))
        replies = [protocol.receive(conn) for _ in range(5)]
    finally:
        conn.close()
    assert [r["id"] for r in replies] == [1, 2, 3, 4, 5]
    assert [r["r"][0][:2] + r["r"][0][3:] for r in replies] == [[0, 1 + 2 * n, 2] for n in range(5)]
    after = wait_until(
        lambda: (s := publisher_stats())["frames"] == 6 and s, 30, "the figures of five frames"
    )
    # Group commit: one batch (one write, one fsync) for the five frames.
    assert after["batches"] - before["batches"] == 1
    assert after["messages"] - before["messages"] == 10


def test_a_hundred_records_near_the_limit_travel_in_frames_a_client_reads(
    broker: BrokerProcess, data_dir: Path
) -> None:
    # 100 records of 900,000 bytes, each under the 1 MiB max_message_bytes: 90 MB together,
    # more than one 64 MiB frame holds. Before, the publisher sent them as one frame (the
    # broker dropped the connection at its length, the publisher resent it, again and
    # again) and the ConsumerBroker pushed them as one (no client read it).
    values = [f"{n:03d}" + "x" * 900_000 for n in range(100)]
    with Publisher(data=data_dir, delivery_timeout=60) as publisher:
        positions = [f.result() for f in publisher.publish_many_async("big", values)]
    assert [p.offset for p in positions] == list(range(100))
    got: list[str] = []
    with Consumer("big", "g", data=data_dir, prefetch=100, reconnect_timeout=30) as consumer:
        while len(got) < 100:
            message = consumer.receive(timeout=60)
            assert message is not None, f"{len(got)} of 100 received"
            got.append(message.value)
            message.ack(wait=False)
    assert got == values


def test_a_record_no_frame_can_carry_is_refused_before_it_is_sent(
    broker: BrokerProcess, data_dir: Path
) -> None:
    huge = "x" * (protocol.MAX_FRAME_BYTES + 1)
    with Publisher(data=data_dir) as publisher:
        with pytest.raises(MessageTooLargeError, match=r"over the \d+ one publish frame can carry"):
            publisher.publish("big", huge)
        with pytest.raises(MessageTooLargeError, match=r"values\[1\]: message encodes to"):
            publisher.publish_many("big", ["small", huge])
        # The connection is the one it had: nothing was sent, nothing to resend.
        assert publisher.publish("big", "small").offset == 0
