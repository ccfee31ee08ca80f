"""Delivery events in the frame shape (one ``delivered`` line per dispatched frame, one
``acked`` line per ACK frame: runs of offsets, processing times as an array) and in the
per-message shape older brokers write, alone and mixed: the job answers alike."""

from __future__ import annotations

import shutil
from copy import deepcopy as copy_of
from pathlib import Path
from typing import Any

import orjson
import pytest
from analytics_helpers import event_file
from pyspark.sql import DataFrame, SparkSession
from test_end_to_end import assert_same, expected_summary, without_attention

from spoolmq import Message, Store
from spoolmq.analytics import run, transform
from spoolmq.store.message import Position

pytestmark = pytest.mark.spark

RECORDS = (
    "topic string, partition int, offset long, timestamp long, key string, bytes long, "
    "deliver_at long"
)


def _lines(spark: SparkSession, *lines: dict[str, Any] | str) -> DataFrame:
    text = [line if isinstance(line, str) else orjson.dumps(line).decode() for line in lines]
    return spark.createDataFrame([(line,) for line in text], "line string")


def _messages(events: DataFrame) -> list[tuple[Any, ...]]:
    """(type, consumer, topic, partition, offset, attempt, processing_ms) of used rows."""
    rows = events.where("problem IS NULL").collect()
    return sorted(
        (
            r["type"], r["consumer"], r["topic"], r["partition"], r["offset"], r["attempt"],
            r["processing_ms"],
        )
        for r in rows
    )  # fmt: skip


def test_a_frame_line_is_one_row_per_offset_of_its_runs(spark: SparkSession) -> None:
    frame = {"ts": 50, "group": "g", "consumer": "c1"}
    lines = _lines(
        spark,
        # Two partitions, and offset 7 at its second attempt: three runs.
        {**frame, "type": "delivered",
         "runs": [["t", 0, 5, 2, 1], ["t", 0, 7, 1, 2], ["t", 1, 0, 3, 1]]},
        # The ACK frame's times follow the runs' order, across partitions.
        {**frame, "ts": 60, "type": "acked",
         "runs": [["t", 1, 1, 2, 1], ["t", 0, 5, 1, 1]], "processing_ms": [3, 4.5, 9]},
        # An auto-ACK has no times: each message took 0 ms.
        {**frame, "ts": 61, "type": "acked", "consumer": "c2", "reason": "auto_ack",
         "runs": [["u", 2, 40, 2, 1]]},
        # The per-message shape, in the same file.
        {**frame, "ts": 62, "type": "acked", "topic": "t", "partition": 0, "offset": 6,
         "attempt": 1, "published_at": 10, "processing_ms": 2.0},
    )  # fmt: skip
    events = transform.parse_events(lines)
    assert _messages(events) == [
        ("acked", "c1", "t", 0, 5, 1, 9.0),
        ("acked", "c1", "t", 0, 6, 1, 2.0),
        ("acked", "c1", "t", 1, 1, 1, 3.0),
        ("acked", "c1", "t", 1, 2, 1, 4.5),
        ("acked", "c2", "u", 2, 40, 1, 0.0),
        ("acked", "c2", "u", 2, 41, 1, 0.0),
        ("delivered", "c1", "t", 0, 5, 1, None),
        ("delivered", "c1", "t", 0, 6, 1, None),
        ("delivered", "c1", "t", 0, 7, 2, None),
        ("delivered", "c1", "t", 1, 0, 1, None),
        ("delivered", "c1", "t", 1, 1, 1, None),
        ("delivered", "c1", "t", 1, 2, 1, None),
    ]
    # Every row of a frame has the line's ts; its published_at is the record's, not here.
    rows = events.collect()
    assert {r["ts"] for r in rows if r["type"] == "delivered"} == {50}
    assert all(r["published_at"] is None for r in rows if r["offset"] != 6)
    # Lines are still counted as lines.
    assert transform.line_counts(spark.createDataFrame([], "problem string"), events).collect() == [
        ("events", "used", 4)
    ]


