"""``spoolmq bench``: throughput, latency, memory and disk figures, each phase in a fresh store,
optionally side by side with Redis Streams, NATS JetStream and RabbitMQ driven the same way
from the same machine.

Phases:
  produce   P publisher processes send N messages as fast as they can; all ACKed.
  consume   C consumer processes of one group drain N pre-stored messages, ACKing each.
  latency   one publisher at a fixed offered rate, one consumer; publish-to-receive times;
            once per rate of ``--rate R1,R2,...``.
  prefilled (with --prefill M) a broker started on a store already holding M messages:
            its start time and memory, then produce and consume as above on that store.

With --compare redis,nats,rabbitmq (any subset) the produce and consume phases also run on
a redis-server, a nats-server with JetStream and a RabbitMQ node the bench starts (and stops,
also on Ctrl-C or SIGTERM), taking turns with spoolmq. ``--partitions N`` gives spoolmq's
topic N partitions; the peers keep one stream or queue each (see ``PEER_PARTITIONS``).

Every phase counts duplicates and missing messages exactly (by message id).

With --client native,asyncio,kafka (see ``clients``) the produce, consume and latency phases run
once per spoolmq client, in turn, each on a fresh broker; the first client's figures are
the main ones (and the ones compared with the peers), every client's are under
``clients`` in the JSON and in a table of their own.

This module is the command (its arguments and the order of the phases); ``phases`` measures
spoolmq, ``peers`` lists the peers and runs Redis, ``jetstream`` and ``rabbitmq`` run the other
two, ``workers`` are the processes they start, ``machine`` samples memory, CPU and the disk,
``report`` prints and writes the results.
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

from spoolmq.bench import clients as bench_clients
from spoolmq.bench import peers, phases, report
from spoolmq.bench.machine import disk_facts, machine_facts
from spoolmq.bench.workers import Progress
from spoolmq.errors import InvalidArgumentError

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["add_arguments", "run"]

PHASES = ("produce", "consume", "latency")

PEER_PARTITIONS = (
    "the peers run on one stream or queue whatever --partitions says: a Redis stream, a "
    "JetStream stream and a quorum queue are each one ordered log with one leader, and their "
    "way to spread load is several streams or queues, each consumer bound to some of them, "
    "which is a different workload from one consumer group sharing one topic"
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``spoolmq bench`` (the CLI adds ``--data``, which the bench ignores)."""
    parser.add_argument("--n", type=int, default=100_000, help="messages per throughput phase")
    parser.add_argument(
        "--producers", type=int, default=2, help="publishing processes in the produce phase"
    )
    parser.add_argument(
        "--consumers", type=int, default=2, help="consuming processes in the consume phase"
    )
    parser.add_argument("--size", type=int, default=200, help="approximate message bytes")
    parser.add_argument(
        "--rate",
        default="2000",
        help="offered msg/s of the latency phase; several (2000,20000) are measured in turn",
    )
    parser.add_argument(
        "--duration", type=float, default=10.0, help="seconds of the latency phase, per rate"
    )
    parser.add_argument(
        "--acks",
        default="all",
        choices=["0", "1", "all"],
        help="what the publishers wait for (all: the fdatasync)",
    )
    parser.add_argument(
        "--partitions", type=int, default=1, help="partitions of spoolmq's topic (peers: one)"
    )
    parser.add_argument("--prefill", type=int, default=0, help="also measure with N stored")
    parser.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="runs of each throughput phase (spoolmq and the peers in turn); the median is kept",
    )
    parser.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    parser.add_argument(
        "--compare",
        default="",
        metavar="PEERS",
        help="run the same workload on these peers too: any of redis,nats,rabbitmq",
    )
    parser.add_argument("--phases", default=",".join(PHASES), help="comma-separated")
    parser.add_argument(
        "--client",
        default="native",
        metavar="CLIENTS",
        help="the spoolmq client(s) driving the phases, each in turn on a fresh broker: any of "
        f"{','.join(bench_clients.CLIENTS)} (the first one's figures are the main ones)",
    )


def _names(text: str) -> list[str]:
    return [name.strip() for name in text.split(",") if name.strip()]


def _rates(text: str) -> list[int]:
    """``--rate``'s comma-separated rates; InvalidArgumentError unless each is a positive
    whole number of messages per second."""
    rates = []
    for name in _names(text) or [text]:
        try:
            rate = int(name)
        except ValueError:
            raise InvalidArgumentError(
                f"--rate takes whole numbers of msg/s separated by commas, not {name!r}"
            ) from None
        if rate < 1:
            raise InvalidArgumentError(f"--rate must be at least 1 msg/s, not {rate}")
        rates.append(rate)
    if len(set(rates)) != len(rates):
        raise InvalidArgumentError(f"--rate names a rate twice: {text}")
    return rates


def _peers(text: str) -> list[str]:
    """``--compare``'s peers, in the order given; InvalidArgumentError for an unknown one."""
    chosen = list(dict.fromkeys(_names(text)))
    unknown = [name for name in chosen if name not in peers.PEERS]
    if unknown:
        raise InvalidArgumentError(
            f"--compare: unknown peer(s) {', '.join(unknown)}; choose from {','.join(peers.PEERS)}"
        )
    return chosen


