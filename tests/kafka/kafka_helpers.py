"""Helpers of the Kafka front's end-to-end tests: a broker with ``--kafka`` on a free port."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

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