@pytest.mark.parametrize(
    "line",
    [
        {"runs": [["t", 0, 5, 0, 1]]},  # an empty run
        {"runs": [["t", 0, 5, -2, 1]]},  # a negative count
        {"runs": [["t", 0, 5, 2]]},  # a run without its attempt
        {"runs": [["t", 0, "five", 2, 1]]},  # an offset that is not a number
        {"runs": [["t", -1, 5, 2, 1]]},  # no such partition
        {"runs": [[None, 0, 5, 2, 1]]},  # no topic
        {"runs": []},  # about nothing
        {"runs": "t:0:5"},  # not runs at all
        {"runs": [["t", 0, 5, 2, 1]], "offset": 5},  # both shapes at once
        {"runs": [["t", 0, 5, 2, 1]], "processing_ms": [1]},  # a time short
        {"runs": [["t", 0, 5, 2, 1]], "processing_ms": 1.0},  # a number, not one per message
        # a count no frame has, which would otherwise be expanded into a huge array
        {"runs": [["t", 0, 0, transform.MAX_MESSAGES_PER_LINE + 1, 1]]},
        {"runs": [["t", 0, 0, transform.MAX_MESSAGES_PER_LINE, 1]] * 2},
        # offsets past the largest a log can hold (2**63 - 1), which no sum may overflow
        {"runs": [["t", 0, 2**63 - 2, 5, 1]]},
        {"runs": [["t", 0, 0, 2**62, 1]] * 2},
        # cut mid-write
        '{"ts":1,"type":"acked","group":"g","consumer":"c","runs":[["t",0,5,2,1]],"proc',
    ],
)
def test_a_damaged_frame_line_is_one_unparsable_line(
    spark: SparkSession, line: dict[str, Any] | str
) -> None:
    full = line if isinstance(line, str) else {"ts": 1, "type": "acked", "group": "g", **line}
    events = transform.parse_events(_lines(spark, full)).collect()
    assert len(events) == 1
    assert events[0]["problem"] == "unparsable" and events[0]["first_in_line"]


def test_published_at_comes_from_the_record_when_events_leave_it_out(
    spark: SparkSession,
) -> None:
    records = spark.createDataFrame(
        [
            ("t", 0, 0, 1000, None, 80, None),
            ("t", 0, 1, 1001, None, 80, None),
            ("t", 0, 3, 1003, "k", 90, None),
        ],
        RECORDS,
    )
    lines = _lines(
        spark,
        # Offsets 0-2 in a frame; offset 2's record was deleted by retention.
        {"ts": 1010, "type": "delivered", "group": "g", "consumer": "c",
         "runs": [["t", 0, 0, 3, 1]]},
        {"ts": 1020, "type": "acked", "group": "g", "consumer": "c",
         "runs": [["t", 0, 0, 3, 1]], "processing_ms": [10, 10, 10]},
        # A per-message line keeps its own published_at.
        {"ts": 1030, "type": "delivered", "group": "g", "consumer": "c", "topic": "t",
         "partition": 0, "offset": 3, "attempt": 1, "published_at": 999},
    )  # fmt: skip
    events = transform.parse_events(lines)
    used = events.where("problem IS NULL")
    outcomes = transform.delivery_outcomes(used, records)
    got = sorted(
        (r["offset"], r["published_at"], r["first_delivered_at"], r["acked_at"])
        for r in outcomes.collect()
    )
    # The message without its record still counts, without a publish time.
    assert got == [(0, 1000, 1010, 1020), (1, 1001, 1010, 1020), (2, None, 1010, 1020),
                   (3, 999, 1030, None)]  # fmt: skip
    latency = {r["measure"]: r for r in transform.latency(outcomes).collect() if r["group"]}
    assert latency["first_delivery"]["messages"] == 3 and latency["ack"]["messages"] == 2
    rates = transform.outcome_rates(outcomes).collect()[0]
    assert (rates["messages"], rates["delivered"], rates["acked"]) == (4, 4, 3)


