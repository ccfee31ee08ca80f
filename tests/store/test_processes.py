"""Several real processes on one store: concurrent appends, and a writer killed mid-batch."""

from __future__ import annotations

import collections
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import store_workers

from spoolmq import Store
from spoolmq.testing import wait_until

WORKERS = 8


def test_eight_processes_append_every_record_once(
    data_dir: Path, figure: Callable[[str], None]
) -> None:
    with Store(data_dir) as store:
        # small segments: the writers also overtake each other's rolls
        store.create_topic("shared", partitions=2, segment_bytes=4096)
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    processes = [
        context.Process(
            target=store_workers.append_worker, args=(str(data_dir), "shared", w, 40, start)
        )
        for w in range(WORKERS)
    ]
    for process in processes:
        process.start()
    start.set()
    for process in processes:
        process.join(120)
        assert process.exitcode == 0
    sent = {w: int((data_dir / f"sent-{w}").read_text()) for w in range(WORKERS)}
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    with Store(data_dir) as store:
        for partition in (0, 1):
            records = list(store.reader("shared", partition))
            assert [r.offset for r in records] == list(range(len(records)))
            stamps = [r.timestamp for r in records]
            assert stamps == sorted(stamps)
            seen.update((r.value["w"], r.value["i"]) for r in records)
            # each worker's records keep their order within a partition
            for w in range(WORKERS):
                mine = [r.value["i"] for r in records if r.value["w"] == w]
                assert mine == sorted(mine)
        assert store.check() == []
    expected = {(w, i) for w in range(WORKERS) for i in range(sent[w])}
    assert set(seen) == expected
    assert all(count == 1 for count in seen.values())
    figure(
        f"{WORKERS} processes on one store: {sum(seen.values())} records, "
        f"{len(expected)} expected, duplicates {sum(c - 1 for c in seen.values())}"
    )


def test_writer_killed_mid_batch(
    data_dir: Path, tmp_path: Path, figure: Callable[[str], None]
) -> None:
    side = tmp_path / "completed.txt"
    rng = random.Random(11)

    def batches_done() -> int:
        return len(side.read_text().splitlines()) if side.exists() else 0

    for run in range(6):
        done_before = batches_done()
        writer = subprocess.Popen(
            [sys.executable, store_workers.__file__, str(data_dir), str(side), str(run)],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )
        # However slowly it starts, the writer is mid-stream when it is killed: a couple of
        # batches done, then a random moment.
        wait_until(lambda n=done_before: batches_done() >= n + 2, 120, "the writer's batches")
        time.sleep(rng.uniform(0.0, 0.6))  # pacing: a random moment, not a wait
        writer.send_signal(signal.SIGKILL)
        assert writer.wait(30) == -signal.SIGKILL
        with Store(data_dir) as store:
            store.append("crash", {"batch": f"marker-{run}", "n": 1, "i": 0}, acks="all")
            records = list(store.reader("crash", 0))
            assert store.check() == []
        assert [r.offset for r in records] == list(range(len(records)))
        by_batch: dict[str, list[int]] = collections.defaultdict(list)
        sizes = {}
        for record in records:
            by_batch[record.value["batch"]].append(record.offset)
            sizes[record.value["batch"]] = record.value["n"]
        # no batch is half there: each stored batch has all its records, contiguous
        for batch, offsets in by_batch.items():
            assert len(offsets) == sizes[batch], batch
            assert offsets == list(range(offsets[0], offsets[0] + len(offsets)))
        # every batch the writer saw acknowledged is there, at the offsets it was told
        completed = [line.split() for line in side.read_text().splitlines()]
        assert completed, "the writer never finished a batch"
        for batch, first, size in completed:
            assert by_batch[batch] == list(range(int(first), int(first) + int(size)))
    assert len(completed) > 6
    figure(
        f"6 SIGKILLs of a writer mid-batch: acknowledged batches lost 0 of {len(completed)}, "
        f"partial batches 0, {len(records)} records readable"
    )
