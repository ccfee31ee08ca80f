"""Real Kafka clients against a real broker with ``--kafka``: the guide's code, kafka-python,
confluent-kafka, aiokafka, and cross traffic with spoolmq's own clients."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kafka_helpers import kafka_broker

from readme_examples import code_blocks
from spoolmq import Consumer, Publisher, Store
from spoolmq.store.partitioner import partition_for_key
from spoolmq.testing import BrokerProcess, run_spoolmq, wait_until

HERE = Path(__file__).parent


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str, Path]]:
    data = tmp_path_factory.mktemp("kafka") / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=3)
        store.create_topic("keyed", partitions=3)
    log = data.parent / "broker.log"
    with kafka_broker(data, log_file=log) as (broker, address):
        yield broker, address, data


def _guide(name: str, address: str) -> str:
    """The guide's code as it is, only pointed at this test's listener."""
    return (HERE / name).read_text().replace("localhost:9092", address)


def test_the_guides_producer_and_consumer_run_unchanged(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    _, address, data = running
    # The README shows the guide's code as it is.
    assert code_blocks("Kafka clients")[:2] == [
        (HERE / "guide_producer.txt").read_text(),
        (HERE / "guide_consumer.txt").read_text(),
    ]
    produced = subprocess.run(
        [sys.executable, "-c", _guide("guide_producer.txt", address)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert produced.returncode == 0, produced.stderr
    assert "Order event sent!" in produced.stdout
    consumer = subprocess.Popen(
        [sys.executable, "-u", "-c", _guide("guide_consumer.txt", address)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        lines: list[str] = []
        assert consumer.stdout is not None
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            line = consumer.stdout.readline()
            if not line:
                break
            lines.append(line.strip())
            if line.startswith("Processing order"):
                break
        assert "Processing order: 12345" in lines, lines
    finally:
        consumer.kill()
        consumer.wait(30)
    # The event is in the store, readable by spoolmq's own reader.
    with Store(data) as store:
        values = [r.value for p in range(3) for r in store.reader("orders", p).poll_batch(100)]
    assert any(isinstance(v, bytes) and b'"order_id": "12345"' in v for v in values), values


def test_kafka_python_bytes_keys_headers_round_trip_and_cross_traffic(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    _, address, data = running
    producer = KafkaProducer(bootstrap_servers=address, acks="all")
    sent = [
        (b"customer-7", b'{"n":1}', [("trace", b"abc")]),
        (b"\xff\x00raw", b"\x00\x01\x02 not json", [("bin", b"\xfe\xff")]),
        (None, b"null", []),
        (b"k", None, []),
        (b"", b"", [("empty", b"")]),
    ]
    metas = [producer.send("cross", key=k, value=v, headers=h).get(timeout=60) for k, v, h in sent]
    producer.close()
    assert [m.offset for m in metas] == [0, 1, 2, 3, 4]

    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=20000)
    consumer.assign([TopicPartition("cross", 0)])
    consumer.seek_to_beginning()
    got = []
    for message in consumer:
        got.append((message.key, message.value, list(message.headers)))
        if len(got) == len(sent):
            break
    consumer.close()
    assert got == [(k, v, list(h)) for k, v, h in sent]

    # A spoolmq Consumer reads what Kafka produced: canonical JSON as data, the rest as bytes.
    with Consumer("cross", group="g-cross", data=data) as spool:
        received = []
        while len(received) < len(sent):
            message = spool.receive(timeout=30)
            assert message is not None
            received.append((message.key, message.value, list(message.headers)))
            message.ack()
    assert received[0] == ("customer-7", {"n": 1}, [("trace", "abc")])
    assert received[1][0] == b"\xff\x00raw" and received[1][1] == b"\x00\x01\x02 not json"
    assert received[1][2] == [("bin", b"\xfe\xff")]
    assert received[2][1] == b"null" and received[3][1] is None

    # And the other way: spoolmq's Publisher, read by a Kafka consumer.
    with Publisher(data) as publisher:
        publisher.publish("cross", {"from": "spoolmq"}, key="p-1", headers={"h": "v"})
        publisher.publish("cross", b"\x00raw bytes")
    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=20000)
    consumer.assign([TopicPartition("cross", 0)])
    consumer.seek(TopicPartition("cross", 0), len(sent))
    tail = []
    for message in consumer:
        tail.append((message.key, message.value, list(message.headers)))
        if len(tail) == 2:
            break
    consumer.close()
    assert tail == [(b"p-1", b'{"from":"spoolmq"}', [("h", b"v")]), (None, b"\x00raw bytes", [])]


def test_a_kafka_consumer_reads_the_log_as_it_is(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """The task-queue delivery features are spoolmq's consumers' (docs/KAFKA.md, "What a
    Kafka consumer sees"): a Kafka consumer fetches the log as Kafka's do, so a message
    delayed by an hour or past its TTL is fetched at once, and the reserved headers come
    as headers."""
    from kafka import KafkaConsumer, TopicPartition

    _, address, data = running
    with Publisher(data) as publisher:
        publisher.publish("as-is", {"n": 1}, delay=3600)
        publisher.publish("as-is", {"n": 2}, priority=9, ttl=0.001)
    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=20000)
    consumer.assign([TopicPartition("as-is", 0)])
    consumer.seek_to_beginning()
    got = []
    for message in consumer:
        got.append((message.value, list(message.headers)))
        if len(got) == 2:
            break
    consumer.close()
    assert got == [(b'{"n":1}', []), (b'{"n":2}', [("x-spoolmq-priority", b"9")])]


def test_a_key_goes_to_the_same_partition_from_both_clients(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    from kafka import KafkaProducer

    _, address, data = running
    producer = KafkaProducer(bootstrap_servers=address, acks="all")
    keys = [f"customer-{i}" for i in range(12)]
    kafka_parts = {
        k: producer.send("keyed", key=k.encode(), value=b"1").get(60).partition for k in keys
    }
    producer.close()
    with Publisher(data) as publisher:
        spool_parts = {k: publisher.publish("keyed", 1, key=k).partition for k in keys}
    assert kafka_parts == spool_parts
    assert spool_parts == {k: partition_for_key(k, 3) for k in keys}
    assert len(set(spool_parts.values())) > 1  # the keys really spread


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_produces_with_each_codec(
    running: tuple[BrokerProcess, str, Path], codec: str
) -> None:
    from confluent_kafka import Consumer as CKConsumer
    from confluent_kafka import Producer as CKProducer

    _, address, _ = running
    topic = f"codec-{codec}"
    producer = CKProducer(
        {
            "bootstrap.servers": address,
            "acks": "all",
            "compression.type": codec,
            "enable.idempotence": True,
            "linger.ms": 5,
        }
    )
    errors: list[object] = []
    values = [f"value {i} ".encode() * 20 for i in range(50)]
    for i, value in enumerate(values):
        producer.produce(
            topic,
            value=value,
            key=f"k{i}".encode(),
            headers=[("i", str(i).encode())],
            on_delivery=lambda err, msg: errors.append(err) if err else None,
        )
    assert producer.flush(60) == 0
    assert errors == []
    consumer = CKConsumer(
        {
            "bootstrap.servers": address,
            "group.id": f"g-{codec}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    from confluent_kafka import TopicPartition as CKTopicPartition

    consumer.assign([CKTopicPartition(topic, 0, 0)])
    got = []
    deadline = time.monotonic() + 60
    while len(got) < len(values) and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None or msg.error():
            continue
        got.append((msg.key(), msg.value(), msg.headers()))
    consumer.close()
    assert got == [(f"k{i}".encode(), v, [("i", str(i).encode())]) for i, v in enumerate(values)]


def test_a_header_with_an_empty_name_fails_its_message_at_once(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """Kafka allows a header with an empty name; spoolmq's headers all have one. The batch
    is answered INVALID_RECORD, which librdkafka does not retry: its message fails at once
    (CORRUPT_MESSAGE was retried until message.timeout.ms, holding back the messages behind
    it), and the next message is stored."""
    from confluent_kafka import KafkaError
    from confluent_kafka import Producer as CKProducer

    _, address, data = running
    producer = CKProducer(
        {"bootstrap.servers": address, "acks": "all", "message.timeout.ms": 120_000}
    )
    results: list[tuple[bytes, object]] = []

    def delivered(err: object, msg: object) -> None:
        results.append((msg.value(), err))  # type: ignore[attr-defined]

    producer.produce("unnamed", value=b"bad", headers=[("", b"x")], on_delivery=delivered)
    assert producer.flush(60) == 0
    producer.produce("unnamed", value=b"good", on_delivery=delivered)
    assert producer.flush(60) == 0
    (bad, bad_error), (good, good_error) = results
    assert (bad, good, good_error) == (b"bad", b"good", None)
    assert bad_error is not None and bad_error.code() == KafkaError.INVALID_RECORD  # type: ignore[attr-defined]
    with Store(data) as store:
        assert [r.value for r in store.reader("unnamed", 0)] == [b"good"]


def test_a_transactional_producer_is_refused_at_once(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    """Transactions are not supported: a transactional producer fails in
    init_transactions() with a fatal error, where librdkafka retried the transaction
    coordinator's lookup until its timeout (COORDINATOR_NOT_AVAILABLE is retriable)."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka import Producer as CKProducer
    from kafka.errors import TransactionalIdAuthorizationFailedError

    from kafka import KafkaProducer

    _, address, _ = running
    producer = CKProducer({"bootstrap.servers": address, "transactional.id": "tx-ck"})
    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(60)  # the timeout it ran into before
    error = refused.value.args[0]
    assert error.code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, error
    assert error.fatal()
    with pytest.raises(TransactionalIdAuthorizationFailedError):
        python_producer = KafkaProducer(bootstrap_servers=address, transactional_id="tx-kp")
        try:
            python_producer.init_transactions()
        finally:
            python_producer.close(timeout=10)


def test_aiokafka_produces_and_consumes(running: tuple[BrokerProcess, str, Path]) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    _, address, _ = running

    async def scenario() -> list[tuple[bytes | None, bytes | None]]:
        producer = AIOKafkaProducer(bootstrap_servers=address, acks="all")
        await producer.start()
        try:
            for i in range(10):
                await producer.send_and_wait("aio", key=b"a%d" % i, value=b"v%d" % i)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=address, auto_offset_reset="earliest")
        await consumer.start()
        try:
            consumer.assign([TopicPartition("aio", 0)])
            await consumer.seek_to_beginning(TopicPartition("aio", 0))
            got = []
            while len(got) < 10:
                batch = await asyncio.wait_for(consumer.getmany(timeout_ms=1000), 60)
                for messages in batch.values():
                    got.extend((m.key, m.value) for m in messages)
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(scenario())
    assert got == [(b"a%d" % i, b"v%d" % i) for i in range(10)]


