"""The job's transformations on small inline DataFrames; every expected value is worked out
by hand in the test (see transform.py for the definitions)."""

from __future__ import annotations

import math
from typing import Any

import orjson
import pytest
from analytics_helpers import record_line
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.testing import assertDataFrameEqual

from spoolmq.analytics import transform

pytestmark = pytest.mark.spark

SEGMENT = "topic string, partition int, line string"
RECORDS = "topic string, partition int, offset long, timestamp long, key string, bytes long"
# Records as parse_records gives them to delivery_outcomes: with their delay, if any.
DUE_RECORDS = RECORDS + ", deliver_at long"
EVENTS = (
    "ts long, type string, group string, topic string, partition int, offset long, "
    "consumer string, attempt long, published_at long, processing_ms double, "
    "committed long, log_end_offset long, lag long"
)


def frame(spark: SparkSession, schema: str, rows: list[tuple[Any, ...]]) -> DataFrame:
    return spark.createDataFrame(rows, schema)


def event(
    ts: int,
    kind: str,
    offset: int | None,
    *,
    group: str = "g",
    topic: str = "t",
    partition: int = 0,
    consumer: str | None = "c1",
    attempt: int | None = 1,
    published_at: int | None = 1000,
    processing_ms: float | None = None,
) -> tuple[Any, ...]:
    return (
        ts, kind, group, topic, partition, offset, consumer, attempt, published_at,
        processing_ms, None, None, None,
    )  # fmt: skip


def test_parse_records_keeps_good_lines_and_names_every_problem(spark: SparkSession) -> None:
    good = record_line(offset=0, timestamp=1000, key="k", value={"a": 1}, headers=[])
    # A value holding the text ,"crc": itself: the checksum covers up to the *last* mark.
    tricky = record_line(offset=1, timestamp=1000, key=None, value={"crc": 5}, headers=[])
    raw_key = record_line(offset=2, timestamp=1001, key_b64="AAE=", value=1, batch_records=2)
    bad_crc = record_line(offset=3, timestamp=1001, key="k", value=2).replace(
        '"value":2', '"value":3'
    )
    torn = '{"offset":4,"timestamp":10'
    lines = frame(
        spark,
        SEGMENT,
        [("t", 0, good), ("t", 0, tricky), ("t", 1, raw_key), ("t", 1, bad_crc), ("t", 1, torn)],
    )
    expected = frame(
        spark,
        DUE_RECORDS + ", batch_records long, problem string",
        [
            ("t", 0, 0, 1000, "k", len(good) + 1, None, None, None),
            ("t", 0, 1, 1000, None, len(tricky) + 1, None, None, None),
            ("t", 1, 2, 1001, "AAE=", len(raw_key) + 1, None, 2, None),
            ("t", 1, 3, 1001, "k", len(bad_crc) + 1, None, None, "checksum mismatch"),
            ("t", 1, None, None, None, len(torn) + 1, None, None, "unparsable"),
        ],
    )
    assertDataFrameEqual(transform.parse_records(lines), expected)


def test_bytes_count_utf8_bytes_not_characters(spark: SparkSession) -> None:
    line = record_line(offset=0, timestamp=1, key="é", value="€")
    parsed = transform.parse_records(frame(spark, SEGMENT, [("t", 0, line)])).collect()[0]
    assert parsed["bytes"] == len(line.encode()) + 1 == len(line) + 4  # é 2 bytes, € 3 bytes
    assert parsed["problem"] is None


