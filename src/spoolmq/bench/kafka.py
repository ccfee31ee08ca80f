"""The bench's Kafka-client workers (``spoolmq bench --client kafka``): the same work as the
threaded ones in ``workers.py`` (same messages, same counting, same CPU accounting), done
with confluent-kafka (librdkafka) against the broker's Kafka listener, which the bench
starts with ``--kafka 127.0.0.1:0`` when this client is chosen. Module level: spawned
processes import them.

What "the same work" means for a Kafka client: the producer uses ``acks=all`` (so each
answer waits for the fsync, as spoolmq's ``acks=all``) with idempotence (a retried batch
is stored once, as a spoolmq Publisher's retries are), a linger of 5 ms and librdkafka's
own batch limits (``batch.num.messages`` 10,000, ``batch.size`` 1 MB), which is what a
user gets; the consumer is in a consumer group and commits its offsets asynchronously
after each batch it takes (up to 500 records), which is how Kafka consumers settle work.
That is coarser than spoolmq's consumers, which ACK each message; the difference is part
of what the comparison shows.

``--client kafka-defaults`` runs the same work with the producer's idempotence at
librdkafka's default, off: ``acks=all`` still, but a batch retried after a lost answer may
be stored twice. An idempotent librdkafka producer keeps one request in flight and polls
without sleeping while it waits (BENCHMARKS.md, "Kafka clients"); this variant shows what
the broker's Kafka front does without that, beside it.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.workers import GROUP, TOPIC, DoneCounter, Progress, add_cpu, payload, so_far


def kafka_address(data: str | Path) -> str:
    """``host:port`` of the broker's Kafka listener, as its stats give it."""
    from spoolmq.client import Admin

    with Admin(data) as admin:
        listen = (admin.stats().get("kafka") or {}).get("listen")
    if not listen:
        raise RuntimeError("the broker under test has no Kafka listener")
    return f"{listen[0]}:{listen[1]}"


def _producer(data: str | Path, linger_ms: int, *, idempotent: bool) -> Any:
    """A confluent-kafka producer as the bench uses it. Its batch limits are librdkafka's
    defaults: an idempotent librdkafka producer has one Produce request at a time in flight
    per partition (its limit of five in flight is compared with the messages in flight, not
    the requests: ``rktp_msgs_inflight`` in rdkafka_broker.c), so the request size sets its
    throughput; 1,000 messages a request, as the bench had before, gave 18 % less
    (BENCHMARKS.md, "Kafka clients")."""
    from confluent_kafka import Producer

    return Producer(
        {
            "bootstrap.servers": kafka_address(data),
            "acks": "all",
            "enable.idempotence": idempotent,
            "linger.ms": linger_ms,
            "queue.buffering.max.messages": 100_000,
        }
    )


def _checked(errors: list[Any]) -> Any:
    """A delivery callback that keeps the errors, which end the worker with an error."""

    def delivered(error: Any, message: Any) -> None:
        if error is not None:
            errors.append(error)

    return delivered


def _produce(producer: Any, value: bytes, on_delivery: Any) -> None:
    while True:
        try:
            producer.produce(TOPIC, value, on_delivery=on_delivery)
            return
        except BufferError:  # the local queue is full: serve the answers, then again
            producer.poll(0.05)


def _warm_up(producer: Any, message_id: int, filler: str, on_delivery: Any) -> None:
    """A librdkafka producer connects, fetches metadata and gets its producer id in the
    background after it is created, where a Publisher connects in its constructor: one
    message first, with a negative id that the counting and the consumers pass over, so the
    measured messages do not wait for that (it cost ~0.5 s on this machine)."""
    _produce(
        producer, orjson.dumps({"id": message_id, "t": time.time_ns(), "p": filler}), on_delivery
    )
    producer.flush(60)


