"""summary.json assembly and the report's HTML and charts, without Spark (plain rows in)."""

from __future__ import annotations

import datetime as dt
import math
import re
from pathlib import Path

import pytest

from spoolmq.analytics import report
from spoolmq.analytics.summary import build_summary, chart_bucket_ms, needs_attention, top_reasons

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _wait(group: str | None, measure: str, *figures: float) -> dict[str, object]:
    return {"topic": "t", "group": group, "measure": measure,
            **dict(zip(("p50", "p90", "p99", "max"), figures, strict=True))}  # fmt: skip


def test_build_summary_sums_groups_and_keeps_the_documented_shape() -> None:
    summary = build_summary(
        data_dir="/d",
        partitions=[
            {"topic": "t", "partition": 1, "messages": 2, "bytes": 20, "log_end_offset": 7},
            {"topic": "t", "partition": 0, "messages": 3, "bytes": 30, "log_end_offset": 3},
            {"topic": "t.dlq", "partition": 0, "messages": 0, "bytes": 0, "log_end_offset": 0},
        ],
        latency=[
            # Pooled over the topic's groups (group None), and group a's own rows.
            _wait(None, "first_delivery", 1.0, 2.0, 3.0, 4.0),
            _wait(None, "ack", 5.0, 6.0, 7.0, 8.0),
            _wait("a", "first_delivery", 0.5, 0.6, 0.7, 0.8),
            _wait("a", "queue", 0.1, 0.2, 0.3, 0.4),
        ],
        attempts=[
            {"topic": "t", "group": "a", "attempts": 1, "messages": 4},
            {"topic": "t", "group": "b", "attempts": 1, "messages": 5},
            {"topic": "t", "group": "a", "attempts": 3, "messages": 1},
        ],
        outcomes=[
            {
                "topic": "t",
                "group": "a",
                "messages": 5,
                "delivered": 5,
                "acked": 4,
                "retried": 1,
                "dead_lettered": 1,
                "expired": 0,
                "cancelled": 0,
            },
            {
                "topic": "t",
                "group": "b",
                "messages": 5,
                "delivered": 5,
                "acked": 5,
                "retried": 0,
                "dead_lettered": 0,
                "expired": 0,
                "cancelled": 0,
            },
        ],
        payload_sizes=[
            {
                "topic": "t",
                "min": 9.0,
                "mean": 10.0,
                "p50": 10.0,
                "p90": 11.0,
                "p99": 12.0,
                "max": 12.0,
            }
        ],
        lag_now=[
            {
                "group": "a",
                "topic": "t",
                "partition": 0,
                "committed": 1,
                "log_end_offset": 3,
                "lag": 2,
            }
        ],
        consumers=[
            {
                "group": "a",
                "consumer": "c1",
                "deliveries": 6,
                "acked": 4,
                "failures": 2,
                "failure_rate": 2 / 6,
                "busy_ms": 300,
                "idle_ms": 100,
                "idle_share": 0.25,
            },
            {
                "group": "b",
                "consumer": "c2",
                "deliveries": 5,
                "acked": 5,
                "failures": 0,
                "failure_rate": 0.0,
                "busy_ms": None,
                "idle_ms": None,
                "idle_share": None,
            },
        ],
        processing=[
            {
                "group": "a",
                "consumer": "c1",
                "mean": 2.0,
                "p50": 2.0,
                "p90": 3.0,
                "p99": 3.0,
                "max": 3.0,
            }
        ],
        lines=[
            {"source": "segments", "status": "used", "lines": 5},
            {"source": "segments", "status": "unparsable", "lines": 1},
            {"source": "events", "status": "used", "lines": 40},
        ],
        files={"segments": 3, "events": 1},
    )
    assert summary["inputs"] == {
        "segment_files": 3,
        "segment_lines": 6,
        "event_files": 1,
        "event_lines": 40,
    }
    assert summary["skipped"] == {"segments": {"unparsable": 1}, "events": {}}
    t = summary["topics"]["t"]
    assert (t["messages"], t["bytes"]) == (5, 50)
    assert list(t["partitions"]) == ["0", "1"]
    assert t["partitions"]["1"] == {"messages": 2, "bytes": 20, "log_end_offset": 7}
    assert t["e2e_latency_ms"] == {"p50": 1.0, "p90": 2.0, "p99": 3.0, "max": 4.0}
    assert t["ack_latency_ms"] == {"p50": 5.0, "p90": 6.0, "p99": 7.0, "max": 8.0}
    assert t["queue_latency_ms"] is None
    assert t["delivery_attempts"] == {"1": 9, "3": 1}
    assert (t["tracked"], t["acked"], t["retried"], t["dead_lettered"], t["expired"]) == (
        10, 9, 1, 1, 0,
    )  # fmt: skip
    assert (t["retry_rate"], t["dlq_rate"], t["expiry_rate"]) == (0.1, 0.1, 0.0)
    assert t["payload_bytes"]["p90"] == 11.0
    dlq = summary["topics"]["t.dlq"]
    assert dlq["e2e_latency_ms"] is None and dlq["retry_rate"] is None
    assert dlq["delivery_attempts"] == {}
    assert summary["groups"] == {"a": {"t": {"0": {"committed": 1, "log_end_offset": 3, "lag": 2}}}}
    assert summary["consumers"]["a"]["c1"]["processing_ms"]["p90"] == 3.0
    assert summary["consumers"]["a"]["c1"]["idle_share"] == 0.25
    assert summary["tasks"] == {} and summary["periodic"] == {}
    # Per group, nothing summed: a's 4 ACKs of 5 and its own latencies, b's 5 of 5.
    a, b = summary["by_group"]["a"]["t"], summary["by_group"]["b"]["t"]
    assert (a["acked"], a["retried"], a["dead_lettered"], a["tracked"]) == (4, 1, 1, 5)
    assert (b["acked"], b["retried"], b["dead_lettered"], b["tracked"]) == (5, 0, 0, 5)
    assert a["e2e_latency_ms"] == {"p50": 0.5, "p90": 0.6, "p99": 0.7, "max": 0.8}
    assert a["queue_latency_ms"] == {"p50": 0.1, "p90": 0.2, "p99": 0.3, "max": 0.4}
    assert b["e2e_latency_ms"] is None and (a["retry_rate"], b["dlq_rate"]) == (0.2, 0.0)
    assert summary["consumers"]["b"]["c2"]["processing_ms"] is None


