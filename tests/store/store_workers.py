"""Code that store tests run in separate processes (importable under ``spawn``)."""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path
from typing import Any

from spoolmq import Message, Store


def append_worker(data_dir: str, topic: str, worker: int, batches: int, start: Any) -> None:
    """Append ``batches`` small batches of ``{"w": worker, "i": n}`` records."""
    start.wait()
    rng = random.Random(worker)
    sent = 0
    with Store(data_dir) as store:
        for _ in range(batches):
            size = rng.randint(1, 5)
            store.append_batch(
                topic, [Message({"w": worker, "i": sent + k}) for k in range(size)], acks="1"
            )
            sent += size
    Path(data_dir, f"sent-{worker}").write_text(str(sent))


def crash_writer(data_dir: str, side_file: str, run: int) -> None:
    """Append batches forever with acks=all; after each append returns, record it.

    Each record carries its batch id and the batch size, so the checker can tell a
    whole batch from part of one. Killed with SIGKILL by the test.
    """
    rng = random.Random(run)
    side = os.open(side_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
    producer = f"run-{run}"
    with Store(data_dir) as store:
        store.create_topic("crash", partitions=1, segment_bytes=64 * 1024)
        batch = 0
        while True:
            size = rng.choice([1, 2, 50, 400])
            batch_id = f"{run}-{batch}"
            messages = [
                Message(
                    {"batch": batch_id, "n": size, "i": i, "pad": "p" * rng.randint(0, 300)},
                    producer_id=producer,
                    sequence=batch * 1000 + i,
                )
                for i in range(size)
            ]
            positions = store.append_batch("crash", messages, acks="all")
            os.write(side, f"{batch_id} {positions[0].offset} {size}\n".encode())
            batch += 1


if __name__ == "__main__":
    crash_writer(sys.argv[1], sys.argv[2], int(sys.argv[3]))
