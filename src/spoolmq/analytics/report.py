"""Load, for people: PNG charts (matplotlib) and one self-contained ``report.html``.

Takes the small aggregate rows the job collected, never a DataFrame. The HTML inlines the
charts as base64 data and has no scripts or external resources, so it opens anywhere,
offline, as one file.
"""

from __future__ import annotations

import base64
import datetime as dt
import functools
import html
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

Row = Mapping[str, Any]
_DPI = 100
_SIZE = (8.0, 3.6)


@functools.cache
def pyplot() -> tuple[ModuleType, ModuleType]:
    """matplotlib's ``pyplot`` and ``dates``, imported on first use (with the file-only
    backend, also right on a cluster's driver). The imports take seconds of CPU (numpy,
    matplotlib), which the job's other paths (a bad argument, a missing directory) do not
    pay. (Importing them in a thread while the JVM starts was measured: the start step was
    2.5 s shorter, the whole run no shorter, on 2 cores.)"""
    import matplotlib

    matplotlib.use("Agg")  # files only: no display
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt

    return plt, mdates


def _times(stamps_ms: Sequence[int]) -> Any:
    """Datetimes for matplotlib's date axis (typed Any: its stubs expect arrays)."""
    return [dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC) for ms in stamps_ms]


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=_DPI)
    pyplot()[0].close(figure)
    return path


def _empty(axes: Any, text: str) -> None:
    axes.text(0.5, 0.5, text, ha="center", va="center", transform=axes.transAxes, color="gray")
    axes.set_xticks([])
    axes.set_yticks([])


Series = tuple[str, Sequence[int], Sequence[float], str]  # label, times (ms), values, style


def _time_chart(
    series: Sequence[Series], bucket_ms: int, ylabel: str, title: str, empty: str, path: Path
) -> Path:
    plt, mdates = pyplot()
    figure, axes = plt.subplots(figsize=_SIZE)
    for label, stamps, values, style in series:
        axes.plot(_times(stamps), values, style, markersize=3, label=label)
    if series:
        first = min(min(stamps) for _, stamps, _, _ in series)
        last = max(max(stamps) for _, stamps, _, _ in series)
        # One bucket of room on each side; a single point would otherwise get a span of years.
        axes.set_xlim(*_times([first - bucket_ms, last + bucket_ms]))
        locator = mdates.AutoDateLocator()
        axes.xaxis.set_major_locator(locator)
        formatter = mdates.ConciseDateFormatter(locator)
        axes.xaxis.set_major_formatter(formatter)
        # From zero, with a little room below it so a flat line at 0 (no lag) stays visible.
        known = [v for _, _, values, _ in series for v in values if not math.isnan(v)]
        top = max(known, default=0.0) or 1.0
        axes.set_ylim(-0.03 * top, 1.08 * top)
        axes.set_ylabel(ylabel)
        axes.set_xlabel(f"time (UTC), {bucket_ms / 1000:g} s buckets")
        # Beside the plot, not on it: a legend never hides a line.
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        _empty(axes, empty)
    axes.set_title(title)
    return _save(figure, path)


def _points(rows: Sequence[Row], **where: Any) -> list[Row]:
    """The rows of one series (those whose columns have the values of ``where``), in time
    order."""
    return sorted(
        (r for r in rows if all(r[column] == value for column, value in where.items())),
        key=lambda r: r["bucket_start_ms"],
    )


def _every_bucket(
    points: Sequence[Row], bucket_ms: int, value: str, missing: float
) -> tuple[list[int], list[float]]:
    """Every bucket from the first point's to the last's, with ``missing`` where there is
    no row: 0 where no row means nothing happened (a line drawn from the last busy bucket
    to the next would show traffic that never was), NaN where it means nothing is known
    (matplotlib breaks the line there). The job's bucket size keeps this to ~300 points."""
    if not points:
        return [], []
    given = {r["bucket_start_ms"]: float(r[value]) for r in points}
    first, last = points[0]["bucket_start_ms"], points[-1]["bucket_start_ms"]
    stamps = list(range(first, last + 1, bucket_ms))
    return stamps, [given.get(stamp, missing) for stamp in stamps]