def test_an_empty_store_gives_an_empty_summary() -> None:
    summary = build_summary(
        data_dir="/d", partitions=[], latency=[], attempts=[], outcomes=[], payload_sizes=[],
        lag_now=[], consumers=[], processing=[], lines=[], files={},
    )  # fmt: skip
    assert summary["topics"] == {} and summary["groups"] == {} and summary["consumers"] == {}
    assert summary["by_group"] == {}
    assert summary["inputs"]["segment_lines"] == 0


@pytest.mark.parametrize(
    ("span_ms", "bucket_ms"),
    [(0, 1_000), (299_000, 1_000), (300_000, 5_000), (3_600_000, 15_000), (86_400_000, 300_000)],
)
def test_chart_buckets_keep_charts_under_300_points(span_ms: int, bucket_ms: int) -> None:
    assert chart_bucket_ms(span_ms) == bucket_ms


def test_html_table_escapes_and_formats() -> None:
    page = report.html_table(
        [("key", "key <b>"), ("n", "n")], [{"key": "<script>x</script>", "n": 12345}]
    )
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "key &lt;b&gt;" in page
    assert '<td class="num">12,345</td>' in page
    assert report.html_table([("a", "a")], []) == '<p class="none">nothing to show</p>'


def test_charts_are_pngs_also_without_data(tmp_path: Path) -> None:
    rows = [
        {"topic": "t", "bucket_start_ms": 60_000, "published": 10, "acked": 5},
        {"topic": "t", "bucket_start_ms": 61_000, "published": 20, "acked": 25},
    ]
    by_group = [{**row, "group": "g"} for row in rows]
    by_consumer = [{**row, "group": "g", "consumer": "c1"} for row in rows]
    made = [
        report.throughput_chart(rows, by_group, 1_000, tmp_path / "a.png"),
        report.throughput_chart([], [], 1_000, tmp_path / "b.png"),
        report.consumers_chart(by_consumer, 1_000, tmp_path / "h.png"),
        report.consumers_chart([], 1_000, tmp_path / "i.png"),
        report.lag_chart(
            [{"group": "g", "bucket_start_ms": 5_000, "lag": 3}], 5_000, tmp_path / "c.png"
        ),
        report.lag_chart([], 5_000, tmp_path / "d.png"),
        report.latency_chart([], tmp_path / "e.png"),
        report.attempts_chart([{"attempts": 1, "messages": 9}], tmp_path / "f.png"),
        report.attempts_chart([], tmp_path / "g.png"),
    ]
    for path in made:
        assert path.read_bytes().startswith(PNG_MAGIC), path


