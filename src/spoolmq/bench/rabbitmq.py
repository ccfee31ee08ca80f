"""RabbitMQ as a ``--compare rabbitmq`` peer: a ``rabbitmq-server`` node the bench starts in a
temporary directory (its own node name, AMQP and distribution ports, and its own ``epmd``),
a durable quorum queue, persistent messages, publisher confirms, manual ACKs with a prefetch;
the produce and consume phases run on it the way spoolmq's are.

The client is pika's asynchronous ``SelectConnection``. Measured on this machine (20,000
200-byte messages, one process, a quorum queue): pika ``SelectConnection`` published 15,000
msg/s at 20 µs of client CPU per message with 1,000 unconfirmed in flight and consumed 18,000
msg/s at 28 µs; aio-pika published 4,200 msg/s at 162 µs (windows of 200 gathered) and
consumed 4,100 msg/s at 187 µs; pika's ``BlockingConnection`` waits for each confirm (400
msg/s). The peer is driven by the fastest client, so it is measured, not its client.

What a confirm promises: a quorum queue confirms a message once its Raft log entry is written
and fsynced on a majority of the queue's members (here one node), so an ACKed message
survives a power loss. ``DURABILITY`` says so in the JSON.

Debian's package runs the server as the ``rabbitmq`` user: when the bench runs as root, the
node and its control commands run as that user, in a directory it owns.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import pwd
import shutil
import socket
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.workers import (
    TOPIC,
    DoneCounter,
    Progress,
    add_cpu,
    end_process,
    free_port,
    payload,
    time_consumers,
    time_publishers,
)
from spoolmq.errors import SpoolError
from spoolmq.stats import duplicates_and_missing

DURABILITY = (
    "RabbitMQ quorum queue, one node, persistent messages, publisher confirms: a confirm "
    "comes after the message's Raft log entry is fsynced, so an ACKed message survives a "
    "power loss"
)
QUEUE = TOPIC
IN_FLIGHT = 1000  # unconfirmed publishes a publisher keeps at once
PREFETCH = 500  # unACKed deliveries a consumer holds, as spoolmq's consumers' prefetch
RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")  # Debian's scripts, without the su wrapper


def _script(name: str) -> str:
    """Debian's ``/usr/sbin`` wrappers ``cd /var/lib/rabbitmq`` and may reset ``HOME``, which
    would point the node at the system's cookie and files: the real scripts are used."""
    path = RABBITMQ_BIN / name
    return str(path) if path.exists() else (shutil.which(name) or name)


def _run_as() -> str | None:
    """The user the node runs as: ``rabbitmq`` when the bench is root (Erlang and the package
    expect it), else the bench's own user."""
    if os.geteuid() != 0:
        return None
    with contextlib.suppress(KeyError):
        return pwd.getpwnam("rabbitmq").pw_name
    return None


def _home(root: Path, user: str | None) -> Path:
    """Where the node's directory goes: under the bench's own when the node's user can reach
    it (the bench's directory is opened to passing through for it), else in that user's home
    directory (a ``TMPDIR`` inside root's private directories, as pytest's, is out of its
    reach)."""
    if user is None:
        return root
    for parent in root.parents:
        if not parent.stat().st_mode & stat.S_IXOTH:
            return Path(pwd.getpwnam(user).pw_dir)
    os.chmod(root, 0o711)  # the node's user may pass, not list
    return root


