"""``summary.json``: the job's key figures, assembled from the (small) aggregate tables.

Pure Python over lists of row dicts, so it is tested without Spark. The shape is
documented in the README ("Analytics").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
_PERCENTILE_KEYS = ("p50", "p90", "p99", "max")
# Per (topic, group) outcome counts (transform.outcome_rates); summed over groups per topic.
_COUNTS = ("delivered", "acked", "retried", "dead_lettered", "expired", "cancelled")


def _figures(row: Row | None, keys: Iterable[str] = _PERCENTILE_KEYS) -> dict[str, Any] | None:
    return None if row is None else {key: row[key] for key in keys}


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def chart_bucket_ms(span_ms: int, *, max_points: int = 300) -> int:
    """The shortest of a few round bucket sizes that keeps a time chart to ``max_points``.

    >>> chart_bucket_ms(40_000), chart_bucket_ms(3_600_000), chart_bucket_ms(0)
    (1000, 15000, 1000)
    """
    for bucket in (1_000, 5_000, 15_000, 60_000, 300_000, 900_000, 3_600_000, 21_600_000):
        if span_ms // bucket < max_points:
            return bucket
    return 86_400_000


def _by_group(
    outcomes: Sequence[Row], latency: Sequence[Row], reasons: Sequence[Row]
) -> dict[str, Any]:
    """``{group: {topic: figures}}``: each group's own outcomes and latencies, never mixed
    with another group's (a group that started late has its own e2e latency)."""
    waits = {(r["group"], r["topic"], r["measure"]): r for r in latency if r["group"] is not None}
    nacks, dead = top_reasons(reasons, "nacked"), top_reasons(reasons, "dead_lettered")
    by_group: dict[str, Any] = {}
    for row in sorted(outcomes, key=lambda r: (r["group"], r["topic"])):
        group, topic = row["group"], row["topic"]
        by_group.setdefault(group, {})[topic] = {
            "tracked": row["messages"],
            **{key: row[key] for key in _COUNTS},
            "retry_rate": _rate(row["retried"], row["messages"]),
            "dlq_rate": _rate(row["dead_lettered"], row["messages"]),
            "e2e_latency_ms": _figures(waits.get((group, topic, "first_delivery"))),
            "queue_latency_ms": _figures(waits.get((group, topic, "queue"))),
            "ack_latency_ms": _figures(waits.get((group, topic, "ack"))),
            "nack_reasons": nacks.get((group, topic), {}),
            "dead_letter_reasons": dead.get((group, topic), {}),
        }
    return by_group


def build_summary(
    *,
    data_dir: str,
    partitions: Sequence[Row],
    latency: Sequence[Row],
    attempts: Sequence[Row],
    outcomes: Sequence[Row],
    payload_sizes: Sequence[Row],
    lag_now: Sequence[Row],
    consumers: Sequence[Row],
    processing: Sequence[Row],
    lines: Sequence[Row],
    files: Mapping[str, int],
    reasons: Sequence[Row] = (),
    tasks: Sequence[Row] = (),
    periodic: Sequence[Row] = (),
) -> dict[str, Any]:
    """The summary document from the tables' rows (column names as in transform.py)."""
    names = sorted(
        {r["topic"] for r in partitions}
        | {r["topic"] for r in outcomes}
        | {r["topic"] for r in latency}
    )
    topics: dict[str, Any] = {}
    for name in names:
        parts = sorted((r for r in partitions if r["topic"] == name), key=lambda r: r["partition"])
        groups = [r for r in outcomes if r["topic"] == name]
        tracked = sum(r["messages"] for r in groups)
        histogram: dict[int, int] = {}
        for row in attempts:
            if row["topic"] == name:
                histogram[row["attempts"]] = histogram.get(row["attempts"], 0) + row["messages"]
        # Pooled over the topic's groups (the rows with no group): see by_group for each.
        waits = {r["measure"]: r for r in latency if r["topic"] == name and r["group"] is None}
        sizes = next((r for r in payload_sizes if r["topic"] == name), None)
        counts = {key: sum(r[key] for r in groups) for key in _COUNTS}
        topics[name] = {
            "messages": sum(r["messages"] for r in parts),
            "bytes": sum(r["bytes"] for r in parts),
            "partitions": {
                str(r["partition"]): {
                    "messages": r["messages"],
                    "bytes": r["bytes"],
                    "log_end_offset": r["log_end_offset"],
                }
                for r in parts
            },
            "e2e_latency_ms": _figures(waits.get("first_delivery")),
            "queue_latency_ms": _figures(waits.get("queue")),
            "ack_latency_ms": _figures(waits.get("ack")),
            "delivery_attempts": {str(k): histogram[k] for k in sorted(histogram)},
            "tracked": tracked,
            **counts,
            "retry_rate": _rate(counts["retried"], tracked),
            "dlq_rate": _rate(counts["dead_lettered"], tracked),
            "expiry_rate": _rate(counts["expired"], tracked),
            "payload_bytes": _figures(sizes, ("min", "mean", *_PERCENTILE_KEYS)),
        }
    by_group = _by_group(outcomes, latency, reasons)
    groups_out: dict[str, Any] = {}
    for row in sorted(lag_now, key=lambda r: (r["group"], r["topic"], r["partition"])):
        groups_out.setdefault(row["group"], {}).setdefault(row["topic"], {})[
            str(row["partition"])
        ] = {
            "committed": row["committed"],
            "log_end_offset": row["log_end_offset"],
            "lag": row["lag"],
        }
    times = {(r["group"], r["consumer"]): r for r in processing}
    consumers_out: dict[str, Any] = {}
    for row in sorted(consumers, key=lambda r: (r["group"], r["consumer"])):
        consumers_out.setdefault(row["group"], {})[row["consumer"]] = {
            "deliveries": row["deliveries"],
            "acked": row["acked"],
            "failures": row["failures"],
            "failure_rate": row["failure_rate"],
            "busy_ms": row["busy_ms"],
            "idle_ms": row["idle_ms"],
            "idle_share": row["idle_share"],
            "processing_ms": _figures(
                times.get((row["group"], row["consumer"])), ("mean", *_PERCENTILE_KEYS)
            ),
        }
    read: dict[str, int] = {"segments": 0, "events": 0}
    skipped: dict[str, dict[str, int]] = {"segments": {}, "events": {}}
    for row in lines:
        read[row["source"]] += row["lines"]
        if row["status"] != "used":
            skipped[row["source"]][row["status"]] = row["lines"]
    return {
        "data": data_dir,
        "inputs": {
            "segment_files": files.get("segments", 0),
            "segment_lines": read["segments"],
            "event_files": files.get("events", 0),
            "event_lines": read["events"],
        },
        "skipped": skipped,
        "topics": topics,
        "groups": groups_out,
        "by_group": by_group,
        "consumers": consumers_out,
        "tasks": _tasks(tasks),
        "periodic": {
            r["job"]: {
                "task": r["task"],
                "schedule": r["schedule"],
                "last_tick": r["last_tick"],
                "last_run_ms": r["last_run_ms"],
                "next_run_ms": r["next_run_ms"],
            }
            for r in sorted(periodic, key=lambda r: r["job"])
        },
    }


