"""Redis Streams, the reference ``--compare redis`` measures spoolmq against: a redis-server the
bench starts and stops, and the produce and consume phases run on it the way spoolmq's are."""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.machine import RssSampler
from spoolmq.bench.report import consume_figures, produce_figures
from spoolmq.bench.workers import (
    GROUP,
    TOPIC,
    DoneCounter,
    Progress,
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


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A redis-server on 127.0.0.1 and a free port, its files in ``root/redis``: append-only,
    fsync every second, no snapshots. ``stop`` ends it and removes its files."""

    def __init__(self, root: Path) -> None:
        self.dir = root / "redis"
        self.port = _free_port()
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
            processes = start_workers(
                context,
                redis_producer,
                [
                    (server.port, first, count, args.size, barrier)
                    for first, count in shares(args.n, args.producers)
                ],
            )
            barrier.wait()
            started = time.perf_counter()
            while alive := [p for p in processes if p.is_alive()]:
                alive[0].join(0.5)
                progress(f"stored {so_far(client.xlen(TOPIC), started)}")
            elapsed = time.perf_counter() - started
        ids = [orjson.loads(fields[b"v"])["id"] for _, fields in client.xrange(TOPIC)]
        return {
            **produce_figures(args.n, elapsed),
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
        barrier = context.Barrier(args.consumers + 1)
        done = DoneCounter(context, args.n)
        processes = start_workers(
            context,
            redis_consumer,
            [(server.port, f"c{i}", out, barrier, done) for i, out in enumerate(outs)],
        )
        barrier.wait()
        started = time.perf_counter()
        finished = wait_until_done(done, started, progress)
        elapsed = time.perf_counter() - started
        for process in processes:
            process.join(30)
        ids = read_ids(outs)
        return {
            **consume_figures(args.n, elapsed, ids, finished),
            **duplicates_and_missing(ids, args.n),
        }
    finally:
        server.stop()
