"""The phases ``spoolmq bench`` measures on spoolmq, each on a fresh store with its own broker:
produce, consume + ACK, latency at an offered rate, and both throughputs on a prefilled store."""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from spoolmq.bench.clients import NATIVE, Client
from spoolmq.bench.machine import RssSampler, cpu_seconds, fdatasync_ms
from spoolmq.bench.report import consume_figures, produce_figures
from spoolmq.bench.workers import (
    GROUP,
    TOPIC,
    DoneCounter,
    Progress,
    payload,
    read_ids,
    shares,
    so_far,
    start_workers,
    wait_until_done,
)
from spoolmq.errors import SpoolError
from spoolmq.stats import duplicates_and_missing, micros_each, per_second, percentile
from spoolmq.testing import BrokerProcess
from spoolmq.types import TopicPartition


class _Broker(BrokerProcess):
    """The broker under test, stopped with SIGINT as a user's Ctrl-C would."""

    def restarts(self) -> int:
        """Re-read the child processes' pids; returns how many restarts the broker made."""
        return sum(self.stats().get("restarts", {}).values())

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30.0) -> int:
        return super().stop(signum, timeout)


# -- the stores the phases run on --------------------------------------------------------------


@contextlib.contextmanager
def _fresh_store(root: Path, name: str) -> Iterator[Path]:
    data = root / name
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)


def _create_topic(data: Path, partitions: int) -> None:
    from spoolmq.store import Store

    with Store(data) as store:
        store.create_topic(TOPIC, partitions=partitions)


def _prefill(
    data: Path, first: int, count: int, args: argparse.Namespace, progress: Progress
) -> dict[int, int]:
    """Store messages ``first .. first+count-1`` directly through the embedded store (no
    broker), round-robin over the partitions, in the same lines a broker writes for them.
    Returns each partition's log end offset afterwards."""
    from spoolmq.store import Store
    from spoolmq.store.record import EncodedMessage

    filler = payload(args.size)
    with Store(data) as store:
        if TOPIC not in store.topics():
            store.create_topic(TOPIC, partitions=args.partitions)
        batches: list[list[EncodedMessage]] = [[] for _ in range(args.partitions)]
        for message_id in range(first, first + count):
            value = orjson.dumps({"id": message_id, "p": filler})
            batch = batches[message_id % args.partitions]
            batch.append(EncodedMessage(b'"key":null,"value":%s,"headers":[]' % value))
            if len(batch) >= 1000:
                store.append_encoded(TOPIC, message_id % args.partitions, batch, "1")
                batch.clear()
            if (message_id - first) % 200_000 == 0 and message_id > first:
                progress(f"storing {message_id - first:,} of {count:,} messages")
        for partition, batch in enumerate(batches):
            if batch:
                store.append_encoded(TOPIC, partition, batch, "1")
        store.flush()
        return {p: store.log_end_offset(TOPIC, p) for p in range(args.partitions)}


def _stored_ids(data: Path, starts: dict[int, int] | None = None) -> list[int]:
    """The ids of the messages stored from ``starts`` (partition: offset; default: all),
    without the warm-up messages some clients send first (negative ids)."""
    from spoolmq.store import Store

    ids: list[int] = []
    with Store(data) as store:
        config = store.topic_config(TOPIC)
        for partition in range(config.partitions):
            reader = store.reader(TOPIC, partition, offset=(starts or {}).get(partition))
            while batch := reader.read_entries(5000):
                ids.extend(fields["value"]["id"] for fields, _ in batch)
            reader.close()
    return [message_id for message_id in ids if message_id >= 0]


def _messages_per_partition(data: Path) -> list[int]:
    """How many messages each partition of the topic holds (``--partitions``: how evenly the
    publishers spread them)."""
    from spoolmq.store import Store

    with Store(data) as store:
        partitions = store.topic_config(TOPIC).partitions
        return [store.log_end_offset(TOPIC, p) for p in range(partitions)]


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.jsonl") if f.is_file())


# -- one round of producing or consuming on a running broker -------------------------------------


