"""The publisher and consumer processes a bench phase starts, for spoolmq and for Redis, the
shared counters they report through, and the timing of a peer's publishers and consumers.
Module level: spawned processes import them."""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.machine import RssSampler, cpu_seconds
from spoolmq.bench.report import consume_figures, peer_cpu_figures, produce_figures
from spoolmq.errors import SpoolError
from spoolmq.stats import duplicates_and_missing, per_second

TOPIC = "bench"
GROUP = "bench"
BATCH = 100
"""Messages a spoolmq bench publisher hands its client per call, as Redis's XADDs go 100 to
a pipeline (and the Publisher's frames hold 100)."""

Progress = Callable[[str], None]
"""Where a phase reports how far it is (the status line)."""


def payload(size: int) -> str:
    """The filler that makes a message about ``size`` bytes with its id."""
    return "x" * max(0, size - 30)


def shares(total: int, workers: int, first: int = 0) -> list[tuple[int, int]]:
    """``(first id, count)`` for each of ``workers`` that together send ids
    ``first .. first+total-1``; the last one takes the remainder.

    >>> shares(10, 3, first=100)
    [(100, 3), (103, 3), (106, 4)]
    """
    share = total // workers
    return [
        (first + i * share, share if i < workers - 1 else total - share * i) for i in range(workers)
    ]


def start_workers(
    context: SpawnContext, target: Callable[..., None], arguments: Sequence[tuple[Any, ...]]
) -> list[SpawnProcess]:
    """One started daemon process running ``target`` for each tuple of ``arguments``."""
    processes = [context.Process(daemon=True, target=target, args=args) for args in arguments]
    for process in processes:
        process.start()
    return processes


def so_far(done: int, started: float) -> str:
    """``done`` messages since ``started`` (a perf_counter time) and their rate, for progress."""
    return f"{done:,} ({per_second(done, time.perf_counter() - started):,.0f} msg/s)"


class DoneCounter:
    """A count shared by the consumers of a phase, with an event set once it reaches the
    number of messages the phase expects, and the time of the first count.

    Times are ``time.monotonic()`` (CLOCK_MONOTONIC, one clock for every process on
    Linux), so a consumer's first count can be set against the phase's start.
    """

    def __init__(self, context: SpawnContext, total: int) -> None:
        self.total = total
        self._value = context.Value("q", 0)
        self._event = context.Event()
        self._first_at = context.Value("d", 0.0, lock=False)  # guarded by _value's lock
        self._first_count = context.Value("q", 0, lock=False)

    @property
    def value(self) -> int:
        return int(self._value.value)

    def add(self, count: int) -> None:
        if count:
            with self._value.get_lock():
                if not self._value.value:
                    self._first_at.value = time.monotonic()
                    self._first_count.value = count
                self._value.value += count
                if self._value.value >= self.total:
                    self._event.set()

    def first(self, started: float) -> tuple[float, int] | None:
        """(seconds from ``started``, a ``time.monotonic()`` value, to the first count; how
        many messages it counted), or None before any."""
        with self._value.get_lock():
            if not self._value.value:
                return None
            return self._first_at.value - started, int(self._first_count.value)

    def is_set(self) -> bool:
        return bool(self._event.is_set())

    def wait(self, timeout: float) -> bool:
        return bool(self._event.wait(timeout))


def wait_until_done(done: DoneCounter, started: float, progress: Progress) -> bool:
    """Wait until the consumers have received every message (True), or give up after a
    minute or a millisecond per message, whichever is longer (False)."""
    deadline = started + max(60.0, done.total / 1000)
    while not (finished := done.wait(0.5)) and time.perf_counter() < deadline:
        progress(f"received and ACKed {so_far(done.value, started)}")
    return finished


def read_ids(outs: Sequence[str]) -> list[int]:
    """The ids the consumers wrote to the files ``outs`` (a missing file: none), which are
    removed."""
    ids: list[int] = []
    for out in outs:
        with contextlib.suppress(FileNotFoundError):
            ids.extend(orjson.loads(Path(out).read_bytes()))
            os.unlink(out)
    return ids


def free_port() -> int:
    """A TCP port on 127.0.0.1 free right now, for a server the bench starts."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ServerProcess:
    """A server the bench starts on 127.0.0.1 and a free port, with its files in ``dir``;
    ``stop`` ends it by pid (SIGTERM, then SIGKILL after 10 s) and removes its files."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def pids(self) -> list[int]:
        return [self.process.pid] if self.process is not None else []

    def stop(self) -> None:
        end_process(self.process)
        self.process = None
        shutil.rmtree(self.dir, ignore_errors=True)


