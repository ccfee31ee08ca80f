"""The Kafka child's link to the PublisherBroker when the broker is slow to answer a new
connection: a request that stops waiting does not start a connect of its own each time,
a connection that arrives late is kept for the next request (not dropped), and one that
arrives after the front closed is said goodbye to."""

from __future__ import annotations

import asyncio
import os
import socket
import threading
from collections.abc import Iterator
from multiprocessing.connection import Connection, Listener
from pathlib import Path

import pytest

from spoolmq import protocol
from spoolmq.errors import BrokerUnavailableError
from spoolmq.kafka.link import PublisherLink
from spoolmq.testing import wait_until

WAIT = 30.0  # generous bound for anything that should happen soon


class SlowBroker:
    """A stand-in PublisherBroker on ``broker.sock`` that holds its welcome until ``release``
    is set, then answers each frame with its id; it records every connection and every
    operation it receives."""

    def __init__(self, data_dir: Path) -> None:
        data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        key = protocol.read_or_create_authkey(data_dir)
        self.listener = Listener(
            str(data_dir / protocol.SOCKET_FILE), family="AF_UNIX", authkey=key
        )
        self.release = threading.Event()
        self.welcome: dict[str, object] = {"op": "welcome", "version": protocol.PROTOCOL_VERSION}
        self.unanswered: set[int] = set()  # frame ids it keeps without answering
        self.connections = 0
        self.ops: list[str] = []
        self.ended = threading.Event()  # a connection reached its end (EOF)
        self._threads: list[threading.Thread] = []
        self.closing = False
        self._accepting = threading.Thread(target=self._accept, daemon=True)
        self._accepting.start()

    def _accept(self) -> None:
        while True:
            try:
                conn = self.listener.accept()
            except Exception:  # the waking connection of close(), which does no handshake
                if self.closing:
                    return
                raise
            self.connections += 1
            served = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._threads.append(served)
            served.start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            try:
                hello = protocol.receive(conn)
                self.ops.append(hello["op"])
                if not self.release.wait(WAIT):
                    return
                protocol.send(conn, self.welcome)
                while True:
                    frame = protocol.receive(conn)
                    self.ops.append(frame["op"])
                    if "id" in frame and frame["id"] not in self.unanswered:
                        protocol.send(conn, {"op": "published", "id": frame["id"]})
            except (EOFError, OSError):
                self.ended.set()

    def close(self) -> None:
        self.closing = True
        self.release.set()
        with socket.socket(socket.AF_UNIX) as waking:  # accept() returns, and the loop ends
            waking.connect(self.listener.address)
        self._accepting.join(WAIT)
        self.listener.close()
        for thread in [self._accepting, *self._threads]:
            thread.join(WAIT)
            assert not thread.is_alive()


@pytest.fixture
def slow_broker(tmp_path: Path) -> Iterator[tuple[SlowBroker, Path]]:
    # A short directory: a Unix socket's path has a length limit.
    data_dir = Path(os.path.relpath(tmp_path / "d"))
    if len(str(data_dir)) > 90:
        data_dir = tmp_path / "d"
    broker = SlowBroker(data_dir)
    yield broker, data_dir
    broker.close()


def publish_frame(frame_id: int) -> bytes:
    return protocol.encode({"op": "publish", "id": frame_id})


def test_a_slow_connect_is_shared_and_a_late_connection_is_kept(
    slow_broker: tuple[SlowBroker, Path],
) -> None:
    broker, data_dir = slow_broker

    async def scenario() -> dict[str, object]:
        link = PublisherLink(data_dir)
        try:
            for frame_id in (1, 2, 3):  # each request gives up waiting for the welcome
                with pytest.raises(TimeoutError):
                    await link.send(
                        frame_id, publish_frame(frame_id), answer=True, connect_timeout=0.2
                    )
            broker.release.set()
            future = await link.send(4, publish_frame(4), answer=True, connect_timeout=WAIT)
            assert future is not None
            return await asyncio.wait_for(future, WAIT)
        finally:
            link.close()

    answer = asyncio.run(scenario())
    assert answer == {"op": "published", "id": 4}
    # close() ended the connection for real: the link's reader thread woke and ended
    # (the stand-in's threads ending is checked as the fixture closes it).
    wait_until(
        lambda: not any(t.name == "kafka-link" for t in threading.enumerate()),
        WAIT,
        "the link's reader thread to end",
    )
    # One connection for all four requests: the three that timed out did not each start
    # one, and the one that arrived after they gave up carried the fourth request.
    assert broker.connections == 1
    assert broker.ops[:2] == ["hello", "publish"]


def test_a_connection_that_arrives_after_close_gets_a_goodbye(
    slow_broker: tuple[SlowBroker, Path],
) -> None:
    broker, data_dir = slow_broker

    async def scenario() -> None:
        link = PublisherLink(data_dir)
        with pytest.raises(TimeoutError):
            await link.send(1, publish_frame(1), answer=True, connect_timeout=0.2)
        attempt = link._connecting
        assert attempt is not None and not attempt.done()
        link.close()  # the Kafka front stops while the connect is still under way
        broker.release.set()
        await asyncio.wait_for(asyncio.wait({attempt}), WAIT)
        assert link._conn is None

    asyncio.run(scenario())
    assert broker.ended.wait(WAIT)
    assert broker.ops == ["hello", "bye"]
    assert broker.connections == 1


def test_a_refused_handshake_is_an_unavailable_broker_and_closes_its_connection(
    slow_broker: tuple[SlowBroker, Path],
) -> None:
    broker, data_dir = slow_broker
    broker.welcome = {"op": "error", "code": "unauthorized", "message": "not you"}
    broker.release.set()

    async def scenario() -> None:
        link = PublisherLink(data_dir)
        try:
            # A retriable error for the Kafka producer, as any failure to connect.
            with pytest.raises(BrokerUnavailableError, match="not you"):
                await link.send(1, publish_frame(1), answer=True, connect_timeout=WAIT)
        finally:
            link.close()
        with pytest.raises(BrokerUnavailableError):  # closed: no connection is opened
            await link.send(2, publish_frame(2), answer=True, connect_timeout=WAIT)

    asyncio.run(scenario())
    assert broker.ended.wait(WAIT)  # the refused connection was closed, not left open
    assert broker.connections == 1


def test_an_answer_given_up_on_is_not_kept_waiting(slow_broker: tuple[SlowBroker, Path]) -> None:
    broker, data_dir = slow_broker
    broker.unanswered = {7}
    broker.release.set()

    async def scenario() -> None:
        link = PublisherLink(data_dir)
        try:
            future = await link.send(7, publish_frame(7), answer=True, connect_timeout=WAIT)
            assert future is not None
            with pytest.raises(TimeoutError):  # as a Produce request's own timeout
                await asyncio.wait_for(future, 0.2)
            answered = await link.send(8, publish_frame(8), answer=True, connect_timeout=WAIT)
            assert answered is not None
            assert await asyncio.wait_for(answered, WAIT) == {"op": "published", "id": 8}
            assert [ids for ids in link._waiting.values()] == [{}]
        finally:
            link.close()

    asyncio.run(scenario())