def _tasks(rows: Sequence[Row]) -> dict[str, Any]:
    """``{task: {"states": {state: n}, "run_ms": {"mean", "max"}}}``: the run time of the
    tasks that finished (succeeded or failed), over the rows tasks.db still keeps."""
    out: dict[str, Any] = {}
    for name in sorted({r["task"] for r in rows}):
        mine = [r for r in rows if r["task"] == name]
        ran = [r for r in mine if r["ran"]]
        runs = sum(r["ran"] for r in ran)
        out[name] = {
            "states": {r["state"]: r["tasks"] for r in sorted(mine, key=lambda r: r["state"])},
            "run_ms": {
                "mean": sum(r["mean_run_ms"] * r["ran"] for r in ran) / runs,
                "max": float(max(r["max_run_ms"] for r in ran)),
            }
            if runs
            else None,
        }
    return out


def top_reasons(rows: Sequence[Row], kind: str, limit: int = 5) -> dict[tuple[str, str], Any]:
    """``{(group, topic): {reason: events}}`` of the ``limit`` commonest reasons of one event
    type (transform.failure_reasons rows), most frequent first; no reason is "(none)"."""
    found: dict[tuple[str, str], list[tuple[int, str]]] = {}
    for row in rows:
        if row["type"] == kind:
            reason = row["reason"] if row["reason"] is not None else "(none)"
            found.setdefault((row["group"], row["topic"]), []).append((row["events"], reason))
    return {
        where: {reason: n for n, reason in sorted(counts, key=lambda c: (-c[0], c[1]))[:limit]}
        for where, counts in found.items()
    }


def needs_attention(
    summary: Mapping[str, Any],
    lag_buckets: Sequence[Row],
    processing: Sequence[Row],
    *,
    slow_factor: float = 2.0,
) -> list[str]:
    """Plain sentences for the top of the report: lines skipped and why, dead letters and
    their top reasons, groups whose lag grew over the store's time span, and consumers whose
    median processing time is ``slow_factor`` times their group's median or more."""
    found: list[str] = []
    for source, reasons in summary["skipped"].items():
        for reason, count in reasons.items():
            found.append(f"{count:,} {source} line(s) skipped: {reason}")
    for group, topics in summary["by_group"].items():
        for topic, figures in topics.items():
            if figures["dead_lettered"]:
                reasons = figures.get("dead_letter_reasons") or {}
                top = ", ".join(f"{r} ({n:,})" for r, n in reasons.items())
                found.append(
                    f"group {group} dead-lettered {figures['dead_lettered']:,} message(s) of "
                    f"{topic}" + (f"; reasons: {top}" if top else "")
                )
    for group in sorted({r["group"] for r in lag_buckets}):
        points = sorted(
            (r for r in lag_buckets if r["group"] == group), key=lambda r: r["bucket_start_ms"]
        )
        first, last = points[0]["lag"], points[-1]["lag"]
        if len(points) > 1 and last > first:
            found.append(f"group {group}'s lag grew from {first:,} to {last:,} messages")
    for group in sorted({r["group"] for r in processing}):
        peers = [r for r in processing if r["group"] == group and r["p50"] is not None]
        if len(peers) < 2:
            continue
        medians = sorted(r["p50"] for r in peers)
        middle = (
            medians[len(medians) // 2]
            if len(medians) % 2
            else (medians[len(medians) // 2 - 1] + medians[len(medians) // 2]) / 2
        )
        for row in sorted(peers, key=lambda r: r["consumer"]):
            if middle > 0 and row["p50"] >= slow_factor * middle:
                found.append(
                    f"consumer {row['consumer']} of group {group} takes {row['p50']:.1f} ms "
                    f"per message (p50), its group's median is {middle:.1f} ms"
                )
    return found
