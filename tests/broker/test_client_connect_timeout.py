"""A client does not wait for ever on a broker that accepted its connection but never
answers: the greeting (authkey challenge, ``hello``/``welcome``) is bounded by
``client.connection.CONNECT_TIMEOUT_S``, for the threaded and the asyncio clients; once
welcomed, the connection has no bound left on its reads."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from spoolmq import Admin, AsyncPublisher, Consumer, Publisher, protocol
from spoolmq.client import connection
from spoolmq.client.common import lost_broker
from spoolmq.client.connection import Address, connect
from spoolmq.errors import BrokerUnavailableError
from spoolmq.testing import BrokerProcess

SILENT = "did not answer within 0.3 s"


@pytest.fixture(autouse=True)
def _short_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connection, "CONNECT_TIMEOUT_S", 0.3)


@pytest.fixture
def never_accepts() -> Iterator[tuple[str, int]]:
    """A TCP listener that never accepts: the kernel completes the connect, nobody speaks."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()


@pytest.fixture
def accepts_and_holds(tmp_path: Path) -> Iterator[str]:
    """A Unix socket whose server accepts each connection and then says nothing."""
    path = str(tmp_path / "silent.sock")
    held: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(8)
        listener.settimeout(0.2)
        stop = threading.Event()

        def accept() -> None:
            while not stop.is_set():
                try:
                    held.append(listener.accept()[0])
                except TimeoutError:
                    continue

        thread = threading.Thread(target=accept, daemon=True)
        thread.start()
        try:
            yield path
        finally:
            stop.set()
            thread.join(10)
            for conn in held:
                conn.close()


def _bounded(call: Callable[[], object]) -> BaseException | None:
    """Run ``call`` in a thread; the exception it raised, or a failure if it is still
    waiting after 30 s (100 times the timeout: it would wait for ever without one)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:
            raised.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(30)
    assert not thread.is_alive(), "the client still waits on a silent broker after 30 s"
    return raised[0] if raised else None


@pytest.mark.parametrize(
    "client",
    [
        lambda data, address: Publisher(data, address=address, authkey=b"key"),
        lambda data, address: Consumer("t", "g", data=data, address=address, authkey=b"key"),
        lambda data, address: Admin(data, address=address, authkey=b"key"),
    ],
    ids=["Publisher", "Consumer", "Admin"],
)
def test_a_client_gives_up_on_a_tcp_listener_that_never_accepts(
    tmp_path: Path, never_accepts: tuple[str, int], client: Callable[[Path, Address], object]
) -> None:
    exc = _bounded(lambda: client(tmp_path, never_accepts))
    assert isinstance(exc, BrokerUnavailableError)
    assert SILENT in str(exc)
    assert str(never_accepts) in str(exc)


def test_a_client_gives_up_on_a_server_that_accepts_and_says_nothing(
    accepts_and_holds: str,
) -> None:
    exc = _bounded(lambda: connect(accepts_and_holds, b"key", "publisher"))
    assert isinstance(exc, BrokerUnavailableError)
    assert SILENT in str(exc)


def test_the_asyncio_client_gives_up_too(
    tmp_path: Path, never_accepts: tuple[str, int], accepts_and_holds: str
) -> None:
    async def open_on(address: Address) -> None:
        async with AsyncPublisher(tmp_path, address=address, authkey=b"key"):
            pass

    for address in (never_accepts, accepts_and_holds):
        exc = _bounded(lambda address=address: asyncio.run(open_on(address)))  # type: ignore[misc]
        assert isinstance(exc, BrokerUnavailableError), exc
        assert SILENT in str(exc)


def test_a_client_waits_its_turn_in_a_full_unix_backlog_then_gives_up(tmp_path: Path) -> None:
    """A Unix socket's connect to a full backlog waits for room (as a blocking connect
    does), bounded like the rest, instead of failing at once with EAGAIN."""
    path = str(tmp_path / "full.sock")
    queued: list[socket.socket] = []
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(0)
        try:
            for _ in range(64):  # fill the backlog: a non-blocking connect then fails
                sock = socket.socket(socket.AF_UNIX)
                sock.setblocking(False)
                queued.append(sock)
                try:
                    sock.connect(path)
                except BlockingIOError:
                    break
            else:
                pytest.fail("the backlog never filled")
            started = time.monotonic()
            exc = _bounded(lambda: connect(path, b"key", "publisher"))
            assert isinstance(exc, BrokerUnavailableError)
            assert SILENT in str(exc)
            assert time.monotonic() - started >= 0.3 * 0.9  # it waited, not failed at once
        finally:
            for sock in queued:
                sock.close()


@pytest.mark.parametrize("default_timeout", [None, 30.0])
def test_a_welcomed_connection_is_blocking_with_no_bound_on_its_reads(
    data_dir: Path, broker: BrokerProcess, default_timeout: float | None
) -> None:
    """Whatever ``socket.setdefaulttimeout`` says in the client's process."""
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(default_timeout)
    try:
        conn, client_id = connect(
            str(data_dir / "broker.sock"), protocol.read_authkey(data_dir), "publisher"
        )
    finally:
        socket.setdefaulttimeout(before)
    try:
        assert client_id
        assert os.get_blocking(conn.fileno())
        with socket.socket(fileno=conn.fileno()) as sock:
            try:
                for option in (socket.SO_RCVTIMEO, socket.SO_SNDTIMEO):
                    assert sock.getsockopt(socket.SOL_SOCKET, option, 16) == struct.pack(
                        "@ll", 0, 0
                    )
            finally:
                sock.detach()
    finally:
        conn.close()


def test_a_consumer_receives_in_a_process_with_a_default_socket_timeout(
    data_dir: Path, broker: BrokerProcess
) -> None:
    before = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30.0)
    try:
        with Publisher(data_dir) as publisher:
            publisher.publish("t", {"n": 1})
        with Consumer("t", "g", data=data_dir) as consumer:
            message = consumer.receive(timeout=30)
            assert message is not None and message.value == {"n": 1}
            message.ack()
    finally:
        socket.setdefaulttimeout(before)


def test_a_lost_connection_says_why_in_the_log(caplog: pytest.LogCaptureFixture) -> None:
    """An EOFError's text is empty: the line said "lost the broker ()"."""
    logger = logging.getLogger("spoolmq.client")
    with caplog.at_level(logging.WARNING, logger="spoolmq.client"):
        lost_broker(logger, EOFError())
        lost_broker(logger, ConnectionResetError(104, "Connection reset by peer"))
        lost_broker(logger, OSError())
    assert [r.getMessage() for r in caplog.records] == [
        "lost the broker (it closed the connection); reconnecting",
        "lost the broker ([Errno 104] Connection reset by peer); reconnecting",
        "lost the broker (OSError); reconnecting",
    ]
