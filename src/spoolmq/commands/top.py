"""``spoolmq top``: a live full-screen view of a running broker, refreshed every second.

Rates (published, delivered, ACKed, NACKed, dead-lettered per second), the lag and
in-flight messages of each consumer group per topic, the connected clients and each
topic's dead letters. The broker's figures come over the admin connection (``stats`` and
``describe_groups``, as ``spoolmq stats`` and ``groups`` read them); the DLQ depths from
the store's files. The screen is rich's ``Live`` on the alternate screen; the terminal is
put in cbreak mode so that one key, ``q``, quits without Enter (Ctrl-C quits too).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import select
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from spoolmq.commands.common import CommandFactory, data_dir
from spoolmq.commands.stats import (
    RATE_FIGURES,
    Sample,
    check_interval,
    duration,
    rates,
    sample,
    seconds_argument,
)
from spoolmq.errors import ConfigError


@contextlib.contextmanager
def _keys() -> Iterator[int | None]:
    """Standard input in cbreak mode (keys arrive one at a time, unechoed), restored on
    the way out; None when it is not a terminal (then only a signal stops ``top``)."""
    if not sys.stdin.isatty():
        yield None
        return
    import termios
    import tty

    fd = sys.stdin.fileno()
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        yield fd
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _wait_for_quit(fd: int | None, seconds: float) -> bool:
    """Wait up to ``seconds``; True as soon as ``q`` is pressed."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        if fd is None:
            time.sleep(left)
            return False
        readable, _, _ = select.select([fd], [], [], left)
        if readable:
            typed = os.read(fd, 64)
            if not typed:  # end of input: nothing more will be typed
                time.sleep(max(0.0, deadline - time.monotonic()))
                return False
            if b"q" in typed.lower():
                return True
    return False


def group_totals(groups: Mapping[str, Any]) -> list[list[str]]:
    """Per group and topic: lag and in-flight summed over partitions, and consumers."""
    rows = []
    for name in sorted(groups):
        info = groups[name]
        by_topic: dict[str, list[int]] = {}
        for row in info["partitions"]:
            totals = by_topic.setdefault(row["topic"], [0, 0])
            totals[0] += row["lag"]
            totals[1] += row["in_flight"]
        consumers = str(len(info.get("consumers", ())))
        for topic in sorted(by_topic):
            lag, in_flight = by_topic[topic]
            rows.append([name, topic, f"{lag:,}", f"{in_flight:,}", consumers])
    return rows


def screen(
    now: Sample,
    before: Sample | None,
    groups: Mapping[str, Any],
    dlq: Mapping[str, int],
    every: float,
) -> Any:
    """What one refresh shows."""
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    stats = now.stats
    clients = stats.get("clients") or {}
    consumer = stats.get("consumer") or {}
    header = Text.assemble(
        ("spoolmq top", "bold"),
        f"  broker pid {stats.get('pid')}, up {duration(stats.get('uptime_s'))}"
        f"  ·  publishers {clients.get('publisher', 0)}"
        f"  ·  consumers {clients.get('consumer', 0)}"
        f"  ·  groups {consumer.get('groups', 0)}"
        f"  ·  in flight {consumer.get('in_flight', 0):,}",
    )
    rate = rates(before, now)
    rate_table = Table(title="messages", expand=True)
    rate_table.add_column("")
    for label, _ in RATE_FIGURES:
        rate_table.add_column(label, justify="right")
    rate_table.add_row(
        "per second",
        *("…" if (r := rate[label]) is None else f"{r:,.1f}" for label, _ in RATE_FIGURES),
    )
    rate_table.add_row(
        "total",
        *(f"{(stats.get(where[0]) or {}).get(where[1], 0):,}" for _, where in RATE_FIGURES),
    )
    group_table = Table(title="consumer groups", expand=True)
    for column in ("group", "topic", "lag", "in flight", "consumers"):
        group_table.add_column(column, justify="left" if column in ("group", "topic") else "right")
    for row in group_totals(groups):
        group_table.add_row(*row)
    dlq_table = Table(title="dead letters", expand=True)
    dlq_table.add_column("topic")
    dlq_table.add_column("in its DLQ", justify="right")
    for topic in sorted(dlq):
        dlq_table.add_row(topic, f"{dlq[topic]:,}")
    footer = Text(f"q quits · refreshed every {every:g} s", style="dim")
    return Group(header, rate_table, group_table, dlq_table, footer)


def _dlq_depths(data: Path) -> dict[str, int]:
    from spoolmq.broker.metrics import dlq_depths
    from spoolmq.store import Store

    with Store(data) as store:
        return dlq_depths(store)


def cmd_top(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.live import Live

    from spoolmq.client import Admin

    every = check_interval(args.interval, "--interval")
    if not sys.stdout.isatty():
        # Its screen needs one: into a pipe or a file, it wrote nothing and never ended.
        raise ConfigError(
            "spoolmq top needs a terminal; for a pipe or a log, `spoolmq stats --watch N` "
            "(add --json for one object a line)"
        )
    data = data_dir(args, must_exist=True)
    with Admin(data) as admin:
        before: Sample | None = None
        now = sample(admin)
        try:
            with (
                _keys() as fd,
                Live(console=Console(), screen=True, auto_refresh=False) as live,
            ):
                while True:
                    live.update(
                        screen(now, before, admin.describe_groups(), _dlq_depths(data), every),
                        refresh=True,
                    )
                    if _wait_for_quit(fd, every):
                        return 0
                    before, now = now, sample(admin)
        except KeyboardInterrupt:
            return 0


def register(command: CommandFactory) -> None:
    p = command("top", cmd_top, "a live full-screen view of a running broker (q quits)")
    p.add_argument(
        "--interval",
        type=seconds_argument,
        default=1.0,
        metavar="SECONDS",
        help="refresh every (1)",
    )
