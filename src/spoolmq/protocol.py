"""The wire protocol between clients and the broker: JSON frames, validated on arrival.

Every frame is bytes sent with ``Connection.send_bytes`` and read with
``Connection.recv_bytes(MAX_FRAME_BYTES)``; nothing that crosses a socket is unpickled.
A frame is one JSON object with an ``op``; the one exception is ``deliver``, which is a JSON
header line followed by the stored record lines exactly as they are on disk (so records
reach consumers without being decoded and re-encoded, and consumers can verify each
record's checksum). See docs/PROTOCOL.md.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import orjson

from spoolmq.errors import ProtocolError, SpoolError, error_from_code

PROTOCOL_VERSION = 1
MAX_FRAME_BYTES = 64 * 1024 * 1024
AUTHKEY_FILE = ".authkey"
SOCKET_FILE = "broker.sock"

# Operations a client may send, by role. Anything else is a protocol error.
CLIENT_OPS = {
    "hello",
    "publish",
    "subscribe",
    "ack",
    "nack",
    "extend",
    "credit",
    "admin",
    "bye",
}


def encode(frame: Mapping[str, Any]) -> bytes:
    return orjson.dumps(frame)


def decode(data: bytes) -> dict[str, Any]:
    """Parse and check a frame's envelope: a JSON object with a known string ``op``."""
    try:
        frame = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"frame is not valid JSON: {exc}") from None
    if not isinstance(frame, dict):
        raise ProtocolError("a frame must be a JSON object")
    op = frame.get("op")
    if not isinstance(op, str):
        raise ProtocolError("a frame needs a string 'op'")
    return frame


def check_client_frame(frame: dict[str, Any]) -> str:
    op: str = frame["op"]
    if op not in CLIENT_OPS:
        raise ProtocolError(f"unknown operation {op[:40]!r}")
    return op


def error_frame(exc: SpoolError, **extra: Any) -> dict[str, Any]:
    return {"op": "error", "code": exc.code, "message": str(exc), **extra}


def raise_if_error(frame: Mapping[str, Any]) -> None:
    if frame.get("op") == "error":
        raise error_from_code(str(frame.get("code", "error")), str(frame.get("message", "")))


def send(conn: Connection, frame: Mapping[str, Any]) -> None:
    conn.send_bytes(encode(frame))


def receive(conn: Connection) -> dict[str, Any]:
    return decode(conn.recv_bytes(MAX_FRAME_BYTES))


def encode_delivery(header: Mapping[str, Any], lines: list[bytes]) -> bytes:
    """A ``deliver`` frame: a header line, then the stored record lines as they are."""
    return orjson.dumps(header) + b"\n" + b"".join(lines)


def split_delivery(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    cut = data.find(b"\n")
    if cut < 0:
        return decode(data), []
    header = decode(data[:cut])
    return header, data[cut + 1 :].splitlines(keepends=True)


def read_or_create_authkey(data_dir: Path) -> bytes:
    """The data directory's authkey (32 random bytes, file mode 0600), created if missing."""
    path = data_dir / AUTHKEY_FILE
    try:
        key = path.read_bytes()
        if len(key) >= 16:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    tmp = path.with_suffix(f".tmp{os.getpid()}")
    fd = os.open(tmp, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    return key


def read_authkey(data_dir: Path) -> bytes:
    try:
        return (data_dir / AUTHKEY_FILE).read_bytes()
    except FileNotFoundError:
        from spoolmq.errors import BrokerUnavailableError

        raise BrokerUnavailableError(
            f"no broker has run at {data_dir} (no {AUTHKEY_FILE}); start one with "
            f"`spoolmq broker --data {data_dir}`"
        ) from None
