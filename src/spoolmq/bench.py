"""``spoolmq bench``: throughput, latency, memory and disk figures, each phase in a fresh store,
optionally side by side with Redis Streams driven the same way from the same machine.

Phases:
  produce   P publisher processes send N messages as fast as they can; all ACKed.
  consume   C consumer processes of one group drain N pre-stored messages, ACKing each.
  latency   one publisher at a fixed offered rate, one consumer; publish-to-receive times.
  prefill   (with --prefill M) produce again on a store already holding M messages, the
            time to reopen that store, and broker memory at both points.

Every phase counts duplicates and missing messages exactly (by message id).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from spoolmq.errors import InvalidArgumentError, SpoolError

TOPIC = "bench"
GROUP = "bench"


# -- helpers -------------------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    """Nearest-rank percentile (0 < fraction <= 1) of unsorted values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))]


def count_ids(ids: list[int], expected: int) -> dict[str, int]:
    """Duplicates and missing among message ids 0..expected-1."""
    seen: set[int] = set()
    duplicates = 0
    for message_id in ids:
        if message_id in seen:
            duplicates += 1
        seen.add(message_id)
    missing = sum(1 for i in range(expected) if i not in seen)
    return {"received": len(ids), "duplicates": duplicates, "missing": missing}


def _payload(size: int) -> str:
    return "x" * max(0, size - 30)


def machine_facts() -> dict[str, Any]:
    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                facts["memory_kib"] = int(line.split()[1])
    return facts


class _RssSampler:
    """Peak RSS (MiB) of a broker's processes, sampled every 50 ms in a thread."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self._pids = pids
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def current_mib(self) -> float:
        import psutil

        total = 0
        for pid in self._pids():
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total / (1024 * 1024)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_mib = max(self.peak_mib, self.current_mib())

    def __enter__(self) -> _RssSampler:
        self.peak_mib = self.current_mib()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (gone ones count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def children_cpu_seconds() -> float:
    """User + system CPU seconds of this process's children that have been waited for."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


# -- a broker under test -----------------------------------------------------------------------


class _Broker:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.process: subprocess.Popen[bytes] | None = None
        self.children: list[int] = []

    def start(self) -> float:
        """Start and return the seconds until it answered."""
        started = time.monotonic()
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "spoolmq",
                "broker",
                "--data",
                str(self.data),
                "--log-level",
                "warning",
            ],
            stdin=subprocess.DEVNULL,
        )
        deadline = started + 60
        while True:
            if self.process.poll() is not None:
                raise SpoolError(f"the broker exited with status {self.process.returncode}")
            try:
                self.refresh()
                if len(self.children) == 2:  # the publisher and the consumer side are up
                    return time.monotonic() - started
            except SpoolError:
                if time.monotonic() > deadline:
                    raise
            if time.monotonic() > deadline:
                raise SpoolError("the broker's child processes did not start in 60 s")
            time.sleep(0.05)  # the broker is another process coming up: nothing to wait on

    def refresh(self) -> int:
        """Re-read the child processes' pids; returns how many restarts the broker made."""
        from spoolmq.client import Admin

        with Admin(self.data) as admin:
            stats = admin.stats()
        self.children = [p for p in stats["pids"].values() if p]
        return sum(stats.get("restarts", {}).values())

    def pids(self) -> list[int]:
        return ([self.process.pid] if self.process else []) + self.children

    def stop(self) -> None:
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)
        self.process = None


@contextlib.contextmanager
def _fresh_store(root: Path, name: str) -> Iterator[Path]:
    data = root / name
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)


# -- spoolmq workers (module level: spawned processes import them) --------------------------------


def _spool_producer(data: str, first: int, count: int, size: int, acks: str, barrier: Any) -> None:
    from spoolmq.client import Publisher

    payload = _payload(size)
    with Publisher(data=data, acks=acks, batch_size=100, max_in_flight=16) as publisher:
        barrier.wait()
        for message_id in range(first, first + count):
            publisher.publish_async(TOPIC, {"id": message_id, "p": payload})
        publisher.flush()