def end_process(process: subprocess.Popen[bytes] | None) -> None:
    """End a process the bench started: SIGTERM, then SIGKILL after 10 s."""
    if process is None:
        return
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)


def add_cpu(cpu: Any, seconds: float) -> None:
    """Add this worker's CPU seconds of the measured part (start-up left out)."""
    with cpu.get_lock():
        cpu.value += seconds


# -- a peer's phases: its publishers or consumers, timed ------------------------------------------


def time_publishers(
    target: Callable[..., None],
    address: Any,
    args: argparse.Namespace,
    pids: Callable[[], list[int]],
    progress: Progress,
    status: Callable[[float], str] | None = None,
) -> dict[str, Any]:
    """``args.producers`` processes, each running ``target(address, first, count, size,
    barrier, cpu)`` for its share of ids ``0 .. n-1``, timed from the moment all are ready
    until the last has ended (each ends once its last message is ACKed): the throughput, the
    server's (``pids``) and the publishers' CPU per message, the server's peak memory.
    ``status(started)`` is the progress shown meanwhile."""
    context = multiprocessing.get_context("spawn")
    with RssSampler(pids) as rss:
        barrier = context.Barrier(args.producers + 1)
        cpu = context.Value("d", 0.0)
        processes = start_workers(
            context,
            target,
            [
                (address, first, count, args.size, barrier, cpu)
                for first, count in shares(args.n, args.producers)
            ],
        )
        barrier.wait()
        started = time.perf_counter()
        cpu_before = cpu_seconds(pids())
        while alive := [p for p in processes if p.is_alive()]:
            alive[0].join(0.5)
            progress(
                status(started) if status else f"publishing, {time.perf_counter() - started:.0f} s"
            )
        elapsed = time.perf_counter() - started
        server_cpu = cpu_seconds(pids()) - cpu_before
    if any(p.exitcode for p in processes):
        raise SpoolError("a publisher process failed")
    return {
        **produce_figures(args.n, elapsed),
        **peer_cpu_figures(server_cpu, cpu.value, args.n, "publishers"),
        "server_rss_peak_mib": round(rss.peak_mib, 1),
    }


def time_consumers(
    target: Callable[..., None],
    address: Any,
    args: argparse.Namespace,
    pids: Callable[[], list[int]],
    progress: Progress,
    outs: list[str],
) -> dict[str, Any]:
    """One process per file of ``outs``, each running ``target(address, out, barrier, done,
    cpu)`` until the ``n`` messages stored before have been received and ACKed between them,
    timed from the moment all are ready: the throughput, the server's and the consumers' CPU
    per message, the server's peak memory, and the duplicates and missing ids."""
    context = multiprocessing.get_context("spawn")
    with RssSampler(pids) as rss:
        barrier = context.Barrier(args.consumers + 1)
        done = DoneCounter(context, args.n)
        cpu = context.Value("d", 0.0)
        processes = start_workers(
            context, target, [(address, out, barrier, done, cpu) for out in outs]
        )
        barrier.wait()
        started, begun = time.perf_counter(), time.monotonic()
        cpu_before = cpu_seconds(pids())
        finished = wait_until_done(done, started, progress)
        elapsed = time.perf_counter() - started
        server_cpu = cpu_seconds(pids()) - cpu_before
        for process in processes:
            process.join(30)
    ids = read_ids(outs)
    return {
        **consume_figures(args.n, elapsed, ids, finished, done.first(begun)),
        **peer_cpu_figures(server_cpu, cpu.value, args.n, "consumers"),
        "server_rss_peak_mib": round(rss.peak_mib, 1),
        **duplicates_and_missing(ids, args.n),
    }


# -- spoolmq ---------------------------------------------------------------------------------


def spool_producer(
    data: str, first: int, count: int, size: int, acks: str, barrier: Any, cpu: Any
) -> None:
    from spoolmq.client import Publisher

    filler = payload(size)
    with Publisher(data=data, acks=acks, batch_size=BATCH, max_in_flight=16) as publisher:
        barrier.wait()
        started = time.process_time()  # every thread's CPU: the I/O thread's too
        for start in range(first, first + count, BATCH):
            values = [
                {"id": i, "p": filler} for i in range(start, min(first + count, start + BATCH))
            ]
            publisher.publish_many_async(TOPIC, values)
        publisher.flush()
        add_cpu(cpu, time.process_time() - started)


