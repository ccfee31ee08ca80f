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
import functools
import itertools
import logging
import threading
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from spoolmq import protocol
from spoolmq.errors import BrokerUnavailableError
from spoolmq.protocol.greeting import greet, hello_frame

log = logging.getLogger(__name__)


class PublisherLink:
    """One native publisher connection, used from one asyncio loop."""

    def __init__(self, data_dir: Path, name: str = "kafka-front", *, link_key: str = "") -> None:
        self.data_dir = data_dir
        self.name = name
        # With the manager's key (given at spawn), the PublisherBroker takes this link's
        # frames in the pre-checked form (``encode_checked_frame``), skipping its parse,
        # check and dump of each record: the child built them in the store's form itself.
        self.link_key = link_key
        self.prechecked = bool(link_key)
        self._conn: Connection | None = None
        self._ids = itertools.count(1)
        # The answers awaited on each connection, by frame id: a connection that ends fails
        # its own, not those of the connection made after it.
        self._waiting: dict[Connection, dict[int, asyncio.Future[dict[str, Any]]]] = {}
        self._connecting: asyncio.Future[Connection] | None = None
        self._send_lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.closed = False

    def next_id(self) -> int:
        return next(self._ids)

    def _attempt(self) -> asyncio.Future[Connection]:
        """The connect attempt in progress, or a new one. There is one at a time, shared by
        every request that needs the connection, and a request that stops waiting (its
        timeout) does not cancel it: a late connection is kept for the next request, not
        dropped, and a PublisherBroker slow to answer is not met with a new thread per
        request."""
        attempt = self._connecting
        if attempt is None or attempt.done():
            self._loop = asyncio.get_running_loop()
            attempt = self._connecting = self._loop.create_task(self._open())
            # Every request may have stopped waiting for it: its error is seen here, not
            # logged as never retrieved (the next request makes a new attempt).
            attempt.add_done_callback(_seen)
        return attempt

    async def _open(self) -> Connection:
        conn = await asyncio.to_thread(self._connect)
        if self.closed:  # closed while connecting: say goodbye to the late connection
            self._bye(conn)
            conn.close()
            raise BrokerUnavailableError("the Kafka front is closing")
        self._conn = conn
        self._waiting[conn] = {}
        threading.Thread(
            target=self._read_answers, args=(conn,), name="kafka-link", daemon=True
        ).start()
        return conn

    def _connect(self) -> Connection:
        path = str(self.data_dir / protocol.SOCKET_FILE)
        try:
            hello = hello_frame("publisher", self.name)
            if self.link_key:
                hello["link_key"] = self.link_key
            conn, _ = greet(path, protocol.read_authkey(self.data_dir), hello)
        except Exception as exc:  # BrokerUnavailableError, AuthenticationError, a refusal
            raise BrokerUnavailableError(f"cannot reach the publisher broker: {exc!r}") from None
        return conn

    def _read_answers(self, conn: Connection) -> None:
        loop = self._loop
        assert loop is not None
        try:
            while True:
                frame = protocol.receive(conn)
                frame_id = frame.get("id")
                if isinstance(frame_id, int):
                    loop.call_soon_threadsafe(self._resolve, conn, frame_id, frame)
        except EOFError:
            # The PublisherBroker closed it: it stops (with the broker, or to be restarted,
            # which the manager reports). The next Produce connects again. Or close() ended it.
            if not self.closed:
                log.info("kafka: the publisher broker closed the connection")
        except Exception as exc:  # OSError, ProtocolError: the link is gone
            if not self.closed:
                log.warning("kafka: the publisher connection closed: %r", exc)
        try:
            loop.call_soon_threadsafe(self._lost, conn)
        except RuntimeError:  # the loop is closed (shutdown)
            conn.close()

    def _resolve(self, conn: Connection, frame_id: int, frame: dict[str, Any]) -> None:
        future = self._waiting[conn].pop(frame_id, None)
        if future is not None and not future.done():
            future.set_result(frame)

    def _lost(self, conn: Connection) -> None:
        """On the loop, once the reader thread of ``conn`` has ended (only then is closing
        it safe: its descriptor cannot be reused under a thread still reading it)."""
        if self._conn is conn:
            self._conn = None
        with contextlib.suppress(OSError):
            conn.close()
        waiting = self._waiting.pop(conn, {})
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
        if self.closed:
            raise BrokerUnavailableError("the Kafka front is closing")
        conn = self._conn
        if conn is None:
            conn = await asyncio.wait_for(asyncio.shield(self._attempt()), connect_timeout)
        waiting = self._waiting.get(conn)
        if waiting is None:  # it ended while this request waited for it to open
            raise BrokerUnavailableError("the publisher broker closed the connection")
        future: asyncio.Future[dict[str, Any]] | None = None
        if answer:
            future = waiting[frame_id] = asyncio.get_running_loop().create_future()
            # Given up on (a timeout cancels it): not kept until an answer that may not come.
            future.add_done_callback(functools.partial(_forget, waiting, frame_id))
        try:
            with self._send_lock:
                conn.send_bytes(frame)
        except OSError as exc:
            waiting.pop(frame_id, None)
            if self._conn is conn:
                self._conn = None  # the next request connects again
            protocol.cut_off(conn)  # the reader thread wakes, ends, and fails the others
            raise BrokerUnavailableError(f"could not send to the publisher broker: {exc}") from None
        return future

    def close(self) -> None:
        self.closed = True
        conn, self._conn = self._conn, None
        if conn is not None:
            self._bye(conn)

    @staticmethod
    def _bye(conn: Connection) -> None:
        with contextlib.suppress(OSError):
            protocol.send(conn, {"op": "bye"})
        protocol.cut_off(conn)  # wakes a reader thread, which closes it


def _forget(
    waiting: dict[int, asyncio.Future[dict[str, Any]]],
    frame_id: int,
    future: asyncio.Future[dict[str, Any]],
) -> None:
    if future.cancelled():
        waiting.pop(frame_id, None)


def _seen(attempt: asyncio.Future[Connection]) -> None:
    if not attempt.cancelled():
        attempt.exception()
