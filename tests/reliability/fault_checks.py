"""Checks shared by the reliability tests: what clients were told against what is stored."""

from __future__ import annotations

import collections
import multiprocessing
import os
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path

import fault_workers

from spoolmq import Store

SPAWN = multiprocessing.get_context("spawn")


@dataclass
class StoreAudit:
    """What a topic holds, compared with the ACKs publishers wrote down."""

    acked: int = 0
    failed: int = 0
    stored: int = 0
    lost: list[tuple[int, int]] = field(default_factory=list)
    moved: list[tuple[int, int]] = field(default_factory=list)
    duplicates: list[tuple[int, int]] = field(default_factory=list)
    gaps: list[str] = field(default_factory=list)
    log_start: dict[int, int] = field(default_factory=dict)
    retired: int = 0

    def line(self) -> str:
        return (
            f"acked lost: {len(self.lost)} of {self.acked}; duplicates: {len(self.duplicates)} "
            f"of {self.stored} stored; offset gaps: {len(self.gaps)}; publish errors: {self.failed}"
        )


def read_acks(path: Path) -> tuple[dict[int, tuple[int, int]], list[int]]:
    """``n partition offset`` lines -> {n: (partition, offset)}, plus the failed ``n``s."""
    acked: dict[int, tuple[int, int]] = {}
    failed: list[int] = []
    if not path.exists():
        return acked, failed
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue  # a line cut by a kill
        if parts[1] == "error":
            failed.append(int(parts[0]))
        else:
            acked[int(parts[0])] = (int(parts[1]), int(parts[2]))
    return acked, failed


def audit(data_dir: Path, topic: str, ack_files: dict[int, Path]) -> StoreAudit:
    """Read the whole topic (the broker stopped) and compare it with every worker's ACKs."""
    result = StoreAudit()
    where: dict[tuple[int, int], list[tuple[int, int]]] = collections.defaultdict(list)
    with Store(data_dir) as store:
        for partition in range(store.topic_config(topic).partitions):
            start = result.log_start[partition] = store.log_start_offset(topic, partition)
            records = list(store.reader(topic, partition))
            offsets = [r.offset for r in records]
            if offsets != list(range(start, start + len(offsets))):
                result.gaps.append(f"partition {partition}: offsets not contiguous from {start}")
            for record in records:
                where[(record.value["w"], record.value["i"])].append((partition, record.offset))
            result.stored += len(records)
    result.duplicates = [k for k, places in where.items() if len(places) > 1]
    for worker, path in ack_files.items():
        acked, failed = read_acks(path)
        result.acked += len(acked)
        result.failed += len(failed)
        for n, position in acked.items():
            places = where.get((worker, n), [])
            if not places and position[1] < result.log_start[position[0]]:
                result.retired += 1  # deleted by retention, as configured
            elif not places:
                result.lost.append((worker, n))
            elif position not in places:
                result.moved.append((worker, n))
    return result


def start_process(target: object, *args: object) -> BaseProcess:
    process = SPAWN.Process(target=target, args=args, daemon=True)
    process.start()
    return process


def start_publishers(
    data_dir: Path, topic: str, workers: int, tmp_path: Path, pace: float
) -> tuple[list[BaseProcess], dict[int, Path], Path]:
    """``workers`` processes publishing a steady stream until the returned stop file exists;
    also returns each worker's ACK file."""
    stop_file = tmp_path / "stop"
    acks = {w: tmp_path / f"acks-{w}" for w in range(workers)}
    processes = [
        start_process(
            fault_workers.publish_until_stopped,
            str(data_dir),
            topic,
            w,
            str(acks[w]),
            str(stop_file),
            10**9,
            pace,
        )
        for w in range(workers)
    ]
    return processes, acks, stop_file


def stop_processes(processes: list[BaseProcess], timeout: float = 120.0) -> None:
    """Join the processes; SIGKILL (by pid) any still running after ``timeout``."""
    for process in processes:
        process.join(timeout)
        if process.is_alive():
            process.kill()
            process.join(10)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
