"""A broker child process: what it does first, the control channel from the manager, and
:class:`BrokerChild`, the plumbing the PublisherBroker and the ConsumerBroker share.

One cohesive thing (a child process's shell), so it is kept in one module: process setup,
the waits of a loop step, handing sockets over, and the base class that owns the client
table, the control frames, status reports and a clean stop. Each child's ``loop()`` does one
step; :meth:`BrokerChild.run` repeats it, and tests call it directly.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import selectors
import signal
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds, sendfds
from pathlib import Path
from typing import Any, ClassVar, Generic, NamedTuple, Self, TypeVar

from spoolmq import protocol
from spoolmq.allocator import libc, tune_allocator
from spoolmq.broker.status import (
    AdminResult,
    Disconnected,
    Ready,
    Stats,
    StatusMessage,
    StatusSender,
)
from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.errors import ProtocolError, SpoolError
from spoolmq.store import Store
from spoolmq.store.names import check_topic

# What ``multiprocessing.connection.wait`` uses: cheap to build for one call.
_Selector = getattr(selectors, "PollSelector", selectors.SelectSelector)

_PR_SET_PDEATHSIG = 1


# Young-generation collections every this many allocations (CPython's default: 700). The
# loop allocates short-lived lists and tuples per frame, almost none of them in cycles;
# at the default a busy broker ran a collection every few frames.
_GC_YOUNG_THRESHOLD = 10_000


def settle_gc() -> None:
    """After start-up: move everything alive now (modules, the store, configuration) out of
    the collector's sight with ``gc.freeze()``, so later collections do not walk it again,
    and collect the young generation less often."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG_THRESHOLD, middle, old)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process if the manager dies (Linux only)."""
    c = libc()
    if c is not None and hasattr(c, "prctl"):
        c.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_setup(name: str, log_level: str) -> None:
    """Signals: Ctrl-C in a terminal reaches the whole process group; only the manager
    acts on it and tells the children to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    tune_allocator()
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def send_control(conn: Connection, frame: dict[str, Any], fd: int | None = None) -> None:
    """A control frame, optionally followed by a file descriptor (SCM_RIGHTS).

    The descriptor travels with one byte, which ``receive_fd`` reads after the frame.
    Should ``sendmsg`` refuse the descriptor (ETOOMANYREFS: too many in flight, ENOBUFS),
    the byte still goes, alone, and the OSError is raised: the child reads one byte as
    always, finds no descriptor and drops that client, and the frames after it stay
    whole. Without the byte, it would take the next frame's first byte for it."""
    protocol.send(conn, frame)
    if fd is not None:
        with protocol.borrowed_socket(conn) as sock:
            try:
                sendfds(sock, [fd])
            except OSError:
                sock.sendall(b"\x01")
                raise


def receive_fd(conn: Connection) -> int:
    with protocol.borrowed_socket(conn) as sock:
        return recvfds(sock, 1)[0]


def wait_io(
    readers: Iterable[Any], writers: Iterable[Any], timeout: float | None
) -> tuple[list[Any], list[Any]]:
    """``multiprocessing.connection.wait`` that also waits for sockets to become writable:
    the objects of ``readers`` that can be read and of ``writers`` that can be written."""
    wanted: dict[Any, int] = {obj: selectors.EVENT_READ for obj in readers}
    for obj in writers:
        wanted[obj] = wanted.get(obj, 0) | selectors.EVENT_WRITE
    with _Selector() as selector:
        for obj, events in wanted.items():
            selector.register(obj, events)
        ready = selector.select(timeout)
    readable = [key.fileobj for key, events in ready if events & selectors.EVENT_READ]
    writable = [key.fileobj for key, events in ready if events & selectors.EVENT_WRITE]
    return readable, writable


