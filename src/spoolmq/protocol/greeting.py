"""The greeting every spoolmq client makes (docs/PROTOCOL.md): connect, the authkey
challenge both ways (``multiprocessing.connection``'s), then ``hello``/``welcome``, each
step bounded so that a broker that accepted and says nothing cannot hold the caller for
ever. The threaded clients (client/connection.py) and the Kafka front's link to the
PublisherBroker (kafka/link.py) greet through :func:`greet`."""

from __future__ import annotations

import errno
import os
import socket
import struct
from multiprocessing import AuthenticationError as _MPAuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from spoolmq.errors import AuthenticationError, BrokerUnavailableError
from spoolmq.protocol.frames import (
    PROTOCOL_VERSION,
    borrowed_socket,
    raise_if_error,
    receive,
    send,
)

Address = str | tuple[str, int]

#: How long each step of a greeting waits (client.connection.CONNECT_TIMEOUT_S is this).
GREETING_TIMEOUT_S = 10.0


def hello_frame(role: str, name: str) -> dict[str, Any]:
    """The first frame of every connection, after the authkey challenge."""
    return {
        "op": "hello",
        "version": PROTOCOL_VERSION,
        "role": role,
        "pid": os.getpid(),
        "name": name,
    }


def _io_timeout(sock: socket.socket, seconds: float) -> None:
    """Bound each blocking connect, read and write of ``sock`` (0: no bound). A timeout
    set with ``settimeout`` would make the descriptor non-blocking, which ``Connection``
    does not expect, and would make a Unix socket's connect to a full backlog fail at
    once instead of waiting its turn; these options keep it blocking, and a step that
    waits too long fails with EAGAIN (EINPROGRESS for a TCP connect) instead."""
    whole = int(seconds)
    micro = int((seconds - whole) * 1_000_000)
    if seconds > 0 and not whole and not micro:
        micro = 1  # (0, 0) would mean no bound at all
    bound = struct.pack("@ll", whole, micro)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, bound)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, bound)


def _open(address: Address, timeout: float) -> Connection:
    """A connected, still unauthenticated ``Connection`` on a blocking socket whose
    connect, reads and writes give up after ``timeout`` seconds each (until ``greet``
    lifts the bound)."""
    sock = socket.socket(socket.AF_UNIX if isinstance(address, str) else socket.AF_INET)
    try:
        sock.setblocking(True)  # whatever socket.setdefaulttimeout() says
        _io_timeout(sock, timeout)
        sock.connect(address)
        return Connection(sock.detach())
    finally:
        sock.close()  # nothing left to close once detached


def _gave_up(exc: OSError) -> bool:
    """Whether ``exc`` is a step of the greeting running out of its time."""
    return isinstance(exc, BlockingIOError) or exc.errno == errno.EINPROGRESS


def greet(
    address: Address, authkey: bytes, hello: dict[str, Any], timeout: float = GREETING_TIMEOUT_S
) -> tuple[Connection, dict[str, Any]]:
    """An authenticated connection that has been welcomed, and the ``welcome`` frame. The
    connect, and each read and write of the greeting, give up after ``timeout``
    (BrokerUnavailableError); a refused key is an AuthenticationError, a refused
    ``hello`` the error its answer carries."""
    silent = f"the broker at {address} did not answer within {timeout:g} s"
    start = "`spoolmq broker`"
    if isinstance(address, str):  # the data directory's socket: name that directory
        start = f"`spoolmq broker --data {Path(address).parent}`"
    absent = f"no broker is listening at {address}; start one with {start}"
    if isinstance(address, str) and "/" not in address:  # "127.0.0.1", "localhost"
        absent += " (a TCP listener's address is HOST:PORT)"
    try:
        conn = _open(address, timeout)
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError):
        raise BrokerUnavailableError(absent) from None
    except OSError as exc:
        if _gave_up(exc):  # no room in a full backlog, or no SYN-ACK, in time
            raise BrokerUnavailableError(silent) from None
        raise BrokerUnavailableError(f"cannot connect to {address}: {exc}") from None
    try:
        try:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
        except (EOFError, ConnectionResetError):  # closed before it said anything
            raise BrokerUnavailableError(absent) from None
        send(conn, hello)
        welcome = receive(conn)
        raise_if_error(welcome)
        with borrowed_socket(conn) as sock:
            _io_timeout(sock, 0)
    except BrokerUnavailableError:  # an OSError too: said already
        conn.close()
        raise
    except _MPAuthenticationError as exc:
        conn.close()
        raise AuthenticationError(f"the broker refused the authkey: {exc}") from None
    except (EOFError, OSError) as exc:
        conn.close()
        if isinstance(exc, OSError) and _gave_up(exc):  # SO_RCVTIMEO or SO_SNDTIMEO ran out
            raise BrokerUnavailableError(silent) from None
        raise BrokerUnavailableError(f"the broker closed the connection: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn, welcome
