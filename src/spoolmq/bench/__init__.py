"""``spoolmq bench``: throughput, latency, memory and disk figures, each phase in a fresh store,
optionally side by side with Redis Streams driven the same way from the same machine.

Phases:
  produce   P publisher processes send N messages as fast as they can; all ACKed.
  consume   C consumer processes of one group drain N pre-stored messages, ACKing each.
  latency   one publisher at a fixed offered rate, one consumer; publish-to-receive times.
  prefilled (with --prefill M) a broker started on a store already holding M messages:
            its start time and memory, then produce and consume as above on that store.

With --compare redis the produce and consume phases also run on a redis-server the bench
starts (and stops, also on Ctrl-C or SIGTERM), taking turns with spoolmq.

Every phase counts duplicates and missing messages exactly (by message id).

This module is the command (its arguments and the order of the phases); ``phases`` measures
spoolmq, ``peers`` runs Redis, ``workers`` are the processes both start, ``machine`` samples
memory, CPU and the disk, ``report`` prints and writes the results.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import signal
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spoolmq.bench import peers, phases, report
from spoolmq.bench.machine import disk_facts, machine_facts
from spoolmq.bench.workers import Progress
from spoolmq.errors import InvalidArgumentError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_arguments", "run"]

PHASES = ("produce", "consume", "latency")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``spoolmq bench`` (the CLI adds ``--data``, which the bench ignores)."""
    parser.add_argument("--n", type=int, default=100_000, help="messages per throughput phase")
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--consumers", type=int, default=2)
    parser.add_argument("--size", type=int, default=200, help="approximate message bytes")
    parser.add_argument("--rate", type=int, default=2000, help="offered msg/s of the latency phase")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of the latency phase")
    parser.add_argument("--acks", default="all", choices=["0", "1", "all"])
    parser.add_argument("--partitions", type=int, default=1)
    parser.add_argument("--prefill", type=int, default=0, help="also measure with N stored")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each throughput phase (spoolmq and Redis in turn); the median is kept",
    )
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    parser.add_argument("--compare", choices=["redis"], help="run the same workload on Redis")
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated")


def _phases(args: argparse.Namespace) -> set[str]:
    """The phases asked for, after every number is checked; InvalidArgumentError if not."""
    for name in ("n", "producers", "consumers", "size", "rate", "partitions", "repeat"):
        if getattr(args, name) < 1:
            raise InvalidArgumentError(f"--{name} must be at least 1")
    if args.duration <= 0:
        raise InvalidArgumentError("--duration must be positive")
    if args.prefill < 0:
        raise InvalidArgumentError("--prefill must not be negative")
    phases = {p.strip() for p in args.phases.split(",") if p.strip()}
    unknown = phases - set(PHASES)
    if unknown:
        raise InvalidArgumentError(f"unknown phase(s) {', '.join(sorted(unknown))}")
    return phases


def _redis_available(console: Console) -> bool:
    """Whether redis-server and the Python client are installed; says how to get them if not."""
    if shutil.which("redis-server") is None:
        console.print(
            "[yellow]redis-server is not installed; for the comparison install it with "
            "`sudo apt-get install redis-server` (Debian/Ubuntu), `sudo dnf install redis` "
            "(Fedora) or `brew install redis` (macOS). Running spoolmq alone.[/yellow]",
            soft_wrap=True,
        )
        return False
    if importlib.util.find_spec("redis") is None:
        console.print(
            "[yellow]the Python client for the comparison is missing: `uv sync` in a checkout "
            "(it is a development dependency) or `pip install redis hiredis`. Running spoolmq "
            "alone.[/yellow]",
            soft_wrap=True,
        )
        return False
    return True


def _interrupted(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM: stop like Ctrl-C, so every server started is stopped


def run(args: argparse.Namespace) -> int:
    """Run the phases ``args`` ask for, print the table and write ``--json``; returns 0."""
    from rich.console import Console

    console = Console(stderr=True)
    wanted = _phases(args)
    compare = args.compare == "redis" and _redis_available(console)
    results: dict[str, Any] = {
        "parameters": {
            k: v for k, v in vars(args).items() if k not in ("handler", "command", "data")
        },
        "machine": machine_facts(),
        "spoolmq": {},
    }
    root = Path(tempfile.mkdtemp(prefix="spoolmq-bench-"))
    results["machine"].update(disk_facts(root))
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        with console.status("benchmarking") as status:

            def step(name: str) -> Progress:
                status.update(name)
                return lambda text: status.update(f"{name}: {text}")

            spool = results["spoolmq"]
            if compare:
                results["redis"] = {"client": peers.redis_versions()}
            throughput = {
                "produce": (phases.spool_produce, peers.redis_produce, "produce"),
                "consume": (phases.spool_consume, peers.redis_consume, "consume + ACK"),
            }
            for phase, (spool_phase, redis_phase, title) in throughput.items():
                if phase not in wanted:
                    continue
                # spoolmq and Redis take turns, so both see the same load on a shared machine.
                spool_runs, redis_runs = [], []
                for attempt in range(args.repeat):
                    of = f" (run {attempt + 1} of {args.repeat})" if args.repeat > 1 else ""
                    spool_runs.append(spool_phase(root, args, step(f"spoolmq {title}{of}")))
                    if compare:
                        redis_runs.append(redis_phase(root, args, step(f"redis {title}{of}")))
                spool[phase] = report.median_run(spool_runs)
                if compare:
                    results["redis"][phase] = report.median_run(redis_runs)
            if "latency" in wanted:
                spool["latency"] = phases.spool_latency(
                    root, args, step(f"spoolmq latency at {args.rate} msg/s")
                )
            if args.prefill:
                prefilled = phases.spool_prefilled(
                    root, args, step(f"spoolmq, {args.prefill:,} stored")
                )
                report.compare_with_empty(prefilled, spool)
                spool["prefilled"] = prefilled
            if compare:
                results["ratios"] = report.throughput_ratios(spool, results["redis"])
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(root, ignore_errors=True)
    results["machine"]["load_average_end"] = list(os.getloadavg())
    report.print_table(results)
    if args.json:
        report.write_json(args.json, results)
    return 0
