"""Client processes that the reliability tests run (importable under ``spawn``).

Each writes what the broker told it to a file as it goes, so the test can compare what
clients were promised with what the store holds, even after the client was killed.
"""

from __future__ import annotations

import os
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from spoolmq import Consumer, Publisher
from spoolmq.store.message import Position


def publish_until_stopped(
    data_dir: str,
    topic: str,
    worker: int,
    out_file: str,
    stop_file: str,
    limit: int,
    pace: float,
) -> None:
    """Publish ``{"w": worker, "i": n}`` with ACK "all" until ``stop_file`` exists or
    ``limit`` messages were sent; write ``n partition offset`` for every ACK and
    ``n error <code>`` for every failure. ``pace``: seconds to pause after each 50
    messages (0: as fast as the broker takes them)."""
    pending: deque[tuple[int, Future[Position]]] = deque()
    with (
        open(out_file, "a", buffering=1) as out,
        Publisher(data=data_dir, acks="all", delivery_timeout=300, name=f"w{worker}") as pub,
    ):

        def settle(block: bool) -> None:
            while pending and (block or pending[0][1].done() or len(pending) > 2000):
                n, future = pending.popleft()
                try:
                    position = future.result()
                except Exception as exc:  # recorded, the test decides what it means
                    out.write(f"{n} error {getattr(exc, 'code', type(exc).__name__)}\n")
                else:
                    out.write(f"{n} {position.partition} {position.offset}\n")

        n = 0
        while n < limit and not os.path.exists(stop_file):
            for _ in range(min(50, limit - n)):
                pending.append((n, pub.publish_async(topic, {"w": worker, "i": n})))
                n += 1
            settle(block=False)
            if pace:
                time.sleep(pace)  # a steady stream, not a flood: the check reads it all back
        pub.flush()
        settle(block=True)
    Path(out_file + ".done").write_text(str(n))


def publish_count(data_dir: str, topic: str, worker: int, count: int, start: Any) -> None:
    """Publish ``count`` messages as fast as possible once ``start`` is set; write how many
    were ACKed and the first error, if any, to ``<data_dir>/../pub-<worker>``."""
    start.wait()
    errors: list[str] = []
    acked = 0
    with Publisher(data=data_dir, acks="all", delivery_timeout=300) as pub:
        futures = [pub.publish_async(topic, {"w": worker, "i": i}) for i in range(count)]
        pub.flush()
        for future in futures:
            try:
                future.result()
                acked += 1
            except Exception as exc:
                errors.append(f"{type(exc).__name__}: {exc}")
    Path(data_dir).parent.joinpath(f"pub-{worker}").write_text(
        f"{acked}\n{errors[0] if errors else ''}"
    )


def take_one_and_hang(data_dir: str, topic: str, group: str, out_file: str, lease: float) -> None:
    """Receive one message, say so in ``out_file``, then work on it forever (until killed)."""
    with Consumer(topic, group=group, data=data_dir, lease=lease) as consumer:
        message = consumer.receive(timeout=60)
        if message is None:
            Path(out_file).write_text("none")
            return
        Path(out_file + ".tmp").write_text(f"{message.offset} {message.attempt}")
        os.replace(out_file + ".tmp", out_file)
        time.sleep(3600)  # the task "runs" until the test SIGKILLs this process


def consume_and_record(data_dir: str, topic: str, group: str, out_file: str, prefetch: int) -> None:
    """ACK every message and write ``partition offset`` once the broker confirmed the ACK
    (``? partition offset`` just before it). Runs until killed or 60 s without a message."""
    with (
        open(out_file, "a", buffering=1) as out,
        Consumer(topic, group=group, data=data_dir, prefetch=prefetch, lease=30) as consumer,
    ):
        while (message := consumer.receive(timeout=60)) is not None:
            # Said before the ACK: a SIGKILL between the ACK and its record leaves this.
            out.write(f"? {message.partition} {message.offset}\n")
            try:
                message.ack()
            except Exception as exc:  # refused or lost: the broker redelivers it
                out.write(f"# {message.partition} {message.offset} {type(exc).__name__}\n")
                continue
            out.write(f"{message.partition} {message.offset}\n")


def open_and_append(data_dir: str, worker: int, count: int, start: Any, out_file: str) -> None:
    """Open the store (maybe creating it) at the same moment as the other workers, append
    ``count`` records one by one, and write ``ok`` or the error a user would see."""
    from spoolmq import Store

    start.wait()
    try:
        with Store(data_dir) as store:
            for i in range(count):
                store.append("crowd", {"w": worker, "i": i}, acks="1")
    except Exception as exc:
        Path(out_file).write_text(f"{type(exc).__name__}: {exc}")
        return
    Path(out_file).write_text("ok")
