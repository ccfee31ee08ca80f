"""``spoolmq export --kafka``: a topic's records copied from one store to a Kafka listener
(a spoolmq broker of a second data directory), read back there with kafka-python."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from kafka_helpers import free_port, kafka_broker

from spoolmq.cli import main
from spoolmq.kafka.core import fields_to_kafka
from spoolmq.store import Message, Store

# (partition, key, value, headers) as given to Store.append: JSON values, raw bytes
# values, text and raw-bytes keys, no key, headers of text and of bytes that are not UTF-8.
SOURCE: list[tuple[int, str | bytes | None, Any, list[tuple[str, str | bytes]]]] = [
    (0, "customer-1", {"order": 1, "items": ["a", "b"]}, [("region", "eu")]),
    (0, "customer-1", {"order": 2, "total": 12.5}, []),
    (1, None, b"\x00\xffraw bytes\x80", [("blob", b"\xfe\xff"), ("kind", "bin")]),
    (1, b"\xc3\x28", [1, 2, 3], [("trace", "t-1")]),
    (2, "customer-2", "plain text", []),
    (2, "customer-2", b'{"spaced": 1}', [("x", "1"), ("x", "2")]),
]


def _stores(tmp_path: Path) -> tuple[Path, Path]:
    """A source store whose topic "orders" (3 partitions) holds SOURCE, and the path of a
    second data directory for the target broker."""
    source = tmp_path / "source"
    with Store(source) as store:
        store.create_topic("orders", partitions=3)
        for partition, key, value, headers in SOURCE:
            store.append("orders", value, key=key, headers=headers, partition=partition)
    return source, tmp_path / "target"


def _one_record_store(path: Path) -> None:
    with Store(path) as store:
        store.create_topic("orders")
        store.append("orders", {"n": 1})


def _read_back(address: str, topic: str, count: int, partitions: int = 3) -> list[Any]:
    """Up to ``count`` records of ``topic`` read with kafka-python from the start of each
    of its ``partitions`` (waiting at most 60 s for them)."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=address, auto_offset_reset="earliest")
    try:
        parts = [TopicPartition(topic, p) for p in range(partitions)]
        consumer.assign(parts)
        consumer.seek_to_beginning(*parts)
        got: list[Any] = []
        deadline = time.monotonic() + 60
        while len(got) < count and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=1000).values():
                got.extend(records)
        return got
    finally:
        consumer.close()


def test_export_copies_keys_values_headers_and_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source, target = _stores(tmp_path)
    with Store(target) as store:
        store.create_topic("orders-copy", partitions=3)

    with kafka_broker(target) as (_, address):
        code = main(
            ["export", "--data", str(source), "--kafka", address, "orders", "--to", "orders-copy"]
        )
        out = capsys.readouterr().out
        assert code == 0
        assert f"exported {len(SOURCE)} records" in out
        got = _read_back(address, "orders-copy", len(SOURCE))

    # Compare against the store, byte for byte: the records the source holds, in order
    # within each partition, with the bytes its Kafka front would serve for them.
    with Store(source) as store:
        wanted = []
        for partition in range(3):
            reader = store.reader("orders", partition)
            for fields, _line in reader.read_entries(100):
                key, value, headers = fields_to_kafka(fields)
                wanted.append((partition, key, value, headers, fields["timestamp"]))
            reader.close()
    assert len(got) == len(wanted) == len(SOURCE)
    got_sorted = sorted(got, key=lambda r: (r.partition, r.offset))
    assert [(r.partition, r.key, r.value, list(r.headers)) for r in got_sorted] == [
        (p, k, v, h) for p, k, v, h, _ in wanted
    ]
    # Spot checks that the mapping is the one a Kafka user expects.
    by_value = {r.value: r for r in got}
    assert by_value[b"\x00\xffraw bytes\x80"].headers == [("blob", b"\xfe\xff"), ("kind", b"bin")]
    assert by_value[b"\x00\xffraw bytes\x80"].key is None
    assert by_value[b"[1,2,3]"].key == b"\xc3\x28"
    assert by_value[b'{"spaced": 1}'].partition == 2
    # A spoolmq target stamps records as it stores them (LogAppendTime), so the copy's
    # times are the export's, never before the source's.
    for record, (*_, stamp) in zip(got_sorted, wanted, strict=True):
        assert record.timestamp >= stamp