def kafka_producer(
    data: str,
    first: int,
    count: int,
    size: int,
    acks: str,
    barrier: Any,
    cpu: Any,
    *,
    idempotent: bool = True,
) -> None:
    filler = payload(size)
    errors: list[Any] = []
    on_delivery = _checked(errors)
    producer = _producer(data, linger_ms=5, idempotent=idempotent)
    _warm_up(producer, -1 - first, filler, on_delivery)
    barrier.wait()
    started = time.process_time()  # librdkafka's threads are this process's too
    for message_id in range(first, first + count):
        _produce(producer, orjson.dumps({"id": message_id, "p": filler}), on_delivery)
        if message_id % 1000 == 999:
            producer.poll(0)
    left = producer.flush(120)
    add_cpu(cpu, time.process_time() - started)
    if left or errors:
        raise RuntimeError(f"{left} message(s) unanswered, {len(errors)} failed: {errors[:3]}")


def _consumer(data: str | Path) -> Any:
    from confluent_kafka import Consumer

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_address(data),
            "group.id": GROUP,
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.subscribe([TOPIC])
    return consumer


def kafka_consumer(data: str, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    ids: list[int] = []
    barrier.wait()  # joining the group starts the fetches: part of the measured time
    started = time.process_time()
    consumer = _consumer(data)
    try:
        while not done.is_set():
            batch = consumer.consume(num_messages=500, timeout=0.2)
            taken = 0
            for message in batch:
                if message.error() is None:
                    message_id = orjson.loads(message.value())["id"]
                    if message_id >= 0:  # not a producer's warm-up message
                        ids.append(message_id)
                    taken += 1
            if taken:
                consumer.commit(asynchronous=True)
                done.add(taken)
    finally:
        consumer.close()  # commits what is pending and leaves the group
    add_cpu(cpu, time.process_time() - started)
    Path(out).write_bytes(orjson.dumps(ids))


def kafka_latency_consumer(data: str, out: str, ready: Any, stop: Any, cpu: Any) -> None:
    records: list[tuple[int, float]] = []
    consumer = _consumer(data)
    try:
        # Wait until the group has its partitions, so no message waits for the join.
        while not consumer.assignment():
            consumer.poll(0.1)
        ready.set()
        started = time.process_time()
        uncommitted = 0
        while not stop.is_set():
            # One message at a time: consume(n) would hold the first message until n had
            # arrived or its timeout passed, which is the API's wait, not the queue's.
            message = consumer.poll(0.2)
            if message is None or message.error() is not None:
                continue
            received = time.time_ns()
            value = orjson.loads(message.value())
            if value["id"] >= 0:  # not the publisher's warm-up message
                records.append((value["id"], (received - value["t"]) / 1e6))
            uncommitted += 1
            if uncommitted >= 100:
                consumer.commit(asynchronous=True)
                uncommitted = 0
        add_cpu(cpu, time.process_time() - started)
    finally:
        consumer.close()
    Path(out).write_bytes(orjson.dumps(records))


def kafka_latency_publisher(
    data: Path,
    acks: str,
    total: int,
    rate: int,
    size: int,
    progress: Progress,
    *,
    idempotent: bool = True,
) -> tuple[float, float]:
    """Publish ``total`` messages at ``rate`` msg/s; returns the seconds until all were
    answered and this process's CPU seconds meanwhile."""
    interval = 1.0 / rate
    filler = payload(size - 20)
    errors: list[Any] = []
    on_delivery = _checked(errors)
    producer = _producer(data, linger_ms=0, idempotent=idempotent)
    _warm_up(producer, -1, filler, on_delivery)
    cpu_before = time.process_time()
    started = time.perf_counter()
    for message_id in range(total):
        pause = started + message_id * interval - time.perf_counter()
        if pause > 0:
            producer.poll(pause)  # pacing the offered rate, serving answers meanwhile
        value = orjson.dumps({"id": message_id, "t": time.time_ns(), "p": filler})
        _produce(producer, value, on_delivery)
        if message_id % 1000 == 999:
            progress(f"sent {so_far(message_id + 1, started)} of {total:,}")
    left = producer.flush(120)
    if left or errors:
        raise RuntimeError(f"{left} message(s) unanswered, {len(errors)} failed: {errors[:3]}")
    return time.perf_counter() - started, time.process_time() - cpu_before