def test_the_helper_writes_either_shape() -> None:
    common = {"group": "g", "consumer": "c", "topic": "t", "partition": 0, "attempt": 1,
              "published_at": 5}  # fmt: skip
    per_message = [
        {"ts": 9, "type": "delivered", "offset": 0, **common},
        {"ts": 9, "type": "delivered", "offset": 1, **common},
        {"ts": 9, "type": "delivered", "offset": 3, **common},
        {"ts": 10, "type": "nacked", "offset": 3, **common, "processing_ms": 1.0},
        {"ts": 12, "type": "acked", "offset": 0, **common, "processing_ms": 3.0},
        {"ts": 12, "type": "acked", "offset": 1, **common, "processing_ms": 3.0},
    ]
    assert event_file(per_message, "old").count(b"\n") == 6
    new = [orjson.loads(line) for line in event_file(per_message, "new").splitlines()]
    assert new == [
        {"ts": 9, "type": "delivered", "group": "g", "consumer": "c",
         "runs": [["t", 0, 0, 2, 1], ["t", 0, 3, 1, 1]]},
        per_message[3],
        {"ts": 12, "type": "acked", "group": "g", "consumer": "c",
         "runs": [["t", 0, 0, 2, 1]], "processing_ms": [3.0, 3.0]},
    ]  # fmt: skip
    assert event_file(per_message, "mixed").count(b"\n") == 1 + 1 + 2


# -- the whole job over the same history in either shape ------------------------------------


def delivery_history(positions: list[Position]) -> list[dict[str, Any]]:
    """A delivery history, one event per message as the per-message shape has it: billing
    (c1, c2) gets frames of 8 and ACKs them in frames; every 7th message is NACKed once and
    redelivered in a frame of retries; every 19th is dead-lettered after 3 attempts; one
    expires, one is released. audit (a1) auto-ACKs frames of 10. Lag snapshots and a
    retention skip in between."""
    events: list[dict[str, Any]] = []

    def message(p: Position) -> dict[str, Any]:
        return {"topic": p.topic, "partition": p.partition, "offset": p.offset,
                "key": f"k{p.offset % 5}", "published_at": p.timestamp, "bytes": 99}  # fmt: skip

    def add(ts: int, kind: str, group: str, consumer: str | None, p: Position,
            attempt: int, **extra: Any) -> None:  # fmt: skip
        events.append({"ts": ts, "type": kind, "group": group, **message(p),
                       "consumer": consumer, "attempt": attempt, **extra})  # fmt: skip

    retries: list[tuple[Position, int]] = []
    for start in range(0, len(positions), 8):
        chunk = positions[start : start + 8]
        consumer = "c1" if start % 16 == 0 else "c2"
        ts = max(p.timestamp for p in chunk) + 3 + start
        for p in chunk:
            add(ts, "delivered", "billing", consumer, p, 1)
        acked = []
        for n, p in enumerate(chunk, start):
            if n == 11:
                add(ts + 30, "expired", "billing", None, p, 0)
            elif n == 12:
                add(ts + 1, "released", "billing", consumer, p, 1, reason="disconnected")
                retries.append((p, 2))
            elif n % 19 == 5 or n % 7 == 3:
                add(ts + 2, "nacked", "billing", consumer, p, 1, processing_ms=1.5)
                retries.append((p, 2))
            else:
                acked.append(p)
        for n, p in enumerate(acked):
            add(ts + 5, "acked", "billing", consumer, p, 1, processing_ms=float(n % 4) + 0.5)
        add(ts + 6, "lag", "billing", None, chunk[0], 0)
        events[-1] = {"ts": ts + 6, "type": "lag", "group": "billing", "topic": "orders",
                      "partition": 0, "committed": start, "log_end_offset": start + 8,
                      "lag": 8}  # fmt: skip
    while retries:
        ts += 200
        batch, retries = retries, []
        for p, attempt in batch:
            add(ts, "delivered", "billing", "c1", p, attempt)
        for p, attempt in batch:
            n = positions.index(p)
            if n % 19 == 5 and attempt < 3:
                add(ts + 4, "nacked", "billing", "c1", p, attempt, processing_ms=4.0)
                retries.append((p, attempt + 1))
            elif n % 19 == 5:
                add(ts + 4, "nacked", "billing", "c1", p, attempt, processing_ms=4.0)
                add(ts + 4, "dead_lettered", "billing", "c1", p, attempt, reason="poison")
        for p, attempt in batch:
            if positions.index(p) % 19 != 5:
                add(ts + 7, "acked", "billing", "c1", p, attempt, processing_ms=7.0)
    for start in range(0, len(positions), 10):
        chunk = positions[start : start + 10]
        ts = max(p.timestamp for p in chunk) + 1
        for p in chunk:
            add(ts, "delivered", "audit", "a1", p, 1)
        for p in chunk:
            add(ts, "acked", "audit", "a1", p, 1, processing_ms=0.0, reason="auto_ack")
    events.append({"ts": ts + 1, "type": "skipped", "group": "audit", "topic": "orders",
                   "partition": 1, "offset": 0, "committed": 0,
                   "reason": "deleted by retention before the group read them"})  # fmt: skip
    return events


