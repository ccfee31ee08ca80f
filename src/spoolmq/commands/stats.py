"""``spoolmq stats``: a running broker's figures over the admin connection, once or every
N seconds (``--watch N``, like ``rq info --interval``), with rates between two samples.

The figures are the children's counters the manager keeps (sent every second), so a rate
is the difference of two samples over the time between them. :func:`sample` and
:func:`rates` are shared with ``spoolmq top``; :func:`metrics_text` renders the Prometheus
text for a data directory (``spoolmq ui`` serves it at ``/metrics``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from spoolmq.commands.common import CommandFactory, print_json, table_console
from spoolmq.errors import InvalidArgumentError

# The counters a rate is shown for: (label, where in the stats answer).
RATE_FIGURES = (
    ("published", ("publisher", "messages")),
    ("delivered", ("consumer", "delivered")),
    ("acked", ("consumer", "acked")),
    ("nacked", ("consumer", "nacked")),
    ("dead-lettered", ("consumer", "dead_lettered")),
)


@dataclass(frozen=True, slots=True)
class Sample:
    """One ``stats`` answer and when it was taken (monotonic seconds)."""

    at: float
    stats: Mapping[str, Any]


def sample(admin: Any) -> Sample:
    stats = admin.stats()
    stats.pop("id", None)
    stats.pop("op", None)
    return Sample(time.monotonic(), stats)


def _figure(stats: Mapping[str, Any], where: tuple[str, str]) -> int:
    return int((stats.get(where[0]) or {}).get(where[1], 0))


def rates(before: Sample | None, after: Sample) -> dict[str, float | None]:
    """Messages per second of each of :data:`RATE_FIGURES` between two samples (None
    without an earlier sample). A child that restarted counts from zero again: a negative
    difference is shown as no rate rather than a negative one."""
    result: dict[str, float | None] = {}
    for label, where in RATE_FIGURES:
        if before is None or after.at <= before.at:
            result[label] = None
            continue
        change = _figure(after.stats, where) - _figure(before.stats, where)
        result[label] = None if change < 0 else change / (after.at - before.at)
    return result


def duration(seconds: float | None) -> str:
    """``3d 4h``, ``2h 05m``, ``4m 07s``, ``12s``: as an uptime is read.

    >>> duration(3725.2)
    '1h 02m'
    >>> duration(None)
    'restarting'
    """
    if seconds is None:
        return "restarting"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes:02d}m"
    if minutes:
        return f"{minutes}m {secs:02d}s"
    return f"{secs}s"


def per_second(rate: float | None) -> str:
    return "" if rate is None else f"{rate:,.1f}/s"


def stats_rows(now: Sample, before: Sample | None) -> list[list[str]]:
    """The ``stats`` table: a label in words, the value, and a rate where one applies."""
    stats = now.stats
    publisher = stats.get("publisher") or {}
    consumer = stats.get("consumer") or {}
    clients = stats.get("clients") or {}
    pids = stats.get("pids") or {}
    ready = stats.get("ready_s") or {}
    restarts = stats.get("restarts") or {}
    rate = rates(before, now)
    rows = [
        ["broker process", f"pid {stats.get('pid')}", ""],
        ["broker uptime", duration(stats.get("uptime_s")), ""],
    ]
    for child in ("publisher", "consumer"):
        rows.append(
            [
                f"{child} broker",
                f"pid {pids.get(child)}, up {duration(ready.get(child))}, "
                f"restarted {restarts.get(child, 0)} times",
                "",
            ]
        )
    rows += [
        ["connected publishers", str(clients.get("publisher", 0)), ""],
        ["connected consumers", str(clients.get("consumer", 0)), ""],
        ["admin connections", str(clients.get("admin", 0)), ""],
        ["messages published", f"{publisher.get('messages', 0):,}", per_second(rate["published"])],
        ["publish requests", f"{publisher.get('frames', 0):,}", ""],
        ["messages refused", f"{publisher.get('errors', 0):,}", ""],
        ["messages delivered", f"{consumer.get('delivered', 0):,}", per_second(rate["delivered"])],
        ["messages acknowledged", f"{consumer.get('acked', 0):,}", per_second(rate["acked"])],
        [
            "messages given back (NACK)",
            f"{consumer.get('nacked', 0):,}",
            per_second(rate["nacked"]),
        ],
        [
            "messages dead-lettered",
            f"{consumer.get('dead_lettered', 0):,}",
            per_second(rate["dead-lettered"]),
        ],
        ["messages expired (TTL)", f"{consumer.get('expired', 0):,}", ""],
        ["messages skipped (retention)", f"{consumer.get('skipped', 0):,}", ""],
        ["consumer groups", str(consumer.get("groups", 0)), ""],
        ["messages in flight", f"{consumer.get('in_flight', 0):,}", ""],
    ]
    return rows


def _table(now: Sample, before: Sample | None) -> Any:
    from rich.table import Table

    table = Table(title="broker")
    for column in ("figure", "value", "rate"):
        table.add_column(column)
    for row in stats_rows(now, before):
        table.add_row(*row)
    return table


def check_interval(seconds: float, option: str = "--watch") -> float:
    """A refresh interval: finite, from 0.1 s (faster only loads the broker) to a day."""
    if not math.isfinite(seconds) or seconds < 0.1 or seconds > 86400:
        raise InvalidArgumentError(f"{option} takes seconds between 0.1 and 86400, not {seconds!r}")
    return seconds


def cmd_stats(args: argparse.Namespace) -> int:
    from spoolmq.client import Admin

    interval = None if args.watch is None else check_interval(args.watch)
    console = table_console()
    with Admin(args.data) as admin:
        before = None
        now = sample(admin)
        if interval is None:
            if args.json:
                print_json(dict(now.stats))
            else:
                console.print(_table(now, None))
            return 0
        try:
            while True:
                if args.json:
                    line = orjson.dumps({**now.stats, "rates": rates(before, now)})
                    sys.stdout.write(line.decode() + "\n")
                    sys.stdout.flush()
                else:
                    console.clear()
                    console.print(_table(now, before))
                    console.print(f"every {interval:g} s; Ctrl-C to stop", style="dim")
                time.sleep(interval)
                before, now = now, sample(admin)
        except KeyboardInterrupt:
            return 0


def seconds_argument(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None


def metrics_text(data: Path) -> bytes:
    """The Prometheus text for ``data``: the running broker's figures over the admin
    connection when one runs, what the store holds otherwise (``spoolmq ui``'s
    ``/metrics``)."""
    from spoolmq.broker.manager import broker_running
    from spoolmq.broker.metrics import Snapshot, render
    from spoolmq.client import Admin

    snapshot = Snapshot()
    if broker_running(data):
        with Admin(data) as admin:
            snapshot = Snapshot(sample(admin).stats, admin.describe_groups())
    return render(data, snapshot)


def register(command: CommandFactory) -> None:
    p = command("stats", cmd_stats, "a running broker's figures")
    p.add_argument("--json", action="store_true", help="JSON (one object a line with --watch)")
    p.add_argument(
        "--watch",
        type=seconds_argument,
        metavar="N",
        help="show the figures again every N seconds, with rates, until Ctrl-C",
    )
