"""Explicit schemas of everything the analytics job reads and writes; nothing is inferred.

The line schemas name only the fields the job uses: a message's ``value`` can be any JSON
and is never parsed. Integers are 64-bit (``LongType``): timestamps are milliseconds.
"""

from __future__ import annotations

from pyspark.sql.types import (
    ArrayType,
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
)

# A message segment line (docs/FORMAT.md, "Message segments"), the fields the job reads.
RECORD_LINE = StructType(
    [
        StructField("offset", LongType()),
        StructField("timestamp", LongType()),
        StructField("key", StringType()),
        StructField("key_b64", StringType()),
        StructField("batch_records", LongType()),
        StructField("deliver_at", LongType()),
        StructField("crc", LongType()),
    ]
)

# A delivery event line (docs/FORMAT.md, "Delivery events"); every field.
EVENT_LINE = StructType(
    [
        StructField("ts", LongType()),
        StructField("type", StringType()),
        StructField("group", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("key", StringType()),
        StructField("key_b64", StringType()),
        StructField("consumer", StringType()),
        StructField("attempt", LongType()),
        StructField("published_at", LongType()),
        StructField("bytes", LongType()),
        StructField("processing_ms", DoubleType()),
        StructField("reason", StringType()),
        StructField("committed", LongType()),
        StructField("log_end_offset", LongType()),
        StructField("lag", LongType()),
    ]
)

# The fields of a delivery event line of the frame shape (docs/FORMAT.md; one ``delivered``
# line per dispatched frame, one ``acked`` line per ACK frame) that are arrays. ``runs`` holds
# ``[topic, partition, first_offset, count, attempt]`` lists of mixed types: read as text,
# each element typed by the job (a JSON number read as a string is its text).
EVENT_RUNS = ArrayType(ArrayType(StringType()))
EVENT_PROCESSING_TIMES = ArrayType(DoubleType())

# Raw lines as extracted: where each came from and its text.
SEGMENT_LINES = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("line", StringType()),
    ]
)
EVENT_LINES = StructType([StructField("line", StringType())])

# state.db, read with sqlite3 in the driver (small tables).
STATE_TOPICS = StructType(
    [StructField("topic", StringType(), False), StructField("partitions", IntegerType(), False)]
)
STATE_PARTITIONS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("log_start_offset", LongType(), False),
        StructField("log_end_offset", LongType(), False),
    ]
)
# tasks.db, aggregated with sqlite3 in the driver (a row per task name and state, a row per
# periodic job).
TASKS = StructType(
    [
        StructField("task", StringType(), False),
        StructField("state", StringType(), False),
        StructField("tasks", LongType(), False),
        StructField("ran", LongType(), False),
        StructField("mean_run_ms", DoubleType()),
        StructField("max_run_ms", LongType()),
    ]
)
PERIODIC = StructType(
    [
        StructField("job", StringType(), False),
        StructField("task", StringType(), False),
        StructField("schedule", StringType(), False),
        StructField("last_tick", LongType()),
        StructField("last_run_ms", LongType()),
        StructField("next_run_ms", LongType()),
    ]
)
STATE_GROUP_OFFSETS = StructType(
    [
        StructField("group", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("committed", LongType(), False),
    ]
)

# The settled outcomes a re-run keeps (analytics/settled.py).
SETTLED_TO = StructType(
    [
        StructField("group", StringType(), False),
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("settled_to", LongType(), False),
    ]
)
SETTLED_MARKS = StructType([*SETTLED_TO.fields, StructField("events_below", LongType(), False)])
OUTCOME_COUNTS = StructType(
    [
        StructField("topic", StringType()),
        StructField("group", StringType()),
        StructField("kind", StringType()),
        StructField("value", LongType()),
        StructField("n", LongType()),
    ]
)
KEY_FINISHES = StructType(
    [
        StructField("group", StringType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("key", StringType()),
        StructField("finished_at", LongType()),
    ]
)
CUTS = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("cut_from", LongType(), False),
    ]
)
# Per partition, where the records the job reads end (transform.visible_to).
VISIBLE = StructType(
    [
        StructField("topic", StringType(), False),
        StructField("partition", IntegerType(), False),
        StructField("visible_to", LongType(), False),
    ]
)
# What analytics/kept.py keeps of each consumer's deliveries' spans (transform.activity_summary).
ACTIVITY = StructType(
    [
        StructField("group", StringType()),
        StructField("consumer", StringType()),
        StructField("first", LongType()),
        StructField("reach", LongType()),
        StructField("idle", LongType()),
    ]
)
