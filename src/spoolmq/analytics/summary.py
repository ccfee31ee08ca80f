"""``summary.json``: the job's key figures, assembled from the (small) aggregate tables.

Pure Python over lists of row dicts, so it is tested without Spark. The shape is
documented in the README ("Analytics").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Row = Mapping[str, Any]
_PERCENTILE_KEYS = ("p50", "p90", "p99", "max")


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
        waits = {r["measure"]: r for r in latency if r["topic"] == name}
        sizes = next((r for r in payload_sizes if r["topic"] == name), None)
        counts = {
            key: sum(r[key] for r in groups)
            for key in ("delivered", "acked", "retried", "dead_lettered", "expired")
        }
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
            "ack_latency_ms": _figures(waits.get("ack")),
            "delivery_attempts": {str(k): histogram[k] for k in sorted(histogram)},
            "tracked": tracked,
            **counts,
            "retry_rate": _rate(counts["retried"], tracked),
            "dlq_rate": _rate(counts["dead_lettered"], tracked),
            "expiry_rate": _rate(counts["expired"], tracked),
            "payload_bytes": _figures(sizes, ("min", "mean", *_PERCENTILE_KEYS)),
        }
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
        "consumers": consumers_out,
    }
