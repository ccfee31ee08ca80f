"""NATS JetStream as a ``--compare nats`` peer: a ``nats-server -js`` the bench starts in a
temporary directory and stops by pid, a stream with file storage, and the produce and consume
phases run on it the way spoolmq's are (2 publisher and 2 consumer processes by default, ~200-
byte values, every id counted).

The client is nats-py (asyncio). Publishers keep up to ``IN_FLIGHT`` publishes waiting for
their PubAck at once, as spoolmq's publishers keep several frames in flight: one awaited
publish at a time would measure the round trip, not the server. Consumers share one durable
push consumer with explicit ACK, delivered to their queue group with ``PREFETCH`` unACKed per
consumer, and ACK each message (an ACK is one small publish back to the server, not waited
for, as spoolmq's ``ack(wait=False)`` and Redis's pipelined XACK are not).

Measured here (20,000 messages, one process, load average 7): the pull consumer's ``fetch``
of 100 or 500 at a time cost 50 µs of client CPU per message and reached 8,700-11,900 msg/s;
the push consumer's callback, 14 µs and 31,000 msg/s. ``publish_async`` (a future, a
semaphore and a timer per message) cost 39 µs per message against 12 µs for plain publishes
with a reply subject whose PubAcks one subscription counts (12,600 against 58,000 msg/s).
The bench uses the cheaper way of each, so it measures the server rather than nats-py.

What a PubAck promises here: the message is in the server's file store through the OS page
cache; the file store is fsynced every ``sync_interval`` (2 minutes by default), not before
the PubAck, so a power loss can lose ACKed messages (a process crash cannot). ``DURABILITY``
says so in the JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.workers import (
    TOPIC,
    DoneCounter,
    Progress,
    ServerProcess,
    add_cpu,
    payload,
    time_consumers,
    time_publishers,
)
from spoolmq.errors import SpoolError
from spoolmq.stats import duplicates_and_missing

DURABILITY = (
    "JetStream file storage, one server, default sync_interval (2 min): a PubAck means the "
    "message reached the server's files through the OS page cache, fsynced on that interval, "
    "not before the PubAck; a power loss can lose ACKed messages"
)
STREAM = "bench"
DURABLE = "bench"
DELIVER = "deliver.bench"  # the push consumer's delivery subject
IN_FLIGHT = 1000  # PubAcks a publisher waits for at once
PREFETCH = 500  # unACKed deliveries per consumer, as spoolmq's consumers' prefetch


class NatsServer(ServerProcess):
    """``nats-server -js`` on 127.0.0.1 and a free port, its store in ``root/nats``; ``stop``
    ends it by pid and removes its files."""

    def __init__(self, root: Path) -> None:
        super().__init__(root / "nats")

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            ["nats-server", "-js", "-sd", str(self.dir), "-a", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
        )
        try:
            asyncio.run(self._create_stream())
        except BaseException:  # Ctrl-C while it comes up included
            self.stop()
            raise

    async def _create_stream(self) -> None:
        """Wait until the server takes JetStream requests, then create the bench's stream."""
        import nats.errors
        from nats.js.api import StorageType, StreamConfig

        deadline = time.monotonic() + 20
        while True:
            try:
                connection = await _connect(self.url)
                break
            except (OSError, nats.errors.Error) as exc:
                assert self.process is not None
                if time.monotonic() > deadline or self.process.poll() is not None:
                    raise SpoolError(f"nats-server did not start: {exc}") from None
                await asyncio.sleep(0.05)  # another process coming up
        try:
            await connection.jetstream().add_stream(
                StreamConfig(name=STREAM, subjects=[TOPIC], storage=StorageType.FILE)
            )
        finally:
            await connection.close()


def versions() -> dict[str, Any]:
    """The Python client's version and the server's."""
    from importlib.metadata import version

    server = subprocess.run(
        ["nats-server", "--version"], capture_output=True, text=True, check=False, timeout=30
    )
    return {"nats_py": version("nats-py"), "server": server.stdout.strip()}


# -- the worker processes and the bench's own client --------------------------------------------


async def _quiet(error: Exception) -> None:
    """nats-py's connection errors, which it would print: the caller sees them raised."""


async def _connect(url: str) -> Any:
    import nats

    return await nats.connect(url, error_cb=_quiet, allow_reconnect=False)


