"""The Kafka front under restarts, kills and hostile bytes: idempotent retries stored once,
no ACKed message lost when the Kafka child is SIGKILLed, every frame survived."""

from __future__ import annotations

import asyncio
import socket
import struct
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka_helpers import call, free_port, kafka_broker, produce_answer, produce_body

from spoolmq import Store
from spoolmq.kafka.api import ApiKey, ErrorCode
from spoolmq.kafka.records import OutRecord, encode_batch
from spoolmq.kafka.server import KafkaServer
from spoolmq.testing import BrokerProcess, wait_until


def _idempotent_batch(producer_id: int, base_sequence: int, values: list[bytes]) -> bytes:
    records = [OutRecord(i, 1000, None, v, []) for i, v in enumerate(values)]
    return encode_batch(
        records, producer_id=producer_id, producer_epoch=0, base_sequence=base_sequence
    )


def _connect(address: str) -> socket.socket:
    host, port = address.split(":")
    return socket.create_connection((host, int(port)), timeout=60)


def test_an_idempotent_retry_after_a_broker_restart_is_stored_once(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    port = free_port()
    values = [b"v%d" % i for i in range(10)]
    batch = _idempotent_batch(4242, 0, values)
    with kafka_broker(data, port=port) as (_, address), _connect(address) as sock:
        call(sock, ApiKey.METADATA, 1, struct.pack(">i", 1) + struct.pack(">h", 3) + b"idm")
        error, first_base = produce_answer(
            call(sock, ApiKey.PRODUCE, 3, produce_body("idm", 0, batch))
        )
        assert error == ErrorCode.NONE
    # The whole broker restarts; the producer, which never saw the answer, retries.
    with kafka_broker(data, port=port) as (_, address), _connect(address) as sock:
        error, retry_base = produce_answer(
            call(sock, ApiKey.PRODUCE, 3, produce_body("idm", 0, batch))
        )
        assert (error, retry_base) == (ErrorCode.NONE, first_base)
        # The next batch of the same producer goes on after it.
        more = _idempotent_batch(4242, 10, [b"v10"])
        error, next_base = produce_answer(
            call(sock, ApiKey.PRODUCE, 3, produce_body("idm", 0, more))
        )
        assert (error, next_base) == (ErrorCode.NONE, first_base + 10)
    with Store(data) as store:
        stored = [r.value for r in store.reader("idm", 0).poll_batch(100)]
    assert stored == [*values, b"v10"]


def test_a_clean_stop_after_produce_logs_no_warning(tmp_path: Path) -> None:
    """Stopping the broker closes the Kafka child's link to the PublisherBroker: that is
    expected, not something an operator is warned about."""
    data, log = tmp_path / "data", tmp_path / "broker.log"
    with Store(data) as store:
        store.create_topic("t")
    batch = encode_batch([OutRecord(0, 1000, None, b'"x"', [])])
    with kafka_broker(data, log_file=log) as (_broker, address), _connect(address) as sock:
        error, _base = produce_answer(call(sock, ApiKey.PRODUCE, 3, produce_body("t", 0, batch)))
        assert error == ErrorCode.NONE
    text = log.read_text()
    assert "broker ready" in text  # the log is the broker's
    assert " WARNING " not in text and " ERROR " not in text, text


def test_sigkill_of_the_kafka_child_during_acks_all_produce_loses_no_acked_message(
    tmp_path: Path,
) -> None:
    from confluent_kafka import Producer

    data = tmp_path / "queue_data"
    with kafka_broker(data) as (broker, address):
        acked: list[bytes] = []
        failed: list[object] = []
        lock = threading.Lock()

        def delivered(err: object, msg: object) -> None:
            with lock:
                if err is None:
                    acked.append(msg.value())  # type: ignore[attr-defined]
                else:
                    failed.append(err)

        producer = Producer(
            {
                "bootstrap.servers": address,
                "acks": "all",
                "enable.idempotence": True,
                "linger.ms": 2,
                "message.timeout.ms": 120000,
            }
        )
        total = 3000
        stop_after = 600

        def produce_all() -> None:
            for i in range(total):
                while True:
                    try:
                        producer.produce("killed", value=b"m%06d" % i, on_delivery=delivered)
                        break
                    except BufferError:
                        producer.poll(0.1)
                producer.poll(0)
            producer.flush(180)

        thread = threading.Thread(target=produce_all)
        thread.start()
        wait_until(lambda: len(acked) >= stop_after, 120, "some ACKed messages")
        old = broker.kill_child("kafka")
        broker.wait_child_replaced("kafka", old, timeout=90)
        thread.join(240)
        assert not thread.is_alive()
        with Store(data) as store:
            stored = [r.value for r in store.reader("killed", 0).poll_batch(10 * total)]
        assert set(acked) <= set(stored), "an ACKed message was lost"
        # Idempotent retries after the kill were recognised: nothing stored twice.
        assert len(stored) == len(set(stored))
        assert failed == [] and len(acked) == total


def test_before_sasl_only_the_handshake_apis_are_served(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = KafkaServer(tmp_path, "127.0.0.1", 0, auth_required=True)
        await server.start()
        try:
            await asyncio.to_thread(_exchange, f"127.0.0.1:{server.port}")
        finally:
            await server.close()

    def _exchange(address: str) -> None:
        with _connect(address) as sock:
            reader = call(sock, ApiKey.API_VERSIONS, 1, b"")
            assert reader.int16() == ErrorCode.NONE
            with pytest.raises(ConnectionError):
                call(sock, ApiKey.METADATA, 1, struct.pack(">i", -1))

    asyncio.run(scenario())


def test_before_sasl_a_frame_past_512_kib_closes_the_connection_from_its_size(
    tmp_path: Path,
) -> None:
    """Where SASL is required, a connection that has not authenticated may send frames of
    512 KiB at most (Kafka's sasl.server.max.receive.size): one byte more and it is closed
    from the size prefix alone, before the body is read or room made for it. Without SASL,
    or at the limit, the same frame is answered."""
    from spoolmq.kafka.server import MAX_UNAUTHENTICATED_REQUEST_BYTES as LIMIT

    def api_versions_of(size: int) -> bytes:
        # ApiVersions v1 (its body is not read) padded to a frame of ``size`` bytes.
        return b"\0" * (size - 14)  # the header: key, version, correlation id, "test"

    async def scenario(auth_required: bool) -> None:
        server = KafkaServer(tmp_path, "127.0.0.1", 0, auth_required=auth_required)
        await server.start()
        try:
            await asyncio.to_thread(_exchange, f"127.0.0.1:{server.port}", auth_required)
        finally:
            await server.close()

    def _exchange(address: str, auth_required: bool) -> None:
        with _connect(address) as sock:
            assert call(sock, ApiKey.API_VERSIONS, 1, api_versions_of(LIMIT)).int16() == 0
            if not auth_required:
                answer = call(sock, ApiKey.API_VERSIONS, 1, api_versions_of(LIMIT + 1), corr=2)
                assert answer.int16() == ErrorCode.NONE
                return
            sock.sendall(struct.pack(">i", LIMIT + 1))  # the size alone, no body
            assert sock.recv(1) == b"", "the connection stays open"

    asyncio.run(scenario(auth_required=True))
    asyncio.run(scenario(auth_required=False))


# -- fuzz ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[BrokerProcess, str]]:
    data = tmp_path_factory.mktemp("fuzz") / "queue_data"
    with kafka_broker(data) as running:
        yield running


_KEYS = [int(k) for k in ApiKey] + [99, -1]
_frames = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda key, version, body: struct.pack(">hhih", key, version, 7, -1) + body,
        st.sampled_from(_KEYS),
        st.integers(min_value=-1, max_value=12),
        st.binary(max_size=300),
    ),
)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(payload=_frames, lie=st.integers(min_value=-8, max_value=8))
def test_fuzzed_request_frames_never_take_the_child_down(
    fuzz_target: tuple[BrokerProcess, str], payload: bytes, lie: int
) -> None:
    broker, address = fuzz_target
    with _connect(address) as sock:
        sock.settimeout(2.0)
        sock.sendall(struct.pack(">i", len(payload) + lie) + payload)
        sock.shutdown(socket.SHUT_WR)
        try:
            while sock.recv(65536):
                pass
        except (TimeoutError, ConnectionError):
            pass
    # The next connection is served, by the same Kafka child.
    with _connect(address) as sock:
        assert call(sock, ApiKey.API_VERSIONS, 0, b"").int16() == ErrorCode.NONE
    assert broker.stats()["restarts"].get("kafka", 0) == 0