def test_only_an_incomplete_last_batch_is_marked(spark: SparkSession) -> None:
    rows = [
        # partition 0: a whole batch of 2, a single record, then 2 of a batch of 3
        ("t", 0, 0, 10, None, 100, 2, None),
        ("t", 0, 1, 10, None, 100, None, None),
        ("t", 0, 2, 11, None, 100, None, None),
        ("t", 0, 3, 12, None, 100, 3, None),
        ("t", 0, 4, 12, None, 100, None, None),
        ("t", 0, None, None, None, 7, None, "unparsable"),
        # partition 1: a whole batch of 3 at the end
        ("t", 1, 0, 10, None, 100, 3, None),
        ("t", 1, 1, 10, None, 100, None, None),
        ("t", 1, 2, 10, None, 100, None, None),
    ]
    schema = RECORDS + ", batch_records long, problem string"
    records = frame(spark, schema, rows)
    ends = transform.merge_ends({}, transform.end_partials(records).collect())
    assert ends == {("t", 0): (4, 3, 3), ("t", 1): (2, 0, 3)}
    assert {where: transform.cut_from(end) for where, end in ends.items()} == {
        ("t", 0): 3,
        ("t", 1): None,
    }
    assert {where: transform.visible_to(end) for where, end in ends.items()} == {
        ("t", 0): 3,
        ("t", 1): 3,
    }
    # The same from partials of two sets of records, in either order.
    first, second = records.where("offset < 3 OR offset IS NULL"), records.where("offset >= 3")
    for one, other in ((first, second), (second, first)):
        parts = transform.merge_ends({}, transform.end_partials(one).collect())
        assert transform.merge_ends(parts, transform.end_partials(other).collect()) == ends
    cuts = frame(spark, "topic string, partition int, cut_from long", [("t", 0, 3)])
    marked = transform.mark_incomplete_batches(records, cuts)
    expected = [(*r[:7], "incomplete batch") if r[1] == 0 and r[2] in (3, 4) else r for r in rows]
    assertDataFrameEqual(marked, frame(spark, schema, expected))
    # Line counts before the marking, told how many it marks: the same as after it.
    counts = transform.line_counts(
        records, records.limit(0).withColumn("first_in_line", F.lit(True))
    )
    assertDataFrameEqual(
        transform.with_incomplete(counts, 2),
        transform.line_counts(marked, marked.limit(0).withColumn("first_in_line", F.lit(True))),
    )


def test_parse_events_and_line_counts(spark: SparkSession) -> None:
    good = orjson.dumps(
        {"ts": 5, "type": "acked", "group": "g", "topic": "t", "partition": 0, "offset": 3,
         "key": None, "consumer": "c", "attempt": 1, "published_at": 2, "bytes": 80,
         "processing_ms": 1.5, "reason": None}
    ).decode()  # fmt: skip
    lag = orjson.dumps(
        {"ts": 6, "type": "lag", "group": "g", "topic": "t", "partition": 0, "committed": 4,
         "log_end_offset": 9, "lag": 5}
    ).decode()  # fmt: skip
    events = transform.parse_events(
        frame(spark, "line string", [(good,), (lag,), ('{"ts":7,"type":"ack',), ("[1,2]",)])
    )
    rows = sorted(events.collect(), key=lambda r: (r["ts"] is None, r["ts"] or 0))
    assert rows[0]["type"] == "acked" and rows[0]["processing_ms"] == 1.5 and rows[0]["offset"] == 3
    assert rows[0]["problem"] is None
    assert (rows[1]["committed"], rows[1]["log_end_offset"], rows[1]["lag"]) == (4, 9, 5)
    assert rows[1]["offset"] is None and rows[1]["problem"] is None
    assert [r["problem"] for r in rows[2:]] == ["unparsable", "unparsable"]
    records = frame(
        spark,
        "problem string",
        [(None,), (None,), (None,), ("unparsable",), ("checksum mismatch",), ("unparsable",)],
    )
    counts = transform.line_counts(records, events)
    assertDataFrameEqual(
        counts,
        frame(
            spark,
            "source string, status string, lines long",
            [
                ("segments", "used", 3),
                ("segments", "unparsable", 2),
                ("segments", "checksum mismatch", 1),
                ("events", "used", 2),
                ("events", "unparsable", 2),
            ],
        ),
    )