async def _publish(url: str, first: int, count: int, size: int) -> None:
    """Publish ids ``first .. first+count-1`` to the stream, up to ``IN_FLIGHT`` waiting for
    their PubAck at once; returns when every PubAck is in, raises if one is an error.

    Each publish names a reply subject under one inbox, and one subscription counts the
    PubAcks arriving there: what ``JetStreamContext.publish_async`` does, without its future,
    semaphore and timer per message, which cost 39 µs of client CPU per message here against
    12 µs this way, so that the server is measured, not nats-py."""
    connection = await _connect(url)
    acked = 0
    refused: list[bytes] = []
    room, finished = asyncio.Event(), asyncio.Event()

    async def on_ack(message: Any) -> None:
        nonlocal acked
        if b'"error"' in message.data:
            refused.append(message.data)
        acked += 1
        room.set()
        if acked >= count:
            finished.set()

    try:
        inbox = connection.new_inbox()
        await connection.subscribe(inbox + ".*", cb=on_ack)
        filler = payload(size)
        for sent in range(count):
            while sent - acked >= IN_FLIGHT:
                room.clear()
                await asyncio.wait_for(room.wait(), 60)
            body = orjson.dumps({"id": first + sent, "p": filler})
            await connection.publish(TOPIC, body, reply=f"{inbox}.{sent}")
        if count:
            await connection.flush()
            await asyncio.wait_for(finished.wait(), 60)
    finally:
        await connection.close()
    if refused:
        raise SpoolError(f"JetStream refused {len(refused)} publishes: {refused[0]!r}")


def nats_producer(url: str, first: int, count: int, size: int, barrier: Any, cpu: Any) -> None:
    barrier.wait()
    started = time.process_time()
    asyncio.run(_publish(url, first, count, size))
    add_cpu(cpu, time.process_time() - started)


async def _consume(url: str, done: DoneCounter) -> list[int]:
    """Receive from the durable push consumer's delivery subject in the consumers' queue
    group (each message goes to one of them), ACKing each, until ``done`` is set."""
    connection = await _connect(url)
    ids: list[int] = []
    uncounted = 0
    subscription: Any = None
    try:

        async def on_message(message: Any) -> None:
            nonlocal uncounted
            ids.append(orjson.loads(message.data)["id"])
            await message.ack()
            uncounted += 1
            # The shared count is taken 100 at a time or when nothing more is waiting here,
            # as spoolmq's consumers do (a lock per message would cost more than the
            # receiving measured here).
            if uncounted >= 100 or subscription is None or subscription.pending_msgs == 0:
                done.add(uncounted)
                uncounted = 0

        subscription = await connection.subscribe(DELIVER, queue=DURABLE, cb=on_message)
        while not done.is_set():
            await asyncio.sleep(0.05)  # the callback does the work; this only watches the end
    finally:
        await connection.close()  # sends the ACKs still buffered
    return ids


def nats_consumer(url: str, out: str, barrier: Any, done: DoneCounter, cpu: Any) -> None:
    barrier.wait()
    started = time.process_time()
    ids = asyncio.run(_consume(url, done))
    add_cpu(cpu, time.process_time() - started)
    Path(out).write_bytes(orjson.dumps(ids))


async def _stored_ids(url: str, expected: int) -> list[int]:
    """Every id in the stream, read by an ephemeral consumer without ACKs; stops at the
    stream's message count (or after 2 s with nothing new)."""
    from nats.errors import TimeoutError as FetchTimeout
    from nats.js.api import AckPolicy, ConsumerConfig

    connection = await _connect(url)
    ids: list[int] = []
    try:
        stream = connection.jetstream()
        total = (await stream.stream_info(STREAM)).state.messages
        subscription = await stream.pull_subscribe(
            TOPIC, stream=STREAM, config=ConsumerConfig(ack_policy=AckPolicy.NONE)
        )
        while len(ids) < max(total, expected):
            try:
                messages = await subscription.fetch(1000, timeout=2)
            except FetchTimeout:
                break
            ids.extend(orjson.loads(message.data)["id"] for message in messages)
    finally:
        await connection.close()
    return ids


async def _add_durable(url: str, consumers: int) -> None:
    """The consumers' shared durable push consumer: explicit ACK, from the first message,
    delivered to the consumers' queue group, ``PREFETCH`` unACKed per consumer at most."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    connection = await _connect(url)
    try:
        await connection.jetstream().add_consumer(
            STREAM,
            ConsumerConfig(
                durable_name=DURABLE,
                deliver_subject=DELIVER,
                deliver_group=DURABLE,
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.ALL,
                ack_wait=60,
                max_ack_pending=PREFETCH * consumers,
            ),
        )
    finally:
        await connection.close()


# -- the phases --------------------------------------------------------------------------------


def produce(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """Publishers add ``n`` messages with up to ``IN_FLIGHT`` each awaiting its PubAck; timed
    until every PubAck is in."""
    server = NatsServer(root)
    server.start()
    try:
        figures = time_publishers(nats_producer, server.url, args, server.pids, progress)
        progress("reading the stream back")
        ids = asyncio.run(_stored_ids(server.url, args.n))
        return {**figures, **duplicates_and_missing(ids, args.n)}
    finally:
        server.stop()


def consume(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """``n`` messages published first; then the consumers drain them, ACKing each."""
    server = NatsServer(root)
    server.start()
    try:
        progress(f"publishing {args.n:,} messages")
        asyncio.run(_publish(server.url, 0, args.n, args.size))
        asyncio.run(_add_durable(server.url, args.consumers))
        outs = [str(root / f"nats-consume-{i}.json") for i in range(args.consumers)]
        return time_consumers(nats_consumer, server.url, args, server.pids, progress, outs)
    finally:
        server.stop()
