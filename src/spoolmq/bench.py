"""``spoolmq bench``: throughput, latency, memory and disk figures, each phase in a fresh store,
optionally side by side with Redis Streams driven the same way from the same machine.

Phases:
  produce   P publisher processes send N messages as fast as they can; all ACKed.
  consume   C consumer processes of one group drain N pre-stored messages, ACKing each.
  latency   one publisher at a fixed offered rate, one consumer; publish-to-receive times.
  prefilled (with --prefill M) a broker started on a store already holding M messages:
            its start time and memory, then produce and consume as above on that store.

With --compare redis the produce and consume phases also run on a redis-server the bench
starts (and stops, also on Ctrl-C or SIGTERM), taking turns with spoolmq.

Every phase counts duplicates and missing messages exactly (by message id).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import math
import multiprocessing
import os
import platform
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson

from spoolmq.errors import InvalidArgumentError, SpoolError
from spoolmq.testing import BrokerProcess

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
    from spoolmq import __version__

    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "spoolmq": __version__,
        "load_average_start": list(os.getloadavg()),
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


def disk_facts(path: Path) -> dict[str, Any]:
    """The filesystem and block device holding ``path`` (from /proc/mounts), if known."""
    facts: dict[str, Any] = {}
    best = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best = mount
                facts = {"disk_device": device, "disk_mount": mount, "disk_filesystem": fstype}
    name = Path(facts.get("disk_device", "")).name
    with contextlib.suppress(OSError):
        rotational = Path(f"/sys/block/{name}/queue/rotational").read_text().strip()
        facts["disk_rotational"] = rotational == "1"
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

    def start(self) -> None:
        self.peak_mib = self.current_mib()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> _RssSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (gone ones count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


# -- a broker under test -----------------------------------------------------------------------


class _Broker(BrokerProcess):
    """The broker under test, stopped with SIGINT as a user's Ctrl-C would."""

    def refresh(self) -> int:
        """Re-read the child processes' pids; returns how many restarts the broker made."""
        return sum(self.stats().get("restarts", {}).values())

    def stop(self, signum: int = signal.SIGINT, timeout: float = 30.0) -> int:
        return super().stop(signum, timeout)


@contextlib.contextmanager
def _fresh_store(root: Path, name: str) -> Iterator[Path]:
    data = root / name
    try:
        yield data
    finally:
        shutil.rmtree(data, ignore_errors=True)


# -- spoolmq workers (module level: spawned processes import them) --------------------------------


def _spool_producer(
    data: str, first: int, count: int, size: int, acks: str, barrier: Any, cpu: Any
) -> None:
    from spoolmq.client import Publisher

    payload = _payload(size)
    with Publisher(data=data, acks=acks, batch_size=100, max_in_flight=16) as publisher:
        barrier.wait()
        started = time.process_time()  # every thread's CPU: the I/O thread's too
        for message_id in range(first, first + count):
            publisher.publish_async(TOPIC, {"id": message_id, "p": payload})
        publisher.flush()
        _add_cpu(cpu, time.process_time() - started)


def _add_cpu(cpu: Any, seconds: float) -> None:
    """Add this worker's CPU seconds of the measured part (start-up left out)."""
    with cpu.get_lock():
        cpu.value += seconds


def _spool_consumer(data: str, total: int, out: str, barrier: Any, done: Any, cpu: Any) -> None:
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
    _add_cpu(cpu, time.process_time() - started)
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


Progress = Callable[[str], None]


