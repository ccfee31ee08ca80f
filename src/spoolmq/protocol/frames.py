"""Frames: how every message between a client and the broker is framed, checked and sent.

Every frame is bytes sent with ``Connection.send_bytes`` and read with
``Connection.recv_bytes(MAX_FRAME_BYTES)``; nothing that crosses a socket is unpickled.
A frame is one JSON object with an ``op``; the one exception is ``deliver``, which is a JSON
header line followed by the stored record lines exactly as they are on disk (so records
reach consumers without being decoded and re-encoded, and consumers can verify each
record's checksum). See docs/PROTOCOL.md.
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
from collections import deque
from collections.abc import Iterator, Mapping
from multiprocessing.connection import Connection
from typing import Any

import orjson

from spoolmq.errors import ProtocolError, SpoolError, error_from_code

PROTOCOL_VERSION = 2
MAX_FRAME_BYTES = 64 * 1024 * 1024

# Operations a client may send, by role. Anything else is a protocol error.
CLIENT_OPS = {
    "hello",
    "publish",
    "subscribe",
    "ack",
    "nack",
    "extend",
    "credit",
    "pause",
    "resume",
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


@contextlib.contextmanager
def borrowed_socket(conn: Connection) -> Iterator[socket.socket]:
    """A socket object on ``conn``'s own descriptor, given back (not closed, in the
    blocking mode it had) on leaving: no ``dup``, which fails in a process that is out of
    descriptors, the state in which cutting a connection off or handing one over must
    still work."""
    fd = conn.fileno()
    blocking = os.get_blocking(fd)
    sock = socket.socket(fileno=fd)  # non-blocking if socket.setdefaulttimeout() was set
    try:
        yield sock
    finally:
        sock.detach()
        if os.get_blocking(fd) != blocking:
            os.set_blocking(fd, blocking)  # as the connection's owner left it


def cut_off(conn: Connection) -> None:
    """Shut a connection down for both directions. ``close()`` alone would not wake a
    thread blocked reading it, and the peer would not see its end while that thread lives."""
    with contextlib.suppress(OSError), borrowed_socket(conn) as sock:
        sock.shutdown(socket.SHUT_RDWR)


_LONG_SIZE = b"\xff\xff\xff\xff"


def _header_bytes(header: bytes | bytearray) -> int:
    """How many bytes the size header that starts ``header`` takes: 12 for a long frame,
    else 4 (also while fewer than 4 have arrived)."""
    return 12 if header[:4] == _LONG_SIZE else 4


def _body_size(header: bytes | bytearray, max_bytes: int) -> int:
    """The body size a whole header gives; OSError over ``max_bytes`` (as ``recv_bytes``)."""
    long = len(header) == 12
    size = int.from_bytes(header[4:] if long else header, signed=not long)
    if not 0 <= size <= max_bytes:
        raise OSError(f"bad message length: {size} (the limit is {max_bytes} bytes)")
    return size


class FrameReader:
    """Reads a client's frames without ever blocking on one that is only partly there.

    ``Connection.recv_bytes`` waits until a whole frame has arrived, so a client that stops
    in the middle of one (hostile, or suspended) would stall a broker loop that serves every
    client. This reads the same framing as ``multiprocessing.connection`` (a 4-byte
    big-endian size, or -1 and an 8-byte size, then the body) with non-blocking ``recv``
    calls, keeping a partial frame until the rest comes. It never reads past the current
    frame, so the socket stays readable while frames are waiting in the kernel.
    """

    __slots__ = ("_body", "_header", "_max_bytes", "_size", "_sock")

    def __init__(self, conn: Connection, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._max_bytes = max_bytes
        self._header = bytearray()
        self._body = bytearray()
        self._size = -1

    def next_frame(self) -> bytes | None:
        """The next whole frame, or None if it has not all arrived yet.

        Raises EOFError when the client closed the connection (mid-frame included) and
        OSError for a frame size over the limit, as ``recv_bytes`` does.
        """
        while self._size < 0:
            need = _header_bytes(self._header)
            if len(self._header) < need:
                chunk = self._receive(need - len(self._header))
                if chunk is None:
                    return None
                self._header += chunk
                continue
            size = self._size = _body_size(self._header, self._max_bytes)
            self._header.clear()
            if size and not self._body:
                chunk = self._receive(size)
                if chunk is None:
                    return None
                if len(chunk) == size:  # the common case: the whole body at once, no copy
                    self._size = -1
                    return chunk
                self._body += chunk
        while len(self._body) < self._size:
            chunk = self._receive(min(self._size - len(self._body), 1 << 20))
            if chunk is None:
                return None
            self._body += chunk
        frame = bytes(self._body)
        self._body.clear()
        self._size = -1
        return frame

    def _receive(self, count: int) -> bytes | None:
        try:
            chunk = self._sock.recv(count, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return None
        if not chunk:
            raise EOFError("the client closed the connection")
        return chunk

    def close(self) -> None:
        self._sock.close()


class PipeFrames:
    """Every whole frame waiting on the reading end of a pipe, without blocking: the
    notices the PublisherBroker sends the ConsumerBroker (``Connection.send_bytes`` on
    the other end, so the same framing as :class:`FrameReader`).

    ``Connection.poll(0)`` builds a selector for each look, and ``recv_bytes`` reads a
    header and a body with two calls: per frame, several system calls and a few tens of
    microseconds of Python on a path the ConsumerBroker takes at every notice. This reads
    whatever has arrived in large chunks and splits it, keeping a partial frame for the
    next call.
    """

    __slots__ = ("_buffer", "_conn", "_fd", "_max_bytes", "ended", "error")

    _CHUNK = 1 << 16

    def __init__(self, conn: Connection, max_bytes: int = MAX_FRAME_BYTES) -> None:
        self._conn = conn  # keeps the descriptor open
        self._fd = conn.fileno()
        os.set_blocking(self._fd, False)
        self._max_bytes = max_bytes
        self._buffer = bytearray()
        # No frame will come any more: the writing end is closed everywhere, or a bad size
        # broke the framing (``error``; the caller has its own way to catch up then).
        self.ended = False
        self.error: OSError | None = None

    def fileno(self) -> int:
        return self._fd

    def read(self) -> list[bytes]:
        """The frames that have arrived whole since the last call (maybe none).

        A frame size over the limit (which ``recv_bytes`` refuses with OSError) leaves no
        frame boundary to trust after it: the frames before it are returned, :attr:`ended`
        is set and :attr:`error` says why."""
        buffer = self._buffer
        while not self.ended:
            try:
                chunk = os.read(self._fd, self._CHUNK)
            except (BlockingIOError, InterruptedError):
                break
            if not chunk:
                self.ended = True
                break
            buffer += chunk
            if len(chunk) < self._CHUNK:
                break  # the pipe was empty after this: the next wait says when it is not
        frames: list[bytes] = []
        start = 0
        end = len(buffer)
        while end - start >= 4:
            header_end = start + _header_bytes(buffer[start : start + 4])
            if end < header_end:
                break
            try:
                body_end = header_end + _body_size(buffer[start:header_end], self._max_bytes)
            except OSError as exc:
                self.ended, self.error = True, exc
                buffer.clear()
                return frames
            if end < body_end:
                break
            frames.append(bytes(buffer[header_end:body_end]))
            start = body_end
        del buffer[:start]
        return frames

    def close(self) -> None:
        self._conn.close()


_SEND_FLAGS = socket.MSG_DONTWAIT | getattr(socket, "MSG_NOSIGNAL", 0)


class FrameWriter:
    """Sends frames to a client without ever blocking on one that does not read.

    ``Connection.send_bytes`` waits until the client has taken the whole frame, so one
    consumer busy with a long task while a pushed batch sits in its socket (or a client that
    stopped reading) would stall every other client of the broker loop. This writes the
    same framing with non-blocking ``sendmsg`` calls and keeps what the socket does not take
    yet; the loop calls :meth:`flush` when the socket is writable again. A client that leaves
    more than ``limit`` bytes unread is treated as gone.
    """

    __slots__ = ("_limit", "_out", "_sock", "waiting")

    def __init__(self, conn: Connection, limit: int = 2 * MAX_FRAME_BYTES) -> None:
        self._sock = socket.socket(fileno=os.dup(conn.fileno()))
        self._limit = limit
        self._out: deque[bytes | memoryview] = deque()
        self.waiting = 0  # bytes queued and not yet written

    def send(self, data: bytes) -> None:
        """Queue one frame and write what the socket takes now.

        Raises OSError when the client has closed its end, or has left more than the
        limit unread.
        """
        size = len(data)
        if size <= 0x7FFFFFFF:
            header = size.to_bytes(4, "big", signed=True)
        else:
            header = _LONG_SIZE + size.to_bytes(8, "big")
        self._out.append(header)
        if size:
            self._out.append(data)
        self.waiting += len(header) + size
        self.flush()
        if self.waiting > self._limit:
            raise OSError(f"the client left {self.waiting} bytes unread")

    def flush(self) -> None:
        """Write what the socket takes without waiting; OSError if the client has gone."""
        out = self._out
        while out:
            chunks = [out[i] for i in range(min(len(out), 64))]
            try:
                sent = self._sock.sendmsg(chunks, (), _SEND_FLAGS)
            except (BlockingIOError, InterruptedError):
                return
            self.waiting -= sent
            while out and sent >= len(out[0]):
                sent -= len(out.popleft())
            if sent:
                out[0] = memoryview(out[0])[sent:]

    def close(self) -> None:
        self._out.clear()
        self.waiting = 0
        self._sock.close()


def encode_delivery(header: Mapping[str, Any], lines: list[bytes]) -> bytes:
    """A ``deliver`` frame: a header line, then the stored record lines as they are."""
    return orjson.dumps(header) + b"\n" + b"".join(lines)


def split_frame(data: bytes) -> tuple[dict[str, Any], list[bytes]]:
    """A frame from the broker as its checked header and the record lines after it.

    Every frame is one line of JSON (``encode`` never writes a raw newline), except a
    ``deliver`` frame, whose header line is followed by record lines: so the header's
    ``op`` says what a frame is, whatever order its keys are in, and only a ``deliver``
    may have lines after it.
    """
    cut = data.find(b"\n")
    if cut < 0:
        return decode(data), []
    header = decode(data[:cut])
    if header["op"] != "deliver":
        raise ProtocolError(f"a {header['op'][:40]!r} frame has lines after its header")
    # The lines with their newlines, split on \n only: BytesIO finds each end with memchr
    # (400 instructions a 300-byte line, where splitlines looks at every byte, 2,800).
    stream = io.BytesIO(data)
    stream.seek(cut + 1)
    return header, stream.readlines()