def _spool_consumer(data: str, total: int, out: str, barrier: Any, done: Any) -> None:
    from spoolmq.client import Consumer

    ids: list[int] = []
    uncounted = 0
    barrier.wait()  # subscribing starts the pushes, so it is part of the measured time
    with Consumer(TOPIC, GROUP, data=data, prefetch=500) as consumer:
        while not done.is_set():
            message = consumer.receive(timeout=0)
            if message is None or uncounted >= 100:
                # The shared count is taken 100 at a time or when this consumer has run
                # out of work, like the Redis consumer's (a lock per message would cost
                # more than the receiving measured here).
                _add_done(done, uncounted, total)
                uncounted = 0
            if message is None:
                message = consumer.receive(timeout=0.2)
                if message is None:
                    continue
            ids.append(message.value["id"])
            message.ack(wait=False)
            uncounted += 1
        _add_done(done, uncounted, total)
    Path(out).write_bytes(orjson.dumps(ids))


def _add_done(done: Any, count: int, total: int) -> None:
    if count:
        with done.get_lock():
            done.value += count
            if done.value >= total:
                done.set()


def _spool_latency_consumer(data: str, out: str, ready: Any, stop: Any) -> None:
    from spoolmq.client import Consumer

    records: list[tuple[int, float]] = []
    with Consumer(TOPIC, GROUP, data=data, prefetch=100) as consumer:
        ready.set()
        while not stop.is_set():
            message = consumer.receive(timeout=0.2)
            if message is None:
                continue
            received = time.time_ns()
            records.append((message.value["id"], (received - message.value["t"]) / 1e6))
            message.ack(wait=False)
    Path(out).write_bytes(orjson.dumps(records))


class _Done:
    """A shared counter with an event, for consumers to say when everything arrived."""

    def __init__(self, context: Any) -> None:
        self._value = context.Value("q", 0)
        self._event = context.Event()

    def get_lock(self) -> Any:
        return self._value.get_lock()

    @property
    def value(self) -> int:
        return int(self._value.value)

    @value.setter
    def value(self, number: int) -> None:
        self._value.value = number

    def set(self) -> None:
        self._event.set()

    def is_set(self) -> bool:
        return bool(self._event.is_set())

    def wait(self, timeout: float) -> bool:
        return bool(self._event.wait(timeout))


def _prefill(data: Path, count: int, size: int, partitions: int) -> None:
    """Store ``count`` messages directly through the embedded store (no broker)."""
    from spoolmq.store import Log, Message

    payload = _payload(size)
    with Log(data) as log:
        log.create_topic(TOPIC, partitions=partitions)
        for start in range(0, count, 1000):
            log.append_batch(
                TOPIC,
                [Message({"id": i, "p": payload}) for i in range(start, min(count, start + 1000))],
                acks="1",
            )
        log.flush()


def _stored_ids(data: Path) -> list[int]:
    from spoolmq.store import Log

    ids: list[int] = []
    with Log(data) as log:
        config = log.topic_config(TOPIC)
        for partition in range(config.partitions):
            reader = log.reader(TOPIC, partition)
            while batch := reader.poll_batch(5000):
                ids.extend(record.value["id"] for record in batch)
            reader.close()
    return ids


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.jsonl") if f.is_file())


# -- spoolmq phases --------------------------------------------------------------------------------


