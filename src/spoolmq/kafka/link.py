"""The Kafka child's connection to the PublisherBroker: a native publisher, shared by all
Kafka connections of the child.

Kafka Produce requests become native protocol v2 publish frames (docs/PROTOCOL.md)
sent on one authenticated connection through ``broker.sock``, exactly as a
``Publisher`` would send them, so they ride the same group commit and get the
same guarantees: the answer to an ``acks=all`` frame comes after ``fdatasync``.
(The broker layer may not import the client package, so the few lines of
handshake live here.)

Sending happens on the event loop (a frame is written whole, quickly); a reader
thread blocks on the answers and resolves each waiting future by frame id. If
the PublisherBroker restarts, every waiting request fails with
:class:`BrokerUnavailableError` (a retriable Kafka error for the producer, never
a false success) and the next publish reconnects.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.errors import BrokerUnavailableError

log = logging.getLogger(__name__)


class PublisherLink:
    """One native publisher connection, used from one asyncio loop."""

    def __init__(self, data_dir: Path, name: str = "kafka-front") -> None:
        self.data_dir = data_dir
        self.name = name
        self._conn: Connection | None = None
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._connecting: asyncio.Lock | None = None
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def next_id(self) -> int:
        return next(self._ids)

    async def _ensure(self) -> Connection:
        if self._conn is not None:
            return self._conn
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            if self._conn is None:
                self._loop = asyncio.get_running_loop()
                conn = await asyncio.to_thread(self._connect)
                self._conn = conn
                threading.Thread(
                    target=self._read_answers, args=(conn,), name="kafka-link", daemon=True
                ).start()
            return self._conn

    def _connect(self) -> Connection:
        path = str(self.data_dir / protocol.SOCKET_FILE)
        try:
            conn = Client(path, family="AF_UNIX", authkey=protocol.read_authkey(self.data_dir))
            protocol.send(
                conn,
                {
                    "op": "hello",
                    "version": protocol.PROTOCOL_VERSION,
                    "role": "publisher",
                    "pid": os.getpid(),
                    "name": self.name,
                },
            )
            welcome = protocol.receive(conn)
            protocol.raise_if_error(welcome)
        except (OSError, EOFError) as exc:
            raise BrokerUnavailableError(f"cannot reach the publisher broker: {exc}") from None
        return conn

    def _read_answers(self, conn: Connection) -> None:
        loop = self._loop
        assert loop is not None
        try:
            while True:
                frame = protocol.receive(conn)
                frame_id = frame.get("id")
                if isinstance(frame_id, int):
                    loop.call_soon_threadsafe(self._resolve, frame_id, frame)
        except EOFError:
            # The PublisherBroker closed it: it stops (with the broker, or to be restarted,
            # which the manager reports). The next Produce connects again.
            log.info("kafka: the publisher broker closed the connection")
        except Exception as exc:  # OSError, ProtocolError: the link is gone
            log.warning("kafka: the publisher connection closed: %r", exc)
        with contextlib.suppress(RuntimeError):  # the loop may be closed at shutdown
            loop.call_soon_threadsafe(self._lost, conn)

    def _resolve(self, frame_id: int, frame: dict[str, Any]) -> None:
        future = self._waiting.pop(frame_id, None)
        if future is not None and not future.done():
            future.set_result(frame)

    def _lost(self, conn: Connection) -> None:
        if self._conn is conn:
            self._conn = None
        with contextlib.suppress(OSError):
            conn.close()
        waiting, self._waiting = self._waiting, {}
        for future in waiting.values():
            if not future.done():
                future.set_exception(
                    BrokerUnavailableError("the publisher broker went away before answering")
                )

    async def send(
        self,
        frame_id: int,
        frame: bytes,
        *,
        answer: bool,
        connect_timeout: float | None = None,
    ) -> asyncio.Future[dict[str, Any]] | None:
        """Send one encoded publish frame (once connected, without giving way to another
        task: frames sent one after the other reach the PublisherBroker in that order);
        the future of its answer, or None when ``answer`` is False. Connecting first takes
        ``connect_timeout`` seconds at most (TimeoutError)."""
        conn = self._conn
        if conn is None:
            conn = await asyncio.wait_for(self._ensure(), connect_timeout)
        future: asyncio.Future[dict[str, Any]] | None = None
        if answer:
            future = asyncio.get_running_loop().create_future()
            self._waiting[frame_id] = future
        try:
            with self._send_lock:
                conn.send_bytes(frame)
        except OSError as exc:
            self._waiting.pop(frame_id, None)
            self._lost(conn)
            raise BrokerUnavailableError(f"could not send to the publisher broker: {exc}") from None
        return future

    def close(self) -> None:
        self.closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(OSError):
                protocol.send(conn, {"op": "bye"})
            with contextlib.suppress(OSError):
                conn.close()
