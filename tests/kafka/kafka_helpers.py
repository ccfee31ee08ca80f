"""Helpers of the Kafka front's end-to-end tests: a broker with ``--kafka`` on a free port."""

from __future__ import annotations

import socket
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from spoolmq.kafka import records
from spoolmq.kafka.wire import Reader, Writer
from spoolmq.testing import BrokerProcess


def free_port() -> int:
    """A TCP port nobody listens on now (the OS picks it; a race is unlikely and loud)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def kafka_broker(
    data: Path, *, port: int | None = None, log_file: Path | None = None
) -> Iterator[tuple[BrokerProcess, str]]:
    """A running broker with a Kafka listener; yields it and ``"127.0.0.1:PORT"``."""
    port = port if port is not None else free_port()
    broker = BrokerProcess(
        data, args=["--kafka", f"127.0.0.1:{port}"], log_file=log_file, log_level="info"
    )
    broker.start(timeout=90)
    try:
        yield broker, f"127.0.0.1:{port}"
    finally:
        broker.stop()


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    """A Kafka request frame (request header v1, client id "test") around ``body``."""
    payload = struct.pack(">hhih", api_key, version, correlation_id, 4) + b"test" + body
    return struct.pack(">i", len(payload)) + payload


def recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed by the broker")
        buf += chunk
    return buf


def call(sock: socket.socket, api_key: int, version: int, body: bytes, corr: int = 1) -> Reader:
    """Send one request and read its answer; a Reader positioned after the correlation id."""
    sock.sendall(request_frame(api_key, version, corr, body))
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    reader = Reader(recv_exact(sock, size))
    assert reader.int32() == corr
    return reader


def produce_body(topic: str, partition: int, record_set: bytes, acks: int = -1) -> bytes:
    """A Produce v3 request body for one partition."""
    w = Writer().nullable_string(None).int16(acks).int32(30000)
    w.int32(1).string(topic).int32(1).int32(partition).bytes_(record_set)
    return w.getvalue()


def produce_answer(reader: Reader) -> tuple[int, int]:
    """(error code, base offset) of a one-partition Produce v3 answer."""
    assert reader.int32() == 1
    reader.string()
    assert reader.int32() == 1
    reader.int32()
    error, base = reader.int16(), reader.int64()
    reader.int64()
    return error, base


def batch_around(block: bytes, count: int, codec: int) -> bytes:
    """A RecordBatch v2 of ``count`` records whose compressed block is ``block`` as given
    (a bomb, a damaged block), its header and CRC-32C computed as for any batch."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(records, "compress", lambda codec, data: block)
        return records.batch_of(
            [b""],
            base=0,
            last_offset_delta=count - 1,
            first_timestamp=1000,
            max_timestamp=1000,
            count=count,
            compression=codec,
        )