def spool_produce(root: Path, args: argparse.Namespace, prefill: int = 0) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    name = "produce" if not prefill else "produce-prefilled"
    with _fresh_store(root, name) as data:
        if prefill:
            _prefill(data, prefill, args.size, args.partitions)
        else:
            from spoolmq.store import Log

            with Log(data) as log:
                log.create_topic(TOPIC, partitions=args.partitions)
        broker = _Broker(data)
        reopen_s = broker.start()
        try:
            with _RssSampler(broker.pids) as rss:
                idle_mib = rss.current_mib()
                barrier = context.Barrier(args.producers + 1)
                share = args.n // args.producers
                processes = [
                    context.Process(
                        target=_spool_producer,
                        args=(
                            str(data),
                            prefill + i * share,
                            share if i < args.producers - 1 else args.n - share * i,
                            args.size,
                            args.acks,
                            barrier,
                        ),
                    )
                    for i in range(args.producers)
                ]
                clients_before = children_cpu_seconds()
                for process in processes:
                    process.start()
                barrier.wait()
                started = time.perf_counter()
                cpu_before = cpu_seconds(broker.pids())
                for process in processes:
                    process.join()
                elapsed = time.perf_counter() - started
                broker_cpu = cpu_seconds(broker.pids()) - cpu_before
                clients_cpu = children_cpu_seconds() - clients_before
                restarts = broker.refresh()
            if any(p.exitcode for p in processes):
                raise SpoolError("a producer process failed")
        finally:
            broker.stop()
        ids = [i - prefill for i in _stored_ids(data) if i >= prefill]
        counted = count_ids(ids, args.n)
        return {
            "messages": args.n,
            "seconds": round(elapsed, 4),
            "msgs_per_s": round(args.n / elapsed, 1),
            "broker_cpu_us_per_message": round(broker_cpu / args.n * 1e6, 2),
            "publishers_cpu_us_per_message": round(clients_cpu / args.n * 1e6, 2),
            "broker_restarts": restarts,
            "broker_rss_peak_mib": round(rss.peak_mib, 1),
            "broker_rss_idle_mib": round(idle_mib, 1),
            "broker_start_s": round(reopen_s, 3),
            "bytes_per_message": round(_disk_bytes(data) / max(1, args.n + prefill), 1),
            "duplicates": counted["duplicates"],
            "missing": counted["missing"],
        }


