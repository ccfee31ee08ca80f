"""``spoolmq demo``: a broker, publisher and consumer processes, and a realistic workload.

Order events with customer keys on four partitions; some are delayed, some handlers fail
once (retried) and some always fail (dead-lettered). Live progress, a summary with latency
percentiles from the delivery events, then the Spark analytics over the result.
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

import orjson

from spoolmq.client import Admin, Consumer, Publisher, ReceivedMessage
from spoolmq.errors import SpoolError
from spoolmq.stats import percentile
from spoolmq.store import Store
from spoolmq.testing import BrokerProcess
from spoolmq.types import EventType

TOPIC = "orders"
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
        "billing",
        data=data,
        prefetch=20,
        max_deliveries=3,
        retry_backoff=0.2,
        retry_backoff_max=1.0,
        name=f"demo-consumer-{number}",
    ) as consumer:
        consumer.run(_handle, idle_timeout=4.0)


def _latencies(data: Path) -> dict[str, list[float]]:
    first_delivery: dict[tuple[str, int, int], float] = {}
    acked: dict[tuple[str, int, int], float] = {}
    for path in sorted((data / "events").glob("date=*/*.jsonl")):
        for line in path.read_bytes().splitlines():
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            if event.get("group") != "billing" or event.get("published_at") is None:
                continue
            key = (event["topic"], event["partition"], event["offset"])
            wait = event["ts"] - event["published_at"]
            if event["type"] == EventType.DELIVERED and key not in first_delivery:
                first_delivery[key] = wait
            elif event["type"] == EventType.ACKED:
                acked[key] = wait
    return {"first delivery": list(first_delivery.values()), "ack": list(acked.values())}


def run_demo(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn
    from rich.table import Table

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
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
        broker.stop(signal.SIGINT)
    consumer_stats = stats.get("consumer", {})
    latencies = _latencies(data)
    table = Table(title=f"spoolmq demo: {elapsed:.1f} s")
    table.add_column("figure")
    table.add_column("value", justify="right")
    table.add_row("published", str(stats.get("publisher", {}).get("messages", 0)))
    table.add_row("delivered (all attempts)", str(consumer_stats.get("delivered", 0)))
    table.add_row("acked", str(consumer_stats.get("acked", 0)))
    table.add_row("retried (NACKed)", str(consumer_stats.get("nacked", 0)))
    table.add_row(f"dead-lettered (expected {poison})", str(consumer_stats.get("dead_lettered", 0)))
    for name, values in latencies.items():
        for label, fraction in (("p50", 0.5), ("p99", 0.99)):
            table.add_row(f"publish to {name} {label}", f"{percentile(values, fraction):.1f} ms")
    console.print(table)
    console.print(f"DLQ: `spoolmq dlq list {TOPIC} --data {data}`")
    if not args.no_analytics:
        from spoolmq.analytics import main

        console.print("[bold]running the Spark analytics over the demo's store[/bold]")
        return main(["--data", str(data)])
    return 0