def flush_before_close(writers: dict[Any, protocol.FrameWriter], timeout: float) -> None:
    """On stop: give frames still queued for slow readers (replies, ``closing``) up to
    ``timeout`` seconds to go out. ``writers`` maps each connection to its writer."""
    deadline = time.monotonic() + timeout
    waiting = {conn: writer for conn, writer in writers.items() if writer.waiting}
    while waiting and (left := deadline - time.monotonic()) > 0:
        _, writable = wait_io((), waiting, left)
        for conn in writable:
            try:
                waiting[conn].flush()
            except OSError:
                waiting[conn].close()  # gone: nothing more to give it
            if not waiting[conn].waiting:
                del waiting[conn]


class Waiter:
    """The waits of a broker loop on one selector (epoll on Linux) kept for the child's
    life: building a selector and registering every connection again at each step cost
    more than the step's own work when steps are short (latency at low rates).

    An object is registered while it is watched and unregistered before it is closed:
    epoll watches the open file, which the non-blocking reader and writer keep alive
    through their duplicated descriptors, so a closed but registered descriptor would go
    on reporting events.
    """

    __slots__ = ("_selector", "_writing")

    def __init__(self) -> None:
        self._selector = selectors.DefaultSelector()
        self._writing: set[Any] = set()

    def watch(self, obj: Any) -> None:
        """Report ``obj`` when it can be read (no-op if it is watched already)."""
        with contextlib.suppress(KeyError):
            self._selector.get_key(obj)
            return
        self._selector.register(obj, selectors.EVENT_READ)

    def forget(self, obj: Any) -> None:
        """Stop watching ``obj``; call before closing it."""
        self._writing.discard(obj)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._selector.unregister(obj)

    def want_writes(self, blocked: set[Any]) -> None:
        """Also report when the objects of ``blocked`` can be written (and stop for the
        others); only what changed since the last call is touched."""
        if blocked == self._writing:
            return
        both = selectors.EVENT_READ | selectors.EVENT_WRITE
        for obj in blocked - self._writing:
            self._selector.modify(obj, both)
        for obj in self._writing - blocked:
            with contextlib.suppress(KeyError, ValueError, OSError):
                self._selector.modify(obj, selectors.EVENT_READ)
        self._writing = set(blocked)

    def readable_now(self) -> bool:
        """Whether anything watched has something to read right now (no wait)."""
        return any(events & selectors.EVENT_READ for _, events in self._selector.select(0))

    def wait(self, timeout: float | None) -> tuple[list[Any], list[Any]]:
        """What can be read, and what of the write-blocked objects can be written."""
        readable: list[Any] = []
        writable: list[Any] = []
        for key, events in self._selector.select(timeout):
            if events & selectors.EVENT_READ:
                readable.append(key.fileobj)
            if events & selectors.EVENT_WRITE:
                writable.append(key.fileobj)
        return readable, writable

    def close(self) -> None:
        self._selector.close()
        self._writing.clear()


class Periodic:
    """A task a loop runs every ``seconds`` (monotonic time), at its first step unless
    ``first_at`` says later."""

    __slots__ = ("_last", "seconds")

    def __init__(self, seconds: float, *, first_at: float | None = None) -> None:
        self.seconds = seconds
        self._last = -seconds if first_at is None else first_at - seconds

    def due(self, now: float) -> bool:
        """True (and the next run ``seconds`` from now) when the task should run now."""
        if now - self._last < self.seconds:
            return False
        self._last = now
        return True


@dataclass(slots=True)
class ClientConnection:
    """A client socket the manager handed to a child, with its non-blocking framing."""

    conn: Connection
    client_id: str
    reader: protocol.FrameReader
    writer: protocol.FrameWriter
    lost: bool = False  # a write failed: the client is gone, only its sent frames remain
    # The broker's own Kafka child, as the manager vouched (its hello showed the key the
    # manager gave it at spawn): the PublisherBroker takes its pre-checked frames.
    trusted: bool = False

    @classmethod
    def open(cls, conn: Connection, client_id: str) -> Self:
        return cls(conn, client_id, protocol.FrameReader(conn), protocol.FrameWriter(conn))

    @property
    def name(self) -> str:
        """How the log names it."""
        return self.client_id