def test_offsets_for_times_seeks_by_timestamp(running: tuple[BrokerProcess, str, Path]) -> None:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    _, address, _ = running
    producer = KafkaProducer(bootstrap_servers=address, acks="all")
    first = [producer.send("timed", value=b"early%d" % i).get(60) for i in range(3)]
    # The store stamps records as it writes them: wait until its clock has moved on.
    boundary = first[-1].timestamp + 1
    wait_until(lambda: time.time() * 1000 > boundary + 5, 30, "the clock to move on")
    later = [producer.send("timed", value=b"late%d" % i).get(60) for i in range(3)]
    producer.close()
    assert later[0].timestamp >= boundary
    consumer = KafkaConsumer(bootstrap_servers=address, consumer_timeout_ms=20000)
    tp = TopicPartition("timed", 0)
    found = consumer.offsets_for_times({tp: boundary})[tp]
    assert found is not None and found.offset == later[0].offset
    assert found.timestamp == later[0].timestamp
    assert consumer.offsets_for_times({tp: later[-1].timestamp + 10**6})[tp] is None
    consumer.assign([tp])
    consumer.seek(tp, found.offset)
    values = [next(consumer).value for _ in range(3)]
    consumer.close()
    assert values == [b"late0", b"late1", b"late2"]


def test_admin_client_creates_describes_and_cannot_delete_topics(
    running: tuple[BrokerProcess, str, Path],
) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient, NewTopic
    from kafka.errors import KafkaError, TopicAlreadyExistsError

    _, address, data = running
    admin = KafkaAdminClient(bootstrap_servers=address)
    try:
        admin.create_topics(
            [NewTopic("admin-made", 4, 1, topic_configs={"retention.ms": "3600000"})]
        )
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([NewTopic("admin-made", 4, 1)])
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "admin-made")])
        text = repr(described)
        # (kafka-python shows only the settings that differ from the defaults.)
        assert "'retention.ms': {'value': '3600000'" in text, text
        # `spoolmq topics alter` from another process shows at once (the child's store
        # kept what it had read before).
        altered = run_spoolmq(
            "topics", "alter", "admin-made", "--retention", "2h", "--data", str(data)
        )
        assert altered.returncode == 0, altered.stderr
        described = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, "admin-made")])
        assert "'retention.ms': {'value': '7200000'" in repr(described), repr(described)
        # Deleting needs the broker stopped: answered as delete.topic.enable=false.
        try:
            outcome = repr(admin.delete_topics(["admin-made"]))
        except KafkaError as exc:
            outcome = repr(exc)
        assert "TopicDeletionDisabled" in outcome or "73" in outcome, outcome
    finally:
        admin.close()
    with Store(data) as store:
        config = store.topic_config("admin-made")
    assert (config.partitions, config.retention_ms) == (4, 7200000)