def test_render_html_inlines_charts_and_lists_what_was_skipped(tmp_path: Path) -> None:
    chart = report.attempts_chart([], tmp_path / "x.png")
    summary = {
        "data": "/d<&>",
        "inputs": {"segment_lines": 3, "segment_files": 1, "event_lines": 0, "event_files": 0},
        "skipped": {"segments": {"unparsable": 2}, "events": {}},
        "topics": {},
    }
    names = (
        "latency",
        "lag_now",
        "outcomes",
        "consumers",
        "partitions",
        "top_keys",
        "payload_sizes",
        "tasks",
        "periodic",
    )
    tables: dict[str, list[dict[str, object]]] = {name: [] for name in names}
    page = report.render_html(
        summary,
        dict.fromkeys(("throughput", "latency", "lag", "attempts", "consumers"), chart),
        tables,
        dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC),
    )
    assert page.count("data:image/png;base64,") == 5
    assert 'src="http' not in page and "<script" not in page
    assert "2 segments line(s): unparsable" in page
    assert "/d&lt;&amp;&gt;" in page and "2026-01-02 03:04:05 UTC" in page


def test_chart_buckets_without_rows_are_zero_or_unknown_not_interpolated() -> None:
    rows = [
        {"bucket_start_ms": 1_000, "published": 4},
        {"bucket_start_ms": 4_000, "published": 6},
    ]
    stamps, values = report._every_bucket(rows, 1_000, "published", 0.0)
    assert (stamps, values) == ([1_000, 2_000, 3_000, 4_000], [4.0, 0.0, 0.0, 6.0])
    _, lags = report._every_bucket(rows, 1_000, "published", math.nan)
    assert math.isnan(lags[1]) and math.isnan(lags[2]) and lags[3] == 6.0
    assert report._every_bucket([], 1_000, "published", 0.0) == ([], [])


def test_needs_attention_names_dead_letters_growing_lag_and_slow_consumers() -> None:
    reasons = [
        {"group": "g", "topic": "t", "type": "dead_lettered", "reason": "bad", "events": 2},
        {"group": "g", "topic": "t", "type": "dead_lettered", "reason": None, "events": 3},
        {"group": "g", "topic": "t", "type": "nacked", "reason": "x", "events": 9},
    ]
    assert top_reasons(reasons, "dead_lettered") == {("g", "t"): {"(none)": 3, "bad": 2}}
    summary = {
        "skipped": {"segments": {}, "events": {"unparsable": 1}},
        "by_group": {
            "g": {"t": {"dead_lettered": 5, "dead_letter_reasons": {"(none)": 3, "bad": 2}}},
            "h": {"t": {"dead_lettered": 0, "dead_letter_reasons": {}}},
        },
    }
    lag = [
        {"group": "g", "bucket_start_ms": 10_000, "lag": 50},
        {"group": "g", "bucket_start_ms": 5_000, "lag": 5},
        {"group": "h", "bucket_start_ms": 5_000, "lag": 9},
        {"group": "h", "bucket_start_ms": 10_000, "lag": 0},
    ]
    processing = [
        {"group": "g", "consumer": c, "p50": p50}
        for c, p50 in (("c1", 1.0), ("c2", 1.2), ("c3", 5.0))
    ]
    assert needs_attention(summary, lag, processing) == [
        "1 events line(s) skipped: unparsable",
        "group g dead-lettered 5 message(s) of t; reasons: (none) (3), bad (2)",
        "group g's lag grew from 5 to 50 messages",
        "consumer c3 of group g takes 5.0 ms per message (p50), its group's median is 1.2 ms",
    ]


def test_the_throughput_chart_has_a_line_per_group_never_a_sum() -> None:
    stored = [
        {"topic": "t", "bucket_start_ms": 0, "published": 4, "acked": 6},
        {"topic": "t", "bucket_start_ms": 2_000, "published": 2, "acked": 0},
    ]
    acked = [
        {"topic": "t", "group": "a", "bucket_start_ms": 0, "acked": 4},
        {"topic": "t", "group": "b", "bucket_start_ms": 0, "acked": 2},
        {"topic": "t", "group": "b", "bucket_start_ms": 2_000, "acked": 2},
    ]
    series = report.throughput_series(stored, acked, 1_000)
    assert [(label, list(stamps), list(values)) for label, stamps, values, _ in series] == [
        ("t stored", [0, 1_000, 2_000], [4.0, 0.0, 2.0]),
        ("t ACKed by a", [0], [4.0]),
        ("t ACKed by b", [0, 1_000, 2_000], [2.0, 0.0, 2.0]),
    ]


def test_each_report_column_has_one_number_format() -> None:
    page = report.html_table(
        [("p50", "p50"), ("retry_rate", "rate"), ("n", "n")],
        [
            {"p50": 0.25, "retry_rate": 0.5, "n": 1234},
            {"p50": 12.0, "retry_rate": 0.001, "n": 7},
            {"p50": None, "retry_rate": None, "n": None},
        ],
    )
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", page)  # each cell's text, row by row
    assert cells == ["0.2", "50.0 %", "1,234", "12.0", "0.1 %", "7", "–", "–", "–"]