def throughput_chart(
    rows: Sequence[Row], group_rows: Sequence[Row], bucket_ms: int, path: Path
) -> Path:
    """Messages stored per second over time, one line per topic, and ACKed, one line per
    topic and group (``group_rows``: transform.worked_by topic, group), never summed over
    groups."""
    series = throughput_series(rows, group_rows, bucket_ms)
    return _time_chart(series, bucket_ms, "messages/s", "Throughput", "no messages", path)


def throughput_series(
    rows: Sequence[Row], group_rows: Sequence[Row], bucket_ms: int
) -> list[Series]:
    """The throughput chart's lines (see throughput_chart)."""
    seconds = bucket_ms / 1000
    series: list[Series] = []
    for topic in sorted({r["topic"] for r in rows}):
        stamps, stored = _every_bucket(_points(rows, topic=topic), bucket_ms, "published", 0.0)
        if any(stored):
            series.append((f"{topic} stored", stamps, [n / seconds for n in stored], ".-"))
    for topic, group in sorted({(r["topic"], r["group"]) for r in group_rows}):
        points = _points(group_rows, topic=topic, group=group)
        if any(r["acked"] for r in points):
            stamps, acked = _every_bucket(points, bucket_ms, "acked", 0.0)
            label = f"{topic} ACKed by {group}"
            series.append((label, stamps, [n / seconds for n in acked], ".--"))
    return series


# More lines than this would make the legend unreadable: the busiest are drawn, and the
# title says how many were left out (the consumers table has every one).
MAX_CONSUMER_LINES = 10


def consumers_chart(rows: Sequence[Row], bucket_ms: int, path: Path) -> Path:
    """ACKs per second over time, one line per consumer (group/consumer), the busiest
    MAX_CONSUMER_LINES of them."""
    seconds = bucket_ms / 1000
    totals: dict[tuple[str, str], int] = {}
    for row in rows:
        who = (row["group"], row["consumer"])
        totals[who] = totals.get(who, 0) + row["acked"]
    busiest = sorted((who for who, n in totals.items() if n), key=lambda w: (-totals[w], w))
    shown = sorted(busiest[:MAX_CONSUMER_LINES])
    series: list[Series] = []
    for group, consumer in shown:
        points = _points(rows, group=group, consumer=consumer)
        stamps, acked = _every_bucket(points, bucket_ms, "acked", 0.0)
        series.append((f"{group}/{consumer}", stamps, [n / seconds for n in acked], ".-"))
    title = "ACKs per consumer"
    if len(busiest) > len(shown):
        title += f" (the {len(shown)} busiest of {len(busiest)})"
    return _time_chart(series, bucket_ms, "ACKs/s", title, "no ACKs", path)


def lag_chart(rows: Sequence[Row], bucket_ms: int, path: Path) -> Path:
    """Each group's lag (summed over its partitions) over time."""
    series: list[Series] = []
    for group in sorted({r["group"] for r in rows}):
        # No snapshot in a bucket (no broker running): unknown, not zero.
        stamps, lags = _every_bucket(_points(rows, group=group), bucket_ms, "lag", math.nan)
        series.append((group, stamps, lags, "o-"))
    return _time_chart(
        series, bucket_ms, "messages behind", "Consumer-group lag", "no lag snapshots", path
    )


def latency_chart(rows: Sequence[Row], path: Path) -> Path:
    """p50/p90/p99 of each wait after publish, per topic and group (never pooled: a group
    that started late would otherwise lend its waits to the others)."""
    plt = pyplot()[0]
    figure, axes = plt.subplots(figsize=_SIZE)
    order = {"first_delivery": 0, "queue": 1, "ack": 2, "lateness": 3}
    own = [r for r in rows if r.get("group") is not None]
    labels = sorted(
        {(r["topic"], r["group"], r["measure"]) for r in own},
        key=lambda label: (label[0], label[1], order.get(label[2], 3)),
    )
    if labels:
        by_label = {(r["topic"], r["group"], r["measure"]): r for r in own}
        width = 0.25
        for index, key in enumerate(("p50", "p90", "p99")):
            xs = [i + (index - 1) * width for i in range(len(labels))]
            axes.bar(xs, [by_label[label][key] for label in labels], width, label=key)
        names = {
            "first_delivery": "to 1st delivery",
            "queue": "queue only",
            "ack": "to ACK",
            "lateness": "delay's lateness",
        }
        axes.set_xticks(range(len(labels)))
        axes.set_xticklabels(
            [f"{t} · {g}\n{names.get(m, m)}" for t, g, m in labels], fontsize="x-small"
        )
        axes.set_ylabel("ms after publish")
        axes.legend(fontsize="small")
    else:
        _empty(axes, "no deliveries")
    axes.set_title("Latency per topic and group")
    return _save(figure, path)


