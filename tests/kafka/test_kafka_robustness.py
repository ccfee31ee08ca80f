"""The Kafka front under restarts, kills and hostile bytes: idempotent retries stored once,
no ACKed message lost when the Kafka child is SIGKILLed, every frame survived."""

from __future__ import annotations

import asyncio
import socket
import ssl
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


# -- connections: how many, and how long before authenticating -------------------------


def _api_versions_answered(sock: socket.socket) -> bool:
    return call(sock, ApiKey.API_VERSIONS, 1, b"").int16() == ErrorCode.NONE


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (waits for it, up to the socket's 60 s timeout)."""
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLEOFError):  # (TLS: closed without close_notify)
        return True


def test_connections_past_the_limit_are_closed_at_their_accept(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """At max_connections, a new connection is closed as soon as it is accepted (one log
    line for a run of them), the ones served are untouched, and once one of those ends a
    new connection is served again."""

    async def scenario() -> None:
        server = KafkaServer(tmp_path, "127.0.0.1", 0, max_connections=2)
        await server.start()
        try:
            await asyncio.to_thread(_exchange, server)
            assert server.refused_connections == 3
        finally:
            await server.close()

    def _exchange(server: KafkaServer) -> None:
        address = f"127.0.0.1:{server.port}"
        first, second = _connect(address), _connect(address)
        with first, second:
            assert _api_versions_answered(first) and _api_versions_answered(second)
            for _ in range(3):
                with _connect(address) as extra:
                    assert _closed_by_server(extra)
            assert _api_versions_answered(second)
            first.close()
            wait_until(lambda: server.connection_count < 2, 30, "the first connection to end")
            with _connect(address) as again:
                assert _api_versions_answered(again)

    with caplog.at_level("WARNING", logger="spoolmq.kafka.server"):
        asyncio.run(scenario())
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(refusals) == 1, refusals
    assert "3 connection(s) refused" not in refusals[0]  # the first is logged at once
    assert "1 connection(s) refused" in refusals[0] and "2 served" in refusals[0]


def _scram_authenticate(sock: socket.socket, user: str, password: str) -> None:
    """SaslHandshake and the two SaslAuthenticate steps of SCRAM-SHA-256, by hand."""
    import base64
    import hashlib
    import hmac

    from spoolmq.kafka.wire import Writer

    handshake = call(sock, ApiKey.SASL_HANDSHAKE, 1, Writer().string("SCRAM-SHA-256").getvalue())
    assert handshake.int16() == ErrorCode.NONE
    client_first = b"n=" + user.encode() + b",r=clientnonce"
    first = Writer().bytes_(b"n,," + client_first).getvalue()
    answer = call(sock, ApiKey.SASL_AUTHENTICATE, 0, first)
    assert answer.int16() == ErrorCode.NONE
    answer.nullable_string()
    server_first = answer.bytes_()
    fields = dict(part.split(b"=", 1) for part in server_first.split(b","))
    without_proof = b"c=biws,r=" + fields[b"r"]
    auth = client_first + b"," + server_first + b"," + without_proof
    salted = hashlib.pbkdf2_hmac(
        "sha256", password.encode(), base64.b64decode(fields[b"s"]), int(fields[b"i"])
    )
    client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
    signature = hmac.new(hashlib.sha256(client_key).digest(), auth, hashlib.sha256).digest()
    proof = base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True)))
    final = Writer().bytes_(without_proof + b",p=" + proof).getvalue()
    assert call(sock, ApiKey.SASL_AUTHENTICATE, 0, final).int16() == ErrorCode.NONE


def test_a_connection_that_does_not_authenticate_in_time_is_closed(tmp_path: Path) -> None:
    """Where SASL is required, a connection not authenticated auth_timeout_s after its
    accept is closed, whatever it sent meanwhile; one that authenticated in time stays
    open past its deadline, and so does any connection where SASL is not required."""
    from spoolmq.kafka.scram import Credential, save_users

    save_users(tmp_path, {"alice": Credential.derive("wonderland")})

    async def scenario() -> None:
        # 2 s: the SCRAM exchange (three round trips) fits on a busy machine.
        guarded = KafkaServer(tmp_path, "127.0.0.1", 0, auth_required=True, auth_timeout_s=2.0)
        open_door = KafkaServer(tmp_path, "127.0.0.1", 0, auth_timeout_s=2.0)
        await guarded.start()
        await open_door.start()
        try:
            await asyncio.to_thread(_exchange, guarded, open_door)
            assert guarded.auth_timeouts == 2 and open_door.auth_timeouts == 0
        finally:
            await guarded.close()
            await open_door.close()

    def _exchange(guarded: KafkaServer, open_door: KafkaServer) -> None:
        address = f"127.0.0.1:{guarded.port}"
        with _connect(address) as idle:
            assert _api_versions_answered(idle)  # served before SASL, and still closed
            assert _closed_by_server(idle)
        with (
            _connect(address) as alice,
            _connect(f"127.0.0.1:{open_door.port}") as plain,
        ):
            _scram_authenticate(alice, "alice", "wonderland")
            # A connection accepted after both: once its deadline has closed it, theirs
            # have passed too.
            with _connect(address) as later:
                assert _closed_by_server(later)
            assert _api_versions_answered(alice) and _api_versions_answered(plain)

    asyncio.run(scenario())


