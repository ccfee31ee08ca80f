"""Where a client connects: ``address`` as ``(host, port)``, ``"host:port"`` or a Unix
socket's path (``spoolmq.client.connection.resolve``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spoolmq.client.connection import connect, resolve
from spoolmq.errors import BrokerUnavailableError, InvalidArgumentError


@pytest.mark.parametrize(
    ("address", "target"),
    [
        ("127.0.0.1:7070", ("127.0.0.1", 7070)),
        ("queue-host:7070", ("queue-host", 7070)),
        ("[::1]:7070", ("::1", 7070)),
        ("[::]:9092", ("::", 9092)),
        ("::1:7070", ("::1", 7070)),
        (("127.0.0.1", 7070), ("127.0.0.1", 7070)),
        ("/run/spoolmq/broker.sock", "/run/spoolmq/broker.sock"),
        ("./broker:1", "./broker:1"),  # a path: it has a slash
        ("\0spool:1", "\0spool:1"),  # an abstract socket name
    ],
)
def test_an_address_is_a_tcp_listener_or_a_socket_path(
    tmp_path: Path, address: str | tuple[str, int], target: str | tuple[str, int]
) -> None:
    assert resolve(tmp_path, address, b"key")[0] == target


def test_an_existing_socket_file_with_a_colon_stays_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    Path("broker:1").touch()
    assert resolve(tmp_path, "broker:1", b"key")[0] == "broker:1"
    os.unlink("broker:1")
    assert resolve(tmp_path, "broker:1", b"key")[0] == ("broker", 1)


@pytest.mark.parametrize("address", ["127.0.0.1:tcp", "::1", "host:", "host:70000", "host:²"])
def test_a_broken_host_and_port_is_refused(tmp_path: Path, address: str) -> None:
    with pytest.raises(InvalidArgumentError, match="an address is HOST:PORT"):
        resolve(tmp_path, address, b"key")


def test_a_tcp_client_without_the_key_is_told_what_it_needs(tmp_path: Path) -> None:
    """Not "no broker has run at <a local directory>": the broker is elsewhere."""
    with pytest.raises(BrokerUnavailableError, match="needs the broker's key: pass authkey="):
        resolve(tmp_path, "127.0.0.1:7070", None)
    with pytest.raises(InvalidArgumentError, match=r"authkey must be bytes .* not str"):
        resolve(tmp_path, "127.0.0.1:7070", "00ff")  # type: ignore[arg-type]
    # Bytes-like keys are taken, as multiprocessing takes them.
    assert resolve(tmp_path, "127.0.0.1:7070", bytearray(b"k"))[1] == b"k"  # type: ignore[arg-type]
    assert resolve(tmp_path, "127.0.0.1:7070", memoryview(b"k"))[1] == b"k"  # type: ignore[arg-type]


def test_a_host_without_a_port_is_pointed_at_host_and_port(tmp_path: Path) -> None:
    with pytest.raises(BrokerUnavailableError, match=r"a TCP listener's address is HOST:PORT"):
        connect("127.0.0.1", b"key", "publisher")
