"""What a broker child tells the manager: the status messages, and their encoding.

Each child incarnation writes them on its own one-way status pipe, one JSON frame each
(``["Stats", {...}]``); the manager reads them with :func:`decode_status`. A pipe has no
lock that a killed child could leave held, and a child killed mid-frame only cuts its own
pipe short.
"""

from __future__ import annotations

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