def test_partition_stats_cover_empty_partitions_and_take_the_larger_log_end(
    spark: SparkSession,
) -> None:
    records = frame(
        spark,
        RECORDS,
        [
            ("t", 0, 0, 100, "a", 50),
            ("t", 0, 1, 200, "b", 60),
            ("t", 0, 2, 300, "a", 70),
            ("t", 1, 5, 150, None, 40),  # 0-4 deleted by retention
        ],
    )
    topics = frame(spark, "topic string, partitions int", [("t", 3), ("quiet", 1)])
    # state.db lags behind partition 0 (written at most once a second), and is ahead of
    # partition 1's segments (nothing there past offset 5 yet: it holds the truth of 9).
    state = frame(
        spark,
        "topic string, partition int, log_start_offset long, log_end_offset long",
        [("t", 0, 0, 1), ("t", 1, 5, 9)],
    )
    expected = frame(
        spark,
        "topic string, partition int, messages long, bytes long, first_offset long, "
        "last_offset long, first_timestamp long, last_timestamp long, log_end_offset long, "
        "share double, ratio_to_mean double",
        [
            ("t", 0, 3, 180, 0, 2, 100, 300, 3, 0.75, 2.25),
            ("t", 1, 1, 40, 5, 5, 150, 150, 9, 0.25, 0.75),
            ("t", 2, 0, 0, None, None, None, None, 0, 0.0, 0.0),
            ("quiet", 0, 0, 0, None, None, None, None, 0, None, None),
        ],
    )
    assertDataFrameEqual(transform.partition_stats(records, topics, state), expected)


def _throughput_inputs(spark: SparkSession) -> tuple[DataFrame, DataFrame]:
    records = frame(
        spark,
        RECORDS,
        [
            ("t", 0, 0, 60_000, None, 10),
            ("t", 0, 1, 119_999, None, 20),
            ("t", 0, 2, 120_000, None, 5),
        ],
    )
    events = frame(
        spark,
        EVENTS,
        [
            event(61_000, "delivered", 0),
            event(62_000, "acked", 0),
            event(190_000, "delivered", 1),
            event(190_500, "nacked", 1),  # neither a delivery nor an ACK
        ],
    )
    return records, events


def test_throughput_buckets_records_and_work(spark: SparkSession) -> None:
    records, events = _throughput_inputs(spark)
    expected = frame(
        spark,
        "topic string, bucket_start_ms long, published long, bytes long, delivered long, "
        "acked long",
        [("t", 60_000, 2, 30, 1, 1), ("t", 120_000, 1, 5, 0, 0), ("t", 180_000, 0, 0, 1, 0)],
    )
    actual = transform.throughput(records, events, 60_000).drop("bucket_start")
    assertDataFrameEqual(actual, expected)
    with pytest.raises(ValueError, match="at least 1 ms"):
        transform.throughput(records, events, 0)


def test_rebucket_sums_per_minute_rows_into_what_a_coarser_bucket_computes(
    spark: SparkSession,
) -> None:
    records, events = _throughput_inputs(spark)
    per_minute = transform.throughput(records, events, 60_000)
    coarse = transform.rebucket(per_minute, 120_000, ["topic"]).drop("bucket_start")
    expected = frame(
        spark,
        "topic string, bucket_start_ms long, published long, bytes long, delivered long, "
        "acked long",
        [("t", 0, 2, 30, 1, 1), ("t", 120_000, 1, 5, 1, 0)],
    )
    assertDataFrameEqual(coarse, expected)
    assertDataFrameEqual(
        coarse, transform.throughput(records, events, 120_000).drop("bucket_start")
    )
    by_group = transform.worked_by(events, 60_000, "topic", "group")
    assertDataFrameEqual(
        transform.rebucket(by_group, 120_000, ["topic", "group"]),
        transform.worked_by(events, 120_000, "topic", "group"),
    )


@pytest.fixture
def delivery_events(spark: SparkSession) -> DataFrame:
    """Group g: offset 0 ACKed first time; 1 NACKed then ACKed; 2 dead-lettered after 3
    attempts; 3 expired. Group h: offset 0 ACKed. A lag snapshot and a retention skip, which
    are not deliveries."""
    return frame(
        spark,
        EVENTS,
        [
            event(1010, "delivered", 0, consumer="c1"),
            event(1030, "acked", 0, consumer="c1", processing_ms=20.0),
            event(1005, "delivered", 1, consumer="c2"),
            event(1006, "nacked", 1, consumer="c2", processing_ms=1.0),
            event(1100, "delivered", 1, consumer="c1", attempt=2),
            event(1140, "acked", 1, consumer="c1", attempt=2, processing_ms=40.0),
            event(1001, "delivered", 2, consumer="c2"),
            event(1002, "nacked", 2, consumer="c2", processing_ms=1.0),
            event(1200, "delivered", 2, consumer="c2", attempt=2),
            event(1201, "lease_expired", 2, consumer="c2", attempt=2),
            event(1300, "delivered", 2, consumer="c1", attempt=3),
            event(1310, "nacked", 2, consumer="c1", attempt=3, processing_ms=10.0),
            event(1311, "dead_lettered", 2, consumer="c1", attempt=3),
            event(5000, "expired", 3, consumer=None, attempt=0, published_at=2000),
            event(1500, "delivered", 0, group="h", consumer="c9"),
            event(1600, "acked", 0, group="h", consumer="c9", processing_ms=100.0),
            (1700, "lag", "g", "t", 0, None, None, None, None, None, 2, 4, 2),
            # Offsets 4..9 deleted by retention before g read them: no message's outcome.
            (1800, "skipped", "g", "t", 0, 4, None, None, None, None, 10, None, None),
        ],
    )


