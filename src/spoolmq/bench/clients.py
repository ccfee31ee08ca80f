"""The spoolmq clients ``spoolmq bench --client`` can drive, one entry each: the same
phases run with each client in turn, on a fresh broker each, so their figures compare
within one run. A client is four functions with the threaded client's signatures (see
``workers.py``): a producer process, a consumer process, the latency phase's consumer
process, and its paced publisher (run in the bench's own process)."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from spoolmq.bench import aio, kafka, workers
from spoolmq.errors import InvalidArgumentError


class Client(NamedTuple):
    name: str
    title: str
    producer: Callable[..., None]
    consumer: Callable[..., None]
    latency_consumer: Callable[..., None]
    latency_publisher: Callable[[Path, str, int, int, int, Any], tuple[float, float]]
    broker_args: tuple[str, ...] = ()  # what the broker under test needs for this client
    needs: str | None = None  # a module the client imports (checked before a run)


NATIVE = Client(
    "native",
    "threaded Publisher/Consumer",
    workers.spool_producer,
    workers.spool_consumer,
    workers.spool_latency_consumer,
    workers.spool_latency_publisher,
)

CLIENTS: dict[str, Client] = {
    client.name: client
    for client in (
        NATIVE,
        Client(
            "asyncio",
            "AsyncPublisher/AsyncConsumer",
            aio.aio_producer,
            aio.aio_consumer,
            aio.aio_latency_consumer,
            aio.aio_latency_publisher,
        ),
        Client(
            "kafka",
            "confluent-kafka through the Kafka listener",
            kafka.kafka_producer,
            kafka.kafka_consumer,
            kafka.kafka_latency_consumer,
            kafka.kafka_latency_publisher,
            broker_args=("--kafka", "127.0.0.1:0"),
            needs="confluent_kafka",
        ),
        Client(
            "kafka-defaults",
            "confluent-kafka, idempotence off (librdkafka's default)",
            functools.partial(kafka.kafka_producer, idempotent=False),
            kafka.kafka_consumer,
            kafka.kafka_latency_consumer,
            functools.partial(kafka.kafka_latency_publisher, idempotent=False),
            broker_args=("--kafka", "127.0.0.1:0"),
            needs="confluent_kafka",
        ),
    )
}
"""Every client by its ``--client`` name; another client is one more entry here."""


def chosen(text: str) -> list[Client]:
    """``--client``'s comma-separated names, in the order given; InvalidArgumentError for
    an unknown one."""
    names = list(dict.fromkeys(name.strip() for name in text.split(",") if name.strip()))
    unknown = [name for name in names if name not in CLIENTS]
    if unknown or not names:
        raise InvalidArgumentError(
            f"--client: unknown client(s) {', '.join(unknown) or repr(text)}; "
            f"choose from {','.join(CLIENTS)}"
        )
    clients = [CLIENTS[name] for name in names]
    for client in clients:
        if client.needs is not None and importlib.util.find_spec(client.needs) is None:
            raise InvalidArgumentError(
                f"--client {client.name} needs the {client.needs} package "
                "(`pip install confluent-kafka 'spoolmq[kafka]'`)"
            )
    return clients


FIGURES = {
    "produce": ("msgs_per_s", "publishers_cpu_us_per_message", "broker_cpu_us_per_message"),
    "consume": (
        "msgs_per_s",
        "first_received_s",
        "msgs_per_s_after_first",
        "consumers_cpu_us_per_message",
        "broker_cpu_us_per_message",
    ),
    "latency": ("p50_ms", "p99_ms", "publisher_cpu_us_per_message", "consumer_cpu_us_per_message"),
}
"""The figures the comparison of clients shows, by phase."""


def print_comparison(by_client: dict[str, dict[str, Any]], console: Any) -> None:
    """The clients' figures side by side, as a table on ``console`` (a rich Console)."""
    from rich.table import Table

    names = list(by_client)
    table = Table(title="spoolmq clients compared (same run, a fresh broker each)")
    for column in ["phase", "figure", *names, *(f"{n} / {names[0]}" for n in names[1:])]:
        table.add_column(column, justify="left" if column in ("phase", "figure") else "right")
    for row in comparison(by_client):
        table.add_row(*row)
    console.print(table)


def comparison(by_client: dict[str, dict[str, Any]]) -> list[list[str]]:
    """Rows ``[phase, figure, value per client...]`` of the clients' figures side by side,
    the last column each client's ratio to the first one."""
    names = list(by_client)
    rows = []
    for phase, figures in FIGURES.items():
        for figure in figures:
            values = [by_client[name].get(phase, {}).get(figure) for name in names]
            if all(value is None for value in values):
                continue
            row = [phase, figure, *("-" if v is None else f"{v:,}" for v in values)]
            first = values[0]
            row += [
                f"{v / first:.2f}" if isinstance(v, int | float) and first else "-"
                for v in values[1:]
            ]
            rows.append(row)
    return rows
