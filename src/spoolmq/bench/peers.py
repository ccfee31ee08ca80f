"""The peers ``--compare`` measures spoolmq against, and Redis Streams, the first of them: a
redis-server the bench starts and stops, and the produce and consume phases run on it the way
spoolmq's are. NATS JetStream is in ``jetstream``, RabbitMQ in ``rabbitmq``; ``PEERS`` lists
all three with what each needs installed and what its ACK promises."""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench import jetstream, rabbitmq
from spoolmq.bench.machine import RssSampler, cpu_seconds
from spoolmq.bench.report import consume_figures, peer_cpu_figures, produce_figures
from spoolmq.bench.workers import (
    GROUP,
    TOPIC,
    DoneCounter,
    Progress,
    free_port,
    read_ids,
    redis_add,
    redis_consumer,
    redis_producer,
    shares,
    so_far,
    start_workers,
    wait_until_done,
)
from spoolmq.errors import SpoolError
from spoolmq.stats import duplicates_and_missing


class RedisServer:
    """A redis-server on 127.0.0.1 and a free port, its files in ``root/redis``: append-only,
    fsync every second, no snapshots. ``stop`` ends it and removes its files."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "redis"
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

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

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


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

    context = multiprocessing.get_context("spawn")
    server = RedisServer(root)
    server.start()
    try:
        with RssSampler(server.pids) as rss:
            client: Any = redis.Redis(port=server.port)
            barrier = context.Barrier(args.producers + 1)
            cpu = context.Value("d", 0.0)
            processes = start_workers(
                context,
                redis_producer,
                [
                    (server.port, first, count, args.size, barrier, cpu)
                    for first, count in shares(args.n, args.producers)
                ],
            )
            barrier.wait()
            started = time.perf_counter()
            cpu_before = cpu_seconds(server.pids())
            while alive := [p for p in processes if p.is_alive()]:
                alive[0].join(0.5)
                progress(f"stored {so_far(client.xlen(TOPIC), started)}")
            elapsed = time.perf_counter() - started
            server_cpu = cpu_seconds(server.pids()) - cpu_before
        ids = [orjson.loads(fields[b"v"])["id"] for _, fields in client.xrange(TOPIC)]
        return {
            **produce_figures(args.n, elapsed),
            **peer_cpu_figures(server_cpu, cpu.value, args.n, "publishers"),
            "server_rss_peak_mib": round(rss.peak_mib, 1),
            **duplicates_and_missing(ids, args.n),
        }
    finally:
        server.stop()


def redis_consume(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Consumers of one group read and XACK ``n`` messages added before they start."""
    import redis

    context = multiprocessing.get_context("spawn")
    server = RedisServer(root)
    server.start()
    outs = [str(root / f"redis-consume-{i}.json") for i in range(args.consumers)]
    try:
        client: Any = redis.Redis(port=server.port)
        redis_add(client, 0, args.n, args.size, pipeline=1000)
        client.xgroup_create(TOPIC, GROUP, id="0")
        with RssSampler(server.pids) as rss:
            barrier = context.Barrier(args.consumers + 1)
            done = DoneCounter(context, args.n)
            cpu = context.Value("d", 0.0)
            processes = start_workers(
                context,
                redis_consumer,
                [(server.port, f"c{i}", out, barrier, done, cpu) for i, out in enumerate(outs)],
            )
            barrier.wait()
            started = time.perf_counter()
            cpu_before = cpu_seconds(server.pids())
            finished = wait_until_done(done, started, progress)
            elapsed = time.perf_counter() - started
            server_cpu = cpu_seconds(server.pids()) - cpu_before
            for process in processes:
                process.join(30)
        ids = read_ids(outs)
        return {
            **consume_figures(args.n, elapsed, ids, finished),
            **peer_cpu_figures(server_cpu, cpu.value, args.n, "consumers"),
            "server_rss_peak_mib": round(rss.peak_mib, 1),
            **duplicates_and_missing(ids, args.n),
        }
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