def _prefill(
    data: Path, first: int, count: int, args: argparse.Namespace, progress: Progress
) -> dict[int, int]:
    """Store messages ``first .. first+count-1`` directly through the embedded store (no
    broker), round-robin over the partitions, in the same lines a broker writes for them.
    Returns each partition's log end offset afterwards."""
    from spoolmq.store import Store
    from spoolmq.store.record import EncodedMessage

    payload = _payload(args.size)
    with Store(data) as store:
        if TOPIC not in store.topics():
            store.create_topic(TOPIC, partitions=args.partitions)
        batches: list[list[EncodedMessage]] = [[] for _ in range(args.partitions)]
        for message_id in range(first, first + count):
            value = orjson.dumps({"id": message_id, "p": payload})
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
    """The ids of the messages stored from ``starts`` (partition: offset; default: all)."""
    from spoolmq.store import Store

    ids: list[int] = []
    with Store(data) as store:
        config = store.topic_config(TOPIC)
        for partition in range(config.partitions):
            reader = store.reader(TOPIC, partition, offset=(starts or {}).get(partition))
            while batch := reader.read_entries(5000):
                ids.extend(fields["value"]["id"] for fields, _ in batch)
            reader.close()
    return ids


def _disk_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*.jsonl") if f.is_file())


def _rate(done: int, started: float) -> str:
    return f"{done:,} ({done / max(1e-9, time.perf_counter() - started):,.0f} msg/s)"


# -- spoolmq phases --------------------------------------------------------------------------------


def _produce_round(
    data: Path, broker: _Broker, args: argparse.Namespace, first: int, progress: Progress
) -> dict[str, Any]:
    """Producers send ids ``first .. first+n-1`` as fast as they can; timed until all ACKed."""
    from spoolmq.client import Admin

    context = multiprocessing.get_context("spawn")
    with _RssSampler(broker.pids) as rss:
        idle_mib = rss.current_mib()
        barrier = context.Barrier(args.producers + 1)
        cpu = context.Value("d", 0.0)
        share = args.n // args.producers
        processes = [
            context.Process(
                daemon=True,
                target=_spool_producer,
                args=(
                    str(data),
                    first + i * share,
                    share if i < args.producers - 1 else args.n - share * i,
                    args.size,
                    args.acks,
                    barrier,
                    cpu,
                ),
            )
            for i in range(args.producers)
        ]
        for process in processes:
            process.start()
        barrier.wait()
        started = time.perf_counter()
        cpu_before = cpu_seconds(broker.pids())
        stored_before = -1
        while alive := [p for p in processes if p.is_alive()]:
            alive[0].join(0.5)
            with contextlib.suppress(SpoolError), Admin(data) as admin:
                stored = admin.stats()["publisher"].get("messages", 0)
                stored_before = stored if stored_before < 0 else stored_before
                progress(f"stored {_rate(stored - stored_before, started)}")
        elapsed = time.perf_counter() - started
        broker_cpu = cpu_seconds(broker.pids()) - cpu_before
        clients_cpu = cpu.value
        restarts = broker.refresh()
    if any(p.exitcode for p in processes):
        raise SpoolError("a producer process failed")
    commits = _group_commits(data, args.n)  # a fresh broker: its count starts at 0
    return {
        "messages": args.n,
        "seconds": round(elapsed, 4),
        "msgs_per_s": round(args.n / elapsed, 1),
        "broker_cpu_us_per_message": round(broker_cpu / args.n * 1e6, 2),
        "publishers_cpu_us_per_message": round(clients_cpu / args.n * 1e6, 2),
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
    data: Path, broker: _Broker, args: argparse.Namespace, progress: Progress
) -> tuple[dict[str, Any], list[int]]:
    """Consumers of one group drain ``n`` stored messages, ACKing each; returns the figures
    and the ids received."""
    context = multiprocessing.get_context("spawn")
    outs = [str(data.parent / f"consume-{i}.json") for i in range(args.consumers)]
    with _RssSampler(broker.pids) as rss:
        barrier = context.Barrier(args.consumers + 1)
        done = _Done(context)
        cpu = context.Value("d", 0.0)
        processes = [
            context.Process(
                target=_spool_consumer,
                args=(str(data), args.n, out, barrier, done, cpu),
                daemon=True,
            )
            for out in outs
        ]
        for process in processes:
            process.start()
        barrier.wait()
        started = time.perf_counter()
        cpu_before = cpu_seconds(broker.pids())
        deadline = started + max(60.0, args.n / 1000)
        while not (finished := done.wait(0.5)) and time.perf_counter() < deadline:
            progress(f"received and ACKed {_rate(done.value, started)}")
        elapsed = time.perf_counter() - started
        broker_cpu = cpu_seconds(broker.pids()) - cpu_before
        restarts = broker.refresh()
        for process in processes:
            process.join(30)
        clients_cpu = cpu.value
    ids: list[int] = []
    for out in outs:
        with contextlib.suppress(FileNotFoundError):
            ids.extend(orjson.loads(Path(out).read_bytes()))
            os.unlink(out)
    return {
        "messages": args.n,
        "seconds": round(elapsed, 4),
        "msgs_per_s": round(len(set(ids)) / elapsed, 1) if finished else 0.0,
        "completed": finished,
        "broker_cpu_us_per_message": round(broker_cpu / args.n * 1e6, 2),
        "consumers_cpu_us_per_message": round(clients_cpu / args.n * 1e6, 2),
        "broker_restarts": restarts,
        "broker_rss_peak_mib": round(rss.peak_mib, 1),
    }, ids


