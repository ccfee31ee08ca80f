"""How a client finds a data directory's broker and proves it may talk to it: the Unix
socket's name and the authkey file (32 random bytes, mode 0600) beside it."""

from __future__ import annotations

import secrets
from pathlib import Path

from spoolmq.errors import BrokerUnavailableError
from spoolmq.files import write_durably

AUTHKEY_FILE = ".authkey"
SOCKET_FILE = "broker.sock"


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
    write_durably([(path, key)])
    return key


def read_authkey(data_dir: Path) -> bytes:
    try:
        return (data_dir / AUTHKEY_FILE).read_bytes()
    except FileNotFoundError:
        raise BrokerUnavailableError(
            f"no broker has run at {data_dir} (no {AUTHKEY_FILE}); start one with "
            f"`spoolmq broker --data {data_dir}`"
        ) from None
