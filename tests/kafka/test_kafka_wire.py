"""The bounded wire reader of the Kafka front and the skeleton server's ApiVersions."""

from __future__ import annotations

import asyncio
import socket
import struct
from pathlib import Path

import pytest
from kafka_helpers import recv_exact, request_frame

from spoolmq.errors import KafkaDecodeError, ProtocolError, SpoolError
from spoolmq.kafka.api import ApiKey, ErrorCode
from spoolmq.kafka.server import KafkaServer, is_loopback_host
from spoolmq.kafka.wire import Reader, Writer


def test_round_trip_of_every_primitive() -> None:
    w = Writer()
    w.int8(-3).int16(-300).int32(70000).int64(-(2**40)).uvarint(300).varint(-1).varlong(2**40)
    w.string("héllo").nullable_string(None).bytes_(b"\x00\xff").nullable_bytes(None)
    w.var_bytes(b"k").var_bytes(None).compact_string("c").compact_bytes(None)
    w.array([1, 2, 3], lambda w, v: w.int32(v))
    r = Reader(w.getvalue())
    assert (r.int8(), r.int16(), r.int32(), r.int64()) == (-3, -300, 70000, -(2**40))
    assert (r.uvarint(), r.varint(), r.varlong()) == (300, -1, 2**40)
    assert (r.string(), r.nullable_string(), r.bytes_(), r.nullable_bytes()) == (
        "héllo",
        None,
        b"\x00\xff",
        None,
    )
    assert (r.var_bytes(), r.var_bytes(), r.compact_string(), r.compact_nullable_bytes()) == (
        b"k",
        None,
        "c",
        None,
    )
    assert r.array(Reader.int32, min_size=4) == [1, 2, 3]
    assert r.remaining == 0


@pytest.mark.parametrize(
    "data, read",
    [
        (b"\x00", Reader.int16),
        (struct.pack(">h", 5) + b"ab", Reader.string),
        (struct.pack(">i", 2**31 - 1) + b"x", Reader.bytes_),
        (struct.pack(">i", -7), Reader.nullable_bytes),
        (struct.pack(">i", 10**9) + b"\x00" * 16, lambda r: r.array(Reader.int32, min_size=4)),
        (b"\xff" * 20, Reader.varint),
        (b"\xff" * 20, Reader.varlong),
        (struct.pack(">h", 2) + b"\xff\xfe", Reader.string),
    ],
)
def test_overruns_and_hostile_lengths_raise_decode_error(data: bytes, read: object) -> None:
    with pytest.raises(KafkaDecodeError) as info:
        read(Reader(data))  # type: ignore[operator]
    assert isinstance(info.value, ProtocolError) and isinstance(info.value, SpoolError)


def test_loopback_detection() -> None:
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1")
    assert is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.1.2.3")


def _request(api_key: int, version: int, corr: int, body: bytes = b"") -> bytes:
    return request_frame(api_key, version, corr, body)


def _recv_frame(sock: socket.socket) -> bytes:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    return recv_exact(sock, size)


def test_api_versions_answers_and_kip511_fallback(tmp_path: Path) -> None:
    async def scenario() -> None:
        server = KafkaServer(tmp_path, "127.0.0.1", 0)
        await server.start()
        try:
            await asyncio.to_thread(_exchange, server.port)
        finally:
            await server.close()

    asyncio.run(scenario())


def _exchange(port: int) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_request(ApiKey.API_VERSIONS, 2, 7))
        r = Reader(_recv_frame(sock))
        assert r.int32() == 7
        assert r.int16() == ErrorCode.NONE
        apis = r.array(lambda r: (r.int16(), r.int16(), r.int16()), min_size=6)
        assert (ApiKey.API_VERSIONS, 0, 2) in apis
        assert r.int32() == 0 and r.remaining == 0
        # KIP-511: an ApiVersions version we do not know gets v0's layout + 35.
        sock.sendall(_request(ApiKey.API_VERSIONS, 9, 8, b"\x00garbage"))
        r = Reader(_recv_frame(sock))
        assert r.int32() == 8 and r.int16() == ErrorCode.UNSUPPORTED_VERSION
        assert (ApiKey.API_VERSIONS, 0, 2) in r.array(
            lambda r: (r.int16(), r.int16(), r.int16()), min_size=6
        )
        # An unknown API key: an error code, and the connection stays usable.
        sock.sendall(_request(999, 0, 9))
        r = Reader(_recv_frame(sock))
        assert r.int32() == 9 and r.int16() == ErrorCode.UNSUPPORTED_VERSION
        sock.sendall(_request(ApiKey.API_VERSIONS, 0, 10))
        assert Reader(_recv_frame(sock)).int32() == 10
        # A size prefix beyond the limit closes this connection only.
        sock.sendall(struct.pack(">i", 2**31 - 1))
        assert sock.recv(1) == b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(_request(ApiKey.API_VERSIONS, 1, 11))
        assert Reader(_recv_frame(sock)).int32() == 11