@pytest.fixture(scope="module")
def shapes(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A store of 60 records on 3 partitions, and its delivery history."""
    root = tmp_path_factory.mktemp("shapes")
    with Store(root / "queue_data") as store:
        store.create_topic("orders", partitions=3)
        positions = [
            position
            for n in range(3)
            for position in store.append_batch(
                "orders", [Message({"n": n * 20 + i}, key=f"k{i % 4}") for i in range(20)]
            )
        ]
    return root / "queue_data", delivery_history(positions)


def _outputs(spark: SparkSession, data: Path, history: list[dict[str, Any]], shape: str,
             out: Path) -> dict[str, Any]:  # fmt: skip
    """Every table, chart and summary figure of the job over ``data`` with ``history``
    written in ``shape``, less what counts lines or bytes (a frame is one line)."""
    copy = out / "queue_data"
    shutil.copytree(data, copy)
    day = copy / "events" / "date=2026-11-23"
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(event_file(history, shape))
    full = run(spark, copy, out / "out").summary
    # The plain Python computation of the end-to-end test reads either shape too.
    assert_same(without_attention(full), expected_summary(copy))
    summary = copy_of(full)
    lines = summary["inputs"].pop("event_lines")
    summary.pop("data")
    summary.pop("run")  # the bytes each run parsed
    tables = {
        path.name: sorted(map(repr, spark.read.parquet(str(path)).collect()))
        for path in sorted((out / "out" / "tables").iterdir())
        if path.name != "lines"
    }
    charts = {p.name: p.read_bytes() for p in sorted((out / "out" / "charts").iterdir())}
    return {"summary": summary, "tables": tables, "charts": charts, "event_lines": lines}


@pytest.fixture(scope="module")
def old_shape_outputs(
    spark: SparkSession,
    shapes: tuple[Path, list[dict[str, Any]]],
    tmp_path_factory: pytest.TempPathFactory,
) -> dict[str, Any]:
    return _outputs(spark, *shapes, "old", tmp_path_factory.mktemp("old"))


@pytest.mark.parametrize("shape", ["new", "mixed"])
def test_the_same_history_in_either_shape_gives_the_same_outputs(
    spark: SparkSession,
    shapes: tuple[Path, list[dict[str, Any]]],
    old_shape_outputs: dict[str, Any],
    shape: str,
    tmp_path: Path,
) -> None:
    data, history = shapes
    outputs = _outputs(spark, data, history, shape, tmp_path)
    old = old_shape_outputs
    # The history covers what it is meant to (so equal outputs compare something).
    orders = old["summary"]["topics"]["orders"]
    assert orders["messages"] == 60 and orders["dead_lettered"] == 3 and orders["expired"] == 1
    assert orders["delivery_attempts"] == {"1": 60 + 60 - 12, "2": 9, "3": 3}
    assert old["event_lines"] == len(history)
    assert outputs["event_lines"] < len(history)  # frames: fewer lines for the same events
    assert outputs["summary"] == old["summary"]
    assert outputs["tables"] == old["tables"]
    assert outputs["charts"] == old["charts"]
