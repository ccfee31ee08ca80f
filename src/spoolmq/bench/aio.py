"""The bench's asyncio workers (``spoolmq bench --client asyncio``): the same work as the
threaded ones in ``workers.py`` (same messages, same counting, same CPU accounting), done
with ``AsyncPublisher`` and ``AsyncConsumer`` on one event loop per process. Module level:
spawned processes import them."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.workers import (
    BATCH,
    GROUP,
    TOPIC,
    DoneCounter,
    Progress,
    add_cpu,
    payload,
    so_far,
)


def aio_producer(
    data: str, first: int, count: int, size: int, acks: str, barrier: Any, cpu: Any
) -> None:
    asyncio.run(_produce(data, first, count, size, acks, barrier, cpu))


async def _produce(
    data: str, first: int, count: int, size: int, acks: str, barrier: Any, cpu: Any
) -> None:
    from spoolmq.client import AsyncPublisher

    filler = payload(size)
    async with AsyncPublisher(data=data, acks=acks, batch_size=100, max_in_flight=16) as pub:
        barrier.wait()  # before the measured part: blocking the loop here costs nothing
        started = time.process_time()
        # 100 messages a call, as the threaded bench publisher and Redis's pipeline.
        for start in range(first, first + count, BATCH):
            values = [
                {"id": i, "p": filler} for i in range(start, min(first + count, start + BATCH))
            ]
            pub.publish_many_nowait(TOPIC, values)
            # A batch's worth queued: let the writer send it (and bound the backlog by
            # max_buffered, as the threaded publish_many_async does by blocking).
            await pub.wait_for_room()
        await pub.flush()
        add_cpu(cpu, time.process_time() - started)


def aio_consumer(data: str, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    ids = asyncio.run(_consume(data, barrier, done, cpu))
    Path(out).write_bytes(orjson.dumps(ids))


async def _consume(data: str, barrier: Any, done: DoneCounter, cpu: Any) -> list[int]:
    from spoolmq.client import AsyncConsumer

    ids: list[int] = []
    uncounted = 0
    barrier.wait()  # subscribing starts the pushes, so it is part of the measured time
    started = time.process_time()
    async with AsyncConsumer(TOPIC, GROUP, data=data, prefetch=500) as consumer:
        while True:  # as the threaded consumer: 100 a call, counted a batch at a time
            batch = await consumer.receive_many(100, timeout=0)
            if not batch:
                done.add(uncounted)
                uncounted = 0
                if done.is_set():
                    break
                batch = await consumer.receive_many(100, timeout=0.2)
                if not batch:
                    continue
            ids += [message.value["id"] for message in batch]
            await consumer.ack_many(batch, wait=False)
            uncounted += len(batch)
            if uncounted >= 100:
                done.add(uncounted)
                uncounted = 0
        done.add(uncounted)
    add_cpu(cpu, time.process_time() - started)
    return ids


def aio_latency_consumer(data: str, out: str, ready: Any, stop: Any, cpu: Any) -> None:
    records = asyncio.run(_latency_consume(data, ready, stop, cpu))
    Path(out).write_bytes(orjson.dumps(records))


async def _latency_consume(data: str, ready: Any, stop: Any, cpu: Any) -> list[tuple[int, float]]:
    from spoolmq.client import AsyncConsumer

    records: list[tuple[int, float]] = []
    async with AsyncConsumer(TOPIC, GROUP, data=data, prefetch=100) as consumer:
        ready.set()
        started = time.process_time()
        while not stop.is_set():
            message = await consumer.receive(timeout=0.2)
            if message is None:
                continue
            received = time.time_ns()
            records.append((message.value["id"], (received - message.value["t"]) / 1e6))
            await message.ack(wait=False)
        add_cpu(cpu, time.process_time() - started)
    return records


def aio_latency_publisher(
    data: Path, acks: str, total: int, rate: int, size: int, progress: Progress
) -> tuple[float, float]:
    """Publish ``total`` messages at ``rate`` msg/s from an event loop; returns the seconds
    it took until all were answered and this process's CPU seconds meanwhile."""
    return asyncio.run(_latency_publish(data, acks, total, rate, size, progress))


async def _latency_publish(
    data: Path, acks: str, total: int, rate: int, size: int, progress: Progress
) -> tuple[float, float]:
    from spoolmq.client import AsyncPublisher

    interval = 1.0 / rate
    filler = payload(size - 20)
    async with AsyncPublisher(data=data, acks=acks, linger_ms=0) as publisher:
        cpu_before = time.process_time()
        started = time.perf_counter()
        for message_id in range(total):
            pause = started + message_id * interval - time.perf_counter()
            if pause > 0:
                await asyncio.sleep(pause)  # pacing the offered rate is the point
            publisher.publish_nowait(TOPIC, {"id": message_id, "t": time.time_ns(), "p": filler})
            if message_id % 1000 == 999:
                progress(f"sent {so_far(message_id + 1, started)} of {total:,}")
        await publisher.flush()
        return time.perf_counter() - started, time.process_time() - cpu_before