def _phases(args: argparse.Namespace) -> set[str]:
    """The phases asked for, after every number is checked (``--rate`` and ``--compare``
    become lists); InvalidArgumentError if one is wrong."""
    args.rate = _rates(str(args.rate))
    args.compare = _peers(args.compare or "")
    args.client = [client.name for client in bench_clients.chosen(str(args.client))]
    for name in ("n", "producers", "consumers", "size", "partitions", "repeat"):
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


PIP_NAMES = {"redis": "redis hiredis", "nats": "nats-py"}
"""The packages that provide a peer's client modules, where their names differ."""


def _available(peer: peers.Peer, console: Console) -> bool:
    """Whether the peer's server and Python client are installed; says how to get them if
    not (the bench then runs without that peer)."""
    if peer.locate() is None:
        console.print(
            f"[yellow]{peer.program} is not installed; for the comparison with {peer.title} "
            f"install it with {peer.install}. Running without {peer.name}.[/yellow]",
            soft_wrap=True,
        )
        return False
    missing = [module for module in peer.clients if importlib.util.find_spec(module) is None]
    if missing:
        console.print(
            f"[yellow]the Python client for the comparison with {peer.title} is missing: "
            "`uv sync` in a checkout (the `bench` dependency group) or `pip install "
            f"{' '.join(PIP_NAMES.get(m, m) for m in missing)}`. Running without "
            f"{peer.name}.[/yellow]",
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
    compared = [name for name in args.compare if _available(peers.PEERS[name], console)]
    results: dict[str, Any] = {
        "parameters": {
            k: v for k, v in vars(args).items() if k not in ("handler", "command", "data")
        },
        "machine": machine_facts(),
        "spoolmq": {},
    }
    if compared:
        results["durability"] = {
            "spoolmq": peers.SPOOLMQ_DURABILITY,
            **{name: peers.PEERS[name].durability for name in compared},
        }
        if args.partitions > 1:
            results["parameters"]["peer_partitions"] = PEER_PARTITIONS
    root = Path(tempfile.mkdtemp(prefix="spoolmq-bench-"))
    results["machine"].update(disk_facts(root))
    previous = signal.signal(signal.SIGTERM, _interrupted)
    try:
        with console.status("benchmarking") as status:

            def step(name: str) -> Progress:
                status.update(name)
                return lambda text: status.update(f"{name}: {text}")

            spool = results["spoolmq"]
            clients = [bench_clients.CLIENTS[name] for name in args.client]
            by_client: dict[str, dict[str, Any]] = {client.name: {} for client in clients}
            first = clients[0]
            for name in compared:
                results[name] = {"client": peers.PEERS[name].versions()}
            throughput = {"produce": (phases.spool_produce, "produce"),
                          "consume": (phases.spool_consume, "consume + ACK")}  # fmt: skip
            for phase, (spool_phase, title) in throughput.items():
                if phase not in wanted:
                    continue
                # spoolmq and the peers take turns, so all see the same load on a shared
                # machine.
                runs: dict[str, list[dict[str, Any]]] = {"spoolmq": []}
                for attempt in range(args.repeat):
                    of = f" (run {attempt + 1} of {args.repeat})" if args.repeat > 1 else ""
                    for client in clients:  # the clients take turns too
                        label = f"spoolmq {title}{of}, {client.name} client"
                        runs.setdefault(client.name, []).append(
                            spool_phase(root, args, step(label), client)
                        )
                    runs["spoolmq"] = runs[first.name]
                    for name in compared:
                        peer_phase = getattr(peers.PEERS[name], phase)
                        runs.setdefault(name, []).append(
                            peer_phase(root, args, step(f"{name} {title}{of}"))
                        )
                spool[phase] = report.median_run(runs["spoolmq"])
                for client in clients:
                    by_client[client.name][phase] = report.median_run(runs[client.name])
                for name in compared:
                    results[name][phase] = report.median_run(runs[name])
            if "latency" in wanted:
                for client in clients:
                    by_rate = {
                        str(rate): phases.spool_latency(
                            root,
                            args,
                            rate,
                            step(f"spoolmq latency at {rate:,} msg/s, {client.name} client"),
                            client,
                        )
                        for rate in args.rate
                    }
                    by_client[client.name]["latency"] = by_rate[str(args.rate[0])]
                    by_client[client.name]["latency_by_rate"] = by_rate
                # The first rate's figures where they always were; every rate's beside them.
                spool["latency"] = by_client[first.name]["latency"]
                spool["latency_by_rate"] = by_client[first.name]["latency_by_rate"]
            if len(clients) > 1:
                results["clients"] = by_client
            if args.prefill:
                prefilled = phases.spool_prefilled(
                    root, args, step(f"spoolmq, {args.prefill:,} stored")
                )
                report.compare_with_empty(prefilled, spool)
                spool["prefilled"] = prefilled
            if "redis" in compared:
                results["ratios"] = report.throughput_ratios(spool, results["redis"])
            if compared:
                results["ratios_by_peer"] = report.ratios_by_peer(results, compared)
    finally:
        signal.signal(signal.SIGTERM, previous)
        shutil.rmtree(root, ignore_errors=True)
    results["machine"]["load_average_end"] = list(os.getloadavg())
    report.print_table(results, compared)
    if "clients" in results:
        bench_clients.print_comparison(results["clients"], console)
    if args.json:
        report.write_json(args.json, results)
    return 0