def test_delivery_outcomes(spark: SparkSession, delivery_events: DataFrame) -> None:
    expected = frame(
        spark,
        "group string, topic string, partition int, offset long, published_at long, "
        "first_delivered_at long, attempts long, acked_at long, dead_lettered boolean, "
        "expired boolean, cancelled boolean, finished_at long, held_back boolean, "
        "due_at long, key string, events long",
        [
            ("g", "t", 0, 0, 1000, 1010, 1, 1030, False, False, False, 1030, None, None, None, 2),
            ("g", "t", 0, 1, 1000, 1005, 2, 1140, False, False, False, 1140, None, None, None, 4),
            ("g", "t", 0, 2, 1000, 1001, 3, None, True, False, False, 1311, None, None, None, 7),
            ("g", "t", 0, 3, 2000, None, None, None, False, True, False, 5000, None, None, None, 1),
            ("h", "t", 0, 0, 1000, 1500, 1, 1600, False, False, False, 1600, None, None, None, 2),
        ],
    )
    # The events carry published_at (the per-message shape); with no record, nothing is
    # known of a message's key or delay: held_back and key are null.
    no_records = frame(spark, DUE_RECORDS, [])
    assertDataFrameEqual(transform.delivery_outcomes(delivery_events, no_records), expected)


def test_a_delayed_or_retrying_keyed_message_holds_back_its_key(spark: SparkSession) -> None:
    records = frame(
        spark,
        DUE_RECORDS,
        [
            ("t", 0, 0, 1000, "k", 10, 3000),  # delayed until 3000
            ("t", 0, 1, 1100, "k", 10, None),  # behind offset 0 (unfinished until 3050)
            ("t", 0, 2, 1200, None, 10, None),  # keyless: waits for nobody
            ("t", 0, 3, 3100, "k", 10, None),  # 0 and 1 are done by then
            ("t", 0, 4, 3200, "j", 10, None),  # j's first: offset 5 comes after it
            ("t", 0, 5, 3150, "j", 10, None),  # (stamps need not grow with offsets)
        ],
    )
    events = frame(
        spark,
        EVENTS,
        [
            event(3010, "delivered", 0, published_at=None),
            event(3050, "acked", 0, published_at=None),
            event(3060, "delivered", 1, published_at=None),
            event(3070, "acked", 1, published_at=None),
            event(1210, "delivered", 2, published_at=None),
            event(1220, "acked", 2, published_at=None),
            event(3110, "delivered", 3, published_at=None),
            event(3300, "delivered", 4, published_at=None),
            event(3400, "dead_lettered", 4, published_at=None),
            event(3500, "delivered", 5, published_at=None),
        ],
    )
    outcomes = transform.delivery_outcomes(events, records)
    held = {r["offset"]: r["held_back"] for r in outcomes.collect()}
    # Offset 5 was published (3150) before 4 finished (3400): held back by its key.
    assert held == {0: True, 1: True, 2: False, 3: False, 4: False, 5: True}
    rows = {(r["group"], r["measure"]): r for r in transform.latency(outcomes).collect()}
    # Queue waits of 2 and 3 (10 ms each) and 4 (100 ms); every first delivery counts in
    # first_delivery; ACK waits of 0, 1 and 2.
    assert (rows[("g", "queue")]["messages"], rows[("g", "queue")]["max"]) == (3, 100.0)
    assert rows[("g", "queue")]["p50"] == 10.0
    assert rows[("g", "first_delivery")]["messages"] == 6
    assert rows[("g", "first_delivery")]["max"] == 2010.0
    assert rows[("g", "ack")]["messages"] == 3
    # Offset 0 was due at 3000 and delivered at 3010: the only delayed message.
    assert (rows[("g", "lateness")]["messages"], rows[("g", "lateness")]["max"]) == (1, 10.0)
    # One group: its pooled rows (group null) are its own.
    for measure in ("queue", "first_delivery", "ack", "lateness"):
        assert rows[(None, measure)].asDict() == rows[("g", measure)].asDict() | {"group": None}


