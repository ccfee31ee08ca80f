"""The peers ``--compare`` measures spoolmq against, and Redis Streams, the first of them: a
redis-server the bench starts and stops, and the produce and consume phases run on it the way
spoolmq's are. NATS JetStream is in ``jetstream``, RabbitMQ in ``rabbitmq``; ``PEERS`` lists
all three with what each needs installed and what its ACK promises."""

from __future__ import annotations

import argparse
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench import jetstream, rabbitmq
from spoolmq.bench.workers import (
    GROUP,
    TOPIC,
    Progress,
    ServerProcess,
    redis_add,
    redis_consumer,
    redis_producer,
    so_far,
    time_consumers,
    time_publishers,
)
from spoolmq.errors import SpoolError
from spoolmq.stats import duplicates_and_missing


class RedisServer(ServerProcess):
    """A redis-server on 127.0.0.1 and a free port, its files in ``root/redis``: append-only,
    fsync every second, no snapshots. ``stop`` ends it and removes its files."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "redis")

    def start(self) -> None:
        import redis

        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(self.dir),
                "--appendonly",
                "yes",
                "--appendfsync",
                "everysec",
                "--save",
                "",
                "--protected-mode",
                "yes",
                "--daemonize",
                "no",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        client: Any = redis.Redis(port=self.port)
        deadline = time.monotonic() + 20
        try:
            while True:
                try:
                    client.ping()
                    return
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.process.poll() is not None:
                        raise SpoolError("redis-server did not start") from None
                    time.sleep(0.05)  # another process coming up
        except BaseException:  # Ctrl-C while it comes up included
            self.stop()
            raise


def redis_versions() -> dict[str, Any]:
    """The Python client's version, whether it parses with hiredis, and the server's version."""
    import redis
    import redis.utils

    return {
        "redis_py": redis.__version__,
        "hiredis_parser": bool(redis.utils.HIREDIS_AVAILABLE),
        "server": subprocess.run(
            ["redis-server", "--version"],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        ).stdout.strip(),
    }


def redis_produce(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Producers XADD ``n`` messages in pipelines of 100; timed until all are added."""
    import redis

    server = RedisServer(root)
    server.start()
    try:
        client: Any = redis.Redis(port=server.port)
        figures = time_publishers(
            redis_producer,
            server.port,
            args,
            server.pids,
            progress,
            lambda started: f"stored {so_far(client.xlen(TOPIC), started)}",
        )
        ids = [orjson.loads(fields[b"v"])["id"] for _, fields in client.xrange(TOPIC)]
        return {**figures, **duplicates_and_missing(ids, args.n)}
    finally:
        server.stop()


def redis_consume(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Consumers of one group read and XACK ``n`` messages added before they start."""
    import redis

    server = RedisServer(root)
    server.start()
    try:
        client: Any = redis.Redis(port=server.port)
        redis_add(client, 0, args.n, args.size, pipeline=1000)
        client.xgroup_create(TOPIC, GROUP, id="0")
        outs = [str(root / f"redis-consume-{i}.json") for i in range(args.consumers)]
        return time_consumers(redis_consumer, server.port, args, server.pids, progress, outs)
    finally:
        server.stop()


REDIS_DURABILITY = (
    "Redis Streams, append-only file with appendfsync everysec: an XADD reply comes before "
    "the fsync, which runs once a second; a power loss can lose about the last second of "
    "ACKed messages"
)
SPOOLMQ_DURABILITY = (
    "spoolmq with ACK `all`: every publish is answered after the fdatasync of the batch that "
    "holds it; an ACKed message survives a power loss"
)


@dataclass(frozen=True)
class Peer:
    """A system ``--compare NAME`` runs the produce and consume phases on."""

    name: str
    title: str
    program: str
    """The server's executable."""
    locate: Callable[[], str | None]
    """Where the server's executable is, or None when it is not installed."""
    install: str
    """How to install the server, for the message when it is missing."""
    clients: tuple[str, ...]
    """The Python modules its workers import."""
    durability: str
    """What its ACK promises at the bench's settings, recorded beside every comparison."""
    versions: Callable[[], dict[str, Any]]
    produce: Callable[[Path, argparse.Namespace, Progress], dict[str, Any]]
    consume: Callable[[Path, argparse.Namespace, Progress], dict[str, Any]]


def _rabbitmq_server() -> str | None:
    found = rabbitmq.RABBITMQ_BIN / "rabbitmq-server"
    return str(found) if found.exists() else shutil.which("rabbitmq-server")


PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer(
            "redis",
            "Redis Streams",
            "redis-server",
            lambda: shutil.which("redis-server"),
            "`sudo apt-get install redis-server` (Debian/Ubuntu), `sudo dnf install redis` "
            "(Fedora) or `brew install redis` (macOS)",
            ("redis",),
            REDIS_DURABILITY,
            redis_versions,
            redis_produce,
            redis_consume,
        ),
        Peer(
            "nats",
            "NATS JetStream",
            "nats-server",
            lambda: shutil.which("nats-server"),
            "`sudo apt-get install nats-server` (Debian/Ubuntu) or `brew install nats-server` "
            "(macOS)",
            ("nats",),
            jetstream.DURABILITY,
            jetstream.versions,
            jetstream.produce,
            jetstream.consume,
        ),
        Peer(
            "rabbitmq",
            "RabbitMQ",
            "rabbitmq-server",
            _rabbitmq_server,
            "`sudo apt-get install rabbitmq-server` (Debian/Ubuntu), `sudo dnf install "
            "rabbitmq-server` (Fedora) or `brew install rabbitmq` (macOS)",
            ("pika",),
            rabbitmq.DURABILITY,
            rabbitmq.versions,
            rabbitmq.produce,
            rabbitmq.consume,
        ),
    )
}