def attempts_chart(rows: Sequence[Row], path: Path) -> Path:
    """How many messages needed 1, 2, … delivery attempts (all topics and groups)."""
    plt = pyplot()[0]
    figure, axes = plt.subplots(figsize=_SIZE)
    totals: dict[int, int] = {}
    for row in rows:
        totals[row["attempts"]] = totals.get(row["attempts"], 0) + row["messages"]
    if totals:
        keys = sorted(totals)
        bars = axes.bar([str(k) for k in keys], [totals[k] for k in keys], color="#4c72b0")
        axes.bar_label(bars, fontsize="small")
        axes.set_yscale("log")
        axes.set_xlabel("delivery attempts")
        axes.set_ylabel("messages (log scale)")
    else:
        _empty(axes, "no deliveries")
    axes.set_title("Delivery attempts")
    return _save(figure, path)


# -- HTML ----------------------------------------------------------------------------------


# Columns whose values are fractions of a whole: shown as percentages.
_SHARES = ("share", "rate")


def column_format(key: str, values: Sequence[Any]) -> Any:
    """One format for every cell of a column, so that its figures line up and compare:
    whole numbers with thousands separators; a share or rate (a key ending in ``share`` or
    ``rate``) as a percentage with one decimal; other fractional numbers with as many
    decimals as the column's largest value needs (0 from 100 up, 1 from 1 up, else 3).

    >>> f = column_format("p50", [0.25, 12.0]); f(0.25), f(12.0)
    ('0.2', '12.0')
    >>> column_format("retry_rate", [0.02])(0.02)
    '2.0 %'
    """
    numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
    if key.endswith(_SHARES):
        return lambda v: f"{100 * v:,.1f} %"
    if all(isinstance(v, int) for v in numbers):
        return lambda v: f"{v:,}"
    largest = max((abs(v) for v in numbers), default=0.0)
    decimals = 0 if largest >= 100 else 1 if largest >= 1 else 3
    return lambda v: f"{v:,.{decimals}f}"


def _when(ms: int | None) -> str | None:
    if ms is None:
        return None
    return f"{dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC):%Y-%m-%d %H:%M:%S}"