def _produce_round(
    data: Path,
    broker: _Broker,
    args: argparse.Namespace,
    first: int,
    progress: Progress,
    client: Client = NATIVE,
) -> dict[str, Any]:
    """Producers send ids ``first .. first+n-1`` as fast as they can; timed until all ACKed."""
    from spoolmq.client import Admin

    context = multiprocessing.get_context("spawn")
    with RssSampler(broker.pids) as rss:
        idle_mib = rss.current_mib()
        barrier = context.Barrier(args.producers + 1)
        cpu = context.Value("d", 0.0)
        processes = start_workers(
            context,
            client.producer,
            [
                (str(data), start, count, args.size, args.acks, barrier, cpu)
                for start, count in shares(args.n, args.producers, first)
            ],
        )
        barrier.wait()
        started = time.perf_counter()
        cpu_before = cpu_seconds(broker.pids())
        stored_before = -1
        while alive := [p for p in processes if p.is_alive()]:
            alive[0].join(0.5)
            with contextlib.suppress(SpoolError), Admin(data) as admin:
                stored = admin.stats()["publisher"].get("messages", 0)
                stored_before = stored if stored_before < 0 else stored_before
                progress(f"stored {so_far(stored - stored_before, started)}")
        elapsed = time.perf_counter() - started
        broker_cpu = cpu_seconds(broker.pids()) - cpu_before
        clients_cpu = cpu.value
        restarts = broker.restarts()
    if any(p.exitcode for p in processes):
        raise SpoolError("a producer process failed")
    commits = _group_commits(data, args.n)  # a fresh broker: its count starts at 0
    return {
        **produce_figures(args.n, elapsed),
        "broker_cpu_us_per_message": round(micros_each(broker_cpu, args.n), 2),
        "publishers_cpu_us_per_message": round(micros_each(clients_cpu, args.n), 2),
        "broker_restarts": restarts,
        "broker_rss_idle_mib": round(idle_mib, 1),
        "broker_rss_peak_mib": round(rss.peak_mib, 1),
        "messages_per_group_commit": commits,
    }


def _group_commits(data: Path, stored: int) -> float | None:
    """Messages per group commit (one write and one fsync each) since the broker started,
    once its PublisherBroker has reported ``stored`` messages (it reports every second)."""
    from spoolmq.client import Admin

    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:
        with contextlib.suppress(SpoolError), Admin(data) as admin:
            figures = admin.stats()["publisher"]
            if figures.get("messages", 0) >= stored and figures.get("batches"):
                return round(int(figures["messages"]) / int(figures["batches"]), 1)
        time.sleep(0.2)  # the broker's next report; nothing to wait on
    return None


def _consume_round(
    data: Path,
    broker: _Broker,
    args: argparse.Namespace,
    progress: Progress,
    client: Client = NATIVE,
) -> tuple[dict[str, Any], list[int]]:
    """Consumers of one group drain ``n`` stored messages, ACKing each; returns the figures
    and the ids received."""
    context = multiprocessing.get_context("spawn")
    outs = [str(data.parent / f"consume-{i}.json") for i in range(args.consumers)]
    with RssSampler(broker.pids) as rss:
        barrier = context.Barrier(args.consumers + 1)
        done = DoneCounter(context, args.n)
        cpu = context.Value("d", 0.0)
        processes = start_workers(
            context, client.consumer, [(str(data), out, barrier, done, cpu) for out in outs]
        )
        barrier.wait()
        started, begun = time.perf_counter(), time.monotonic()
        cpu_before = cpu_seconds(broker.pids())
        finished = wait_until_done(done, started, progress)
        elapsed = time.perf_counter() - started
        broker_cpu = cpu_seconds(broker.pids()) - cpu_before
        restarts = broker.restarts()
        for process in processes:
            process.join(30)
        clients_cpu = cpu.value
    ids = read_ids(outs)
    return {
        **consume_figures(args.n, elapsed, ids, finished, done.first(begun)),
        "broker_cpu_us_per_message": round(micros_each(broker_cpu, args.n), 2),
        "consumers_cpu_us_per_message": round(micros_each(clients_cpu, args.n), 2),
        "broker_restarts": restarts,
        "broker_rss_peak_mib": round(rss.peak_mib, 1),
    }, ids


# -- the phases --------------------------------------------------------------------------------


def spool_produce(
    root: Path, args: argparse.Namespace, progress: Progress, client: Client = NATIVE
) -> dict[str, Any]:
    """``n`` messages published to an empty store, then read back and counted."""
    with _fresh_store(root, "produce") as data:
        _create_topic(data, args.partitions)
        broker = _Broker(data, args=client.broker_args)
        start_s = broker.start()
        try:
            figures = _produce_round(data, broker, args, 0, progress, client)
        finally:
            broker.stop()
        return {
            **figures,
            "broker_start_s": round(start_s, 3),
            "bytes_per_message": round(_disk_bytes(data) / args.n, 1),
            "messages_per_partition": _messages_per_partition(data),
            **duplicates_and_missing(_stored_ids(data), args.n),
        }


def spool_consume(
    root: Path, args: argparse.Namespace, progress: Progress, client: Client = NATIVE
) -> dict[str, Any]:
    """``n`` messages stored first, then drained by one group's consumers."""
    with _fresh_store(root, "consume") as data:
        _prefill(data, 0, args.n, args, progress)
        broker = _Broker(data, args=client.broker_args)
        broker.start()
        try:
            figures, ids = _consume_round(data, broker, args, progress, client)
        finally:
            broker.stop()
        return {**figures, **duplicates_and_missing(ids, args.n)}


