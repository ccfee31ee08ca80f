"""The asyncio listener of the Kafka front: frames in, dispatch, frames out.

One connection is answered in request order, as a Kafka broker answers it, and
its Produce batches reach the PublisherBroker in request order, which idempotent
sequence numbers rely on. A Kafka broker serves one request of a connection at a
time, which costs it little: it answers ``acks=all`` before any disk sync. Here
every ``acks=all`` answer waits for an ``fdatasync``, so Produce requests are
pipelined: the next ones (up to ``MAX_PIPELINED`` requests and
``MAX_PIPELINED_BYTES``) are read, checked and sent to
the PublisherBroker while the earlier ones wait for their answers, and share its
group commits (a producer without idempotence keeps many requests in flight; one
sync per request held it to a few hundred requests a second). Any other request
waits until every request before it is answered, and is answered before the next
one is started, so it sees their effects as it would on a Kafka broker.

Hostile input stays on its connection: the size prefix is checked against
``max_request_bytes`` (``MAX_UNAUTHENTICATED_REQUEST_BYTES`` before a connection that
must authenticate has) before the frame is read, the body is parsed by the
bounded :class:`~spoolmq.kafka.wire.Reader`, and a frame that does not parse
closes that connection only. An unknown API key or a version outside the
advertised range is answered with UNSUPPORTED_VERSION and the connection
stays usable. Connections are counted: past ``max_connections`` one is closed as
soon as it is accepted, and where SASL is required a connection that has not
authenticated ``auth_timeout_s`` after its accept is closed, so peers without
credentials cannot hold the child's file descriptors for ever.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ipaddress
import logging
import ssl
import struct
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka.api import PRE_AUTH_APIS, ApiKey, ErrorCode, HeldBytes, RequestContext
from spoolmq.kafka.dispatch import Dispatcher, default_dispatcher
from spoolmq.kafka.wire import Reader

log = logging.getLogger(__name__)

_SIZE = struct.Struct(">i")
_HEADER = struct.Struct(">hhi")  # api_key, api_version, correlation_id

# Kafka's socket.request.max.bytes default; a size prefix above it is refused
# before anything is allocated for the frame.
DEFAULT_MAX_REQUEST_BYTES = 100 * 1024 * 1024
# Before a connection has authenticated (on a listener that requires SASL), its frames
# are ApiVersions and the SASL exchange, a few hundred bytes each: one larger than this
# closes the connection before anything is allocated for it, so a peer without
# credentials cannot make the child hold max_request_bytes per connection (Kafka's
# sasl.server.max.receive.size, 512 KiB).
MAX_UNAUTHENTICATED_REQUEST_BYTES = 512 * 1024
# Where SASL is required, a connection that has not authenticated this long after its
# accept is closed (the exchange takes two round trips): without a deadline a peer with no
# credentials could hold connections, and the child's file descriptors, open for ever.
AUTH_TIMEOUT_S = 10.0
# A TLS handshake not done in this long closes its connection (asyncio's default is 60 s).
TLS_HANDSHAKE_TIMEOUT_S = 10.0
# Connections served at once (Kafka's max.connections, unbounded there by default); one
# more is closed as soon as it is accepted. Bounded here by default: each connection holds
# a file descriptor, and a child that has run out of them refuses every client, a
# legitimate one too (kafka/child.py raises the descriptor limit to fit this many).
DEFAULT_MAX_CONNECTIONS = 1000
# At most one log line this often about refused connections (a flood must not flood the log).
_REFUSAL_LOG_S = 10.0
# api_key + api_version + correlation_id + client_id length.
MIN_REQUEST_BYTES = _HEADER.size + 2
# Pipelined requests of one connection started and not answered yet, and the bytes they
# hold (their frames, what their compressed batches inflated to, and their decoded
# records: produce.HELD_PER_RECORD each): at this many (or when the next would pass the
# bytes), the connection is not read until the oldest is answered (a librdkafka producer
# without idempotence may keep a million requests in flight). A request alone may be as
# large as max_request_bytes, inflate to produce.MAX_INFLATED_BYTES more, and hold
# produce.MAX_RECORDS_PER_REQUEST records.
MAX_PIPELINED = 16
MAX_PIPELINED_BYTES = 32 * 1024 * 1024
# What the requests of every connection hold together (api.HeldBytes; Kafka's
# queued.max.request.bytes, unbounded there by default): a frame's body is read once it
# fits (in the order the connections asked), so many connections cannot add up what each
# may hold alone. A request being decoded may add one request's inflating and records
# beyond it. Frames read before a connection has authenticated are not counted: they are
# bounded on their own (MAX_UNAUTHENTICATED_REQUEST_BYTES, one at a time), and peers
# without credentials must not be able to fill the room of those with them.
DEFAULT_MAX_HELD_BYTES = 256 * 1024 * 1024
# Room is taken for a frame before its body is read (nothing is allocated past the bound),
# so a body must then arrive in BODY_TIMEOUT_S, and a second more per
# BODY_MIN_BYTES_PER_S of its size (a 1 MB request: 30 s; the 100 MiB limit: 55 s), or its
# connection is closed and the room given back: a peer that sends a large size prefix and
# nothing more holds the room that long at most.
BODY_TIMEOUT_S = 30.0
BODY_MIN_BYTES_PER_S = 4 * 1024 * 1024

# What the reading side of a connection hands to the answering side, in request order:
# a started pipelined request, a request to serve alone (and the future that lets the
# reading go on once it is answered, and the bytes of it counted in HeldBytes), the end of
# the connection (None), or the error that ended its reading.
_Request = (
    asyncio.Task[bytes | None] | tuple[bytes, asyncio.Future[None], int] | BaseException | None
)


class CloseConnection(Exception):
    """Raised inside the serving loop to drop one connection (not an error of the child)."""


def is_loopback_host(host: str) -> bool:
    """True for addresses only this machine can reach (no authentication needed there)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class KafkaServer:
    """Serves Kafka requests on one listener; one instance per Kafka child."""

    def __init__(
        self,
        data_dir: Path,
        host: str,
        port: int,
        *,
        dispatcher: Dispatcher | None = None,
        auth_required: bool = False,
        ssl_context: ssl.SSLContext | None = None,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        auth_timeout_s: float = AUTH_TIMEOUT_S,
        max_held_bytes: int = DEFAULT_MAX_HELD_BYTES,
        body_timeout_s: float = BODY_TIMEOUT_S,
        shared: dict[str, Any] | None = None,
    ) -> None:
        self.dispatcher = dispatcher if dispatcher is not None else default_dispatcher()
        self.auth_required = auth_required
        self.ssl_context = ssl_context
        self.max_request_bytes = max_request_bytes
        self.max_connections = max_connections
        self.auth_timeout_s = auth_timeout_s
        self.body_timeout_s = body_timeout_s
        # Connections closed at their accept (over max_connections), and closed because
        # they had not authenticated in time; both also in the child's figures.
        self.refused_connections = 0
        self.auth_timeouts = 0
        self._refusals_unlogged = 0
        self._refusal_logged_at = -_REFUSAL_LOG_S
        self.template = RequestContext(
            data_dir=Path(data_dir),
            host=host,
            port=port,
            auth_required=auth_required,
            tls=ssl_context is not None,
            shared=shared if shared is not None else {},
            memory=HeldBytes(max_held_bytes),
        )
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self) -> asyncio.Server:
        # Plain TCP: _serve starts TLS on each connection it serves.
        self._server = await asyncio.start_server(
            self._serve, self.template.host, self.template.port, reuse_address=True
        )
        # Port 0 asks the OS for a free port; advertise the one we got.
        sock = self._server.sockets[0]
        self.template.port = int(sock.getsockname()[1])
        return self._server

    @property
    def port(self) -> int:
        return self.template.port

    @property
    def connection_count(self) -> int:
        return len(self._connections)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.gather(*self._connections, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    def new_context(self, peer: str) -> RequestContext:
        # Each connection gets its own context; ``shared`` stays the one dict.
        return replace(
            self.template,
            peer=peer,
            conn={},
            pipelined={},
            authenticated=False,
            principal=None,
            held=0,
        )

    @property
    def memory(self) -> HeldBytes:
        """What every connection's requests hold (DEFAULT_MAX_HELD_BYTES)."""
        assert self.template.memory is not None
        return self.template.memory

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peername = writer.get_extra_info("peername")
        if len(self._connections) >= self.max_connections:
            await self._refuse(writer, peername)
            return
        task = asyncio.current_task()
        if task is not None:
            self._connections.add(task)
        ctx = self.new_context(str(peername))
        ctx.host = advertised_host(ctx.host, writer.get_extra_info("sockname"))
        deadline = None
        if ctx.auth_required and task is not None:
            deadline = asyncio.get_running_loop().call_later(
                self.auth_timeout_s, self._auth_deadline, ctx, task
            )
        requests: asyncio.Queue[_Request] = asyncio.Queue()
        # Pipelined requests started and not answered yet, with the bytes they hold (their
        # frames, and what their handlers add with ctx.holds): the reading waits for room
        # among them, and the end of the connection collects them.
        started = ctx.pipelined
        room = asyncio.Condition()
        reading: asyncio.Task[None] | None = None
        try:
            if self.ssl_context is not None:
                # TLS here, not in the listener: a connection is counted and given its
                # deadline from its accept, and one that stalls in its handshake is cut
                # off like any other.
                await writer.start_tls(
                    self.ssl_context, ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT_S
                )
            reading = asyncio.create_task(self._read_requests(ctx, reader, requests, room))
            while True:
                request = await requests.get()
                if request is None:
                    return  # a clean close between requests
                if isinstance(request, BaseException):
                    raise request
                if isinstance(request, asyncio.Task):
                    response = await request
                else:
                    frame, answered, counted = request
                    response = await self.handle_frame(ctx, frame)
                if response is not None:
                    writer.write(response)
                    await writer.drain()
                if ctx.close_after_response:
                    return
                if isinstance(request, asyncio.Task):
                    self._give_back(ctx, started.pop(request))
                    async with room:
                        room.notify()
                else:
                    self._give_back(ctx, counted)
                    answered.set_result(None)
        except (CloseConnection, KafkaDecodeError) as exc:
            log.info("kafka: closing %s: %s", ctx.peer, exc)
        except (ConnectionError, asyncio.IncompleteReadError, ssl.SSLError):
            pass
        except asyncio.CancelledError:
            # close() and the authentication deadline cancel the connections they end;
            # asyncio's stream callback would log a cancelled serving task as an error,
            # so end it normally.
            return
        except Exception:
            # A bug in a handler must cost one connection, never the child.
            log.exception("kafka: request from %s failed; closing the connection", ctx.peer)
        finally:
            # Requests started and not answered go with the connection: what they sent is
            # stored or not, as when a connection drops while its answer is on the way.
            # Those that ended already are collected too (their errors are not logged).
            if deadline is not None:
                deadline.cancel()
            ending = [*started] if reading is None else [reading, *started]
            for each in ending:
                each.cancel()
            writer.close()
            try:
                with contextlib.suppress(asyncio.CancelledError):  # close() while ending
                    await asyncio.gather(*ending, return_exceptions=True)
                    # Not after a TLS handshake that did not finish: asyncio then never
                    # tells the stream it closed, and the wait would never end (the
                    # connection would hold its place under max_connections for ever).
                    if reading is not None:
                        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
                            await writer.wait_closed()
            finally:
                self._give_back(ctx, ctx.held)  # what its requests read and made
                if task is not None:  # counted, and waited for by close(), until here
                    self._connections.discard(task)

    async def _refuse(self, writer: asyncio.StreamWriter, peer: Any) -> None:
        """Close a connection over ``max_connections`` at once (logged at most once per
        ``_REFUSAL_LOG_S``, with how many were refused meanwhile)."""
        self.refused_connections += 1
        self._refusals_unlogged += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= _REFUSAL_LOG_S:
            log.warning(
                "kafka: %d connection(s) refused (the last from %s): %d served, the limit "
                "(--kafka-max-connections)",
                self._refusals_unlogged,
                peer,
                self.max_connections,
            )
            self._refusals_unlogged = 0
            self._refusal_logged_at = now
        writer.close()
        with contextlib.suppress(ConnectionError, ssl.SSLError, OSError):
            await writer.wait_closed()

    def _auth_deadline(self, ctx: RequestContext, task: asyncio.Task[None]) -> None:
        """``auth_timeout_s`` after a connection's accept: close it unless it has
        authenticated (its serving task ends as when the listener closes)."""
        if not ctx.authenticated:
            self.auth_timeouts += 1
            log.info(
                "kafka: closing %s: not authenticated within %g s", ctx.peer, self.auth_timeout_s
            )
            task.cancel()

    async def _read_requests(
        self,
        ctx: RequestContext,
        reader: asyncio.StreamReader,
        requests: asyncio.Queue[_Request],
        room: asyncio.Condition,
    ) -> None:
        """Read a connection's requests into ``requests``, in order: a pipelined one is
        started once there is room for it among those started and not answered
        (``ctx.pipelined``; ``MAX_PIPELINED``, ``MAX_PIPELINED_BYTES``); after any other
        one, reading waits until it is answered."""
        started = ctx.pipelined
        try:
            while True:
                read = await self._read_frame(ctx, reader)
                if read is None:
                    requests.put_nowait(None)
                    return
                frame, counted = read
                # One read before authenticating is served alone: it closes the
                # connection unless it is part of the SASL exchange.
                if counted and self._pipelined(frame):
                    async with room:
                        await room.wait_for(functools.partial(_has_room, started, len(frame)))
                    request = asyncio.create_task(self.handle_frame(ctx, frame))
                    started[request] = len(frame)
                    requests.put_nowait(request)
                    # Its first step runs now, before the next frame is read (which may
                    # be buffered already): what it holds (ctx.holds) counts in that
                    # frame's room.
                    await asyncio.sleep(0)
                else:
                    answered = asyncio.get_running_loop().create_future()
                    requests.put_nowait((frame, answered, counted))
                    await answered
        except Exception as exc:  # answered in its turn: after the requests before it
            requests.put_nowait(exc)

    def _pipelined(self, frame: bytes) -> bool:
        api_key, version = struct.unpack_from(">hh", frame)
        handler = self.dispatcher.get(api_key)
        return handler is not None and handler.pipelined and handler.supports(version)

    def _give_back(self, ctx: RequestContext, nbytes: int) -> None:
        ctx.held -= nbytes
        self.memory.give_back(nbytes)

    async def _read_frame(
        self, ctx: RequestContext, reader: asyncio.StreamReader
    ) -> tuple[bytes, int] | None:
        """The next frame (None at a clean close between requests), and the bytes of it
        counted in the child's :class:`HeldBytes` (all of it once the connection may send
        more than the SASL exchange: its body is read once it fits, within a deadline)."""
        try:
            head = await reader.readexactly(_SIZE.size)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise CloseConnection("truncated size prefix") from None
            return None  # a clean close between requests
        (size,) = _SIZE.unpack(head)
        limit = self.max_request_bytes
        if ctx.auth_required and not ctx.authenticated:
            limit = min(limit, MAX_UNAUTHENTICATED_REQUEST_BYTES)
        if size < MIN_REQUEST_BYTES or size > limit:
            raise CloseConnection(f"request size {size} outside [{MIN_REQUEST_BYTES}, {limit}]")
        counted = 0 if ctx.auth_required and not ctx.authenticated else size
        if not counted:
            return await reader.readexactly(size), 0
        await self.memory.take(counted)  # given back when answered, or at the end
        ctx.held += counted
        # Room taken for a body that does not come would stop every connection: a body
        # gets body_timeout_s, and a second more per BODY_MIN_BYTES_PER_S of its size.
        deadline = self.body_timeout_s + size / BODY_MIN_BYTES_PER_S
        try:
            frame = await asyncio.wait_for(reader.readexactly(size), deadline)
        except TimeoutError:
            raise CloseConnection(
                f"a request of {size} bytes did not arrive within {deadline:.0f} s"
            ) from None
        return frame, counted

    async def handle_frame(self, ctx: RequestContext, frame: bytes) -> bytes | None:
        """One request frame (without its size prefix) to one response frame, or None."""
        r = Reader(frame)
        api_key = r.int16()
        version = r.int16()
        correlation_id = r.int32()
        ctx.client_id = r.nullable_string()
        if ctx.auth_required and not ctx.authenticated and api_key not in PRE_AUTH_APIS:
            raise CloseConnection(f"api {api_key} before authentication")
        handler = self.dispatcher.get(api_key)
        if api_key == ApiKey.API_VERSIONS and (handler is None or not handler.supports(version)):
            # KIP-511: the body (flexible from v3) is not parsed; the answer is v0.
            return _frame(correlation_id, self.dispatcher.unsupported_api_versions())
        if handler is None or not handler.supports(version):
            # Without a schema for this key/version, the one thing a client can
            # read is an error code at the front of the body; the connection
            # stays open for the requests it sends next.
            return _frame(correlation_id, struct.pack(">h", ErrorCode.UNSUPPORTED_VERSION))
        if handler.is_flexible(version):
            r.tagged_fields()
        body = await handler.handle(ctx, version, r)
        if body is None:
            return None
        return _frame(correlation_id, body)


def advertised_host(bound: str, local: Any) -> str:
    """The host Metadata and FindCoordinator name for this broker on one connection: the
    listener's own address, or, for a listener on every address (0.0.0.0, ::), the
    address this connection reached (``local``: its socket's name), which the client can
    reach again. "0.0.0.0" itself would send a client on another host to itself.

    >>> advertised_host("0.0.0.0", ("192.0.2.7", 9093)), advertised_host("::", ("::1", 1, 0, 0))
    ('192.0.2.7', '::1')
    >>> advertised_host("127.0.0.1", ("127.0.0.1", 9092))
    '127.0.0.1'
    """
    if bound in ("", "0.0.0.0", "::") and isinstance(local, tuple) and local:
        return str(local[0])
    return bound


def _has_room(started: dict[asyncio.Task[Any], int], size: int) -> bool:
    """Whether a pipelined request of ``size`` bytes may start beside ``started``."""
    return not started or (
        len(started) < MAX_PIPELINED and sum(started.values()) + size <= MAX_PIPELINED_BYTES
    )


def _frame(correlation_id: int, body: bytes) -> bytes:
    # Response header v0: just the correlation id (no flexible versions served).
    return _SIZE.pack(len(body) + 4) + _SIZE.pack(correlation_id) + body


async def start_kafka_listener(
    data_dir: Path,
    host: str,
    port: int,
    *,
    ssl_context: ssl.SSLContext | None = None,
    auth_required: bool | None = None,
    dispatcher: Dispatcher | None = None,
) -> KafkaServer:
    """Start serving Kafka on ``host:port``; the returned server knows the bound port.

    ``auth_required`` defaults to "the address is not loopback": a development
    listener on 127.0.0.1 accepts clients as they are (the guide's code), any
    other address demands SASL first. ``ssl_context`` (from ``--kafka-tls``)
    wraps every connection in TLS.
    """
    if auth_required is None:
        auth_required = not is_loopback_host(host)
    server = KafkaServer(
        data_dir,
        host,
        port,
        dispatcher=dispatcher,
        auth_required=auth_required,
        ssl_context=ssl_context,
    )
    await server.start()
    return server