def test_latency_attempts_and_rates(spark: SparkSession, delivery_events: DataFrame) -> None:
    outcomes = transform.delivery_outcomes(delivery_events, frame(spark, DUE_RECORDS, []))
    # Pooled over both groups (group null). First delivery waits: 10, 5, 1, 500 ms. Sorted
    # 1, 5, 10, 500: p50 at rank 1.5 is 5 + 0.5 * 5 = 7.5; p90 at 2.7 is 10 + 0.7 * 490 =
    # 353; p99 at 2.97 is 10 + 0.97 * 490. ACK waits: 30, 140, 600: p50 140; p90 at 1.8 is
    # 140 + 0.8 * 460 = 508; p99 at 1.98. Group g alone: 10, 5, 1 and 30, 140; h: 500, 600.
    # No record: no message is known to be due at once, so no queue figure.
    assertDataFrameEqual(
        transform.latency(outcomes),
        frame(
            spark,
            "topic string, group string, measure string, messages long, p50 double, "
            "p90 double, p99 double, max double",
            [
                ("t", None, "first_delivery", 4, 7.5, 353.0, 10 + 0.97 * 490, 500.0),
                ("t", None, "ack", 3, 140.0, 508.0, 140 + 0.98 * 460, 600.0),
                ("t", "g", "first_delivery", 3, 5.0, 9.0, 9.9, 10.0),
                ("t", "g", "ack", 2, 85.0, 129.0, 138.9, 140.0),
                ("t", "h", "first_delivery", 1, 500.0, 500.0, 500.0, 500.0),
                ("t", "h", "ack", 1, 600.0, 600.0, 600.0, 600.0),
            ],
        ),
    )
    assertDataFrameEqual(
        transform.attempts_histogram(outcomes),
        frame(
            spark,
            "topic string, group string, attempts long, messages long",
            [("t", "g", 1, 1), ("t", "g", 2, 1), ("t", "g", 3, 1), ("t", "h", 1, 1)],
        ),
    )
    assertDataFrameEqual(
        transform.outcome_rates(outcomes),
        frame(
            spark,
            "topic string, group string, messages long, delivered long, acked long, "
            "retried long, dead_lettered long, expired long, cancelled long, "
            "retry_rate double, dlq_rate double, expiry_rate double",
            [
                ("t", "g", 4, 3, 2, 2, 1, 1, 0, 0.5, 0.25, 0.25),
                ("t", "h", 1, 1, 1, 0, 0, 0, 0, 0.0, 0.0, 0.0),
            ],
        ),
    )


def test_processing_time_and_consumer_stats(
    spark: SparkSession, delivery_events: DataFrame
) -> None:
    assertDataFrameEqual(
        transform.processing_time(delivery_events),
        frame(
            spark,
            "group string, consumer string, acked long, mean double, p50 double, p90 double, "
            "p99 double, max double",
            [
                # c1 ACKed after 20 and 40 ms: p90 at rank 0.9 is 20 + 0.9 * 20 = 38.
                ("g", "c1", 2, 30.0, 30.0, 38.0, 39.8, 40.0),
                ("h", "c9", 1, 100.0, 100.0, 100.0, 100.0, 100.0),
            ],
        ),
    )
    assertDataFrameEqual(
        transform.consumer_stats(delivery_events),
        frame(
            spark,
            "group string, consumer string, deliveries long, acked long, nacked long, "
            "lease_expired long, released long, first_ts long, last_ts long, failures long, "
            "failure_rate double, acked_per_s double",
            [
                # c1: delivered 0, 1 (2nd), 2 (3rd); ACKed 0 and 1; NACKed 2. 1010..1310 ms.
                ("g", "c1", 3, 2, 1, 0, 0, 1010, 1310, 1, 1 / 3, 2 * 1000 / 300),
                # c2: delivered 1, 2, 2 again; NACKed twice, one lease expired; no ACK.
                ("g", "c2", 3, 0, 2, 1, 0, 1001, 1201, 3, 1.0, 0.0),
                ("h", "c9", 1, 1, 0, 0, 0, 1500, 1600, 0, 0.0, 10.0),
            ],
        ),
    )