def spool_consume(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    with _fresh_store(root, "consume") as data:
        _prefill(data, args.n, args.size, args.partitions)
        broker = _Broker(data)
        broker.start()
        outs = [str(data.parent / f"consume-{i}.json") for i in range(args.consumers)]
        try:
            with _RssSampler(broker.pids) as rss:
                barrier = context.Barrier(args.consumers + 1)
                done = _Done(context)
                processes = [
                    context.Process(
                        target=_spool_consumer, args=(str(data), args.n, out, barrier, done)
                    )
                    for out in outs
                ]
                clients_before = children_cpu_seconds()
                for process in processes:
                    process.start()
                barrier.wait()
                started = time.perf_counter()
                cpu_before = cpu_seconds(broker.pids())
                finished = done.wait(max(60.0, args.n / 1000))
                elapsed = time.perf_counter() - started
                broker_cpu = cpu_seconds(broker.pids()) - cpu_before
                restarts = broker.refresh()
                for process in processes:
                    process.join(30)
                clients_cpu = children_cpu_seconds() - clients_before
        finally:
            broker.stop()
        ids: list[int] = []
        for out in outs:
            with contextlib.suppress(FileNotFoundError):
                ids.extend(orjson.loads(Path(out).read_bytes()))
                os.unlink(out)
        counted = count_ids(ids, args.n)
        return {
            "messages": args.n,
            "seconds": round(elapsed, 4),
            "msgs_per_s": round(len(set(ids)) / elapsed, 1) if finished else 0.0,
            "completed": finished,
            "broker_cpu_us_per_message": round(broker_cpu / args.n * 1e6, 2),
            "consumers_cpu_us_per_message": round(clients_cpu / args.n * 1e6, 2),
            "broker_restarts": restarts,
            "broker_rss_peak_mib": round(rss.peak_mib, 1),
            **{k: counted[k] for k in ("duplicates", "missing")},
        }


def spool_latency(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    from spoolmq.client import Publisher
    from spoolmq.store import Log

    context = multiprocessing.get_context("spawn")
    with _fresh_store(root, "latency") as data:
        with Log(data) as log:
            log.create_topic(TOPIC, partitions=args.partitions)
        broker = _Broker(data)
        broker.start()
        out = str(data.parent / "latency.json")
        try:
            ready, stop = context.Event(), context.Event()
            consumer = context.Process(
                target=_spool_latency_consumer, args=(str(data), out, ready, stop)
            )
            consumer.start()
            ready.wait(30)
            total = int(args.rate * args.duration)
            interval = 1.0 / args.rate
            payload = _payload(args.size - 20)
            with Publisher(data=data, acks=args.acks, linger_ms=0) as publisher:
                started = time.perf_counter()
                for message_id in range(total):
                    target = started + message_id * interval
                    pause = target - time.perf_counter()
                    if pause > 0:
                        time.sleep(pause)  # pacing the offered rate is the point of this phase
                    publisher.publish_async(
                        TOPIC, {"id": message_id, "t": time.time_ns(), "p": payload}
                    )
                publisher.flush()
                sent_s = time.perf_counter() - started
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                from spoolmq.client import Admin

                with Admin(data) as admin:
                    if admin.stats()["consumer"].get("acked", 0) >= total:
                        break
                time.sleep(0.1)  # waiting for another process's progress
            stop.set()
            consumer.join(30)
        finally:
            broker.stop()
        records = orjson.loads(Path(out).read_bytes()) if Path(out).exists() else []
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)
        latencies = [latency for _, latency in records]
        counted = count_ids([message_id for message_id, _ in records], total)
        return {
            "offered_per_s": args.rate,
            "achieved_per_s": round(total / sent_s, 1),
            "messages": total,
            "p50_ms": round(percentile(latencies, 0.5), 3),
            "p99_ms": round(percentile(latencies, 0.99), 3),
            "p999_ms": round(percentile(latencies, 0.999), 3),
            "max_ms": round(max(latencies), 3) if latencies else float("nan"),
            "duplicates": counted["duplicates"],
            "missing": counted["missing"],
        }


# -- Redis Streams, the reference --------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class _Redis:
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
        while True:
            try:
                client.ping()
                return
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise SpoolError("redis-server did not start") from None
                time.sleep(0.05)  # another process coming up

    def stop(self) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
            self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


def _redis_producer(port: int, first: int, count: int, size: int, barrier: Any) -> None:
    import redis

    client: Any = redis.Redis(port=port)
    payload = _payload(size)
    barrier.wait()
    for start in range(first, first + count, 100):
        pipe = client.pipeline(transaction=False)
        for message_id in range(start, min(first + count, start + 100)):
            pipe.xadd(TOPIC, {"v": orjson.dumps({"id": message_id, "p": payload})})
        pipe.execute()


def _redis_consumer(port: int, name: str, total: int, out: str, barrier: Any, done: Any) -> None:
    import redis

    client: Any = redis.Redis(port=port)
    ids: list[int] = []
    barrier.wait()
    while not done.is_set():
        reply = client.xreadgroup(GROUP, name, {TOPIC: ">"}, count=100, block=200)
        if not reply:
            continue
        entries = reply[0][1]
        ids.extend(orjson.loads(fields[b"v"])["id"] for _, fields in entries)
        client.xack(TOPIC, GROUP, *[entry_id for entry_id, _ in entries])
        _add_done(done, len(entries), total)
    Path(out).write_bytes(orjson.dumps(ids))


def redis_produce(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    import redis

    context = multiprocessing.get_context("spawn")
    server = _Redis(root)
    server.start()
    try:
        barrier = context.Barrier(args.producers + 1)
        share = args.n // args.producers
        processes = [
            context.Process(
                target=_redis_producer,
                args=(
                    server.port,
                    i * share,
                    share if i < args.producers - 1 else args.n - share * i,
                    args.size,
                    barrier,
                ),
            )
            for i in range(args.producers)
        ]
        for process in processes:
            process.start()
        barrier.wait()
        started = time.perf_counter()
        for process in processes:
            process.join()
        elapsed = time.perf_counter() - started
        client: Any = redis.Redis(port=server.port)
        ids = [orjson.loads(fields[b"v"])["id"] for _, fields in client.xrange(TOPIC)]
        counted = count_ids(ids, args.n)
        return {
            "messages": args.n,
            "seconds": round(elapsed, 4),
            "msgs_per_s": round(args.n / elapsed, 1),
            "duplicates": counted["duplicates"],
            "missing": counted["missing"],
        }
    finally:
        server.stop()


def redis_consume(root: Path, args: argparse.Namespace) -> dict[str, Any]:
    import redis

    context = multiprocessing.get_context("spawn")
    server = _Redis(root)
    server.start()
    outs = [str(root / f"redis-consume-{i}.json") for i in range(args.consumers)]
    try:
        client: Any = redis.Redis(port=server.port)
        payload = _payload(args.size)
        for start in range(0, args.n, 1000):
            pipe = client.pipeline(transaction=False)
            for message_id in range(start, min(args.n, start + 1000)):
                pipe.xadd(TOPIC, {"v": orjson.dumps({"id": message_id, "p": payload})})
            pipe.execute()
        client.xgroup_create(TOPIC, GROUP, id="0")
        barrier = context.Barrier(args.consumers + 1)
        done = _Done(context)
        processes = [
            context.Process(
                target=_redis_consumer, args=(server.port, f"c{i}", args.n, out, barrier, done)
            )
            for i, out in enumerate(outs)
        ]
        for process in processes:
            process.start()
        barrier.wait()
        started = time.perf_counter()
        finished = done.wait(max(60.0, args.n / 1000))
        elapsed = time.perf_counter() - started
        for process in processes:
            process.join(30)
        ids: list[int] = []
        for out in outs:
            with contextlib.suppress(FileNotFoundError):
                ids.extend(orjson.loads(Path(out).read_bytes()))
        counted = count_ids(ids, args.n)
        return {
            "messages": args.n,
            "seconds": round(elapsed, 4),
            "msgs_per_s": round(len(set(ids)) / elapsed, 1) if finished else 0.0,
            "completed": finished,
            "duplicates": counted["duplicates"],
            "missing": counted["missing"],
        }
    finally:
        server.stop()


# -- the command -------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--n", type=int, default=100_000, help="messages per throughput phase")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--size", type=int, default=200, help="approximate message bytes")
    parser.add_argument("--rate", type=int, default=2000, help="offered msg/s of the latency phase")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the latency phase")
    parser.add_argument("--acks", default="all", choices=["0", "1", "all"])
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=0, help="also measure with N stored")
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    parser.add_argument("--compare", choices=["redis"], help="run the same workload on Redis")
    parser.add_argument("--phases", default="produce,consume,latency", help="comma-separated")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    for name in ("n", "producers", "consumers", "size", "rate", "partitions"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name} must be at least 1")
    if args.duration <= 0:
        raise InvalidArgumentError("--duration must be positive")
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"produce", "consume", "latency"}
    if unknown:
        raise InvalidArgumentError(f"unknown phase(s) {', '.join(sorted(unknown))}")
    compare = args.compare == "redis"
    if compare and shutil.which("redis-server") is None:
        console.print(
            "[yellow]redis-server is not installed: `apt-get install redis-server` (Debian) "
            "for the comparison; running spoolmq alone[/yellow]"
        )
        compare = False
    results: dict[str, Any] = {
        "parameters": {
            k: v for k, v in vars(args).items() if k not in ("handler", "command", "data")
        },
        "machine": machine_facts(),
        "spoolmq": {},
    }
    root = Path(tempfile.mkdtemp(prefix="spoolmq-bench-"))
    try:
        with console.status("benchmarking") as status:
            if "produce" in phases:
                status.update("spoolmq: produce")
                results["spoolmq"]["produce"] = spool_produce(root, args)
            if "consume" in phases:
                status.update("spoolmq: consume + ACK")
                results["spoolmq"]["consume"] = spool_consume(root, args)
            if "latency" in phases:
                status.update(f"spoolmq: latency at {args.rate} msg/s")
                results["spoolmq"]["latency"] = spool_latency(root, args)
            if args.prefill:
                status.update(f"spoolmq: produce with {args.prefill} stored")
                results["spoolmq"]["prefilled"] = spool_produce(root, args, prefill=args.prefill)
            if compare:
                results["redis"] = {}
                if "produce" in phases:
                    status.update("redis: produce")
                    results["redis"]["produce"] = redis_produce(root, args)
                if "consume" in phases:
                    status.update("redis: consume + ACK")
                    results["redis"]["consume"] = redis_consume(root, args)
                results["ratios"] = {
                    phase: round(
                        results["spoolmq"][phase]["msgs_per_s"]
                        / max(1e-9, results["redis"][phase]["msgs_per_s"]),
                        3,
                    )
                    for phase in ("produce", "consume")
                    if phase in results["redis"]
                }
    finally:
        shutil.rmtree(root, ignore_errors=True)
    table = Table(title="spoolmq bench")
    for column in ("phase", "system", "figure", "value"):
        table.add_column(column)
    for system in ("spoolmq", "redis"):
        for phase, figures in results.get(system, {}).items():
            for figure, value in figures.items():
                table.add_row(phase, system, figure, str(value))
    for phase, ratio in results.get("ratios", {}).items():
        table.add_row(phase, "spoolmq / redis", "ratio", str(ratio))
    Console().print(table)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0
