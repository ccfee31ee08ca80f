"""The BrokerManager: the parent process of a broker.

It holds the data directory's broker lock (one broker per directory), owns the listeners
clients connect to, authenticates each connection and reads its ``hello``, then hands the
socket itself to the PublisherBroker or the ConsumerBroker (SCM_RIGHTS over the child's
control pipe), so client traffic never takes an extra hop through the manager. It spawns
both children (start method ``spawn``), restarts a crashed one with backoff, keeps the
registry of connected clients, answers admin requests, and shuts everything down cleanly
on SIGINT/SIGTERM.

Channels: a duplex control Pipe per child (manager -> child frames and file descriptors),
a watch Pipe per child (the child sees EOF when the manager dies), a one-way status Pipe
per child incarnation (child -> manager: the messages of :mod:`spoolmq.broker.status`),
and one notice Pipe from the PublisherBroker to the ConsumerBroker ("these partitions
grew").

One cohesive thing (the parent process: its lock, listeners, children and admin answers),
so it stays one module past 500 lines.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import itertools
import logging
import multiprocessing
import os
import secrets
import signal
import socket
import sqlite3
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import (
    Connection,
    Listener,
    answer_challenge,
    deliver_challenge,
    wait,
)
from pathlib import Path
from typing import Any, TypeVar

from filelock import FileLock, Timeout

from spoolmq import protocol
from spoolmq.allocator import tune_allocator
from spoolmq.broker.child import BrokerChild, ChildChannels, run_child, send_control
from spoolmq.broker.consumer_broker import ConsumerBroker
from spoolmq.broker.metrics import MetricsServer, Snapshot
from spoolmq.broker.publisher_broker import PublisherBroker
from spoolmq.broker.status import (
    AdminResult,
    Disconnected,
    Ready,
    Stats,
    StatusMessage,
    decode_status,
)
from spoolmq.config import host_port, listen_error
from spoolmq.errors import (
    AuthenticationError,
    BrokerLockedError,
    ConfigError,
    ProtocolError,
    SpoolError,
    StorageError,
)
from spoolmq.files import FILE_MODE, check_data_dir, write_new_file
from spoolmq.store.names import check_topic
from spoolmq.store.state import StateDB

logger = logging.getLogger("spoolmq.broker")

LOCK_FILE = "broker.lock"
PID_FILE = "broker.pid"
_BACKOFF_MIN_S = 0.1
_SERVED_S = 1.0  # ready this long before dying: it had started well, not a crash loop
# Connections the kernel holds for the accept loop (multiprocessing's Listener keeps 1: a
# burst of clients connecting at once then waited for the loop one by one, and over TCP a
# connect past the one waiting had its SYN dropped and retried a second later).
_BACKLOG = 128
# Connections greeted at once per listener (authentication and hello, up to
# handshake_timeout_s each); the next ones wait in the backlog (_accept_loop).
_GREETING = 512
# accept() errors that end one connection (try the next at once), and those that say the
# process is short of descriptors or memory (pause, then go on accepting).
_ACCEPT_AGAIN = frozenset({errno.ECONNABORTED, errno.EPROTO, errno.EINTR})
_ACCEPT_LATER = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
_ACCEPT_PAUSE_S = 0.5
_ACCEPT_WARN_EVERY_S = 10.0  # one warning per this many seconds of failing accepts

_T = TypeVar("_T")


class AcceptFailures:
    """What an accept loop logs while ``accept()`` fails for want of descriptors or
    memory: the first failure, and any failure for another reason, at once; then one line
    per ``every`` seconds, with how many failed meanwhile; and one line when a connection
    is accepted again. A flood of connections must not flood the log (one line per pause
    would be two a second for as long as it lasts)."""

    __slots__ = ("_reason", "_unlogged", "_warn_at", "every", "total")

    def __init__(self, every: float) -> None:
        self.every = every
        self.total = 0  # failures since the last accepted connection
        self._reason = ""
        self._unlogged = 0  # failures not yet in a line
        self._warn_at = 0.0

    def failed(self, reason: str, now: float) -> str | None:
        """Count a failure (``now``: monotonic seconds); the line to log, if one is due."""
        self.total += 1
        if reason == self._reason and now < self._warn_at:
            self._unlogged += 1
            return None
        more = f" ({self._unlogged} more since the last line)" if self._unlogged else ""
        self._reason, self._unlogged, self._warn_at = reason, 0, now + self.every
        return (
            f"accepting a connection failed ({reason}){more}; "
            f"trying again every {_ACCEPT_PAUSE_S:g} s"
        )

    def accepted(self) -> str:
        """Count a connection accepted after failures; the line that says so."""
        line = f"accepting connections again, after {self.total} failed accepts"
        self.total, self._reason, self._unlogged, self._warn_at = 0, "", 0, 0.0
        return line


def _listening(option: str, address: tuple[str, int], bind: Callable[[], _T]) -> _T:
    """``bind()``, whose failure to listen on ``address`` (a port taken, an address not
    of this host) is a ConfigError that names the option and the address."""
    try:
        return bind()
    except OSError as exc:
        raise listen_error(address, exc, option) from None


def _forget_kafka_members(data_dir: Path) -> None:
    """A broker without --kafka has no Kafka member joined, whatever a Kafka child of an
    earlier broker (killed, say) recorded: its rows would list ghosts in ``groups
    describe --members``. A Kafka child clears them itself when it starts."""
    if not (data_dir / "state.db").exists():
        return
    try:
        state = StateDB(data_dir / "state.db")
        try:
            if state.kafka_members():
                state.clear_kafka_members()
        finally:
            state.close()
    except sqlite3.DatabaseError as exc:  # not a database, or damaged: say so in one line
        raise StorageError(f"{data_dir / 'state.db'} cannot be read: {exc}") from None


def _check_tls(cert: str, key: str) -> None:
    """Load ``--kafka-tls CERT KEY`` as the Kafka child will: a missing file, a key that
    is not the certificate's, or PEM that does not parse is a ConfigError now, not a
    child restarted in a loop until the start times out."""
    from spoolmq.kafka.child import KafkaSettings

    try:
        KafkaSettings("127.0.0.1", 0, cert, key).ssl_context()
    except OSError as exc:  # ssl.SSLError is one
        reason = getattr(exc, "reason", None) or exc.strerror or str(exc)
        if isinstance(exc, ssl.SSLError):
            reason = f"{reason} (CERT is the PEM certificate, KEY its private key)"
        raise ConfigError(f"cannot use --kafka-tls {cert} {key}: {reason}") from None


def _port_free(address: tuple[str, int]) -> None:
    """Raise the OSError that binding ``address`` would raise now. The Kafka child binds
    it itself, in its own process; this finds a port taken before the child is started
    (and restarted in a loop)."""
    host, port = address
    bound = []
    try:
        # Every address the name gives, as asyncio.start_server binds them all.
        for family, kind, proto, _, where in socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        ):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(where)
    finally:
        for sock in bound:
            sock.close()


def restart_backoff(backoff: float, served: bool, cap: float) -> tuple[float, float]:
    """How long to wait before restarting a child that died, and the wait for next time.

    A child that came up and served before it died (killed, say) is restarted at once; one
    that dies while starting (a crash loop: a bad disk, a bug at start-up) waits twice as
    long each time, up to ``cap``, as supervisord's ``startsecs`` does.

    >>> restart_backoff(0.4, served=False, cap=5.0)
    (0.4, 0.8)
    >>> restart_backoff(5.0, served=True, cap=5.0)
    (0.1, 0.2)
    """
    wait_s = _BACKOFF_MIN_S if served else backoff
    return wait_s, min(wait_s * 2, cap)


@dataclass(frozen=True, slots=True)
class BrokerSettings:
    """How to run a broker.

    Attributes:
        data_dir: the data directory it serves.
        listen: also accept TCP clients on this (host, port); None: the Unix socket only.
        log_level: logging level name for all three processes.
        store: StoreConfig settings (e.g. ``{"max_message_bytes": 2097152}``).
        handshake_timeout_s: a connection that has not authenticated and said hello in
            this time is closed.
        restart_backoff_max_s: the longest wait before restarting a crashed child.
        metrics: serve Prometheus ``GET /metrics`` on this (host, port); None: not at all.
        kafka: also serve the Kafka protocol on this (host, port), from a third child
            (docs/KAFKA.md); None: off.
        kafka_tls: (certificate file, key file) for TLS on the Kafka listener.
        kafka_max_connections: Kafka connections served at once; None: the listener's
            default (``kafka.server.DEFAULT_MAX_CONNECTIONS``).
    """

    data_dir: Path
    listen: tuple[str, int] | None = None
    log_level: str = "info"
    store: dict[str, Any] = field(default_factory=dict)
    handshake_timeout_s: float = 5.0
    restart_backoff_max_s: float = 5.0
    metrics: tuple[str, int] | None = None
    kafka: tuple[str, int] | None = None
    kafka_tls: tuple[str, str] | None = None
    kafka_max_connections: int | None = None


@dataclass(slots=True)
class _Child:
    name: str
    child_class: type[BrokerChild[Any]]
    process: Any = None
    control: Connection | None = None
    watch: Connection | None = None
    status: Connection | None = None  # the read end of this incarnation's status pipe
    started: float = 0.0
    restarts: int = 0
    backoff: float = _BACKOFF_MIN_S
    restart_at: float | None = None
    ready_at: float | None = None  # when this incarnation said it was ready
    stats: dict[str, Any] = field(default_factory=dict)
    ready: threading.Event = field(default_factory=threading.Event)


#: How long a starting broker waits for the lock. A probe (:func:`broker_running`, which
#: the console, ``topics delete`` and the operations run) holds it for microseconds: a
#: broker started in that instant waits the probe out instead of being refused, while one
#: started beside a running broker is still refused within this bound.
START_LOCK_WAIT = 2.0


def broker_lock(data_dir: Path, timeout: float = 0) -> FileLock:
    """The lock a BrokerManager holds for as long as it runs: one broker per directory."""
    return FileLock(str(data_dir / LOCK_FILE), timeout=timeout, mode=FILE_MODE)


def broker_running(data_dir: Path) -> bool:
    """Does a broker hold ``data_dir`` now? The same lock :meth:`BrokerManager.start`
    takes, tried without waiting (a ``broker.pid`` left by a killed broker does not count)."""
    if not (data_dir / LOCK_FILE).exists():
        return False
    lock = broker_lock(data_dir)
    try:
        lock.acquire()
    except Timeout:
        return True
    lock.release()
    return False


def lock_holder(data_dir: Path) -> int | None:
    """The pid in ``broker.pid``: who holds (or last held) the lock, for messages."""
    try:
        return int((data_dir / PID_FILE).read_text().strip())
    except (OSError, ValueError):
        return None


class BrokerManager:
    def __init__(self, settings: BrokerSettings) -> None:
        self.settings = settings
        self.data_dir = settings.data_dir
        self._context = multiprocessing.get_context("spawn")
        self._lock = broker_lock(self.data_dir, timeout=START_LOCK_WAIT)
        self._topic_lock = threading.Lock()  # one topic deletion at a time
        self._children = {
            "publisher": _Child("publisher", PublisherBroker),
            "consumer": _Child("consumer", ConsumerBroker),
        }
        if settings.kafka is not None:
            # Imported here: the Kafka front builds on broker.child, which imports
            # this package.
            from spoolmq.kafka.child import KafkaChild

            self._children["kafka"] = _Child("kafka", KafkaChild)
        self._control_lock = threading.Lock()
        self._listeners: list[Listener] = []
        self._threads: list[threading.Thread] = []
        self._notice_writer: Connection | None = None
        self._authkey = b""
        # Given to the Kafka child at spawn (never written anywhere): its link to the
        # PublisherBroker shows it in its hello, and only that connection may send
        # pre-checked publish frames (docs/PROTOCOL.md). A new one per manager.
        self._link_key = secrets.token_hex(32)
        self._stopping = threading.Event()
        self._wake_read, self._wake_write = socket.socketpair()
        self._client_ids = itertools.count(1)
        self.registry: dict[str, dict[str, Any]] = {}
        self._registry_lock = threading.Lock()
        self._admin_results: dict[int, tuple[threading.Event, list[Any]]] = {}
        self._admin_ids = itertools.count(1)
        self.socket_path = self.data_dir / protocol.SOCKET_FILE
        self.metrics: MetricsServer | None = None
        self._started = time.monotonic()

    # -- start and stop ------------------------------------------------------------------

    def start(self) -> None:
        check_data_dir(self.data_dir)
        try:
            self._lock.acquire()
        except Timeout:
            pid = lock_holder(self.data_dir)
            who = f"process {pid}" if pid else "another process"
            raise BrokerLockedError(
                f"a broker is already running on {self.data_dir} ({who} holds "
                f"{self.data_dir / LOCK_FILE})",
                pid=pid,
            ) from None
        try:
            self._start_locked()
        except BaseException:
            # The lock, the pid file and the socket go; nothing is left running.
            self.stop(quiet=True)
            raise

    def _start_locked(self) -> None:
        tune_allocator()
        self._started = time.monotonic()
        pid_path = self.data_dir / PID_FILE
        write_new_file(pid_path, f"{os.getpid()}\n".encode())
        self._authkey = protocol.read_or_create_authkey(self.data_dir)
        # Every port is taken before any child starts: one taken already is a one-line
        # error now, not a child restarted in a loop until the start times out. The
        # Kafka port is tried last, so that one of ours (--listen, --metrics) counts.
        self._open_listeners()
        metrics, kafka = self.settings.metrics, self.settings.kafka
        if kafka is None:
            _forget_kafka_members(self.data_dir)
        if metrics is not None:
            self.metrics = _listening(
                "--metrics",
                metrics,
                lambda: MetricsServer(metrics, self.data_dir, self.snapshot),
            )
        if kafka is not None:
            _listening("--kafka", kafka, lambda: _port_free(kafka))
            if self.settings.kafka_tls is not None:
                _check_tls(*self.settings.kafka_tls)
        self._start_child(self._children["consumer"])
        self._start_child(self._children["publisher"])
        if "kafka" in self._children:
            self._start_child(self._children["kafka"])
        deadline = time.monotonic() + 60
        while not all(child.ready.is_set() for child in self._children.values()):
            if self._stopping.is_set():
                return  # SIGINT or SIGTERM while starting: run() stops what started
            if time.monotonic() > deadline:
                raise SpoolError("the broker processes did not start within 60 s")
            self.supervise_step(timeout=0.5)
        if self.metrics is not None:
            self.metrics.start()
            logger.info("metrics on http://%s/metrics", host_port(*self.metrics.address))
        if self.tcp_address is not None:  # once started: a failed start says one line
            logger.info("also listening on tcp %s", host_port(*self.tcp_address))
        logger.info("broker ready on %s (pid %d)", self.socket_path, os.getpid())

    def _open_listeners(self) -> None:
        if self.socket_path.exists() or self.socket_path.is_symlink():
            # We hold the lock: a socket file here was left by a broker that died.
            self.socket_path.unlink()
        old_umask = os.umask(0o177)
        try:
            self._listeners.append(
                Listener(str(self.socket_path), family="AF_UNIX", backlog=_BACKLOG)
            )
        finally:
            os.umask(old_umask)
        os.chmod(self.socket_path, FILE_MODE)
        if self.settings.listen is not None:
            address = self.settings.listen
            self._listeners.append(
                _listening(
                    "--listen",
                    address,
                    lambda: Listener(address, family="AF_INET", backlog=_BACKLOG),
                )
            )
        for listener in self._listeners:
            thread = threading.Thread(
                target=self._accept_loop, args=(listener,), name="accept", daemon=True
            )
            thread.start()
            self._threads.append(thread)

    @property
    def tcp_address(self) -> tuple[str, int] | None:
        for listener in self._listeners:
            if isinstance(listener.address, tuple):
                return listener.address
        return None

    def _start_child(self, child: _Child) -> None:
        ctx = self._context
        manager_end, child_end = ctx.Pipe(duplex=True)
        watch_read, watch_write = ctx.Pipe(duplex=False)
        status_read, status_write = ctx.Pipe(duplex=False)
        notice_read = None
        if child.name == "consumer":
            notice_read, notice_write = ctx.Pipe(duplex=False)
            if self._notice_writer is not None:
                self._notice_writer.close()
            self._notice_writer = notice_write
        channels = ChildChannels(child_end, watch_read, status_write, notice_read)
        target, args = self._child_entry(child, channels)
        process = ctx.Process(target=target, args=args, name=f"spoolmq-{child.name}")
        process.daemon = True
        process.start()
        # Only the child holds these ends now: its death reads as EOF on ours.
        for end in channels:
            if end is not None:
                end.close()
        child.process, child.control, child.watch, child.status = (
            process,
            manager_end,
            watch_write,
            status_read,
        )
        child.started = time.monotonic()
        child.restart_at = None
        child.ready_at = None
        # The PublisherBroker writes notices on the current pipe, whichever side restarted.
        publisher = self._children["publisher"]
        if self._notice_writer is not None and publisher.control is not None:
            with self._control_lock, contextlib.suppress(OSError):
                send_control(publisher.control, {"op": "notices"}, self._notice_writer.fileno())

    def _child_entry(
        self, child: _Child, channels: ChildChannels
    ) -> tuple[Callable[..., None], tuple[Any, ...]]:
        common = (str(self.data_dir), channels, self.settings.log_level, self.settings.store)
        if child.name == "kafka" and self.settings.kafka is not None:
            from spoolmq.kafka.child import KafkaSettings, run_kafka_child

            host, port = self.settings.kafka
            cert, key = self.settings.kafka_tls or (None, None)
            kafka = KafkaSettings(host, port, cert, key, link_key=self._link_key)
            if self.settings.kafka_max_connections is not None:
                kafka = replace(kafka, max_connections=self.settings.kafka_max_connections)
            return run_kafka_child, (*common, kafka)
        return run_child, (child.child_class, *common)

    def run(self) -> int:
        """Start, then supervise until SIGINT/SIGTERM. Returns the exit status."""
        self._install_signals()
        self.start()
        try:
            while not self._stopping.is_set():
                self.supervise_step(timeout=1.0)
        finally:
            self.stop()
        return 0

    def _install_signals(self) -> None:
        self._wake_write.setblocking(False)
        signal.set_wakeup_fd(self._wake_write.fileno())

        def request_stop(signum: int, frame: object) -> None:
            self._stopping.set()

        signal.signal(signal.SIGINT, request_stop)
        signal.signal(signal.SIGTERM, request_stop)

    def supervise_step(self, timeout: float) -> None:
        """One step: read status, notice dead children, restart them when their backoff ends."""
        now = time.monotonic()
        waitables: list[Any] = [self._wake_read]
        deadlines = [timeout]
        for child in self._children.values():
            if child.process is not None and child.restart_at is None:
                waitables.append(child.process.sentinel)
            if child.status is not None:
                waitables.append(child.status)
            if child.restart_at is not None:
                deadlines.append(max(0.0, child.restart_at - now))
        ready = wait(waitables, min(deadlines))
        if self._wake_read in ready:
            with contextlib.suppress(BlockingIOError, OSError):
                self._wake_read.recv(4096)
        for child in self._children.values():
            self._drain_status(child)
            if self._stopping.is_set():
                continue
            if (
                child.restart_at is None
                and child.process is not None
                and not child.process.is_alive()
            ):
                served = child.ready_at is not None and (
                    time.monotonic() - child.ready_at >= _SERVED_S
                )
                child.ready_at = None  # a dead child is not ready (admin `stats` says so)
                wait_s, child.backoff = restart_backoff(
                    child.backoff, served, self.settings.restart_backoff_max_s
                )
                logger.error(
                    "the %s broker (pid %s) exited with status %s; restarting in %.1fs",
                    child.name,
                    child.process.pid,
                    child.process.exitcode,
                    wait_s,
                )
                child.restart_at = time.monotonic() + wait_s
                self._close_child_channels(child)
                self._forget_clients_of(child.name)
            if child.restart_at is not None and time.monotonic() >= child.restart_at:
                child.restarts += 1
                self._start_child(child)
                logger.warning("restarted the %s broker (restart #%d)", child.name, child.restarts)

    def _forget_clients_of(self, role: str) -> None:
        """The connections a dead child served died with it (their clients reconnect and
        register again), so they leave the registry that ``stats`` counts."""
        with self._registry_lock:
            for client_id in [k for k, c in self.registry.items() if c["role"] == role]:
                del self.registry[client_id]

    def _close_child_channels(self, child: _Child) -> None:
        """Close the manager's ends of a dead (or stopped) child's pipes, once its status
        has been read."""
        for conn in (child.control, child.watch, child.status):
            if conn is not None:
                with contextlib.suppress(OSError):
                    conn.close()
        child.control = None
        child.watch = None
        child.status = None

    def _drain_status(self, child: _Child) -> None:
        """Handle every status message the child has written so far."""
        status = child.status
        while status is not None:
            try:
                if not status.poll(0):
                    return
                data = status.recv_bytes()
            except (EOFError, OSError):
                # The child has gone and everything it wrote has been read.
                status.close()
                child.status = None
                return
            try:
                self._on_status(child, decode_status(data))
            except ProtocolError as exc:
                logger.error("the %s broker sent a bad status message: %s", child.name, exc)

    def _on_status(self, child: _Child, message: StatusMessage) -> None:
        match message:
            case Ready():
                child.ready.set()
                child.ready_at = time.monotonic()
            case Stats(figures):
                child.stats = figures
            case Disconnected(client_id):
                with self._registry_lock:
                    self.registry.pop(client_id, None)
            case AdminResult(request_id, body):
                waiter = self._admin_results.get(request_id)
                if waiter is not None:
                    waiter[1].append(body)
                    waiter[0].set()

    def _join(self, child: _Child, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for a stopping child to exit, reading its status
        meanwhile: a child blocked writing a full status pipe would never exit."""
        deadline = time.monotonic() + timeout
        while child.process.is_alive() and (left := deadline - time.monotonic()) > 0:
            waitables = [child.process.sentinel]
            if child.status is not None:
                waitables.append(child.status)
            wait(waitables, left)
            self._drain_status(child)

    def request_stop(self) -> None:
        self._stopping.set()
        with contextlib.suppress(OSError):
            self._wake_write.send(b"x")

    def stop(self, *, quiet: bool = False) -> None:
        """Stop accepting, let the PublisherBroker store and answer what it has, then the
        ConsumerBroker tell its consumers and save its state; release the lock. ``quiet``:
        a start that failed, whose error says enough (no "broker stopped" line after it)."""
        self._stopping.set()
        if self.metrics is not None:
            self.metrics.stop()
        for listener in self._listeners:
            with contextlib.suppress(OSError):
                listener.close()
        # The Kafka child first: its producers' frames reach the PublisherBroker
        # before that one drains and stops.
        for name in ("kafka", "publisher", "consumer"):
            child = self._children.get(name)
            if child is None or child.process is None:
                continue
            if child.ready_at is None:
                # Still starting (a stop while the broker starts, or a restart): it serves
                # nobody yet and reads no control frame before it is ready, and whatever it
                # was recovering is safe to cut, as after a crash.
                child.process.terminate()
            elif child.control is not None:
                with self._control_lock, contextlib.suppress(OSError):
                    protocol.send(child.control, {"op": "stop"})
            self._join(child, 15)
            if child.process.is_alive():
                logger.error("the %s broker did not stop in 15 s; killing it", name)
                child.process.kill()
                child.process.join(5)
            self._drain_status(child)
            self._close_child_channels(child)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()
        with contextlib.suppress(FileNotFoundError):
            (self.data_dir / PID_FILE).unlink()
        if self._lock.is_locked:
            self._lock.release()
        if not quiet:
            logger.info("broker stopped")

    # -- connections ------------------------------------------------------------------------

    def _accept_loop(self, listener: Listener) -> None:
        """Accept connections, each greeted in a thread of its own; at most ``_GREETING``
        greetings at a time, beyond which the next connections wait in the kernel's
        backlog (a peer that connects and says nothing holds its greeting's two threads
        until ``handshake_timeout_s``: without a bound, a flood of such connections grew
        the manager by two threads each until it could start no more)."""
        slots = threading.BoundedSemaphore(_GREETING)
        failures = AcceptFailures(_ACCEPT_WARN_EVERY_S)
        while not self._stopping.is_set():
            slots.acquire()
            try:
                conn = listener.accept()
            except OSError as exc:
                slots.release()
                if exc.errno in _ACCEPT_AGAIN and not self._stopping.is_set():
                    continue  # that connection was gone before it was accepted
                if exc.errno not in _ACCEPT_LATER or self._stopping.is_set():
                    return  # the listener was closed
                # Out of descriptors or memory for now: stop accepting for a moment (the
                # connections wait in the backlog), as asyncio does, not for good.
                line = failures.failed(str(exc.strerror or exc), time.monotonic())
                if line is not None:
                    logger.warning("%s", line)
                self._stopping.wait(_ACCEPT_PAUSE_S)
                continue
            if failures.total:
                logger.warning("%s", failures.accepted())
            thread = threading.Thread(target=self._handshake, args=(conn, slots), daemon=True)
            try:
                thread.start()
            except RuntimeError as exc:  # no more threads: this connection only is lost
                slots.release()
                logger.warning("refused a connection: %s", exc)
                conn.close()

    def _handshake(self, conn: Connection, slots: threading.BoundedSemaphore) -> None:
        """Greet a connection (:meth:`_greet`), giving back its greeting slot, then hand
        the socket to a child (or serve admin)."""
        try:
            greeting = self._greet(conn)
        finally:
            slots.release()
        if greeting is None:
            return
        client_id, role, hello = greeting
        trusted = "link_key" in hello  # checked by _greeting
        with self._registry_lock:
            self.registry[client_id] = {
                "role": role,
                "pid": hello.get("pid"),
                "name": str(hello.get("name", ""))[:100],
                "since": time.time_ns() // 1_000_000,  # epoch ms, as last_seen
            }
        if role == "admin":
            self._serve_admin(conn, client_id)
            return
        child = self._children["publisher" if role == "publisher" else "consumer"]
        try:
            with self._control_lock:
                if child.control is None:
                    raise OSError("child is restarting")
                handover: dict[str, Any] = {"op": "client", "client_id": client_id}
                if trusted:
                    handover["trusted"] = True
                send_control(child.control, handover, conn.fileno())
        except OSError:
            logger.warning("could not hand %s to the %s broker; closing it", client_id, child.name)
            with self._registry_lock:
                self.registry.pop(client_id, None)
        conn.close()

    def _greet(self, conn: Connection) -> tuple[str, str, dict[str, Any]] | None:
        """Authenticate and read hello (within ``handshake_timeout_s``): the client's id,
        role and hello, or None when the connection was refused (and closed)."""
        timeout = self.settings.handshake_timeout_s
        late = threading.Event()

        def cut_off() -> None:
            late.set()
            protocol.cut_off(conn)

        timer = threading.Timer(timeout, cut_off)
        timer.start()
        try:
            try:
                client_id, role, hello = self._greeting(conn)
            finally:
                # Its thread gone too before the connection is closed or handed over (the
                # descriptor is not reused under a late cut-off) and before the greeting's
                # slot is given back (the bound on the greetings' threads holds).
                timer.cancel()
                timer.join()
            if late.is_set():  # cut off as the welcome went out: the client sees the end
                raise ProtocolError(f"no hello within {timeout:g} s")
        except (SpoolError, EOFError, OSError) as exc:
            logger.info("refused a connection: %s", exc)
            if isinstance(exc, SpoolError):
                with contextlib.suppress(OSError):
                    protocol.send(conn, protocol.error_frame(exc))
            with contextlib.suppress(OSError):
                conn.close()
            return None
        return client_id, role, hello

    def _greeting(self, conn: Connection) -> tuple[str, str, dict[str, Any]]:
        """The challenges both ways, then hello and welcome: the client's id, role and
        hello (SpoolError, EOFError or OSError when it fails)."""
        try:
            deliver_challenge(conn, self._authkey)
            answer_challenge(conn, self._authkey)
        except Exception as exc:  # AuthenticationError, EOFError, OSError
            raise AuthenticationError(f"authentication failed: {exc}") from None
        hello = protocol.receive(conn)
        if hello.get("op") != "hello":
            raise ProtocolError("the first frame must be 'hello'")
        if hello.get("version") != protocol.PROTOCOL_VERSION:
            raise ProtocolError(
                f"protocol version {hello.get('version')!r} is not supported; "
                f"this broker speaks {protocol.PROTOCOL_VERSION}"
            )
        role = hello.get("role")
        if role not in ("publisher", "consumer", "admin"):
            raise ProtocolError("role must be 'publisher', 'consumer' or 'admin'")
        if "link_key" in hello:
            # Claims to be this broker's Kafka child: only with the key it was given.
            key = hello["link_key"]
            if (
                role != "publisher"
                or "kafka" not in self._children
                or type(key) is not str
                or not hmac.compare_digest(key.encode(), self._link_key.encode())
            ):
                raise AuthenticationError("this is not the broker's Kafka child")
        client_id = f"{role[0]}{next(self._client_ids)}-{hello.get('pid', '?')}"
        protocol.send(
            conn,
            {"op": "welcome", "version": protocol.PROTOCOL_VERSION, "client_id": client_id},
        )
        return client_id, role, hello

    # -- admin -------------------------------------------------------------------------------

    def _serve_admin(self, conn: Connection, client_id: str) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    frame = protocol.receive(conn)
                except (EOFError, OSError):
                    return
                except SpoolError as exc:
                    protocol.send(conn, protocol.error_frame(exc))
                    return
                if frame.get("op") == "bye":
                    return
                try:
                    reply = self.admin(frame)
                except SpoolError as exc:
                    reply = protocol.error_frame(exc)
                reply["id"] = frame.get("id")
                protocol.send(conn, reply)
                if frame.get("op") != "admin":
                    return  # an unknown op closes the connection, as on the others
        finally:
            with self._registry_lock:
                self.registry.pop(client_id, None)
            with contextlib.suppress(OSError):
                conn.close()

    def admin(self, frame: dict[str, Any]) -> dict[str, Any]:
        action = frame.get("action")
        if frame.get("op") != "admin":
            raise ProtocolError("an admin connection sends 'admin' frames")
        if action == "stats":
            with self._registry_lock:
                clients = list(self.registry.values())
            return {
                "op": "ok",
                "pid": os.getpid(),
                "uptime_s": round(time.monotonic() - self._started, 3),
                "publisher": self._children["publisher"].stats,
                "consumer": self._children["consumer"].stats,
                "restarts": {name: c.restarts for name, c in self._children.items()},
                "pids": {
                    name: (c.process.pid if c.process is not None else None)
                    for name, c in self._children.items()
                },
                "clients": {
                    role: sum(1 for c in clients if c["role"] == role)
                    for role in ("publisher", "consumer", "admin")
                },
                # Seconds each child has been ready, None while it (re)starts.
                "ready_s": {
                    name: None if (at := c.ready_at) is None else round(time.monotonic() - at, 3)
                    for name, c in self._children.items()
                },
                # The TCP listener's real port, which `--listen HOST:0` leaves to the OS.
                "listen": list(self.tcp_address) if self.tcp_address else None,
                # The Kafka child's figures, only with --kafka (the shape is unchanged without).
                **({"kafka": self._children["kafka"].stats} if "kafka" in self._children else {}),
            }
        if action == "describe_groups":
            answer = self._ask_consumer_broker(frame)
            # The consumer broker knows its consumers by client id; the process behind
            # each (pid, name, connected since) is known here, from its hello.
            with self._registry_lock:
                for described in answer.get("groups", {}).values():
                    for member in described.get("members", []):
                        client = self.registry.get(member["client_id"], {})
                        member.update(
                            pid=client.get("pid"),
                            name=client.get("name"),
                            since=client.get("since"),
                        )
            return answer
        if action in ("reset_group", "delete_group", "cancel"):
            return self._ask_consumer_broker(frame)
        if action == "delete_topic":
            return self._delete_topic(check_topic(frame.get("topic")))
        raise ProtocolError(f"unknown admin action {str(action)[:40]!r}")

    def _delete_topic(self, topic: str) -> dict[str, Any]:
        """``topics delete`` while the broker runs, in three steps: the ConsumerBroker stops
        serving the topic (refuses subscriptions to it, drops it from every group, tells its
        consumers); the PublisherBroker answers what it received for it and deletes it
        (producer runs, state rows, files); then the ConsumerBroker accepts the name again
        and the other children forget what they cached of it. One deletion at a time."""
        with self._topic_lock:
            dropped = self._ask("consumer", {"action": "drop_topic", "topic": topic})
            protocol.raise_if_error(dropped)  # an unknown topic: nothing was changed
            try:
                deleted = self._ask("publisher", {"action": "delete_topic", "topic": topic})
                protocol.raise_if_error(deleted)
            finally:
                with contextlib.suppress(SpoolError):  # a restarted child has no cache
                    self._ask("consumer", {"action": "topic_deleted", "topic": topic})
                if "kafka" in self._children:
                    with contextlib.suppress(SpoolError):
                        self._ask("kafka", {"action": "forget_topic", "topic": topic})
        return {
            "op": "ok",
            "deleted": topic,
            "partitions": deleted.get("partitions"),
            "groups": dropped.get("groups", []),
            "consumers_told": dropped.get("consumers", 0),
        }

    def snapshot(self) -> Snapshot:
        """The figures a metrics scrape reads (the groups are left out while the consumer
        broker restarts)."""
        stats = self.admin({"op": "admin", "action": "stats"})
        try:
            groups = self._ask_consumer_broker({"op": "admin", "action": "describe_groups"})
        except SpoolError:
            return Snapshot(stats, None)
        return Snapshot(stats, groups.get("groups"))

    def _ask_consumer_broker(self, frame: dict[str, Any]) -> dict[str, Any]:
        return self._ask("consumer", frame)

    def _ask(self, name: str, frame: dict[str, Any]) -> dict[str, Any]:
        """Send an admin request to child ``name`` and wait for its answer; an error answer
        is raised as its SpoolError."""
        child = self._children[name]
        request_id = next(self._admin_ids)
        event = threading.Event()
        answer: list[Any] = []
        self._admin_results[request_id] = (event, answer)
        try:
            with self._control_lock:
                if child.control is None:
                    raise SpoolError(f"the {name} broker process is restarting; try again")
                protocol.send(
                    child.control, {"op": "admin", "request_id": request_id, "body": frame}
                )
            if not event.wait(15):
                raise SpoolError(f"the {name} broker process did not answer in 15 s")
            return dict(answer[0])
        finally:
            self._admin_results.pop(request_id, None)
