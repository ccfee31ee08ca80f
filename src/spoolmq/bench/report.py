"""How ``spoolmq bench`` reports: the throughput figures every system's phases share, the median
of repeated runs, the ratios between systems and stores, the table and the JSON file."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from spoolmq.stats import micros_each, per_second, ratio


def produce_figures(messages: int, seconds: float) -> dict[str, Any]:
    """The first figures of a produce phase, spoolmq's or Redis's.

    >>> produce_figures(1000, 0.25)
    {'messages': 1000, 'seconds': 0.25, 'msgs_per_s': 4000.0}
    """
    return {
        "messages": messages,
        "seconds": round(seconds, 4),
        "msgs_per_s": round(per_second(messages, seconds), 1),
    }


AFTER_FIRST = "msgs_per_s_after_first"
"""The consume rate from the first messages received to the last: the phase's rate without
the consumers' start (connecting, joining a group: librdkafka's group consumers, for one,
wait 100 ms before asking where a partition without a committed offset begins)."""


def consume_figures(
    messages: int,
    seconds: float,
    ids: list[int],
    completed: bool,
    first: tuple[float, int] | None = None,
) -> dict[str, Any]:
    """The first figures of a consume phase, spoolmq's or Redis's: the rate counts each id
    once, and a drain that did not complete counts as 0 msg/s. ``first``: (seconds from the
    start, count) of the consumers' first count, which gives ``first_received_s`` and the
    rate of the rest, :data:`AFTER_FIRST`.

    >>> consume_figures(3, 0.5, [0, 1, 1, 2], True)
    {'messages': 3, 'seconds': 0.5, 'msgs_per_s': 6.0, 'completed': True}
    >>> figures = consume_figures(1000, 0.5, list(range(1000)), True, (0.3, 100))
    >>> figures["first_received_s"], figures["msgs_per_s_after_first"]
    (0.3, 4500.0)
    """
    figures: dict[str, Any] = {
        "messages": messages,
        "seconds": round(seconds, 4),
        "msgs_per_s": round(per_second(len(set(ids)), seconds), 1) if completed else 0.0,
        "completed": completed,
    }
    if first is not None:
        first_s, first_count = first
        first_s = max(0.0, first_s)  # the start is read just after the consumers pass it
        figures["first_received_s"] = round(first_s, 4)
        rest = len(set(ids)) - first_count
        figures[AFTER_FIRST] = (
            round(per_second(rest, seconds - first_s), 1) if completed and rest > 0 else 0.0
        )
    return figures


def peer_cpu_figures(
    server_seconds: float, clients_seconds: float, messages: int, clients: str
) -> dict[str, float]:
    """A peer's server and client CPU per message (µs), named as spoolmq's are.

    >>> peer_cpu_figures(0.5, 0.25, 100_000, "publishers")
    {'server_cpu_us_per_message': 5.0, 'publishers_cpu_us_per_message': 2.5}
    """
    return {
        "server_cpu_us_per_message": round(micros_each(server_seconds, messages), 2),
        f"{clients}_cpu_us_per_message": round(micros_each(clients_seconds, messages), 2),
    }


def median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the median throughput (the lower middle one of an even count), with
    every run's throughput beside it; a run that did not complete counts as 0 msg/s.

    >>> median_run([{"msgs_per_s": 3.0}, {"msgs_per_s": 1.0}, {"msgs_per_s": 2.0}])
    {'msgs_per_s': 2.0, 'runs_msgs_per_s': [3.0, 1.0, 2.0]}
    """
    ordered = sorted(runs, key=lambda run: float(run["msgs_per_s"]))
    return {
        **ordered[(len(ordered) - 1) // 2],
        "runs_msgs_per_s": [run["msgs_per_s"] for run in runs],
    }


def throughput_ratios(
    ours: dict[str, Any], theirs: dict[str, Any], figure: str = "msgs_per_s"
) -> dict[str, float]:
    """``ours[phase][figure] / theirs[phase][figure]`` for the produce and consume phases
    both have, to 3 decimals.

    >>> throughput_ratios({"produce": {"msgs_per_s": 3}}, {"produce": {"msgs_per_s": 4}})
    {'produce': 0.75}
    """
    ratios: dict[str, float] = {
        phase: round(ratio(float(ours[phase][figure]), float(theirs[phase][figure])), 3)
        for phase in ("produce", "consume")
        if phase in ours and phase in theirs
    }
    if figure == "msgs_per_s":  # the consume rates without the consumers' start, too
        mine, other = (side.get("consume", {}).get(AFTER_FIRST) for side in (ours, theirs))
        if mine is not None and other is not None:
            ratios["consume_after_first"] = round(ratio(float(mine), float(other)), 3)
    return ratios


def compare_with_empty(prefilled: dict[str, Any], empty: dict[str, Any]) -> None:
    """Add to the prefilled store's figures their ratios to the empty store's."""
    prefilled["vs_empty"] = throughput_ratios(prefilled, empty)
    # The broker's CPU per message moves far less with the machine's load than
    # throughput does: the steadier answer to "does a big store slow it down".
    # Another process's CPU is read in 10 ms clock ticks: a short phase's can read 0, and a
    # ratio to 0 says nothing (None then, rather than a ratio to a near-zero floor).
    prefilled["broker_cpu_vs_empty"] = {
        phase: value if empty[phase]["broker_cpu_us_per_message"] > 0 else None
        for phase, value in throughput_ratios(prefilled, empty, "broker_cpu_us_per_message").items()
    }


def _flatten(figures: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for name, value in figures.items():
        if isinstance(value, dict):
            yield from _flatten(value, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", value


def ratios_by_peer(results: dict[str, Any], peers: list[str]) -> dict[str, dict[str, float]]:
    """spoolmq's throughput over each peer's, phase by phase (``ratios_by_peer`` in the JSON).

    >>> ratios_by_peer(
    ...     {"spoolmq": {"produce": {"msgs_per_s": 3}}, "nats": {"produce": {"msgs_per_s": 2}}},
    ...     ["nats"],
    ... )
    {'nats': {'produce': 1.5}}
    """
    return {peer: throughput_ratios(results["spoolmq"], results[peer]) for peer in peers}


def print_table(results: dict[str, Any], systems: list[str]) -> None:
    """Every figure of every phase of spoolmq and of the ``systems`` compared with it, and the
    ratios of spoolmq to each, on stdout."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="spoolmq bench")
    for column in ("phase", "system", "figure", "value"):
        table.add_column(column)
    for system in ("spoolmq", *systems):
        for phase, figures in results.get(system, {}).items():
            for figure, value in _flatten(figures):
                table.add_row(phase, system, figure, str(value))
    for peer, ratios in results.get("ratios_by_peer", {}).items():
        for phase, value in ratios.items():
            table.add_row(phase, f"spoolmq / {peer}", "ratio", str(value))
    for system, promise in results.get("durability", {}).items():
        table.add_row("", system, "an ACK means", promise)
    Console().print(table)


def write_json(path: str | Path, results: dict[str, Any]) -> None:
    """The results as indented JSON (``--json FILE``), in the order they were measured."""
    Path(path).write_bytes(orjson.dumps(results, option=orjson.OPT_INDENT_2))