def test_the_connection_limit_reaches_the_kafka_child(tmp_path: Path) -> None:
    """``spoolmq broker --kafka-max-connections 2``: the child serves two connections,
    closes the third at its accept, and says so in its figures."""
    from spoolmq.client import Admin

    port = free_port()
    data = tmp_path / "data"
    broker = BrokerProcess(
        data,
        args=["--kafka", f"127.0.0.1:{port}", "--kafka-max-connections", "2"],
        log_file=tmp_path / "broker.log",
    )
    broker.start(timeout=90)
    try:
        address = f"127.0.0.1:{port}"
        with _connect(address) as first, _connect(address) as second:
            assert _api_versions_answered(first) and _api_versions_answered(second)
            with _connect(address) as third:
                assert _closed_by_server(third)

            def kafka_figures() -> dict[str, object]:
                with Admin(data) as admin:
                    return dict(admin.stats()["kafka"])

            # The figures come with the child's next report (once a second).
            wait_until(
                lambda: kafka_figures().get("connections_refused") == 1, 30, "the refusal's figure"
            )
            figures = kafka_figures()
            assert figures["max_connections"] == 2 and figures["auth_timeouts"] == 0
    finally:
        broker.stop()


def test_the_open_file_limit_is_raised_to_fit_the_connections(tmp_path: Path) -> None:
    """descriptors_for raises the soft limit up to the hard one; with a hard limit too low
    it serves what fits and logs why (in a process of its own: it changes the limits)."""
    import subprocess
    import sys

    script = """
import logging, resource, sys
from spoolmq.kafka.child import descriptors_for, _OWN_DESCRIPTORS
logging.basicConfig(level="WARNING", format="%(message)s")
log = logging.getLogger("t")
resource.setrlimit(resource.RLIMIT_NOFILE, (300, 2000))
print(descriptors_for(1000, log), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
print(descriptors_for(1744, log), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
resource.setrlimit(resource.RLIMIT_NOFILE, (300, 300))
print(descriptors_for(1000, log), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split("\n")[:3] == ["1000 1256", "1744 2000", "44 300"]
    assert result.stderr.count("open-file limit is 300") == 1, result.stderr


def test_over_tls_a_stalled_handshake_counts_and_is_cut_off_in_time(tmp_path: Path) -> None:
    """With --kafka-tls the TLS handshake happens on a served connection: one that never
    sends its ClientHello counts against max_connections and is closed at the SASL
    deadline like any other, and a client that speaks TLS is answered through it."""
    from groups_helpers import self_signed_certificate

    cert, key = self_signed_certificate(tmp_path, "127.0.0.1")
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    client_tls = ssl.create_default_context(cafile=str(cert))

    async def scenario() -> None:
        server = KafkaServer(
            tmp_path,
            "127.0.0.1",
            0,
            auth_required=True,
            auth_timeout_s=2.0,
            ssl_context=server_tls,
            max_connections=2,
        )
        await server.start()
        try:
            await asyncio.to_thread(_exchange, server)
            assert server.refused_connections == 1 and server.auth_timeouts == 2
        finally:
            await server.close()
        # Stopping the listener while a handshake stalls ends it (it used to wait for ever).
        plain = KafkaServer(tmp_path, "127.0.0.1", 0, ssl_context=server_tls)
        await plain.start()
        stalled = await asyncio.to_thread(_connect, f"127.0.0.1:{plain.port}")
        try:
            await asyncio.to_thread(
                wait_until, lambda: plain.connection_count == 1, 30, "the stalled connection"
            )
            await asyncio.wait_for(plain.close(), 30)
            assert plain.connection_count == 0
        finally:
            stalled.close()

    def _exchange(server: KafkaServer) -> None:
        address = f"127.0.0.1:{server.port}"
        with _connect(address) as stalled:  # TCP only: no ClientHello, ever
            with client_tls.wrap_socket(_connect(address), server_hostname="127.0.0.1") as tls:
                assert _api_versions_answered(tls)
                with _connect(address) as third:
                    assert _closed_by_server(third)
                # Neither authenticates: both are closed at their deadline.
                assert _closed_by_server(tls)
            assert _closed_by_server(stalled)
        # ...and give their places back (a handshake cut off used to hold its own).
        wait_until(lambda: server.connection_count == 0, 30, "the cut-off connections to end")
        with client_tls.wrap_socket(_connect(address), server_hostname="127.0.0.1") as again:
            assert _api_versions_answered(again)

    asyncio.run(scenario())


def test_tls_files_that_cannot_serve_are_one_line_before_any_child_starts(
    tmp_path: Path,
) -> None:
    """A missing file, the certificate and key swapped, a key of another certificate: the
    Kafka child was restarted in a loop (a traceback each time) until the start gave up
    after 60 s with an error that did not say why."""
    from groups_helpers import self_signed_certificate

    from spoolmq.testing import run_spoolmq

    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    cert, key = self_signed_certificate(tmp_path / "one", "127.0.0.1")
    _, other_key = self_signed_certificate(tmp_path / "two", "127.0.0.1")
    for pair, says in [
        ((tmp_path / "nope.pem", key), "No such file or directory"),
        ((key, cert), "CERT is the PEM certificate, KEY its private key"),
        ((cert, other_key), "KEY_VALUES_MISMATCH"),
    ]:
        result = run_spoolmq(
            "broker",
            "--data",
            str(tmp_path / "queue_data"),
            "--kafka",
            f"127.0.0.1:{free_port()}",
            "--kafka-tls",
            *map(str, pair),
            timeout=60,
        )
        assert result.returncode == 2
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith("spoolmq: cannot use --kafka-tls") and says in lines[0]
