"""``spoolmq demo``: a broker, publisher and consumer processes, and a realistic workload.

Order events with customer keys on four partitions; some are delayed, some handlers fail
once (retried) and some always fail (dead-lettered). Live progress, a summary with latency
percentiles computed by the Spark analytics over the result (the same figures as its report).
"""

from __future__ import annotations

import argparse
import logging
import multiprocessing
import random
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from spoolmq.client import Admin, Consumer, Publisher, ReceivedMessage
from spoolmq.errors import SpoolError
from spoolmq.store import Store
from spoolmq.testing import BrokerProcess

TOPIC = "orders"
GROUP = "billing"
POISON_EVERY = 97  # orders whose id is a multiple of this always fail: they end in the DLQ
FLAKY_EVERY = 13  # these fail on their first attempt only


def _publish(data: str, first: int, count: int, seed: int) -> None:
    rng = random.Random(seed)
    with Publisher(data=data, name=f"demo-publisher-{seed}") as publisher:
        futures = []
        for order_id in range(first, first + count):
            customer = f"customer-{order_id % 40}"
            amount = round(rng.uniform(5, 500), 2)
            value = {
                "order_id": order_id,
                "customer": customer,
                "amount": amount,
                "items": rng.randint(1, 6),
            }
            delay = rng.uniform(0.5, 2.0) if rng.random() < 0.05 else None
            futures.append(
                publisher.publish_async(
                    TOPIC,
                    value,
                    key=customer,
                    headers={"source": "demo"},
                    tags=["vip"] if amount > 400 else None,
                    delay=delay,
                )
            )
            if order_id % 50 == 0:
                time.sleep(0.005)  # a steady stream rather than one burst
        publisher.flush()
        for future in futures:
            future.result()


def _handle(message: ReceivedMessage) -> None:
    order_id = message.value["order_id"]
    if order_id % POISON_EVERY == 0:
        raise ValueError(f"order {order_id} has an invalid address")
    if order_id % FLAKY_EVERY == 0 and message.attempt == 1:
        raise TimeoutError("payment service timed out")
    time.sleep(0.0005)  # the work itself


def _consume(data: str, number: int) -> None:
    # Every failure here is planned (poison and flaky orders) and the summary counts them:
    # the traceback Consumer.run logs for each would bury it.
    logging.getLogger("spoolmq.client").setLevel(logging.CRITICAL)
    with Consumer(
        TOPIC,
        GROUP,
        data=data,
        prefetch=20,
        max_deliveries=3,
        retry_backoff=0.2,
        retry_backoff_max=1.0,
        name=f"demo-consumer-{number}",
    ) as consumer:
        consumer.run(_handle, idle_timeout=4.0)


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn

    console = Console()
    total = max(10, int(args.messages))
    if args.data:
        data = Path(args.data)
        if data.exists() and any(data.iterdir()):
            raise SpoolError(f"{data} is not empty; the demo needs a fresh data directory")
    else:
        data = Path(tempfile.mkdtemp(prefix="spoolmq-demo-")) / "queue_data"
    console.print(f"[bold]spoolmq demo[/bold]: {total} order events, data in {data}")
    Store(data).create_topic(TOPIC, partitions=4)
    broker = BrokerProcess(data)
    context = multiprocessing.get_context("spawn")
    processes: list[Any] = []
    started = time.monotonic()
    try:
        broker.start(timeout=30)
        half = total // 2
        processes += [
            context.Process(target=_consume, args=(str(data), n), name=f"demo-consumer-{n}")
            for n in range(3)
        ]
        processes += [
            context.Process(target=_publish, args=(str(data), 1, half, 1)),
            context.Process(target=_publish, args=(str(data), 1 + half, total - half, 2)),
        ]
        for process in processes:
            process.start()
        poison = sum(1 for i in range(1, total + 1) if i % POISON_EVERY == 0)
        with (
            Admin(data) as admin,
            Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total}"),
                console=console,
            ) as progress,
        ):
            published = progress.add_task("published", total=total)
            finished = progress.add_task("acked or dead-lettered", total=total)
            deadline = time.monotonic() + 50
            stats: dict[str, Any] = {}
            while time.monotonic() < deadline:
                stats = admin.stats()
                done = stats["consumer"].get("acked", 0) + stats["consumer"].get("dead_lettered", 0)
                progress.update(published, completed=stats["publisher"].get("messages", 0))
                progress.update(finished, completed=done)
                if done >= total:
                    break
                time.sleep(0.2)  # a progress display refresh, not a wait for work
        for process in processes:
            process.join(15)
        elapsed = time.monotonic() - started
        from spoolmq.tasks.demo import run_tasks_demo  # the task layer on the same broker

        run_tasks_demo(data, console)
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        broker.stop(signal.SIGINT)
    console.print(f"DLQ: `spoolmq dlq list {TOPIC} --data {data}`")
    if args.no_analytics:
        _print_counters(console, stats, elapsed, poison)
        console.print(f"retried messages and latencies: `spoolmq analytics --data {data}`")
        return 0
    from spoolmq.analytics import analyse

    console.print("[bold]running the Spark analytics over the demo's store[/bold]")
    result = analyse(data)
    _print_figures(console, result.summary, elapsed, poison)
    console.print(f"report: {result.report}")
    return 0


def _print_counters(console: Any, stats: dict[str, Any], elapsed: float, poison: int) -> None:
    """The broker's live counters: events, not messages (a message NACKed twice counts
    twice), so no "retried" here; the analytics count retried messages."""
    from rich.table import Table

    consumer = stats.get("consumer", {})
    table = Table(title=f"spoolmq demo: {elapsed:.1f} s (broker counters)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("published", str(stats.get("publisher", {}).get("messages", 0)))
    table.add_row("delivered (all attempts)", str(consumer.get("delivered", 0)))
    table.add_row("acked", str(consumer.get("acked", 0)))
    table.add_row("NACKs (failed attempts)", str(consumer.get("nacked", 0)))
    table.add_row(f"dead-lettered (expected {poison})", str(consumer.get("dead_lettered", 0)))
    console.print(table)


def _print_figures(console: Any, summary: dict[str, Any], elapsed: float, poison: int) -> None:
    """The demo's figures as the analytics computed them (summary.json's ``by_group``), so
    they are the report's, by construction."""
    from rich.table import Table

    mine = summary["by_group"].get(GROUP, {}).get(TOPIC, {})
    table = Table(title=f"spoolmq demo: {elapsed:.1f} s (from the analytics' summary.json)")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_column("what it means")
    table.add_row("published", str(summary["topics"].get(TOPIC, {}).get("messages", 0)), "")
    table.add_row("acked", str(mine.get("acked", 0)), f"by group {GROUP}")
    table.add_row("retried", str(mine.get("retried", 0)), "messages delivered more than once")
    table.add_row(
        f"dead-lettered (expected {poison})", str(mine.get("dead_lettered", 0)), "after 3 attempts"
    )
    waits = (
        ("e2e", "e2e_latency_ms", "publish to first delivery, every message"),
        ("queue", "queue_latency_ms", "the same, only messages due at once whose key was free"),
    )
    for name, field, meaning in waits:
        figures = mine.get(field) or {}
        for label in ("p50", "p99"):
            value = figures.get(label)
            shown = "–" if value is None else f"{value:.1f} ms"
            table.add_row(f"{name} latency {label}", shown, meaning if label == "p50" else "")
    console.print(table)
    console.print(
        "e2e includes waiting for a delay and behind an earlier delayed or retrying message "
        "of the same key (the broker delivers a key's messages in order, one at a time); "
        "queue latency leaves those messages out: it is what the queue itself took."
    )
