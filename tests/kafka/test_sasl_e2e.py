"""SASL/SCRAM-SHA-256 and TLS end to end: a broker whose Kafka listener is on an address
other than loopback, real clients (confluent-kafka/librdkafka and kafka-python)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient
from groups_helpers import outward_address, self_signed_certificate
from kafka_helpers import free_port

from spoolmq import Store
from spoolmq.kafka.scram import Credential, save_users
from spoolmq.testing import BrokerProcess

HOST = outward_address()
pytestmark = pytest.mark.skipif(HOST is None, reason="no address other than loopback")


@contextmanager
def outward_broker(data: Path, *extra: str) -> Iterator[str]:
    with Store(data) as store:
        store.create_topic("orders", partitions=1)
    save_users(data, {"alice": Credential.derive("wonderland")})
    address = f"{HOST}:{free_port()}"
    broker = BrokerProcess(
        data, args=["--kafka", address, *extra], log_file=data.parent / "broker.log"
    )
    broker.start(timeout=90)
    try:
        yield address
    finally:
        broker.stop()


def sasl(address: str, password: str, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap.servers": address,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanism": "SCRAM-SHA-256",
        "sasl.username": "alice",
        "sasl.password": password,
        **extra,
    }


def produce_and_consume(config: dict[str, Any]) -> list[bytes]:
    """Produce one record with acks=all and read the topic back through a group."""
    producer = Producer({**config, "acks": "all"})
    producer.produce("orders", b"secret order")
    assert producer.flush(60) == 0, "the record was not acknowledged"
    consumer = Consumer({**config, "group.id": "sasl-group", "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    got: list[bytes] = []
    try:
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg.value())
                break
    finally:
        consumer.close()
    return got


def refused(config: dict[str, Any]) -> bool:
    try:
        AdminClient(config).list_topics(timeout=15)
    except KafkaException:
        return True
    return False


def test_scram_accepted_wrong_password_and_no_sasl_refused(tmp_path: Path) -> None:
    with outward_broker(tmp_path / "queue_data") as address:
        assert produce_and_consume(sasl(address, "wonderland")) == [b"secret order"]
        assert refused(sasl(address, "looking-glass"))
        assert refused({"bootstrap.servers": address})
        # The refusals cost their connections only: the right password still works.
        assert "orders" in AdminClient(sasl(address, "wonderland")).list_topics(timeout=30).topics


def test_kafka_python_authenticates_with_scram(tmp_path: Path) -> None:
    from kafka.errors import KafkaError

    from kafka import KafkaAdminClient

    with outward_broker(tmp_path / "queue_data") as address:
        common = {
            "bootstrap_servers": address,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-256",
            "sasl_plain_username": "alice",
            "request_timeout_ms": 15_000,
        }
        admin = KafkaAdminClient(**common, sasl_plain_password="wonderland")
        assert "orders" in admin.list_topics()
        admin.close()
        with pytest.raises(KafkaError):
            KafkaAdminClient(**common, sasl_plain_password="wrong")


@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed")
def test_tls_with_a_self_signed_certificate(tmp_path: Path) -> None:
    assert HOST is not None
    cert, key = self_signed_certificate(tmp_path, HOST)
    with outward_broker(tmp_path / "queue_data", "--kafka-tls", str(cert), str(key)) as address:
        tls = sasl(address, "wonderland", **{"security.protocol": "SASL_SSL"})
        tls["ssl.ca.location"] = str(cert)
        assert produce_and_consume(tls) == [b"secret order"]
        # A client that does not speak TLS gets nowhere.
        assert refused(sasl(address, "wonderland"))


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")
def test_kcat_authenticates_with_scram(tmp_path: Path) -> None:
    """Debian's kcat (librdkafka 2.0.2) looks for SaslHandshake v0 in the table before it
    uses SASL at all: with v1 alone it said "SASL Handshake not supported by broker"."""
    import subprocess

    with outward_broker(tmp_path / "q") as address:
        common = ["kcat", "-b", address, "-X", "security.protocol=SASL_PLAINTEXT"]
        common += ["-X", "sasl.mechanism=SCRAM-SHA-256", "-X", "sasl.username=alice"]
        listed = subprocess.run(
            [*common, "-X", "sasl.password=wonderland", "-L", "-m", "30"],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert listed.returncode == 0, listed.stderr
        assert 'topic "orders"' in listed.stdout
        wrong = subprocess.run(
            [*common, "-X", "sasl.password=looking-glass", "-L", "-m", "10"],
            capture_output=True,
            text=True,
            timeout=90,
        )
        assert wrong.returncode != 0 and 'topic "orders"' not in wrong.stdout
