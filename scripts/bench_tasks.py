"""What a task costs to send and to run through spoolmq's task layer (issue 13).

    uv run python scripts/bench_tasks.py --tasks 2000 --processes 1 --concurrency 4

A real broker and a real ``spoolmq worker`` in a temporary directory, running a task that
returns at once (``add``), so the figures are the task layer's own cost: sending (a row in
``tasks.db`` and an ``acks=all`` publish, one after the other as an application calls
``send``), the worker's claim, call, result row and ACK, and reading the results back.
Printed as a Markdown table for BENCHMARKS.md: sends per second and the sender's CPU per
send, tasks per second from the first send to the last result, and the worker processes'
CPU per task. Then ``--round-trips`` tasks one at a time, each sent and its result waited
for (``send(...).result()``, as a caller that needs the answer does): the time from send to
result, p50 and p90, for ``add`` and for a task that sleeps 100 ms (``nap``), so what
``result`` adds to the task's own time shows.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

from spoolmq.testing import BrokerProcess, wait_until

APP = """
import time

from spoolmq import Tasks

tasks = Tasks()


@tasks.task(topic="bench.tasks")
def add(a: int, b: int) -> int:
    return a + b


@tasks.task(topic="bench.tasks")
def nap(n: int) -> int:
    time.sleep(0.1)
    return n
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tasks", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--round-trips", type=int, default=100)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="spoolmq-tasks-") as tmp:
        root = Path(tmp)
        data = root / "queue_data"
        (root / "bench_app.py").write_text(APP)
        os.environ["SPOOLMQ_DATA"] = str(data)
        sys.path.insert(0, str(root))
        with BrokerProcess(data):
            app = importlib.import_module("bench_app")
            worker = subprocess.Popen(
                [sys.executable, "-m", "spoolmq", "worker", "bench_app:tasks",
                 "--processes", str(args.processes), "--concurrency", str(args.concurrency)],
                cwd=root, stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
            try:
                # One task first: the worker is up and subscribed before the clock starts.
                assert app.add.send(0, 0).result(timeout=120) == 0
                children = psutil.Process(worker.pid).children(recursive=True)
                workers = [psutil.Process(worker.pid), *children]
                worker_cpu = sum(sum(p.cpu_times()[:2]) for p in workers)
                cpu = time.process_time()
                began = time.perf_counter()
                handles = [app.add.send(n, 1) for n in range(args.tasks)]
                sent_s = time.perf_counter() - began
                send_cpu = time.process_time() - cpu
                for n, handle in enumerate(handles):
                    assert handle.result(timeout=300) == n + 1
                done_s = time.perf_counter() - began
                worker_cpu = sum(sum(p.cpu_times()[:2]) for p in workers) - worker_cpu
                trips = {
                    "add": _round_trips(lambda n: app.add.send(n, 0), args.round_trips),
                    "nap (100 ms)": _round_trips(app.nap.send, max(args.round_trips // 5, 1)),
                }
            finally:
                worker.terminate()
                worker.wait(60)
            wait_until(lambda: worker.poll() is not None, 60, "the worker to stop")
            app.tasks.close()

    n = args.tasks
    print(
        f"\n{n:,} tasks, {args.processes} worker process(es) x {args.concurrency}; "
        f"{os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n"
    )
    print("| measure | value |")
    print("|---|---|")
    print(f"| send (one after another) | {n / sent_s:,.0f} tasks/s |")
    print(f"| sender CPU per send | {send_cpu / n * 1e6:,.0f} µs |")
    print(f"| first send to last result | {n / done_s:,.0f} tasks/s |")
    print(f"| worker processes' CPU per task | {worker_cpu / n * 1e6:,.0f} µs |")
    for name, times in trips.items():
        print(
            f"| send to result, one at a time, {name} ({len(times)}) | "
            f"p50 {_at(times, 0.5):.1f} ms, p90 {_at(times, 0.9):.1f} ms |"
        )


def _round_trips(send: Callable[[int], Any], count: int) -> list[float]:
    """Milliseconds from each send to its result, one task at a time."""
    times = []
    for n in range(count):
        began = time.perf_counter()
        assert send(n).result(timeout=120) == n
        times.append((time.perf_counter() - began) * 1000)
    return sorted(times)


def _at(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


if __name__ == "__main__":
    main()
