"""The publisher and consumer processes a bench phase starts, for spoolmq and for Redis, and
the shared counters they report through. Module level: spawned processes import them."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Callable, Sequence
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

import orjson

from spoolmq.stats import per_second

TOPIC = "bench"
GROUP = "bench"

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
    number of messages the phase expects."""

    def __init__(self, context: SpawnContext, total: int) -> None:
        self.total = total
        self._value = context.Value("q", 0)
        self._event = context.Event()

    @property
    def value(self) -> int:
        return int(self._value.value)

    def add(self, count: int) -> None:
        if count:
            with self._value.get_lock():
                self._value.value += count
                if self._value.value >= self.total:
                    self._event.set()

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


def add_cpu(cpu: Any, seconds: float) -> None:
    """Add this worker's CPU seconds of the measured part (start-up left out)."""
    with cpu.get_lock():
        cpu.value += seconds


# -- spoolmq ---------------------------------------------------------------------------------


def spool_producer(
    data: str, first: int, count: int, size: int, acks: str, barrier: Any, cpu: Any
) -> None:
    from spoolmq.client import Publisher

    filler = payload(size)
    with Publisher(data=data, acks=acks, batch_size=100, max_in_flight=16) as publisher:
        barrier.wait()
        started = time.process_time()  # every thread's CPU: the I/O thread's too
        for message_id in range(first, first + count):
            publisher.publish_async(TOPIC, {"id": message_id, "p": filler})
        publisher.flush()
        add_cpu(cpu, time.process_time() - started)


def spool_consumer(data: str, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    from spoolmq.client import Consumer

    ids: list[int] = []
    uncounted = 0
    barrier.wait()  # subscribing starts the pushes, so it is part of the measured time
    started = time.process_time()
    with Consumer(TOPIC, GROUP, data=data, prefetch=500) as consumer:
        while not done.is_set():
            message = consumer.receive(timeout=0)
            if message is None or uncounted >= 100:
                # The shared count is taken 100 at a time or when this consumer has run
                # out of work, like the Redis consumer's (a lock per message would cost
                # more than the receiving measured here).
                done.add(uncounted)
                uncounted = 0
            if message is None:
                message = consumer.receive(timeout=0.2)
                if message is None:
                    continue
            ids.append(message.value["id"])
            message.ack(wait=False)
            uncounted += 1
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


def redis_consumer(
    port: int, name: str, out: str, barrier: Any, done: DoneCounter, cpu: Any
) -> None:
    import redis

    client: Any = redis.Redis(port=port)
    ids: list[int] = []
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