def spool_prefilled(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    """``--prefill N``: N messages stored first; then the broker's start on that store,
    its memory, and produce and consume throughput of n more messages."""
    from spoolmq.store import Store

    stored = args.prefill
    with _fresh_store(root, "prefilled") as data:
        began = time.perf_counter()
        ends = _prefill(data, 0, stored, args, progress)
        prefill_s = time.perf_counter() - began
        with Store(data) as store:
            # The group starts where the new messages will: it drains only those.
            store.state.commit_offsets(
                GROUP, {TopicPartition(TOPIC, p): end for p, end in ends.items()}
            )
        progress(f"starting a broker on {stored:,} stored messages")
        broker = _Broker(data)
        reopen_s = broker.start()
        try:
            idle_mib = RssSampler(broker.pids).current_mib()
            progress(f"produce with {stored:,} stored")
            produce = _produce_round(
                data,
                broker,
                args,
                stored,
                lambda text: progress(f"produce with {stored:,} stored: {text}"),
            )
            consume, received = _consume_round(
                data, broker, args, lambda text: progress(f"consume with {stored:,} stored: {text}")
            )
        finally:
            broker.stop()
        produce.update(
            duplicates_and_missing([i - stored for i in _stored_ids(data, ends)], args.n)
        )
        consume.update(duplicates_and_missing([i - stored for i in received], args.n))
        return {
            "stored": stored,
            "store_bytes": _disk_bytes(data),
            "prefill_s": round(prefill_s, 2),
            "broker_start_s": round(reopen_s, 3),
            "broker_rss_idle_mib": round(idle_mib, 1),
            "produce": produce,
            "consume": consume,
        }


def spool_latency(
    root: Path, args: argparse.Namespace, rate: int, progress: Progress, client: Client = NATIVE
) -> dict[str, Any]:
    """One publisher at ``rate`` msg/s for ``--duration`` s, one consumer: the time from
    publish to receive of each message, the CPU each side spent per message, and the disk's
    fdatasync time for reference."""
    from spoolmq.client import Admin

    context = multiprocessing.get_context("spawn")
    progress("timing the disk's fdatasync")
    syncs = fdatasync_ms(root)
    with _fresh_store(root, "latency") as data:
        _create_topic(data, args.partitions)
        broker = _Broker(data, args=client.broker_args)
        broker.start()
        out = str(data.parent / "latency.json")
        rss = RssSampler(broker.pids)
        try:
            rss.start()
            ready, stop = context.Event(), context.Event()
            consumer_cpu = context.Value("d", 0.0)
            consumer = context.Process(
                daemon=True,
                target=client.latency_consumer,
                args=(str(data), out, ready, stop, consumer_cpu),
            )
            consumer.start()
            ready.wait(30)
            total = int(rate * args.duration)
            cpu_before = cpu_seconds(broker.pids())
            # This process's CPU: the publisher's (its threads too), and the sampler's and
            # the status line's (small beside it).
            sent_s, publisher_cpu = client.latency_publisher(
                data, args.acks, total, rate, args.size, progress
            )
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with Admin(data) as admin:
                    if admin.stats()["consumer"].get("acked", 0) >= total:
                        break
                time.sleep(0.1)  # waiting for another process's progress
            broker_cpu = cpu_seconds(broker.pids()) - cpu_before
            stop.set()
            consumer.join(30)
        finally:
            rss.stop()
            broker.stop()
        records = orjson.loads(Path(out).read_bytes()) if Path(out).exists() else []
        with contextlib.suppress(FileNotFoundError):
            os.unlink(out)
        latencies = [latency for _, latency in records]
        return {
            "offered_per_s": rate,
            "achieved_per_s": round(per_second(total, sent_s), 1),
            "messages": total,
            "p50_ms": round(percentile(latencies, 0.5), 3),
            "p99_ms": round(percentile(latencies, 0.99), 3),
            "p999_ms": round(percentile(latencies, 0.999), 3),
            "max_ms": round(max(latencies), 3) if latencies else float("nan"),
            "broker_cpu_us_per_message": round(micros_each(broker_cpu, total), 2),
            "publisher_cpu_us_per_message": round(micros_each(publisher_cpu, total), 2),
            "consumer_cpu_us_per_message": round(micros_each(consumer_cpu.value, total), 2),
            "broker_rss_peak_mib": round(rss.peak_mib, 1),
            "disk_fdatasync_p50_ms": round(percentile(syncs, 0.5), 3),
            "disk_fdatasync_p99_ms": round(percentile(syncs, 0.99), 3),
            **duplicates_and_missing([message_id for message_id, _ in records], total),
        }