def html_table(columns: Sequence[tuple[str, str]], rows: Sequence[Row]) -> str:
    """``columns`` are (key, heading); numbers are right-aligned, in one format per column
    (column_format)."""
    if not rows:
        return '<p class="none">nothing to show</p>'
    head = "".join(f"<th>{html.escape(title)}</th>" for _, title in columns)
    formats = {key: column_format(key, [row.get(key) for row in rows]) for key, _ in columns}
    body = []
    for row in rows:
        cells = []
        for key, _ in columns:
            value = row.get(key)
            if value is None:
                cells.append('<td class="num">–</td>')
            elif isinstance(value, int | float) and not isinstance(value, bool):
                cells.append(f'<td class="num">{formats[key](value)}</td>')
            else:
                cells.append(f'<td class="txt">{html.escape(str(value))}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _image(path: Path, alt: str) -> str:
    data = base64.b64encode(path.read_bytes()).decode("ascii")
    return f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{data}"></figure>'


_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;margin:2em auto;
max-width:1000px;color:#222;padding:0 1em}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd;padding-bottom:.2em}
.meta{color:#666}table{border-collapse:collapse;margin:.6em 0;font-size:14px}
th,td{padding:.25em .7em;border-bottom:1px solid #eee}th{background:#f4f4f4;text-align:left}
td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}.none{color:#888}
.warn{background:#fff4e5;border-left:4px solid #f0a020;padding:.5em 1em}
.ok{background:#eef7ee;border-left:4px solid #5a5;padding:.5em 1em}
figure{margin:1em 0}img{max-width:100%;border:1px solid #eee}
"""


def render_html(
    summary: Mapping[str, Any],
    charts: Mapping[str, Path],
    tables: Mapping[str, Sequence[Row]],
    generated_at: dt.datetime,
) -> str:
    """The report page: overview, what was skipped, the charts, the key tables."""
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        '<link rel="icon" href="data:,">',
        "<title>spoolmq analytics</title>",
        f"<style>{_STYLE}</style></head><body>",
        "<h1>spoolmq analytics</h1>",
        f'<p class="meta">store <code>{html.escape(str(summary["data"]))}</code> · generated '
        f"{generated_at:%Y-%m-%d %H:%M:%S} UTC</p>",
    ]
    inputs = summary["inputs"]
    parts.append(
        f"<p>Read {inputs['segment_lines']:,} segment lines from {inputs['segment_files']:,} "
        f"files and {inputs['event_lines']:,} delivery events from {inputs['event_files']:,} "
        "files.</p>"
    )
    skipped = [
        (source, reason, count)
        for source, reasons in summary["skipped"].items()
        for reason, count in reasons.items()
    ]
    attention = summary.get("attention", [])
    if attention:
        items = "".join(f"<li>{html.escape(text)}</li>" for text in attention)
        parts.append(f'<div class="warn"><strong>Needs attention</strong><ul>{items}</ul></div>')
    if skipped:
        items = "".join(
            f"<li>{count:,} {html.escape(source)} line(s): {html.escape(reason)}</li>"
            for source, reason, count in skipped
        )
        parts.append(f'<div class="warn"><strong>Skipped</strong><ul>{items}</ul></div>')
    else:
        parts.append('<p class="ok">Every line was read; nothing was skipped.</p>')
    overview = [
        {
            "topic": name,
            "messages": t["messages"],
            "bytes": t["bytes"],
            "partitions": len(t["partitions"]),
            "acked": t["acked"],
            "retried": t["retried"],
            "dead_lettered": t["dead_lettered"],
            "expired": t["expired"],
            "p50": (t["e2e_latency_ms"] or {}).get("p50"),
            "p99": (t["e2e_latency_ms"] or {}).get("p99"),
        }
        for name, t in summary["topics"].items()
    ]
    parts += [
        "<h2>Topics</h2>",
        html_table(
            [
                ("topic", "topic"),
                ("messages", "messages"),
                ("bytes", "bytes"),
                ("partitions", "partitions"),
                ("acked", "ACKed (sum of groups)"),
                ("retried", "retried (sum of groups)"),
                ("dead_lettered", "dead-lettered (sum of groups)"),
                ("expired", "expired (sum of groups)"),
                ("p50", "e2e p50 ms (groups pooled)"),
                ("p99", "e2e p99 ms (groups pooled)"),
            ],
            overview,
        ),
        '<p class="meta">Counts here add up every group\'s outcomes (a message read by two '
        "groups counts twice) and latencies pool every group's deliveries; the tables below "
        "give each group its own.</p>",
        "<h2>Throughput</h2>",
        _image(charts["throughput"], "throughput over time"),
        "<h2>Latency</h2>",
        _image(charts["latency"], "latency percentiles"),
        html_table(
            [
                ("topic", "topic"),
                ("group", "group"),
                ("measure", "publish to"),
                ("messages", "messages"),
                ("p50", "p50 ms"),
                ("p90", "p90 ms"),
                ("p99", "p99 ms"),
                ("max", "max ms"),
            ],
            [{**r, "group": r["group"] or "(all groups pooled)"} for r in tables["latency"]],
        ),
        '<p class="meta"><em>first_delivery</em>: publish to first delivery, every message. '
        "<em>queue</em>: the same for messages that were due at once and had no earlier message "
        "of their key unfinished: the time the queue itself took. <em>ack</em>: publish to "
        "ACK, retries included. <em>lateness</em>: delayed messages only, from when they were "
        "due to their first delivery.</p>",
        "<h2>Consumer-group lag</h2>",
        _image(charts["lag"], "lag per group over time"),
        html_table(
            [
                ("group", "group"),
                ("topic", "topic"),
                ("partition", "partition"),
                ("committed", "committed"),
                ("log_end_offset", "log end"),
                ("lag", "lag"),
            ],
            tables["lag_now"],
        ),
        "<h2>Deliveries and failures</h2>",
        _image(charts["attempts"], "delivery attempts histogram"),
        html_table(
            [
                ("topic", "topic"),
                ("group", "group"),
                ("messages", "messages"),
                ("acked", "ACKed"),
                ("retried", "retried"),
                ("dead_lettered", "dead-lettered"),
                ("expired", "expired"),
                ("cancelled", "cancelled"),
                ("retry_rate", "retry rate"),
                ("dlq_rate", "DLQ rate"),
            ],
            tables["outcomes"],
        ),
        "<h2>Consumers</h2>",
        html_table(
            [
                ("group", "group"),
                ("consumer", "consumer"),
                ("deliveries", "deliveries"),
                ("acked", "ACKed"),
                ("failures", "failures"),
                ("failure_rate", "failure rate"),
                ("acked_per_s", "ACKs/s"),
                ("p50", "processing p50 ms"),
                ("p99", "processing p99 ms"),
                ("busy_ms", "busy ms"),
                ("idle_ms", "idle ms"),
                ("idle_share", "idle"),
            ],
            tables["consumers"],
        ),
        '<p class="meta"><em>busy</em>: the time a consumer held at least one message (from '
        "each delivery to the ACK, NACK, lease expiry or release that ended it); "
        "<em>idle</em>: the rest of the time from its first delivery to its last, waiting "
        "for work.</p>",
        _image(charts["consumers"], "ACKs per consumer over time"),
        "<h2>Tasks</h2>",
        "<h3>By task and state</h3>",
        html_table(
            [
                ("task", "task"),
                ("state", "state"),
                ("tasks", "tasks"),
                ("mean_run_ms", "mean run ms"),
                ("max_run_ms", "longest run ms"),
            ],
            tables["tasks"],
        ),
        "<h3>Periodic jobs</h3>",
        html_table(
            [
                ("job", "periodic job"),
                ("task", "task"),
                ("schedule", "schedule"),
                ("last_tick", "last tick"),
                ("last_run", "last run (UTC)"),
                ("next_run", "next run (UTC)"),
            ],
            [
                {**r, "last_run": _when(r["last_run_ms"]), "next_run": _when(r["next_run_ms"])}
                for r in tables["periodic"]
            ],
        ),
        '<p class="meta">From <code>tasks.db</code>: the tasks whose rows it still keeps (a '
        "finished task's row goes when its result expires); run time is from start to finish "
        "of the last attempt. A cancelled task never ran.</p>",
        "<h2>Partitions</h2>",
        html_table(
            [
                ("topic", "topic"),
                ("partition", "partition"),
                ("messages", "messages"),
                ("bytes", "bytes"),
                ("log_end_offset", "log end"),
                ("share", "share"),
                ("ratio_to_mean", "vs. even"),
            ],
            tables["partitions"],
        ),
        "<h2>Top keys</h2>",
        html_table(
            [
                ("topic", "topic"),
                ("rank", "rank"),
                ("key", "key"),
                ("messages", "messages"),
                ("share", "share"),
            ],
            tables["top_keys"],
        ),
        "<h2>Payload sizes (stored bytes per record)</h2>",
        html_table(
            [
                ("topic", "topic"),
                ("messages", "messages"),
                ("min", "min"),
                ("mean", "mean"),
                ("p50", "p50"),
                ("p90", "p90"),
                ("p99", "p99"),
                ("max", "max"),
            ],
            tables["payload_sizes"],
        ),
        "</body></html>",
    ]
    return "\n".join(parts)
