"""The Kafka child's pre-checked publish frames (docs/PROTOCOL.md, "The Kafka child's
pre-checked frame"), against a real broker: the child's Produce requests reach the store
in that form, with their keys, headers and sequences; no other connection may claim to be
the child or send the form."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from multiprocessing.connection import Client, Connection
from pathlib import Path

import pytest
from kafka_helpers import call, kafka_broker, produce_answer, produce_body

from spoolmq import Consumer, protocol
from spoolmq.client import Admin
from spoolmq.kafka.records import OutRecord, encode_batch
from spoolmq.protocol.publish import encode_checked_frame
from spoolmq.store import Store
from spoolmq.testing import BrokerProcess, wait_until

WAIT = 60.0


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str, Path]]:
    data = tmp_path_factory.mktemp("prechecked") / "queue_data"
    with Store(data) as store:
        store.create_topic("mixed", partitions=2)
        store.create_topic("guarded", partitions=1)
    with kafka_broker(data) as (broker, address):
        yield broker, address, data


def _connect(data: Path) -> Connection:
    key = (data / protocol.AUTHKEY_FILE).read_bytes()
    return Client(str(data / protocol.SOCKET_FILE), family="AF_UNIX", authkey=key)


def _hello(conn: Connection, role: str, **extra: object) -> dict[str, object]:
    protocol.send(
        conn,
        {"op": "hello", "version": protocol.PROTOCOL_VERSION, "role": role, "pid": os.getpid()}
        | extra,
    )
    return protocol.receive(conn)


def _publisher_figures(data: Path) -> dict[str, int]:
    with Admin(data) as admin:
        figures = admin.stats()["publisher"]
    return {k: figures[k] for k in ("frames", "frames_prechecked")}


def test_kafka_produce_is_stored_through_the_pre_checked_form(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """Text and raw-bytes keys, headers, a JSON and a non-JSON value, numbered by an
    idempotent producer: stored as the plain form stores them, and counted as pre-checked
    frames by the PublisherBroker; the batch sent again is answered with the first copy's
    offset, not stored twice."""
    _, address, data = running
    before = _publisher_figures(data)
    records = [
        OutRecord(0, 1000, b"customer-7", b'{"order":1}', []),
        OutRecord(1, 1000, b"\xff\xfe", b"\x00\x01", [("trace", b"abc"), ("bin", b"\xfe")]),
        OutRecord(2, 1000, None, b'{"order":3}', [("empty", None)]),
        OutRecord(3, 1000, b"customer-7", b"not json", []),
    ]
    batch = encode_batch(records, producer_id=42, producer_epoch=0, base_sequence=10)
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        error, base = produce_answer(call(sock, 0, 3, produce_body("mixed", 1, batch)))
        assert (error, base) == (0, 0)
        again = produce_answer(call(sock, 0, 3, produce_body("mixed", 1, batch), corr=2))
        assert again == (0, 0)  # the retry is recognised: same offset, nothing added
    # Two frames (the batch and its retry), both in the pre-checked form (the figures
    # reach the manager within a second or so).
    after = wait_until(
        lambda: (f := _publisher_figures(data))["frames"] - before["frames"] >= 2 and f,
        WAIT,
        "the PublisherBroker's figures to count the two frames",
    )
    assert after["frames"] - before["frames"] == 2
    assert after["frames_prechecked"] - before["frames_prechecked"] == 2
    with Store(data) as store:
        stored = store.reader("mixed", 1).poll_batch(100)
    assert [(r.key, r.value, list(map(tuple, r.headers)), r.sequence) for r in stored] == [
        ("customer-7", {"order": 1}, [], 10),
        (b"\xff\xfe", b"\x00\x01", [("trace", "abc"), ("bin", b"\xfe")], 11),
        (None, {"order": 3}, [("empty", "")], 12),
        ("customer-7", b"not json", [], 13),
    ]
    assert {r.producer_id for r in stored} == {"kafka-42.0.mixed.1"}


def test_no_other_connection_may_claim_to_be_the_kafka_child(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """The key the manager gave its Kafka child is never on disk: a client with the
    authkey that shows another one, or shows one in another role, is refused at its hello."""
    _, _, data = running
    for role, key in (("publisher", "0" * 64), ("publisher", ""), ("consumer", "0" * 64)):
        conn = _connect(data)
        try:
            answer = _hello(conn, role, link_key=key)
            assert answer["op"] == "error", (role, key, answer)
            assert answer["code"] == "authentication"
            with pytest.raises((EOFError, OSError)):
                protocol.receive(conn)  # and the connection is closed
        finally:
            conn.close()
    assert not [p for p in data.rglob("*") if p.is_file() and b"0" * 64 in p.read_bytes()]


def test_a_publisher_cannot_send_the_pre_checked_form(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """A plain publisher's frame in the pre-checked form is a bad frame, which closes
    its connection, and stores nothing: only the Kafka child's records skip the checks."""
    _, _, data = running
    conn = _connect(data)
    try:
        assert _hello(conn, "publisher")["op"] == "welcome"
        # Records no check would pass, yet a well-formed pre-checked frame: fields out of
        # order, and a second "offset" that readers would take for the record's own.
        forged = [b'"value":1,"key":null,"headers":[],"offset":99', b'"value":2']
        conn.send_bytes(
            encode_checked_frame(9, "all", "forger", "guarded", 0, forged, None, None, None)
        )
        answer = protocol.receive(conn)
        assert answer["op"] == "error"
        assert answer["code"] == "protocol"
        with pytest.raises((EOFError, OSError)):
            protocol.receive(conn)
    finally:
        conn.close()
    with Store(data) as store:
        assert store.reader("guarded", 0).poll_batch(10) == []


def test_a_broker_without_a_kafka_child_refuses_every_claim(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    broker = BrokerProcess(data)
    broker.start(timeout=90)
    try:
        conn = _connect(data)
        try:
            answer = _hello(conn, "publisher", link_key="")
            assert (answer["op"], answer["code"]) == ("error", "authentication")
        finally:
            conn.close()
    finally:
        broker.stop()


def test_a_kafka_priority_header_that_is_not_one_digit_is_kept(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """A Kafka producer may send any header: the reserved priority header with a value
    that is not one digit is stored as it came (delivery counts it as 0; docs/FORMAT.md),
    where a native publisher's is refused."""
    _, address, data = running
    records = [
        OutRecord(0, 1000, None, b'{"n":1}', [("x-spoolmq-priority", b"high")]),
        OutRecord(1, 1000, None, b'{"n":2}', [("x-spoolmq-priority", b"7")]),
    ]
    host, port = address.split(":")
    with socket.create_connection((host, int(port)), timeout=WAIT) as sock:
        answer = call(sock, 0, 3, produce_body("mixed", 0, encode_batch(records)))
        assert produce_answer(answer) == (0, 0)
    with Store(data) as store:
        stored = store.reader("mixed", 0).poll_batch(10)
    assert [(r.value, list(map(tuple, r.headers))) for r in stored] == [
        ({"n": 1}, [("x-spoolmq-priority", "high")]),
        ({"n": 2}, [("x-spoolmq-priority", "7")]),
    ]
    # And both are delivered (the ConsumerBroker was told they have headers).
    seen: set[int] = set()
    with Consumer("mixed", group="priorities", data=data) as consumer:
        while {1, 2} - seen:
            message = consumer.receive(timeout=WAIT)
            assert message is not None, f"only {sorted(seen)} of n 1 and 2 were delivered"
            if message.partition == 0:
                seen.add(message.value["n"])
            message.ack()