class RabbitServer:
    """A RabbitMQ node on 127.0.0.1 with free ports, everything in its own temporary directory;
    ``stop`` asks it to stop, then ends whatever is left by pid, and removes the directory."""

    def __init__(self, root: Path) -> None:
        self.port = free_port()
        self.node = f"spoolmq-bench-{self.port}@localhost"
        self.user = _run_as()
        self.dir = Path(
            tempfile.mkdtemp(prefix="spoolmq-bench-rabbitmq-", dir=_home(root, self.user))
        )
        self.env = {
            **os.environ,
            "HOME": str(self.dir),  # the Erlang cookie the node and rabbitmqctl share
            "RABBITMQ_NODENAME": self.node,
            "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_QUORUM_DIR": str(self.dir / "quorum"),
            "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
            "RABBITMQ_FEATURE_FLAGS_FILE": str(self.dir / "feature_flags"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),  # none
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(self.dir / "plugins"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq"),  # none: the defaults
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            # Its own epmd on its own port, started and stopped here: the node would
            # otherwise start a system-wide one on 4369 that outlives the bench.
            "ERL_EPMD_PORT": str(free_port()),
            "ERL_EPMD_ADDRESS": "127.0.0.1",
        }
        self.epmd: subprocess.Popen[bytes] | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._pids: list[int] = []

    def _popen(self, command: list[str]) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            command,
            env=self.env,
            cwd=self.dir,
            user=self.user,
            group=self.user,
            extra_groups=[] if self.user else None,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )

    def _ctl(self, *command: str, timeout: float) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run(
            [_script("rabbitmqctl"), "-n", self.node, *command],
            env=self.env,
            cwd=self.dir,
            user=self.user,
            group=self.user,
            extra_groups=[] if self.user else None,
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )

    def start(self) -> None:
        if self.user:
            shutil.chown(self.dir, self.user, self.user)
        try:
            epmd = shutil.which("epmd") or "epmd"
            self.epmd = self._popen([epmd, "-port", self.env["ERL_EPMD_PORT"], "-address",
                                     "127.0.0.1"])  # fmt: skip
            self.process = self._popen([_script("rabbitmq-server")])
            # rabbitmqctl fails at once while the node is not yet reachable, and waits for it
            # to finish booting once it is: it is asked when the node's distribution port
            # takes connections.
            self._wait_for_port(int(self.env["RABBITMQ_DIST_PORT"]), 90)
            ready = self._ctl("await_startup", "--timeout", "90", timeout=120)
            if ready.returncode != 0 or self.process.poll() is not None:
                said = (ready.stderr or ready.stdout).decode(errors="replace").strip()
                raise SpoolError(f"rabbitmq-server did not start: {said[-300:]} {self._log_tail()}")
            self._pids = self._tree()
        except BaseException:  # Ctrl-C while it comes up included
            self.stop()
            raise

    def _log_tail(self) -> str:
        """The end of the node's log, for the error when it does not start (the directory
        is removed when it stops)."""
        lines: list[str] = []
        for log in sorted((self.dir / "log").glob("*.log")):
            with contextlib.suppress(OSError):
                lines.extend(log.read_text(errors="replace").splitlines()[-5:])
        return " | ".join(lines)[-600:]

    def _wait_for_port(self, port: int, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            assert self.process is not None
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SpoolError(f"rabbitmq-server did not start: {self._log_tail()}")
            time.sleep(0.1)  # another process coming up

    def _tree(self) -> list[int]:
        """The server script's pid and its descendants' (the Erlang VM and its helpers)."""
        import psutil

        if self.process is None:
            return []
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(self.process.pid)
            return [root.pid, *(child.pid for child in root.children(recursive=True))]
        return [self.process.pid]

    def pids(self) -> list[int]:
        return list(self._pids)

    def stop(self) -> None:
        import psutil

        if self.process is not None:
            left = [self.process.pid, *self._pids, *self._tree()]
            if self.process.poll() is None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    self._ctl("stop", timeout=60)
            processes = []
            for pid in set(left):
                with contextlib.suppress(psutil.Error):
                    processes.append(psutil.Process(pid))
            for process in processes:
                with contextlib.suppress(psutil.Error):
                    process.terminate()
            _, alive = psutil.wait_procs(processes, timeout=10)
            for process in alive:
                with contextlib.suppress(psutil.Error):
                    process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(10)
            self.process = None
        end_process(self.epmd)
        self.epmd = None
        shutil.rmtree(self.dir, ignore_errors=True)


def versions() -> dict[str, Any]:
    """The Python client's version and the server's (the Debian package's directory name)."""
    import pika

    servers = sorted(p.name for p in Path("/usr/lib/rabbitmq/lib").glob("rabbitmq_server-*"))
    return {"pika": pika.__version__, "server": servers[-1] if servers else "unknown"}


# -- the AMQP client: pika's asynchronous connection ---------------------------------------------


class _Session:
    """One ``SelectConnection`` and channel on which ``run`` calls ``on_ready(channel)`` once
    the quorum queue is declared, and returns when ``finish`` is called (or the connection
    fails: then it raises)."""

    def __init__(self, port: int) -> None:
        import pika

        self.channel: Any = None
        self.error: str | None = None
        self._on_ready: Callable[[Any], None] = lambda channel: None
        self.connection: Any = pika.SelectConnection(
            pika.ConnectionParameters("127.0.0.1", port),
            on_open_callback=lambda connection: connection.channel(on_open_callback=self._declare),
            on_open_error_callback=self._failed,
            on_close_callback=self._closed,
        )

    def _declare(self, channel: Any) -> None:
        self.channel = channel
        channel.add_on_close_callback(self._channel_closed)
        channel.queue_declare(
            QUEUE,
            durable=True,
            arguments={"x-queue-type": "quorum"},
            callback=lambda frame: self._on_ready(channel),
        )

    def _failed(self, connection: Any, error: Any) -> None:
        self.error = f"could not connect to RabbitMQ: {error}"
        connection.ioloop.stop()

    def _channel_closed(self, channel: Any, reason: Any) -> None:
        if self.error is None and not self.connection.is_closing:
            self.error = f"RabbitMQ closed the channel: {reason}"
            self.connection.close()

    def _closed(self, connection: Any, reason: Any) -> None:
        connection.ioloop.stop()

    def finish(self) -> None:
        if self.connection.is_open:
            self.connection.close()  # _closed then stops the loop

    def fail(self, error: str) -> None:
        self.error = error
        self.finish()

    def run(self, on_ready: Callable[[Any], None]) -> None:
        self._on_ready = on_ready
        self.connection.ioloop.start()
        if self.error is not None:
            raise SpoolError(self.error)


def _publish(port: int, first: int, count: int, size: int) -> None:
    """Publish ids ``first .. first+count-1`` as persistent messages, up to ``IN_FLIGHT``
    unconfirmed at once; returns when every one is confirmed, raises if one is refused."""
    import pika

    session = _Session(port)
    properties = pika.BasicProperties(delivery_mode=pika.DeliveryMode.Persistent)
    filler = payload(size)
    sent = confirmed = 0

    def pump() -> None:
        nonlocal sent
        while sent < count and sent - confirmed < IN_FLIGHT:
            body = orjson.dumps({"id": first + sent, "p": filler})
            session.channel.basic_publish("", QUEUE, body, properties)
            sent += 1

    def on_confirm(frame: Any) -> None:
        nonlocal confirmed
        method = frame.method
        if isinstance(method, pika.spec.Basic.Nack):
            session.fail(f"RabbitMQ refused publish {method.delivery_tag}")
            return
        # Delivery tags count the channel's publishes from 1; `multiple` confirms all up to it.
        confirmed = method.delivery_tag if method.multiple else confirmed + 1
        if confirmed >= count:
            session.finish()
        else:
            pump()

    def ready(channel: Any) -> None:
        channel.confirm_delivery(on_confirm, callback=lambda frame: pump())

    if count:
        session.run(ready)


def rabbit_producer(port: int, first: int, count: int, size: int, barrier: Any, cpu: Any) -> None:
    barrier.wait()
    started = time.process_time()
    _publish(port, first, count, size)
    add_cpu(cpu, time.process_time() - started)


def _receive(port: int, enough: Callable[[int], bool], ack: bool) -> list[int]:
    """Ids received from the queue (each ACKed if ``ack``, else taken with auto-ACK) until
    ``enough(received)`` says so; it is asked after each burst of deliveries pika read at
    once, and every 0.2 s."""
    session = _Session(port)
    ids: list[int] = []
    asked = [False]  # whether the check after the current burst is already scheduled

    def check() -> None:
        asked[0] = False
        if enough(len(ids)):
            session.finish()

    def on_message(channel: Any, method: Any, properties: Any, body: bytes) -> None:
        ids.append(orjson.loads(body)["id"])
        if ack:
            channel.basic_ack(method.delivery_tag)
        if not asked[0]:
            # Runs once pika has handled every frame it read: once per burst, not per message.
            asked[0] = True
            session.connection.ioloop.call_later(0, check)

    def tick() -> None:
        if enough(len(ids)):
            session.finish()
        else:
            session.connection.ioloop.call_later(0.2, tick)

    def ready(channel: Any) -> None:
        channel.basic_qos(
            prefetch_count=PREFETCH,
            callback=lambda frame: channel.basic_consume(QUEUE, on_message, auto_ack=not ack),
        )
        session.connection.ioloop.call_later(0.2, tick)

    session.run(ready)
    return ids


def rabbit_consumer(port: int, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    counted = 0

    def enough(received: int) -> bool:
        # The shared count is taken once per burst, as spoolmq's consumers take it when they
        # run out of work (a lock per message would cost more than the receiving measured).
        nonlocal counted
        done.add(received - counted)
        counted = received
        return done.is_set()

    barrier.wait()
    started = time.process_time()
    ids = _receive(port, enough, ack=True)
    add_cpu(cpu, time.process_time() - started)
    Path(out).write_bytes(orjson.dumps(ids))


def _declare_queue(port: int) -> None:
    """The durable quorum queue, declared before anything is timed."""
    session = _Session(port)
    session.run(lambda channel: session.finish())


# -- the phases --------------------------------------------------------------------------------


def _stored_ids(port: int, expected: int) -> list[int]:
    """Every id in the queue, taken out with auto-ACK; stops at ``expected`` or after 5 s
    with nothing new (the queue then held fewer)."""
    last = [0, time.monotonic()]

    def enough(received: int) -> bool:
        if received != last[0]:
            last[:] = [received, time.monotonic()]
        return received >= expected or time.monotonic() - last[1] > 5

    return _receive(port, enough, ack=False)


def produce(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Publishers send ``n`` persistent messages with up to ``IN_FLIGHT`` unconfirmed each;
    timed until every confirm is in."""
    progress("starting rabbitmq-server")
    server = RabbitServer(root)
    server.start()
    try:
        _declare_queue(server.port)
        figures = time_publishers(rabbit_producer, server.port, args, server.pids, progress)
        progress("reading the queue back")
        ids = _stored_ids(server.port, args.n)
        return {**figures, **duplicates_and_missing(ids, args.n)}
    finally:
        server.stop()


def consume(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """``n`` messages published (and confirmed) first; then the consumers drain them, ACKing
    each."""
    progress("starting rabbitmq-server")
    server = RabbitServer(root)
    server.start()
    try:
        progress(f"publishing {args.n:,} messages")
        _publish(server.port, 0, args.n, args.size)
        outs = [str(root / f"rabbitmq-consume-{i}.json") for i in range(args.consumers)]
        return time_consumers(rabbit_consumer, server.port, args, server.pids, progress, outs)
    finally:
        server.stop()