def test_lag_now_and_over_time(spark: SparkSession) -> None:
    offsets = frame(
        spark,
        "group string, topic string, partition int, committed long",
        [("g", "t", 0, 3), ("g", "t", 1, 9), ("g", "gone", 0, 4)],
    )
    partitions = frame(
        spark, "topic string, partition int, log_end_offset long", [("t", 0, 10), ("t", 1, 9)]
    )
    assertDataFrameEqual(
        transform.lag_now(offsets, partitions),
        frame(
            spark,
            "group string, topic string, partition int, committed long, log_end_offset long, "
            "lag long",
            [("g", "t", 0, 3, 10, 7), ("g", "t", 1, 9, 9, 0), ("g", "gone", 0, 4, 4, 0)],
        ),
    )
    snapshots = frame(
        spark,
        EVENTS,
        [
            (1_000, "lag", "g", "t", 0, None, None, None, None, None, 0, 10, 10),
            (1_002, "lag", "g", "t", 1, None, None, None, None, None, 0, 4, 4),
            (3_000, "lag", "g", "t", 0, None, None, None, None, None, 8, 10, 2),
            (6_000, "lag", "g", "t", 0, None, None, None, None, None, 10, 10, 0),
            (6_001, "lag", "h", "t", 0, None, None, None, None, None, 7, 10, None),  # no lag field
            event(6_002, "acked", 1),
        ],
    )
    over_time = transform.lag_over_time(snapshots)
    assert sorted(r["lag"] for r in over_time.collect()) == [0, 2, 3, 4, 10]
    # 5 s buckets: g at 0 has partition 0 peaking at 10 plus partition 1 at 4.
    assertDataFrameEqual(
        transform.lag_by_bucket(over_time, 5_000),
        frame(
            spark,
            "group string, bucket_start_ms long, lag long",
            [("g", 0, 14), ("g", 5_000, 0), ("h", 5_000, 3)],
        ),
    )


def test_top_keys_and_payload_sizes(spark: SparkSession) -> None:
    records = frame(
        spark,
        RECORDS,
        [
            ("t", 0, 0, 1, "a", 100),
            ("t", 0, 1, 1, "b", 200),
            ("t", 0, 2, 1, "a", 300),
            ("t", 1, 0, 1, "c", 400),
            ("t", 1, 1, 1, None, 500),
            ("u", 0, 0, 1, "z", 50),
        ],
    )
    assertDataFrameEqual(
        transform.top_keys(records, 2),
        frame(
            spark,
            "topic string, rank int, key string, messages long, share double",
            # b and c tie at 1: the key order breaks the tie; keyless records count in
            # the topic's total (5) but are not a key.
            [("t", 1, "a", 2, 0.4), ("t", 2, "b", 1, 0.2), ("u", 1, "z", 1, 1.0)],
        ),
    )
    assertDataFrameEqual(
        transform.payload_sizes(records),
        frame(
            spark,
            "topic string, messages long, min double, mean double, p50 double, p90 double, "
            "p99 double, max double",
            [
                # 100..500: p90 at rank 3.6 is 400 + 0.6 * 100; p99 at 3.96.
                ("t", 5, 100.0, 300.0, 300.0, 460.0, 496.0, 500.0),
                ("u", 1, 50.0, 50.0, 50.0, 50.0, 50.0, 50.0),
            ],
        ),
    )


