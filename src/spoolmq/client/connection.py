"""Connecting to a broker: the Unix socket of a data directory (or TCP), the authkey
challenge, then ``hello``/``welcome``."""

from __future__ import annotations

import os
from multiprocessing import AuthenticationError as _MPAuthenticationError
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.config import resolve_data_dir
from spoolmq.errors import AuthenticationError, BrokerUnavailableError

Address = str | tuple[str, int]


def parse_address(text: str) -> tuple[str, int]:
    """``"127.0.0.1:7070"`` -> ("127.0.0.1", 7070)."""
    from spoolmq.errors import InvalidArgumentError

    host, _, port = text.rpartition(":")
    if not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise InvalidArgumentError(f"an address is HOST:PORT, not {text!r}")
    return host.strip("[]"), int(port)


def resolve(
    data: str | os.PathLike[str] | None, address: Address | None, authkey: bytes | None
) -> tuple[Address, bytes, Path]:
    data_dir = resolve_data_dir(data)
    target: Address = address if address is not None else str(data_dir / protocol.SOCKET_FILE)
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


def connect(address: Address, authkey: bytes, role: str, name: str = "") -> tuple[Connection, str]:
    """An authenticated connection that has been welcomed; returns it and the client id."""
    family = "AF_UNIX" if isinstance(address, str) else "AF_INET"
    try:
        conn = Client(address, family=family, authkey=authkey)
    except _MPAuthenticationError as exc:
        raise AuthenticationError(f"the broker refused the authkey: {exc}") from None
    except (FileNotFoundError, ConnectionRefusedError, ConnectionResetError, EOFError):
        start = "`spoolmq broker`"
        if isinstance(address, str):  # the data directory's socket: name that directory
            start = f"`spoolmq broker --data {Path(address).parent}`"
        raise BrokerUnavailableError(
            f"no broker is listening at {address}; start one with {start}"
        ) from None
    except OSError as exc:
        raise BrokerUnavailableError(f"cannot connect to {address}: {exc}") from None
    try:
        protocol.send(conn, hello_frame(role, name))
        welcome = protocol.receive(conn)
        protocol.raise_if_error(welcome)
    except (EOFError, OSError) as exc:
        conn.close()
        raise BrokerUnavailableError(f"the broker closed the connection: {exc}") from None
    except BaseException:
        conn.close()
        raise
    return conn, str(welcome.get("client_id", ""))
