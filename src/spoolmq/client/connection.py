"""Connecting to a broker: the Unix socket of a data directory (or TCP), the authkey
challenge, then ``hello``/``welcome``."""

from __future__ import annotations

import math
import os
import select
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.config import resolve_data_dir
from spoolmq.errors import BrokerUnavailableError, InvalidArgumentError
from spoolmq.protocol.greeting import GREETING_TIMEOUT_S, greet
from spoolmq.protocol.greeting import Address as Address
from spoolmq.protocol.greeting import hello_frame as hello_frame

#: How long a client waits to connect and be welcomed (the authkey challenge both ways,
#: then ``hello``/``welcome``) before it gives up with BrokerUnavailableError. A broker
#: that accepted the connection but never answers (stopped with SIGSTOP, or a connect
#: whose last packet the kernel dropped from a full accept queue) would otherwise hold
#: the client for ever. The broker gives a greeting 5 s; this leaves room for a busy host.
CONNECT_TIMEOUT_S = GREETING_TIMEOUT_S


def parse_address(text: str) -> tuple[str, int]:
    """``"127.0.0.1:7070"`` -> ("127.0.0.1", 7070)."""
    host, _, port = text.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    if bracketed:
        host = host[1:-1]
    if (
        not host
        or (host.endswith(":") and not bracketed)  # "::1" is a host without a port
        or not (port.isascii() and port.isdigit())
        or not 0 <= int(port) <= 65535
    ):
        raise InvalidArgumentError(f"an address is HOST:PORT, not {text!r}")
    return host, int(port)


def _host_and_port(address: str) -> bool:
    """Whether a str address is "host:port" (as the CLI takes it) rather than a Unix
    socket's path: one with a "/", an abstract name ("\\0..."), or a file that exists."""
    return (
        ":" in address
        and "/" not in address
        and not address.startswith("\0")
        and not os.path.exists(address)
    )


def resolve(
    data: str | os.PathLike[str] | None, address: Address | None, authkey: bytes | None
) -> tuple[Address, bytes, Path]:
    """Where a client connects (``address``: ``(host, port)`` or ``"host:port"`` of a TCP
    listener, else the data directory's socket) and the key it proves it has.

    >>> resolve("/srv/q", "127.0.0.1:7070", b"k")[0]
    ('127.0.0.1', 7070)
    >>> resolve("/srv/q", None, b"k")[0]
    '/srv/q/broker.sock'
    >>> resolve("/srv/q", "./broker:1", b"k")[0]
    './broker:1'
    """
    data_dir = resolve_data_dir(data)
    if isinstance(address, str) and _host_and_port(address):
        address = parse_address(address)
    target: Address = address if address is not None else str(data_dir / protocol.SOCKET_FILE)
    if (
        authkey is None
        and isinstance(target, tuple)
        and not (data_dir / protocol.AUTHKEY_FILE).exists()
    ):
        # A BrokerUnavailableError, as protocol.read_authkey's was: callers that wait for
        # a broker to come up retry on it.
        raise BrokerUnavailableError(
            f"a client of the TCP listener {target[0]}:{target[1]} needs the broker's key: "
            f"pass authkey= (the bytes of .authkey in the broker's data directory), or "
            f"data= that directory if this host has it"
        )
    given: Any = authkey  # what a caller passed, whatever the annotation says
    if isinstance(given, str):
        raise InvalidArgumentError("authkey must be bytes (the contents of .authkey), not str")
    if given is not None and not isinstance(given, bytes):
        authkey = bytes(given)  # a bytearray or memoryview, as multiprocessing takes
    key = authkey if authkey is not None else protocol.read_authkey(data_dir)
    return target, key, data_dir


def connect(address: Address, authkey: bytes, role: str, name: str = "") -> tuple[Connection, str]:
    """An authenticated connection that has been welcomed; returns it and the client id.
    The connect, and each read and write of the greeting, give up after
    ``CONNECT_TIMEOUT_S`` (protocol.greeting)."""
    conn, welcome = greet(address, authkey, hello_frame(role, name), CONNECT_TIMEOUT_S)
    return conn, str(welcome.get("client_id", ""))


class Readiness:
    """Waits until a client's connection, or its wake-up descriptor, has something to read.

    ``multiprocessing.connection.wait`` and ``Connection.poll`` build a selector, register
    and unregister for every call: some 15 us of Python, which a client at a low rate pays
    per message (a consumer waiting for each delivery, a publisher's I/O thread for each
    answer). One ``poll`` object serves here for the client's life; it keeps no state in
    the kernel, so a new connection (after a reconnect) only needs its descriptor noted.
    """

    __slots__ = ("_conn_fd", "_poll")

    def __init__(self, wake_fd: int) -> None:
        self._poll = select.poll()
        self._poll.register(wake_fd, select.POLLIN)
        self._conn_fd = -1

    def wait(self, conn: Connection, timeout: float | None) -> tuple[bool, bool]:
        """Wait up to ``timeout`` seconds (None: no limit); (the connection is readable or
        closed, the wake-up descriptor is readable)."""
        fd = conn.fileno()
        if fd != self._conn_fd:
            if self._conn_fd >= 0:
                self._poll.unregister(self._conn_fd)
            self._poll.register(fd, select.POLLIN)
            self._conn_fd = fd
        # Milliseconds, rounded up (as the selectors module does): a wait shorter than
        # asked would come back early and be asked again.
        # poll() takes at most 2**31 - 1 ms (24.8 days): a longer wait comes back early,
        # and the callers, which loop to their deadline, wait again.
        wait_ms = -1 if timeout is None else min(math.ceil(max(timeout, 0) * 1000), 2**31 - 1)
        events = self._poll.poll(wait_ms)
        conn_ready = woken = False
        for ready_fd, _ in events:  # any event: data, or a hang-up the read then reports
            if ready_fd == fd:
                conn_ready = True
            else:
                woken = True
        return conn_ready, woken
