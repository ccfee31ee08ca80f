"""What a broker child tells the manager: the status messages, and their encoding.

Each child incarnation writes them on its own one-way status pipe, one JSON frame each
(``["Stats", {...}]``); the manager reads them with :func:`decode_status`. A pipe has no
lock that a killed child could leave held, and a child killed mid-frame only cuts its own
pipe short.
"""

from __future__ import annotations

import queue
import threading
from multiprocessing.connection import Connection
from typing import Any, NamedTuple

import orjson

from spoolmq.errors import ProtocolError


class Ready(NamedTuple):
    """The child has started and serves clients."""

    pid: int


class Stats(NamedTuple):
    """The child's figures (sent every second, and once more as it stops)."""

    figures: dict[str, Any]


class Disconnected(NamedTuple):
    """A client the manager handed to the child has gone: drop it from the registry."""

    client_id: str


class AdminResult(NamedTuple):
    """The answer to the manager's admin request ``request_id``."""

    request_id: int
    body: dict[str, Any]


StatusMessage = Ready | Stats | Disconnected | AdminResult

_KINDS: dict[str, type[StatusMessage]] = {
    kind.__name__: kind for kind in (Ready, Stats, Disconnected, AdminResult)
}


def encode_status(message: StatusMessage) -> bytes:
    """One frame: the message's kind, then its fields.

    >>> encode_status(Disconnected("c7-123"))
    b'["Disconnected","c7-123"]'
    """
    return orjson.dumps([type(message).__name__, *message])


def decode_status(data: bytes) -> StatusMessage:
    """The message ``encode_status`` made; ProtocolError for anything else.

    >>> decode_status(b'["Ready",4242]')
    Ready(pid=4242)
    """
    try:
        kind, *fields = orjson.loads(data)
        return _KINDS[kind](*fields)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
        raise ProtocolError(f"not a status message: {data[:100]!r}") from None


class StatusSender:
    """Writes a child's status messages to its pipe from a thread of its own, so the
    child's loop never waits for the manager: a pipe holds 64 KiB, and a manager busy
    elsewhere (starting a child, a slow handshake) must not stall publishing or delivery.
    ``Stats`` are periodic, so while a backlog waits a new one is dropped (the next one
    says more); every other message is kept in order."""

    _MAX_STATS_BACKLOG = 4

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._queue: queue.SimpleQueue[bytes | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="status", daemon=True)
        self._thread.start()

    def send(self, message: StatusMessage) -> None:
        if isinstance(message, Stats) and self._queue.qsize() >= self._MAX_STATS_BACKLOG:
            return
        self._queue.put(encode_status(message))

    def _run(self) -> None:
        while (data := self._queue.get()) is not None:
            try:
                self._conn.send_bytes(data)
            except OSError:
                return  # the manager is gone: it reads its end until it stops

    def close(self, timeout: float = 2.0) -> None:
        """Send what is queued (waiting up to ``timeout`` seconds), then stop."""
        self._queue.put(None)
        self._thread.join(timeout)