def spool_consumer(data: str, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    from spoolmq.client import Consumer

    ids: list[int] = []
    uncounted = 0
    barrier.wait()  # subscribing starts the pushes, so it is part of the measured time
    started = time.process_time()
    with Consumer(TOPIC, GROUP, data=data, prefetch=500) as consumer:
        # 100 messages a call and their ACKs in one, as the Redis consumers XREADGROUP
        # COUNT 100 and XACK what they read.
        while True:
            batch = consumer.receive_many(100, timeout=0)
            if not batch:
                # The shared count is taken, and the shared end looked at, once a batch or
                # when this consumer has run out of work, as the peers' consumers do once
                # per batch they fetch (each is a lock shared between processes, costlier
                # than the receiving measured here).
                done.add(uncounted)
                uncounted = 0
                if done.is_set():
                    break
                batch = consumer.receive_many(100, timeout=0.2)
                if not batch:
                    continue
            ids += [message.value["id"] for message in batch]
            consumer.ack_many(batch, wait=False)
            uncounted += len(batch)
            if uncounted >= 100:
                done.add(uncounted)
                uncounted = 0
        done.add(uncounted)
    add_cpu(cpu, time.process_time() - started)
    Path(out).write_bytes(orjson.dumps(ids))


def spool_latency_consumer(data: str, out: str, ready: Any, stop: Any, cpu: Any) -> None:
    from spoolmq.client import Consumer

    records: list[tuple[int, float]] = []
    with Consumer(TOPIC, GROUP, data=data, prefetch=100) as consumer:
        ready.set()
        started = time.process_time()
        while not stop.is_set():
            message = consumer.receive(timeout=0.2)
            if message is None:
                continue
            received = time.time_ns()
            records.append((message.value["id"], (received - message.value["t"]) / 1e6))
            message.ack(wait=False)
        add_cpu(cpu, time.process_time() - started)
    Path(out).write_bytes(orjson.dumps(records))


def spool_latency_publisher(
    data: Path, acks: str, total: int, rate: int, size: int, progress: Progress
) -> tuple[float, float]:
    """Publish ``total`` messages at ``rate`` msg/s (in the bench's own process); returns
    the seconds it took until all were answered and this process's CPU seconds meanwhile
    (the publisher's I/O thread's included)."""
    from spoolmq.client import Publisher

    interval = 1.0 / rate
    filler = payload(size - 20)
    with Publisher(data=data, acks=acks, linger_ms=0) as publisher:
        cpu_before = time.process_time()
        started = time.perf_counter()
        for message_id in range(total):
            pause = started + message_id * interval - time.perf_counter()
            if pause > 0:
                time.sleep(pause)  # pacing the offered rate is the point of this phase
            publisher.publish_async(TOPIC, {"id": message_id, "t": time.time_ns(), "p": filler})
            if message_id % 1000 == 999:
                progress(f"sent {so_far(message_id + 1, started)} of {total:,}")
        publisher.flush()
        return time.perf_counter() - started, time.process_time() - cpu_before


# -- Redis Streams ---------------------------------------------------------------------------


def redis_producer(port: int, first: int, count: int, size: int, barrier: Any, cpu: Any) -> None:
    import redis

    client: Any = redis.Redis(port=port)
    barrier.wait()
    started = time.process_time()
    redis_add(client, first, count, size, pipeline=100)
    add_cpu(cpu, time.process_time() - started)


def redis_add(client: Any, first: int, count: int, size: int, *, pipeline: int) -> None:
    """XADD messages ``first .. first+count-1`` to the stream, ``pipeline`` per round trip."""
    filler = payload(size)
    for start in range(first, first + count, pipeline):
        pipe = client.pipeline(transaction=False)
        for message_id in range(start, min(first + count, start + pipeline)):
            pipe.xadd(TOPIC, {"v": orjson.dumps({"id": message_id, "p": filler})})
        pipe.execute()


def redis_consumer(port: int, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    import redis

    client: Any = redis.Redis(port=port)
    ids: list[int] = []
    name = Path(out).stem  # the consumer's name in the group: one per output file
    barrier.wait()
    started = time.process_time()
    while not done.is_set():
        reply = client.xreadgroup(GROUP, name, {TOPIC: ">"}, count=100, block=200)
        if not reply:
            continue
        entries = reply[0][1]
        ids.extend(orjson.loads(fields[b"v"])["id"] for _, fields in entries)
        client.xack(TOPIC, GROUP, *[entry_id for entry_id, _ in entries])
        done.add(len(entries))
    add_cpu(cpu, time.process_time() - started)
    Path(out).write_bytes(orjson.dumps(ids))