def test_export_of_an_unknown_topic_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Store(tmp_path / "source") as store:
        store.create_topic("orders")
    code = main(["export", "--data", str(tmp_path / "source"), "--kafka", "127.0.0.1:9", "nope"])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "nope" in err


def test_export_to_an_unreachable_cluster_fails_within_the_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _one_record_store(tmp_path / "source")
    began = time.monotonic()
    code = main(
        [
            "export",
            "--data",
            str(tmp_path / "source"),
            "--kafka",
            f"127.0.0.1:{free_port()}",
            "--timeout",
            "3",
            "orders",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "no answer from the Kafka cluster" in err
    # Bounded: the 3 s timeout, not librdkafka's default of minutes (generous for a busy box).
    assert time.monotonic() - began < 60


def test_export_of_part_of_a_topic_to_fewer_partitions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--partition and --from-offset pick what goes; a partition the target does not have
    is left to the target's partitioner (here: its only partition)."""
    source, target = _stores(tmp_path)
    with Store(target) as store:
        store.create_topic("orders", partitions=1)
    with kafka_broker(target) as (_, address):
        argv = ["export", "--data", str(source), "--kafka", address, "orders"]
        code = main([*argv, "--partition", "1", "--partition", "2", "--from-offset", "1"])
        assert code == 0
        assert "exported 2 records" in capsys.readouterr().out
        got = _read_back(address, "orders", 2, partitions=1)
    # Offset 1 of partitions 1 and 2, in the order exported; offset 0 of each is not.
    assert sorted((r.key, r.value) for r in got) == sorted(
        [(b"\xc3\x28", b"[1,2,3]"), (b"customer-2", b'{"spaced": 1}')]
    )
    assert {r.partition for r in got} == {0}


@pytest.mark.parametrize(("records", "to"), [(3, "orders"), (20_000, "_refused")])
def test_delivery_failures_are_counted(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], records: int, to: str
) -> None:
    """A target that refuses the topic (no auto-creation) fails every record: the export
    says how many, in one line, and exits non-zero instead of claiming a copy. A name the
    target calls invalid (spoolmq's names do not start with "_"), with many records:
    librdkafka learns of it while they are still being queued and refuses the next one
    at once (that was a traceback); the export stops there."""
    from spoolmq.testing import BrokerProcess

    source, target = tmp_path / "source", tmp_path / "target"
    with Store(source) as store:
        store.create_topic("orders", partitions=1)
        store.append_batch("orders", [Message(value={"n": n}) for n in range(records)])
    port = free_port()
    broker = BrokerProcess(
        target, args=["--kafka", f"127.0.0.1:{port}", "--auto-create-topics", "off"]
    )
    broker.start(timeout=90)
    try:
        code = main(
            [
                "export",
                "--data",
                str(source),
                "--kafka",
                f"127.0.0.1:{port}",
                "--timeout",
                "5",
                "orders",
                "--to",
                to,
            ]
        )
    finally:
        broker.stop()
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    if records == 3:
        assert "3 of 3 records were not delivered" in err
    else:
        assert (
            "stopped: the cluster refused it" in err and "0 records were delivered before" in err
        ) or f"{records} of {records} records were not delivered" in err, err


def test_export_to_a_name_kafka_would_refuse_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--to ""`` exported the topic into itself."""
    _one_record_store(tmp_path / "source")
    for name in ("", "a b", "..", "x" * 250):
        argv = ["export", "--data", str(tmp_path / "source"), "--kafka", "127.0.0.1:9"]
        assert main([*argv, "orders", "--to", name]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "is not a Kafka topic name" in err, err