def test_a_cancelled_message_is_an_outcome_of_its_own(spark: SparkSession) -> None:
    events = frame(
        spark,
        EVENTS,
        [
            event(1010, "delivered", 0),
            event(1020, "acked", 0, processing_ms=10.0),
            # Cancelled before any delivery (the broker records it with no consumer).
            event(1500, "cancelled", 1, consumer=None, attempt=0),
        ],
    )
    outcomes = transform.delivery_outcomes(events, frame(spark, DUE_RECORDS, []))
    cancelled = outcomes.where("offset = 1").first()
    assert cancelled is not None
    assert cancelled["cancelled"] and cancelled["finished_at"] == 1500
    assert cancelled["attempts"] is None and cancelled["acked_at"] is None
    rates = transform.outcome_rates(outcomes).first()
    assert rates is not None
    assert (rates["messages"], rates["acked"], rates["cancelled"]) == (2, 1, 1)


def test_consumer_activity_is_the_union_of_its_deliveries(
    spark: SparkSession, delivery_events: DataFrame
) -> None:
    expected = "group string, consumer string, busy_ms long, idle_ms long, idle_share double"
    assertDataFrameEqual(
        transform.consumer_activity(delivery_events),
        frame(
            spark,
            expected,
            [
                # c1 held 1010-1030, 1100-1140 (2nd attempt), 1300-1310: 70 ms busy, gaps
                # of 70 and 160 ms idle, over 300 ms.
                ("g", "c1", 70, 230, 230 / 300),
                # c2: 1001-1002, 1005-1006, 1200-1201 (ended by a lease expiry).
                ("g", "c2", 3, 197, 197 / 200),
                ("h", "c9", 100, 0, 0.0),
            ],
        ),
    )
    # Overlapping deliveries (prefetch) count once; one not ended yet is a moment.
    overlapping = frame(
        spark,
        EVENTS,
        [
            event(0, "delivered", 0),
            event(0, "delivered", 1),
            event(50, "acked", 0, processing_ms=50.0),
            event(60, "delivered", 2),
            event(80, "acked", 1, processing_ms=80.0),
            event(100, "released", 2),
            event(200, "delivered", 3),
        ],
    )
    assertDataFrameEqual(
        transform.consumer_activity(overlapping),
        frame(spark, expected, [("g", "c1", 100, 100, 0.5)]),
    )


def test_worked_by_group_and_by_consumer(spark: SparkSession, delivery_events: DataFrame) -> None:
    by_group = transform.worked_by(delivery_events, 100, "topic", "group").drop("bucket_start")
    assertDataFrameEqual(
        by_group,
        frame(
            spark,
            "topic string, group string, bucket_start_ms long, delivered long, acked long",
            [
                ("t", "g", 1000, 3, 1),
                ("t", "g", 1100, 1, 1),
                ("t", "g", 1200, 1, 0),
                ("t", "g", 1300, 1, 0),
                ("t", "h", 1500, 1, 0),
                ("t", "h", 1600, 0, 1),
            ],
        ),
    )
    by_consumer = transform.worked_by(delivery_events, 1000, "group", "consumer")
    rows = {
        (r["group"], r["consumer"]): (r["delivered"], r["acked"]) for r in by_consumer.collect()
    }
    assert rows == {("g", "c1"): (3, 2), ("g", "c2"): (3, 0), ("h", "c9"): (1, 1)}


def test_the_mean_processing_time_is_exact_and_survives_damaged_times(
    spark: SparkSession,
) -> None:
    """Summed as decimals: 3 x 0.1 + 0.2 over 4 is 0.125 (doubles give 0.12500000000000003),
    whatever the order of the counts; a time no decimal holds (a damaged line's infinity
    or NaN) gives the doubles' mean, not an error."""
    counts = frame(
        spark,
        "group string, consumer string, processing_ms double, n long",
        [
            ("g", "c", 0.1, 3), ("g", "c", 0.2, 1),
            ("g", "d", float("inf"), 1), ("g", "d", 1.0, 1),
            ("g", "e", float("nan"), 2),
        ],
    )  # fmt: skip
    rows = {row.consumer: row for row in transform.processing_from_counts(counts).collect()}
    assert (rows["c"].acked, rows["c"].mean, rows["c"].max) == (4, 0.125, 0.2)
    assert rows["d"].acked == 2 and rows["d"].mean == float("inf")
    assert rows["e"].acked == 2 and math.isnan(rows["e"].mean)
