"""Connecting to a broker: the Unix socket of a data directory (or TCP), the authkey
challenge, then ``hello``/``welcome``."""

from __future__ import annotations

import errno
import math
import os
import select
import socket
import struct
from multiprocessing import AuthenticationError as _MPAuthenticationError
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.config import resolve_data_dir
from spoolmq.errors import AuthenticationError, BrokerUnavailableError, InvalidArgumentError

Address = str | tuple[str, int]

#: How long a client waits to connect and be welcomed (the authkey challenge both ways,
#: then ``hello``/``welcome``) before it gives up with BrokerUnavailableError. A broker
#: that accepted the connection but never answers (stopped with SIGSTOP, or a connect
#: whose last packet the kernel dropped from a full accept queue) would otherwise hold
#: the client for ever. The broker gives a greeting 5 s; this leaves room for a busy host.
CONNECT_TIMEOUT_S = 10.0


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


def hello_frame(role: str, name: str) -> dict[str, Any]:
    """The first frame of every connection, after the authkey challenge."""
    return {
        "op": "hello",
        "version": protocol.PROTOCOL_VERSION,
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
    connect, reads and writes give up after ``timeout`` seconds each (until ``connect``
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


def connect(address: Address, authkey: bytes, role: str, name: str = "") -> tuple[Connection, str]:
    """An authenticated connection that has been welcomed; returns it and the client id.
    The connect, and each read and write of the greeting, give up after
    ``CONNECT_TIMEOUT_S``."""
    silent = f"the broker at {address} did not answer within {CONNECT_TIMEOUT_S:g} s"
    start = "`spoolmq broker`"
    if isinstance(address, str):  # the data directory's socket: name that directory
        start = f"`spoolmq broker --data {Path(address).parent}`"
    absent = f"no broker is listening at {address}; start one with {start}"
    if isinstance(address, str) and "/" not in address:  # "127.0.0.1", "localhost"
        absent += " (a TCP listener's address is HOST:PORT)"
    try:
        conn = _open(address, CONNECT_TIMEOUT_S)
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
        protocol.send(conn, hello_frame(role, name))
        welcome = protocol.receive(conn)
        protocol.raise_if_error(welcome)
        with protocol.borrowed_socket(conn) as sock:
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
        events = self._poll.poll(-1 if timeout is None else math.ceil(max(timeout, 0) * 1000))
        conn_ready = woken = False
        for ready_fd, _ in events:  # any event: data, or a hang-up the read then reports
            if ready_fd == fd:
                conn_ready = True
            else:
                woken = True
        return conn_ready, woken