ClientT = TypeVar("ClientT", bound=ClientConnection)


class ChildChannels(NamedTuple):
    """The pipes between the manager and one child incarnation."""

    control: Connection  # duplex: frames (and file descriptors) from the manager
    parent_watch: Connection  # reads EOF when the manager dies
    status: Connection  # write end: StatusMessages to the manager
    notices: Connection | None = None  # the ConsumerBroker's: "these partitions grew"


class BrokerChild(Generic[ClientT]):
    """The shell of a broker child: its clients, control frames, status and stop.

    A subclass names its ``role``, makes its client records (:meth:`new_client`), does one
    step in :meth:`loop` (starting it with :meth:`_wait_step`), and fills in the hooks it
    needs: :meth:`start`, :meth:`drain`, :meth:`save`, :meth:`forget`, :meth:`admin`,
    :meth:`on_control`, :meth:`connection_lost`, :meth:`figures`.
    """

    role: ClassVar[str]

    def __init__(
        self,
        data_dir: Path,
        channels: ChildChannels,
        *,
        store_settings: dict[str, Any] | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self.control = channels.control
        self.parent_watch = channels.parent_watch
        self.status = StatusSender(channels.status)
        self.clock = clock  # record timestamps, leases, retries, delays; tests pass a ManualClock
        self.store = Store(data_dir, config=store_settings or None, clock=clock)
        self.clients: dict[Connection, ClientT] = {}
        self.stopping = False
        self.logger = logging.getLogger(f"spoolmq.{self.role}")
        self._stats_timer = Periodic(1.0)
        self._waiter = Waiter()
        self._others: set[Any] = set()  # what the last step watched besides clients
        self._waiter.watch(self.control)
        self._waiter.watch(self.parent_watch)

    # -- what a subclass provides ------------------------------------------------------

    def new_client(self, conn: Connection, client_id: str) -> ClientT:
        raise NotImplementedError

    def loop(self, timeout: float | None) -> None:
        """One step: wait up to ``timeout`` seconds for something to do, then do it."""
        raise NotImplementedError

    def wait_timeout(self) -> float | None:
        """How long the next step may wait when nothing arrives."""
        return 1.0

    def figures(self) -> dict[str, Any]:
        """The figures reported to the manager (``spoolmq stats``)."""
        raise NotImplementedError

    def start(self) -> None:
        """Before the first step (after which the child reports ready)."""

    def drain(self) -> None:
        """On stop, before :meth:`close`: finish the work already received."""

    def save(self) -> None:
        """On close, once every client is dropped: persist what the child holds."""

    def forget(self, client: ClientT) -> None:
        """A client is being dropped: release what it held."""

    def on_control(self, op: str, frame: dict[str, Any]) -> None:
        """A control frame other than ``client``, ``stop`` and ``admin``."""

    def admin(self, request: dict[str, Any]) -> dict[str, Any]:
        if request.get("action") == "forget_topic":
            # A topic was deleted by another process of the broker: its cached settings
            # and open partition logs here are stale.
            self.store.forget_topic(check_topic(request.get("topic")))
            return {"op": "ok"}
        raise ProtocolError(f"unknown admin action {str(request.get('action'))[:40]!r}")

    def connection_lost(self, client: ClientT, reason: str) -> None:
        """Writing to ``client`` failed: it is gone."""
        client.lost = True
        self._drop(client, reason)

    # -- the loop --------------------------------------------------------------------------

    def run(self) -> None:
        self.start()
        settle_gc()
        self._report(Ready(os.getpid()))
        # Figures from the start, so `spoolmq stats` has its full shape at once.
        self._report(Stats(self.figures()))
        try:
            while not self.stopping:
                self.loop(self.wait_timeout())
            self.drain()
        finally:
            self.close()

    def _wait_step(self, timeout: float | None, others: Sequence[Any] = ()) -> list[Any]:
        """The start of a step: wait until the manager, a client or one of ``others`` has
        something to read (writing out what clients can take meanwhile), handle the
        manager's frames, and return what else can be read."""
        waiter = self._waiter
        # ``others`` are watched for this step only, as with a selector built per step: an
        # object left registered while its owner no longer reads it would wake every step.
        if others or self._others:
            current = set(others)
            for obj in self._others - current:
                waiter.forget(obj)
            for obj in current - self._others:
                waiter.watch(obj)
            self._others = current
        waiter.want_writes({conn for conn, c in self.clients.items() if c.writer.waiting})
        ready, writable = waiter.wait(timeout)
        for conn in writable:
            client = self.clients.get(conn)
            if client is None:
                continue
            try:
                client.writer.flush()
            except OSError:
                self.connection_lost(client, "connection lost while writing to it")
        if self.parent_watch in ready:
            self.logger.error("the manager is gone; stopping")
            self.stopping = True
        if self.control in ready:
            self._handle_control()
        return ready

    def _report_stats_when_due(self, now: float) -> None:
        if self._stats_timer.due(now):
            self._report(Stats(self.figures()))

    # -- the manager ---------------------------------------------------------------------

    def _handle_control(self) -> None:
        try:
            frame = protocol.receive(self.control)
        except (EOFError, OSError):
            self.stopping = True
            return
        op = str(frame.get("op"))
        if op == "client":
            try:
                conn = Connection(receive_fd(self.control))
            except (OSError, RuntimeError) as exc:  # out of descriptors: its fd was dropped
                self.logger.warning("could not take client %s: %s", frame.get("client_id"), exc)
                return
            client = self.clients[conn] = self.new_client(conn, str(frame.get("client_id")))
            client.trusted = frame.get("trusted") is True
            self._waiter.watch(conn)
        elif op == "stop":
            self.stopping = True
        elif op == "admin":
            try:
                body = self.admin(frame.get("body") or {})
            except SpoolError as exc:
                body = protocol.error_frame(exc)
            except Exception as exc:
                # A bug must cost one admin request, not every client of the broker.
                self.logger.exception("failed an admin request")
                body = protocol.error_frame(SpoolError(f"internal error: {exc!r}"[:300]))
            self._report(AdminResult(frame.get("request_id", 0), body))
        else:
            self.on_control(op, frame)

    def _report(self, message: StatusMessage) -> None:
        self.status.send(message)

    # -- clients ---------------------------------------------------------------------------

    def _send(self, client: ClientT, frame: dict[str, Any]) -> None:
        if client.lost:
            return
        try:
            client.writer.send(protocol.encode(frame))
        except OSError:
            self.connection_lost(client, "connection lost while answering")

    def _drop(self, client: ClientT, reason: str) -> None:
        if self.clients.pop(client.conn, None) is None:
            return
        self._waiter.forget(client.conn)
        self.forget(client)
        self.logger.info("%s %s left: %s", self.role, client.name, reason)
        with contextlib.suppress(OSError):
            client.conn.close()
        client.reader.close()
        client.writer.close()
        self._report(Disconnected(client.client_id))

    def close(self) -> None:
        flush_before_close({c.conn: c.writer for c in self.clients.values()}, timeout=2.0)
        for client in list(self.clients.values()):
            self._drop(client, "broker stopping")
        try:
            self.save()
        finally:
            self.store.close()
            self._waiter.close()
            self._report(Stats(self.figures()))
            self.status.close()


def run_child(
    child_class: type[BrokerChild[Any]],
    data_dir: str,
    channels: ChildChannels,
    log_level: str,
    store_settings: dict[str, Any],
) -> None:
    """Entry point of a broker child process (spawned by the manager)."""
    child_setup(child_class.role, log_level)
    child_class(Path(data_dir), channels, store_settings=store_settings).run()
