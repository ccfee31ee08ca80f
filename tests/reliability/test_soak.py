"""Point 13: a soak. Publishers and consumers run while broker processes and consumers are
SIGKILLed at random: no ACKed message is lost, every one is consumed or reported skipped (a
group that lagged past retention), broker memory and open file descriptors stay flat, and
retention keeps the disk bounded. 5 minutes with --long; a
short smoke run otherwise."""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fault_workers
import orjson
import psutil
import pytest
from fault_checks import audit, read_acks, start_process, start_publishers, stop_processes

from spoolmq import Consumer, Publisher, Store
from spoolmq.testing import BrokerProcess, wait_until

TOPIC = "soak"
PARTITIONS = 2
SEGMENT_BYTES = 128 * 1024
RETENTION_BYTES = 512 * 1024


def fd_count(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def broker_rss(broker: BrokerProcess) -> int:
    pids = [broker.pid, *broker.child_pids().values()]
    return sum(psutil.Process(pid).memory_info().rss for pid in pids)


def log_bytes(data_dir: Path) -> int:
    return sum(p.stat().st_size for p in (data_dir / "logs" / TOPIC).rglob("*") if p.is_file())


def consumed(paths: list[Path]) -> set[tuple[int, int]]:
    """(partition, offset) of every ACK a consumer saw confirmed."""
    seen = set()
    for path in paths:
        if path.exists():
            for line in path.read_text().splitlines():
                parts = line.split()
                if len(parts) == 2:
                    seen.add((int(parts[0]), int(parts[1])))
    return seen


def skipped(data_dir: Path, group: str) -> set[tuple[int, int]]:
    """(partition, offset) of what the broker reported deleted by retention before the group
    read it (``skipped`` events)."""
    lost = set()
    for path in (data_dir / "events").rglob("*.jsonl"):
        for line in path.read_bytes().splitlines():
            event = orjson.loads(line)
            if event["type"] == "skipped" and event["group"] == group:
                first, begin = event["offset"], event["committed"]
                lost |= {(event["partition"], offset) for offset in range(first, begin)}
    return lost


def no_clients(broker: BrokerProcess) -> bool:
    """Both broker children have closed every client connection, so their open files are
    their own. (Their own counts: the manager's client registry keeps the clients of a
    child that was SIGKILLed.)"""
    stats = broker.stats()
    return stats["publisher"]["publishers"] == 0 and stats["consumer"]["consumers"] == 0


def last_intent(path: Path) -> tuple[int, int] | None:
    """The message a consumer was ACKing when it was killed, if it had not recorded it."""
    lines = path.read_text().splitlines() if path.exists() else []
    if lines and lines[-1].startswith("? "):
        _, partition, offset = lines[-1].split()
        return int(partition), int(offset)
    return None


@pytest.mark.timeout(900)  # the long variant runs 5 minutes, past the default 300 s
def test_soak(
    data_dir: Path, tmp_path: Path, long_run: bool, figure: Callable[[str], None]
) -> None:
    duration = 300.0 if long_run else 20.0
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with Store(data_dir) as store:
        store.create_topic(
            TOPIC,
            partitions=PARTITIONS,
            segment_bytes=SEGMENT_BYTES,
            retention_bytes=RETENTION_BYTES,
        )
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    broker.start()
    # Warm up, so the baseline has the files a working broker keeps open (segments, index,
    # state.db and its WAL, events), then measure it with no client connected.
    with Publisher(data=data_dir) as pub:
        for i in range(200):
            pub.publish_async(TOPIC, {"w": -1, "i": i})
    with Consumer(TOPIC, group="soak", data=data_dir, prefetch=50) as warm:
        for _ in range(200):
            message = warm.receive(timeout=30)
            assert message is not None
            message.ack()
    wait_until(lambda: no_clients(broker), 60, "the brokers to notice the disconnects")
    fds_before = {"manager": fd_count(broker.pid)} | {
        name: fd_count(pid) for name, pid in broker.child_pids().items()
    }
    publishers, acks, stop_file = start_publishers(data_dir, TOPIC, 2, tmp_path, 0.05)
    consumer_files: list[Path] = []

    def new_consumer() -> Any:
        consumer_files.append(tmp_path / f"consumed-{len(consumer_files)}")
        return start_process(
            fault_workers.consume_and_record,
            str(data_dir),
            TOPIC,
            "soak",
            str(consumer_files[-1]),
            20,
        )

    consumers = [new_consumer(), new_consumer()]
    live_files = [0, 1]  # consumer_files index of each live consumer
    killed_files: list[Path] = []
    kills: dict[str, int] = {"publisher": 0, "consumer": 0, "consumer process": 0}
    rss: list[tuple[float, int]] = []
    disk: list[int] = []
    started = time.monotonic()
    try:
        while (elapsed := time.monotonic() - started) < duration:
            time.sleep(min(rng.uniform(1.0, 4.0), max(0.0, duration - elapsed)))
            target = rng.choice(list(kills))
            kills[target] += 1
            if target == "consumer process":
                index = rng.randrange(len(consumers))
                victim = consumers.pop(index)
                victim.kill()
                victim.join(10)
                killed_files.append(consumer_files[live_files.pop(index)])
                consumers.append(new_consumer())
                live_files.append(len(consumer_files) - 1)
            else:
                broker.wait_child_replaced(target, broker.kill_child(target))
            rss.append((time.monotonic() - started, broker_rss(broker)))
            disk.append(log_bytes(data_dir))
        stop_file.touch()
        stop_processes(publishers, timeout=300)
        acked = {position for path in acks.values() for position in read_acks(path)[0].values()}
        # A consumer killed between its confirmed ACK and writing it down: not a loss, if
        # that message is exactly the one it was ACKing.
        unrecorded = acked & {last_intent(path) for path in killed_files}
        deadline = time.monotonic() + 120
        while (
            missing := acked - unrecorded - consumed(consumer_files) - skipped(data_dir, "soak")
        ) and time.monotonic() < deadline:
            time.sleep(0.2)  # the consumers drain the topic; nothing to wait on from here
        fds_busy = fd_count(broker.pid)
        for process in consumers:
            process.kill()
        stop_processes(consumers, timeout=10)
        wait_until(lambda: no_clients(broker), 60, "the brokers to notice the disconnects")
        deadline = time.monotonic() + 30
        while fd_count(broker.pid) > fds_before["manager"] and time.monotonic() < deadline:
            time.sleep(0.1)  # the manager notices the disconnects
        fds_after = {"manager": fd_count(broker.pid)} | {
            name: fd_count(pid) for name, pid in broker.child_pids().items()
        }
        open_files = {  # for the failure message
            name: sorted(
                os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")
            )
            for name, pid in broker.child_pids().items()
        }
    finally:
        stop_file.touch()
        stop_processes(publishers, timeout=30)
        for process in consumers:
            process.kill()
        stop_processes(consumers, timeout=10)
        broker.stop()
    result = audit(data_dir, TOPIC, acks)
    lost_to_retention = skipped(data_dir, "soak")
    with Store(data_dir) as store:
        committed = store.state.committed_offsets("soak")
        ends = {(TOPIC, p): store.log_end_offset(TOPIC, p) for p in range(PARTITIONS)}
        dead_lettered = f"{TOPIC}.dlq" in store.topics()
    early = statistics.median(r for t, r in rss if t <= duration * 0.3) if rss else 0
    late = statistics.median(r for t, r in rss if t >= duration * 0.7) if rss else 0
    growth = (late - early) / early if early else 0.0
    # Retention runs every few seconds: allow what the publishers write in 6 s on top.
    line_bytes = log_bytes(data_dir) / max(1, result.stored)
    rate = (result.stored + result.retired) * line_bytes / duration
    bound = int(PARTITIONS * (RETENTION_BYTES + 2 * SEGMENT_BYTES) + 6 * rate)
    figure(
        f"{duration:.0f} s, SIGKILLs {kills} (seed {seed}): {result.line()}; retired by "
        f"retention {result.retired} (of them unread by the group, reported skipped: "
        f"{len(lost_to_retention)}); acked but neither consumed nor reported skipped "
        f"{len(missing)} (ACKed by a consumer killed before it wrote it down: {len(unrecorded)}); "
        "broker RSS "
        f"{early / 2**20:.1f} -> {late / 2**20:.1f} MiB ({growth:+.1%}); fds {fds_before} -> "
        f"{fds_after} (with clients {fds_busy}); log bytes max {max(disk, default=0):,} "
        f"(bound {bound:,})"
    )
    assert result.lost == [] and result.duplicates == [] and result.gaps == []
    assert result.moved == [] and result.failed == 0
    assert missing == set()
    assert not lost_to_retention & consumed(consumer_files)  # skipped means never delivered
    assert committed == ends  # every message of the topic finished, none dead-lettered
    assert not dead_lettered
    assert fds_after["manager"] <= fds_before["manager"] + 2
    assert all(fds_after[name] <= fds_before[name] + 8 for name in ("publisher", "consumer")), (
        open_files
    )
    assert max(disk, default=0) <= bound
    if long_run:
        assert growth < 0.10