def _create_topic(data: Path, partitions: int) -> None:
    from spoolmq.store import Store

    with Store(data) as store:
        store.create_topic(TOPIC, partitions=partitions)


def spool_produce(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with _fresh_store(root, "produce") as data:
        _create_topic(data, args.partitions)
        broker = _Broker(data)
        start_s = broker.start()
        try:
            figures = _produce_round(data, broker, args, 0, progress)
        finally:
            broker.stop()
        counted = count_ids(_stored_ids(data), args.n)
        return {
            **figures,
            "broker_start_s": round(start_s, 3),
            "bytes_per_message": round(_disk_bytes(data) / args.n, 1),
            "duplicates": counted["duplicates"],
            "missing": counted["missing"],
        }


def spool_consume(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    with _fresh_store(root, "consume") as data:
        _prefill(data, 0, args.n, args, progress)
        broker = _Broker(data)
        broker.start()
        try:
            figures, ids = _consume_round(data, broker, args, progress)
        finally:
            broker.stop()
        counted = count_ids(ids, args.n)
        return {**figures, "duplicates": counted["duplicates"], "missing": counted["missing"]}


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
            store.state.commit_offsets(GROUP, {(TOPIC, p): end for p, end in ends.items()})
        progress(f"starting a broker on {stored:,} stored messages")
        broker = _Broker(data)
        reopen_s = broker.start()
        try:
            idle_mib = _RssSampler(broker.pids).current_mib()
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
        produced = count_ids([i - stored for i in _stored_ids(data, ends)], args.n)
        consumed = count_ids([i - stored for i in received], args.n)
        produce.update(duplicates=produced["duplicates"], missing=produced["missing"])
        consume.update(duplicates=consumed["duplicates"], missing=consumed["missing"])
        return {
            "stored": stored,
            "store_bytes": _disk_bytes(data),
            "prefill_s": round(prefill_s, 2),
            "broker_start_s": round(reopen_s, 3),
            "broker_rss_idle_mib": round(idle_mib, 1),
            "produce": produce,
            "consume": consume,
        }


def fdatasync_ms(directory: Path, count: int = 200, size: int = 350) -> list[float]:
    """Times (ms) of ``count`` appends of ``size`` bytes each followed by fdatasync, in a
    file in ``directory``: the disk's floor under a publish with ACK ``all``."""
    times: list[float] = []
    fd, name = tempfile.mkstemp(dir=directory)
    try:
        for _ in range(count):
            os.write(fd, b"x" * size)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.unlink(name)
    return times


def spool_latency(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    from spoolmq.client import Admin, Publisher

    context = multiprocessing.get_context("spawn")
    progress("timing the disk's fdatasync")
    syncs = fdatasync_ms(root)
    with _fresh_store(root, "latency") as data:
        _create_topic(data, args.partitions)
        broker = _Broker(data)
        broker.start()
        out = str(data.parent / "latency.json")
        rss = _RssSampler(broker.pids)
        try:
            rss.start()
            ready, stop = context.Event(), context.Event()
            consumer = context.Process(
                daemon=True, target=_spool_latency_consumer, args=(str(data), out, ready, stop)
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
                    if message_id % 1000 == 999:
                        progress(f"sent {_rate(message_id + 1, started)} of {total:,}")
                publisher.flush()
                sent_s = time.perf_counter() - started
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                with Admin(data) as admin:
                    if admin.stats()["consumer"].get("acked", 0) >= total:
                        break
                time.sleep(0.1)  # waiting for another process's progress
            stop.set()
            consumer.join(30)
        finally:
            rss.stop()
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
            "broker_rss_peak_mib": round(rss.peak_mib, 1),
            "disk_fdatasync_p50_ms": round(percentile(syncs, 0.5), 3),
            "disk_fdatasync_p99_ms": round(percentile(syncs, 0.99), 3),
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


def redis_produce(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    import redis

    context = multiprocessing.get_context("spawn")
    server = _Redis(root)
    server.start()
    rss = _RssSampler(server.pids)
    try:
        rss.start()
        client: Any = redis.Redis(port=server.port)
        barrier = context.Barrier(args.producers + 1)
        share = args.n // args.producers
        processes = [
            context.Process(
                daemon=True,
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
        while alive := [p for p in processes if p.is_alive()]:
            alive[0].join(0.5)
            progress(f"stored {_rate(client.xlen(TOPIC), started)}")
        elapsed = time.perf_counter() - started
        rss.stop()
        ids = [orjson.loads(fields[b"v"])["id"] for _, fields in client.xrange(TOPIC)]
        counted = count_ids(ids, args.n)
        return {
            "messages": args.n,
            "seconds": round(elapsed, 4),
            "msgs_per_s": round(args.n / elapsed, 1),
            "server_rss_peak_mib": round(rss.peak_mib, 1),
            "duplicates": counted["duplicates"],
            "missing": counted["missing"],
        }
    finally:
        rss.stop()
        server.stop()


def redis_consume(root: Path, args: argparse.Namespace, progress: Progress) -> dict[str, Any]:
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
                daemon=True,
                target=_redis_consumer,
                args=(server.port, f"c{i}", args.n, out, barrier, done),
            )
            for i, out in enumerate(outs)
        ]
        for process in processes:
            process.start()
        barrier.wait()
        started = time.perf_counter()
        deadline = started + max(60.0, args.n / 1000)
        while not (finished := done.wait(0.5)) and time.perf_counter() < deadline:
            progress(f"received and ACKed {_rate(done.value, started)}")
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
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each throughput phase (spoolmq and Redis in turn); the median is kept",
    )
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    parser.add_argument("--compare", choices=["redis"], help="run the same workload on Redis")
    parser.add_argument("--phases", default="produce,consume,latency", help="comma-separated")


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM: stop like Ctrl-C, so every server started is stopped


def _flatten(figures: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in figures.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput (the lower middle one of an even count), with
    every run's throughput beside it; a run that did not complete counts as 0 msg/s.

    >>> median_run([{"msgs_per_s": 3.0}, {"msgs_per_s": 1.0}, {"msgs_per_s": 2.0}])
    {'msgs_per_s': 2.0, 'runs_msgs_per_s': [3.0, 1.0, 2.0]}
    """
    ordered = sorted(runs, key=lambda run: float(run["msgs_per_s"]))
    return {
        **ordered[(len(ordered) - 1) // 2],
        "runs_msgs_per_s": [run["msgs_per_s"] for run in runs],
    }


def _ratio(a: dict[str, Any], b: dict[str, Any]) -> float:
    return round(float(a["msgs_per_s"]) / max(1e-9, float(b["msgs_per_s"])), 3)


def run(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    console = Console(stderr=True)
    for name in ("n", "producers", "consumers", "size", "rate", "partitions", "repeat"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name} must be at least 1")
    if args.duration <= 0:
        raise InvalidArgumentError("--duration must be positive")
    if args.prefill < 0:
        raise InvalidArgumentError("--prefill must not be negative")
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - {"produce", "consume", "latency"}
    if unknown:
        raise InvalidArgumentError(f"unknown phase(s) {', '.join(sorted(unknown))}")
    compare = args.compare == "redis"
    if compare and shutil.which("redis-server") is None:
        console.print(
            "[yellow]redis-server is not installed; for the comparison install it with "
            "`sudo apt-get install redis-server` (Debian/Ubuntu), `sudo dnf install redis` "
            "(Fedora) or `brew install redis` (macOS). Running spoolmq alone.[/yellow]",
            soft_wrap=True,
        )
        compare = False
    if compare and importlib.util.find_spec("redis") is None:
        console.print(
            "[yellow]the Python client for the comparison is missing: `uv sync` in a checkout "
            "(it is a development dependency) or `pip install redis hiredis`. Running spoolmq "
            "alone.[/yellow]",
            soft_wrap=True,
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
    results["machine"].update(disk_facts(root))
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        with console.status("benchmarking") as status:

            def step(name: str) -> Progress:
                status.update(name)
                return lambda text: status.update(f"{name}: {text}")

            spool = results["spoolmq"]
            if compare:
                import redis
                import redis.utils

                results["redis"] = {
                    "client": {
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
                }
            throughput = {
                "produce": (spool_produce, redis_produce, "produce"),
                "consume": (spool_consume, redis_consume, "consume + ACK"),
            }
            for phase, (spool_phase, redis_phase, title) in throughput.items():
                if phase not in phases:
                    continue
                # spoolmq and Redis take turns, so both see the same load on a shared machine.
                spool_runs, redis_runs = [], []
                for attempt in range(args.repeat):
                    of = f" (run {attempt + 1} of {args.repeat})" if args.repeat > 1 else ""
                    spool_runs.append(spool_phase(root, args, step(f"spoolmq {title}{of}")))
                    if compare:
                        redis_runs.append(redis_phase(root, args, step(f"redis {title}{of}")))
                spool[phase] = median_run(spool_runs)
                if compare:
                    results["redis"][phase] = median_run(redis_runs)
            if "latency" in phases:
                spool["latency"] = spool_latency(
                    root, args, step(f"spoolmq latency at {args.rate} msg/s")
                )
            if args.prefill:
                prefilled = spool_prefilled(root, args, step(f"spoolmq, {args.prefill:,} stored"))
                compared = [phase for phase in ("produce", "consume") if phase in spool]
                prefilled["vs_empty"] = {
                    phase: _ratio(prefilled[phase], spool[phase]) for phase in compared
                }
                # The broker's CPU per message moves far less with the machine's load than
                # throughput does: the steadier answer to "does a big store slow it down".
                prefilled["broker_cpu_vs_empty"] = {
                    phase: round(
                        prefilled[phase]["broker_cpu_us_per_message"]
                        / max(1e-9, spool[phase]["broker_cpu_us_per_message"]),
                        3,
                    )
                    for phase in compared
                }
                spool["prefilled"] = prefilled
            if compare:
                results["ratios"] = {
                    phase: _ratio(spool[phase], results["redis"][phase])
                    for phase in ("produce", "consume")
                    if phase in results["redis"]
                }
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(root, ignore_errors=True)
    results["machine"]["load_average_end"] = list(os.getloadavg())
    table = Table(title="spoolmq bench")
    for column in ("phase", "system", "figure", "value"):
        table.add_column(column)
    for system in ("spoolmq", "redis"):
        for phase, figures in results.get(system, {}).items():
            for figure, value in _flatten(figures):
                table.add_row(phase, system, figure, str(value))
    for phase, ratio in results.get("ratios", {}).items():
        table.add_row(phase, "spoolmq / redis", "ratio", str(ratio))
    Console().print(table)
    if args.json:
        Path(args.json).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
    return 0
