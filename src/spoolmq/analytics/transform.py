"""Transformations: pure functions from DataFrames to DataFrames, no I/O.

Every figure is an aggregate computed by Spark; the driver only ever receives aggregates.
Percentiles are exact (Spark's ``percentile``: linear interpolation between the two closest
ranks, as numpy's default), which is cheap here because latencies and sizes are whole
milliseconds and bytes, so the aggregation keeps one count per distinct value.

Definitions (docs: README "Analytics"):

- a *record* is a line of a message segment that parses, has its checksum right, and whose
  batch is whole in the file; ``bytes`` is the stored line with its newline;
- a *delivery outcome* is one message as seen by one consumer group, from its events:
  first delivery, attempts (the highest delivery attempt), ACK, dead letter, expiry, cancel;
- e2e latency is publish (the record's timestamp) to first delivery; ack latency is publish
  to ACK; processing time is delivery to ACK (``processing_ms`` of ``acked`` events).

Delivery events are read in both shapes brokers write, mixed: one line per message, or one
``delivered``/``acked`` line per frame (runs of offsets). ``parse_events`` turns both into
one row per message, so every function after it sees the same rows for the same history.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spoolmq.analytics import schemas
from spoolmq.types import EventType

PERCENTILES = (0.5, 0.9, 0.99)
# Later than any publish time: the finish of a message not finished yet.
UNFINISHED = 2**62
# Delivery events that a consumer's work ended in, other than an ACK.
FAILURE_TYPES = (EventType.NACKED, EventType.LEASE_EXPIRED, EventType.RELEASED)
_CRC_MARK = ',"crc":'
# The problem of the records of a batch not all of whose lines are in the file.
INCOMPLETE_BATCH = "incomplete batch"
# A delivery event line of the frame shape is about one frame's messages: at most a
# consumer's prefetch (the broker allows up to 100,000). A larger count is damage, and is
# not expanded into an array that large.
MAX_MESSAGES_PER_LINE = 1_000_000
# The event fields that a line of the frame shape gives per message (from its runs).
_PER_MESSAGE = ("topic", "partition", "offset", "attempt", "processing_ms")


def _percentile_columns(value: Column, prefix: str = "") -> list[Column]:
    """p50, p90, p99 (exact, interpolated) and max of ``value`` as doubles."""
    fractions = F.array(*(F.lit(f) for f in PERCENTILES))
    values = F.percentile(value.cast("double"), fractions)
    return [
        values[0].alias(f"{prefix}p50"),
        values[1].alias(f"{prefix}p90"),
        values[2].alias(f"{prefix}p99"),
        F.max(value).cast("double").alias(f"{prefix}max"),
    ]


def _count_if(condition: Column) -> Column:
    return F.sum(F.when(condition, 1).otherwise(0)).cast("long")


def _ratio(part: str, whole: str) -> Column:
    return F.when(F.col(whole) > 0, F.col(part) / F.col(whole))


# -- parsing -----------------------------------------------------------------------------


def _parse_json_lines(
    lines: DataFrame, keep: list[str], schema: StructType, text: tuple[str, ...] = ()
) -> DataFrame:
    """The top-level fields of ``schema`` from each JSON line, typed as the schema says.

    One ``json_tuple`` pass per line (about twice as fast as ``from_json`` here), then a
    ``try_cast`` per field: a line that is not a JSON object, or is cut off, gives nulls;
    so does a field of the wrong type. The fields named in ``text`` are also kept as their
    JSON text, in columns ``_json_<name>`` (for arrays, parsed further by the caller).
    """
    names = [field.name for field in schema.fields]
    names += [name for name in text if name not in names]
    raw = [f"_json_{name}" for name in names]
    parsed = lines.select(*keep, F.json_tuple(F.col("line"), *names).alias(*raw))
    return parsed.select(
        *keep,
        *(F.col(f"_json_{f.name}").try_cast(f.dataType).alias(f.name) for f in schema.fields),
        *(F.col(f"_json_{name}") for name in text),
    )


def parse_records(lines: DataFrame) -> DataFrame:
    """Segment lines (topic, partition, line) to records with a ``problem`` column.

    ``problem`` is null for a good record, else ``unparsable`` (not a JSON record line: a
    torn write, or damage) or ``checksum mismatch`` (``crc`` is not the CRC-32 of the
    bytes before the last ``,"crc":``, as the store writes it). Columns of ``lines`` other
    than those three (the parse cache's ``file_id``) are passed through.
    """
    passed = [c for c in lines.columns if c not in ("topic", "partition", "line")]
    parsed = _parse_json_lines(lines, ["topic", "partition", "line", *passed], schemas.RECORD_LINE)
    after_mark = F.substring_index(F.col("line"), _CRC_MARK, -1)
    before_mark = F.expr(
        "left(line, length(line) - length(substring_index(line, ',\"crc\":', -1)) - 7)"
    )
    good_checksum = F.crc32(before_mark.cast("binary")) == F.col("crc")
    problem = (
        F.when(
            F.col("offset").isNull() | F.col("timestamp").isNull() | F.col("crc").isNull(),
            F.lit("unparsable"),
        )
        .when(~good_checksum | (after_mark == F.col("line")), F.lit("checksum mismatch"))
        .otherwise(F.lit(None).cast("string"))
    )
    return parsed.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        F.coalesce(F.col("key"), F.col("key_b64")).alias("key"),
        (F.octet_length("line") + 1).cast("long").alias("bytes"),
        "deliver_at",
        "batch_records",
        problem.alias("problem"),
        *passed,
    )


def end_partials(records: DataFrame) -> DataFrame:
    """Where each partition's records end, as partial aggregates of some records (merged,
    with those of other records, by ``merge_ends``): per (topic, partition), the newest
    offset, the newest batch head's offset and its ``batch_records``. One row per
    partition, so the result is small."""
    heads = F.when(F.col("batch_records").isNotNull(), F.col("offset"))
    return (
        records.where(F.col("problem").isNull())
        .groupBy("topic", "partition")
        .agg(
            F.max("offset").alias("max_offset"),
            F.max(heads).alias("head"),
            F.max_by("batch_records", heads).alias("head_records"),
        )
    )


# Per (topic, partition): the newest offset, the newest batch head and its batch_records.
PartitionEnd = tuple[int, int | None, int | None]


def merge_ends(
    ends: dict[tuple[str, int], PartitionEnd], partials: Iterable[Sequence[Any]]
) -> dict[tuple[str, int], PartitionEnd]:
    """``ends`` (from earlier ``end_partials``) with the rows of ``end_partials`` of other
    records merged in."""
    merged = dict(ends)
    for topic, partition, max_offset, head, head_records in partials:
        known = merged.get((topic, partition))
        if known is not None:
            if known[1] is not None and (head is None or known[1] > head):
                head, head_records = known[1], known[2]
            max_offset = max(max_offset, known[0])
        merged[topic, partition] = (max_offset, head, head_records)
    return merged


def cut_from(end: PartitionEnd) -> int | None:
    """Where a partition's newest batch starts when not all of that batch's lines are in the
    file (else None). A writer appends a batch with one ``write``; a reader can see part of
    it (a write in progress, or a crash mid-write before recovery). Only the newest batch
    of a partition can be incomplete: its head (the newest record with ``batch_records``
    N) must have N - 1 records after it."""
    max_offset, head, head_records = end
    if head is not None and head_records is not None and head + head_records - 1 > max_offset:
        return head
    return None


def visible_to(end: PartitionEnd) -> int:
    """The end of what the job reads of a partition: ``cut_from``, or the newest record's
    offset + 1."""
    cut = cut_from(end)
    return end[0] + 1 if cut is None else cut


def mark_incomplete_batches(records: DataFrame, cuts: DataFrame) -> DataFrame:
    """Give the records from each ``cut_from`` on the problem ``incomplete batch``: the
    store's readers never return part of a batch, and neither does this job."""
    joined = records.join(F.broadcast(cuts), ["topic", "partition"], "left")
    incomplete = F.col("problem").isNull() & (F.col("offset") >= F.col("cut_from"))
    return joined.select(
        *(c for c in records.columns if c != "problem"),
        F.when(incomplete, F.lit(INCOMPLETE_BATCH)).otherwise(F.col("problem")).alias("problem"),
    )


def _typed_run(run: Column) -> Column:
    """A run ``[topic, partition, first_offset, count, attempt]`` (JSON text of each element)
    as a struct; ``fields`` is how many elements it had (5 when whole)."""

    def at(index: int) -> Column:  # null, not an error, past the end of a short run
        return F.try_element_at(run, F.lit(index))

    return F.struct(
        at(1).alias("topic"),
        at(2).try_cast("int").alias("partition"),
        at(3).try_cast("long").alias("first"),
        at(4).try_cast("long").alias("count"),
        at(5).try_cast("long").alias("attempt"),
        F.size(run).alias("fields"),
    )


def _whole_run(run: Column) -> Column:
    return F.coalesce(
        (run["fields"] == 5)
        & run["topic"].isNotNull()
        & (run["partition"] >= 0)
        & (run["first"] >= 0)
        & run["count"].between(1, MAX_MESSAGES_PER_LINE)
        # Offsets past a long's range (damage): expanding them would overflow, and with
        # ANSI arithmetic fail the whole job.
        & F.try_add(run["first"], run["count"]).isNotNull()
        & run["attempt"].isNotNull(),
        F.lit(False),
    )


def parse_events(lines: DataFrame) -> DataFrame:
    """Event lines to one row per message an event is about (docs/FORMAT.md fields), with a
    ``problem`` column and ``first_in_line`` (true on the first row of each line, so lines
    can still be counted).

    A line of the per-message shape (``offset``; every event type, and ``delivered`` and
    ``acked`` as older brokers write them) is one row, as are events about a position
    rather than a message (``lag``, ``skipped``). A line of the frame shape (``runs`` and no
    ``offset``: a dispatched frame or an ACK frame) becomes one row per offset of its runs,
    in order, each with its run's topic, partition and attempt, its own ``processing_ms``
    (the array's element at the message's index; 0 for an auto-ACK, which has no array) and
    the line's ``ts``, ``type``, ``group`` and ``consumer``: the rows a per-message writer
    would have written, less ``key``, ``published_at`` and ``bytes``, which the record has
    (delivery_outcomes takes ``published_at`` from it). The runs are expanded with Spark's
    array functions, so nothing runs in Python on the executors.

    ``problem`` is ``unparsable`` when a line is not an event (a torn last line, damage):
    no ``ts``, ``type`` or ``group``; per message, no ``topic`` or ``partition``; per frame,
    an ``offset`` too, a run that is not five fields with a count from 1 to
    MAX_MESSAGES_PER_LINE (in all) and offsets a long holds, or a ``processing_ms`` array
    of another length. Such a line is one row. Columns of ``lines`` other than ``line``
    are passed through.
    """
    passed = [c for c in lines.columns if c != "line"]
    parsed = _parse_json_lines(lines, passed, schemas.EVENT_LINE, text=("runs", "processing_ms"))
    framed = F.col("_json_runs").isNotNull()
    # Parsed once per line into columns, each used by the checks and by the expansion.
    arrays = parsed.select(
        "*",
        F.when(
            framed,
            F.transform(F.from_json(F.col("_json_runs"), schemas.EVENT_RUNS), _typed_run),
        ).alias("_runs"),
        F.when(
            framed, F.from_json(F.col("_json_processing_ms"), schemas.EVENT_PROCESSING_TIMES)
        ).alias("_times"),
    )
    runs, times = F.col("_runs"), F.col("_times")
    total = F.aggregate(runs, F.lit(0).cast("long"), lambda sum_, run: sum_ + run["count"])
    whole_frame = F.coalesce(
        (F.size(runs) > 0)
        & F.forall(runs, _whole_run)
        & (total <= MAX_MESSAGES_PER_LINE)
        & (F.col("_json_processing_ms").isNull() | (F.size(times) == total)),
        F.lit(False),
    )
    missing = F.lit(False)
    for name in ("ts", "type", "group"):
        missing = missing | F.col(name).isNull()
    per_message_missing = F.col("topic").isNull() | F.col("partition").isNull()
    problem = (
        F.when(missing, F.lit("unparsable"))
        .when(framed & (F.col("offset").isNotNull() | ~whole_frame), F.lit("unparsable"))
        .when(~framed & per_message_missing, F.lit("unparsable"))
        .otherwise(F.lit(None).cast("string"))
    )
    checked = arrays.select("*", problem.alias("problem"))

    # The frame's messages in the order of its runs, which is the order of processing_ms.
    offsets = F.flatten(
        F.transform(
            runs,
            lambda run: F.transform(
                F.sequence(F.lit(0).cast("long"), run["count"] - 1),
                lambda step: F.struct(
                    run["topic"].alias("topic"),
                    run["partition"].alias("partition"),
                    (run["first"] + step).alias("offset"),
                    run["attempt"].alias("attempt"),
                ),
            ),
        )
    )
    auto_ack = F.when(
        (F.col("type") == EventType.ACKED) & (F.col("reason") == "auto_ack"), F.lit(0.0)
    )
    in_frame = F.transform(
        offsets,
        lambda message, index: F.struct(
            message["topic"].alias("topic"),
            message["partition"].alias("partition"),
            message["offset"].alias("offset"),
            message["attempt"].alias("attempt"),
            F.coalesce(F.try_element_at(times, index + 1), auto_ack).alias("processing_ms"),
        ),
    )
    alone = F.array(
        F.struct(
            *(F.col(name) for name in ("topic", "partition", "offset", "attempt", "processing_ms"))
        )
    )
    # Only a whole frame is expanded (a count is bounded before it sizes an array).
    messages = F.when(framed & F.col("problem").isNull(), in_frame).otherwise(alone)
    exploded = checked.select("*", F.posexplode(messages).alias("_index", "_message"))
    return exploded.select(
        *(
            F.col(f"_message.{f.name}").alias(f.name) if f.name in _PER_MESSAGE else F.col(f.name)
            for f in schemas.EVENT_LINE.fields
        ),
        "problem",
        (F.col("_index") == 0).alias("first_in_line"),
        *passed,
    )


def line_counts(records: DataFrame, events: DataFrame) -> DataFrame:
    """Lines read per source (``segments``, ``events``) and ``status``: ``used``, or the
    reason a line was skipped (the records' ``problem`` as they are: before or after
    ``mark_incomplete_batches``; see ``with_incomplete``). Counts of several sets of
    lines are summed by ``merge_line_counts``."""

    def counted(frame: DataFrame, source: str) -> DataFrame:
        if "first_in_line" in frame.columns:  # events: a frame's line has a row per message
            frame = frame.where(F.col("first_in_line"))
        return frame.groupBy(
            F.lit(source).alias("source"),
            F.coalesce(F.col("problem"), F.lit("used")).alias("status"),
        ).agg(F.count(F.lit(1)).alias("lines"))

    return counted(records, "segments").unionByName(counted(events, "events"))


def merge_line_counts(counts: DataFrame) -> DataFrame:
    return counts.groupBy("source", "status").agg(F.sum("lines").cast("long").alias("lines"))


def with_incomplete(counts: DataFrame, lines: int) -> DataFrame:
    """``line_counts`` of records before ``mark_incomplete_batches``, given how many
    ``lines`` it marks: those move from ``used`` to ``incomplete batch``."""
    if not lines:
        return counts
    used = (F.col("source") == "segments") & (F.col("status") == "used")
    marked = counts.sparkSession.range(1).select(
        F.lit("segments").alias("source"),
        F.lit(INCOMPLETE_BATCH).alias("status"),
        F.lit(lines).cast("long").alias("lines"),
    )
    return (
        counts.select(
            "source",
            "status",
            (F.col("lines") - F.when(used, lines).otherwise(0)).cast("long").alias("lines"),
        )
        .unionByName(marked)
        .where(F.col("lines") != 0)
    )


# -- messages ----------------------------------------------------------------------------


def partition_stats(records: DataFrame, topics: DataFrame, partitions: DataFrame) -> DataFrame:
    """Messages and bytes per topic and partition, with the log end offset and balance.

    Every partition known to ``state.db`` or present in ``logs/`` has a row, also when it
    holds no records. ``log_end_offset`` is the larger of ``state.db``'s figure (written at
    most once a second by appenders) and the newest record's offset + 1. ``share`` is the
    partition's part of its topic's messages; ``ratio_to_mean`` compares it with a perfectly
    even spread (1.0 = even).
    """
    return partition_stats_from_counts(partition_counts(records), topics, partitions)


def partition_counts(records: DataFrame) -> DataFrame:
    """``partition_stats``' partial aggregates (merged by ``merge_partition_counts``)."""
    return merge_partition_counts(
        records.select(
            "topic",
            "partition",
            F.lit(1).cast("long").alias("messages"),
            "bytes",
            F.col("offset").alias("first_offset"),
            F.col("offset").alias("last_offset"),
            F.col("timestamp").alias("first_timestamp"),
            F.col("timestamp").alias("last_timestamp"),
        )
    )


def merge_partition_counts(counts: DataFrame) -> DataFrame:
    return counts.groupBy("topic", "partition").agg(
        F.sum("messages").cast("long").alias("messages"),
        F.sum("bytes").cast("long").alias("bytes"),
        F.min("first_offset").alias("first_offset"),
        F.max("last_offset").alias("last_offset"),
        F.min("first_timestamp").alias("first_timestamp"),
        F.max("last_timestamp").alias("last_timestamp"),
    )


def partition_stats_from_counts(
    counted: DataFrame, topics: DataFrame, partitions: DataFrame
) -> DataFrame:
    """``partition_stats`` from ``partition_counts``."""
    declared = topics.select(
        "topic", F.explode(F.sequence(F.lit(0), F.col("partitions") - 1)).alias("partition")
    ).where(F.col("partition") >= 0)
    known = (
        declared.unionByName(partitions.select("topic", "partition"))
        .unionByName(counted.select("topic", "partition"))
        .distinct()
    )
    by_topic = Window.partitionBy("topic")
    return (
        known.join(counted, ["topic", "partition"], "left")
        .join(
            partitions.select("topic", "partition", F.col("log_end_offset").alias("_state_end")),
            ["topic", "partition"],
            "left",
        )
        .select(
            "topic",
            "partition",
            F.coalesce(F.col("messages"), F.lit(0)).cast("long").alias("messages"),
            F.coalesce(F.col("bytes"), F.lit(0)).cast("long").alias("bytes"),
            "first_offset",
            "last_offset",
            "first_timestamp",
            "last_timestamp",
            F.greatest(
                F.coalesce(F.col("_state_end"), F.lit(0)),
                F.coalesce(F.col("last_offset") + 1, F.lit(0)),
            )
            .cast("long")
            .alias("log_end_offset"),
        )
        .withColumn("_topic_messages", F.sum("messages").over(by_topic))
        .withColumn("_partitions", F.count(F.lit(1)).over(by_topic))
        .withColumn("share", _ratio("messages", "_topic_messages"))
        .withColumn("ratio_to_mean", F.col("share") * F.col("_partitions"))
        .drop("_topic_messages", "_partitions")
    )


def throughput(records: DataFrame, events: DataFrame, bucket_ms: int) -> DataFrame:
    """Per topic and time bucket: messages and bytes stored, deliveries and ACKs made (the
    deliveries and ACKs of every group summed: ``worked_by`` has them per group)."""
    stored = records.groupBy("topic", _bucket(F.col("timestamp"), bucket_ms)).agg(
        F.count(F.lit(1)).alias("published"), F.sum("bytes").cast("long").alias("bytes")
    )
    worked = worked_by(events, bucket_ms, "topic").drop("bucket_start")
    joined = stored.join(worked, ["topic", "bucket_start_ms"], "full")
    return joined.select(
        "topic",
        "bucket_start_ms",
        F.timestamp_millis("bucket_start_ms").alias("bucket_start"),
        *(
            F.coalesce(F.col(name), F.lit(0)).cast("long").alias(name)
            for name in ("published", "bytes", "delivered", "acked")
        ),
    )


def _bucket(ms: Column, bucket_ms: int) -> Column:
    if bucket_ms < 1:
        raise ValueError(f"a time bucket must be at least 1 ms, not {bucket_ms}")
    return (F.floor(ms / bucket_ms) * bucket_ms).cast("long").alias("bucket_start_ms")


def worked_by(events: DataFrame, bucket_ms: int, *keys: str) -> DataFrame:
    """Deliveries and ACKs per time bucket and ``keys`` (``topic, group``: each group's own
    throughput; ``group, consumer``: each consumer's). A bucket without a row had none."""
    return (
        events.where(F.col("type").isin(EventType.DELIVERED, EventType.ACKED))
        .groupBy(*keys, _bucket(F.col("ts"), bucket_ms))
        .agg(
            _count_if(F.col("type") == EventType.DELIVERED).alias("delivered"),
            _count_if(F.col("type") == EventType.ACKED).alias("acked"),
        )
        .select(
            *keys,
            "bucket_start_ms",
            F.timestamp_millis("bucket_start_ms").alias("bucket_start"),
            "delivered",
            "acked",
        )
    )


def top_keys(records: DataFrame, limit: int) -> DataFrame:
    """The ``limit`` most frequent keys of each topic and their share of its messages."""
    return top_keys_from_counts(key_counts(records), limit)


def key_counts(records: DataFrame) -> DataFrame:
    """Messages per topic and key (null: keyless), summed by ``merge_key_counts``."""
    return records.groupBy("topic", "key").agg(F.count(F.lit(1)).alias("messages"))


def merge_key_counts(counts: DataFrame) -> DataFrame:
    return counts.groupBy("topic", "key").agg(F.sum("messages").cast("long").alias("messages"))


def top_keys_from_counts(counts: DataFrame, limit: int) -> DataFrame:
    """``top_keys`` from ``key_counts``."""
    totals = counts.groupBy("topic").agg(F.sum("messages").cast("long").alias("_topic_messages"))
    ranked = Window.partitionBy("topic").orderBy(F.desc("messages"), F.asc("key"))
    return (
        counts.where(F.col("key").isNotNull())
        .withColumn("rank", F.row_number().over(ranked))
        .where(F.col("rank") <= limit)
        .join(totals, "topic")
        .select(
            "topic",
            "rank",
            "key",
            "messages",
            (F.col("messages") / F.col("_topic_messages")).alias("share"),
        )
    )


def payload_sizes(records: DataFrame) -> DataFrame:
    """Stored record sizes per topic: count, min, mean, p50, p90, p99, max bytes."""
    return payload_from_counts(size_counts(records))


def size_counts(records: DataFrame) -> DataFrame:
    """Records per topic and size in bytes (``n``), summed by ``merge_size_counts``."""
    return records.groupBy("topic", "bytes").agg(F.count(F.lit(1)).alias("n"))


def merge_size_counts(counts: DataFrame) -> DataFrame:
    return counts.groupBy("topic", "bytes").agg(F.sum("n").cast("long").alias("n"))


def payload_from_counts(counts: DataFrame) -> DataFrame:
    """``payload_sizes`` from ``size_counts`` (the mean is the exact sum over the count, as
    Spark's average of whole numbers gives it)."""
    fractions = F.array(*(F.lit(f) for f in PERCENTILES))
    values = F.percentile(F.col("bytes").cast("double"), fractions, F.col("n"))
    return counts.groupBy("topic").agg(
        F.sum("n").cast("long").alias("messages"),
        F.min("bytes").cast("double").alias("min"),
        (F.sum(F.col("bytes") * F.col("n")).cast("double") / F.sum("n")).alias("mean"),
        values[0].alias("p50"),
        values[1].alias("p90"),
        values[2].alias("p99"),
        F.max("bytes").cast("double").alias("max"),
    )


# -- deliveries --------------------------------------------------------------------------


def _message_events(events: DataFrame) -> DataFrame:
    # ``lag`` and ``skipped`` are about a group's position, not about one message.
    return events.where(
        ~F.col("type").isin(EventType.LAG, EventType.SKIPPED) & F.col("offset").isNotNull()
    )


def delivery_outcomes(
    events: DataFrame,
    records: DataFrame,
    *,
    settled_to: DataFrame | None = None,
    key_finishes: DataFrame | None = None,
) -> DataFrame:
    """One row per (group, topic, partition, offset) that has delivery events.

    ``published_at`` is the one the message's events carry (per-message lines have it),
    else the ``timestamp`` of its record in ``records`` (frame lines leave it out): one
    join of the outcomes, not of every event, with the records the job already parsed.
    A record deleted by retention leaves it null: its events still count, its latencies
    cannot be measured. ``key`` is the record's key, ``events`` how many of the group's
    delivery events are about the message.

    ``finished_at`` is when the group was done with the message (its ACK, dead letter,
    expiry or cancel). ``held_back`` says the message could not be delivered at once for a reason
    of its own making, not the queue's: it was delayed (``deliver_at`` after its publish
    time), or an earlier message of its key in its partition was still unfinished for this
    group when it was published (the broker delivers a key's messages in order, one at a
    time, so a delayed or retrying message holds back its key). Null when its record is
    gone (nothing is known of its key or delay). ``due_at`` is a delayed message's
    ``deliver_at`` (null for a message due at once).

    Incrementally (analytics/settled.py): with ``settled_to`` (group, topic, partition,
    settled_to), only the messages at or after a group's ``settled_to`` in a partition are
    computed (0 where it has none), and ``key_finishes`` (group, topic, partition, key,
    finished_at) gives, per key, the latest finish of the messages before it, which the
    messages after it compare their publish time with: the same rows as computing every
    message and keeping those at or after ``settled_to``.
    """
    typed = _message_events(events)
    if settled_to is not None:
        typed = typed.join(
            F.broadcast(settled_to.select("group", "topic", "partition", "settled_to")),
            ["group", "topic", "partition"],
            "left",
        ).where(F.col("offset") >= F.coalesce(F.col("settled_to"), F.lit(0)))
    kind = F.col("type")
    delivered = kind == EventType.DELIVERED
    final = kind.isin(
        EventType.ACKED, EventType.DEAD_LETTERED, EventType.EXPIRED, EventType.CANCELLED
    )
    outcomes = typed.groupBy("group", "topic", "partition", "offset").agg(
        F.max("published_at").alias("_event_published_at"),
        F.min(F.when(delivered, F.col("ts"))).alias("first_delivered_at"),
        F.max(F.when(delivered, F.col("attempt"))).alias("attempts"),
        F.min(F.when(kind == EventType.ACKED, F.col("ts"))).alias("acked_at"),
        F.max(kind == EventType.DEAD_LETTERED).alias("dead_lettered"),
        F.max(kind == EventType.EXPIRED).alias("expired"),
        F.max(kind == EventType.CANCELLED).alias("cancelled"),
        F.min(F.when(final, F.col("ts"))).alias("finished_at"),
        F.count(F.lit(1)).alias("events"),
    )
    # (topic, partition, offset) is unique among records: the join adds no rows.
    facts = records.select(
        "topic",
        "partition",
        "offset",
        F.col("timestamp").alias("_stamp"),
        F.col("key").alias("_key"),
        F.col("deliver_at").alias("_deliver_at"),
        F.lit(True).alias("_stored"),
    )
    joined = outcomes.join(facts, ["topic", "partition", "offset"], "left")
    if key_finishes is not None:
        joined = joined.join(
            key_finishes.select(
                "group",
                "topic",
                "partition",
                F.col("key").alias("_key"),
                F.col("finished_at").alias("_key_finished_before"),
            ),
            ["group", "topic", "partition", "_key"],
            "left",
        )
    else:
        joined = joined.withColumn("_key_finished_before", F.lit(None).cast("long"))
    published = F.coalesce(F.col("_event_published_at"), F.col("_stamp"))
    # The latest finish among the key's earlier messages (never finished: later than any
    # publish), for this group; a keyless message waits for no other.
    earlier = (
        Window.partitionBy("group", "topic", "partition", "_key")
        .orderBy("offset")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    before_it = F.greatest(
        F.max(F.coalesce(F.col("finished_at"), F.lit(UNFINISHED))).over(earlier),
        F.col("_key_finished_before"),
    )
    delayed = F.coalesce(F.col("_deliver_at") > published, F.lit(False))
    waits_for_key = F.col("_key").isNotNull() & F.coalesce(before_it > published, F.lit(False))
    return joined.select(
        "group",
        "topic",
        "partition",
        "offset",
        published.alias("published_at"),
        "first_delivered_at",
        "attempts",
        "acked_at",
        "dead_lettered",
        "expired",
        "cancelled",
        "finished_at",
        F.when(F.col("_stored"), delayed | waits_for_key).alias("held_back"),
        F.when(delayed, F.col("_deliver_at")).alias("due_at"),
        F.col("_key").alias("key"),
        "events",
    )


def _waits() -> list[tuple[str, Column]]:
    """The measures of ``latency`` (MEASURES): a name and the wait in ms, from an outcome
    row."""
    first = F.col("first_delivered_at") - F.col("published_at")
    return [
        ("first_delivery", first),
        ("queue", F.when(~F.col("held_back"), first)),
        ("ack", F.col("acked_at") - F.col("published_at")),
        ("lateness", F.col("first_delivered_at") - F.col("due_at")),
    ]


MEASURES = ("first_delivery", "queue", "ack", "lateness")


def _counters() -> list[tuple[str, Column]]:
    """The per-(topic, group) counters of ``outcome_rates``: when an outcome row counts."""
    return [
        ("messages", F.lit(True)),
        ("delivered", F.col("attempts").isNotNull()),
        ("acked", F.col("acked_at").isNotNull()),
        ("retried", F.col("attempts") > 1),
        ("dead_lettered", F.col("dead_lettered")),
        ("expired", F.col("expired")),
        ("cancelled", F.col("cancelled")),
    ]


COUNTERS = ("messages", "delivered", "acked", "retried", "dead_lettered", "expired", "cancelled")


def outcome_counts(outcomes: DataFrame, *extra: str) -> DataFrame:
    """What the outcome tables are computed from, as counts that add up: per topic, group,
    ``kind`` and ``value``, how many messages (``n``). Kinds: each of MEASURES with the
    wait in ms as the value, ``attempts`` with the delivery attempts and each of COUNTERS
    (value 0). ``extra`` columns of
    ``outcomes`` are kept as grouping keys.

    The counts of two sets of outcome rows are the counts of their union, summed; so the
    figures of ``latency``, ``attempts_histogram`` and ``outcome_rates`` can be kept for
    the messages that are settled and added to the ones still changing
    (analytics/settled.py)."""
    entries = [
        F.struct(
            F.lit(name).alias("kind"), wait.alias("value"), F.lit(1).cast("long").alias("weight")
        )
        for name, wait in _waits()
    ]
    entries.append(
        F.struct(
            F.lit("attempts").alias("kind"),
            F.col("attempts").alias("value"),
            F.lit(1).cast("long").alias("weight"),
        )
    )
    entries += [
        F.struct(
            F.lit(name).alias("kind"),
            F.when(when, F.lit(0).cast("long")).alias("value"),
            F.lit(1).cast("long").alias("weight"),
        )
        for name, when in _counters()
    ]
    return (
        outcomes.select("topic", "group", *extra, F.explode(F.array(*entries)).alias("_c"))
        .where(F.col("_c.value").isNotNull())
        .groupBy(
            "topic",
            "group",
            *extra,
            F.col("_c.kind").alias("kind"),
            F.col("_c.value").alias("value"),
        )
        .agg(F.sum("_c.weight").cast("long").alias("n"))
    )


def events_below(events: DataFrame, marks: DataFrame) -> DataFrame:
    """Per (group, topic, partition) of ``events`` with delivery events: ``marked``, whether
    ``marks`` (group, topic, partition, settled_to) has it, and ``events``, how many of them
    are about messages before its ``settled_to`` (analytics/settled.py checks that none
    of the new ones are)."""
    return (
        _message_events(events)
        .join(
            F.broadcast(marks.select("group", "topic", "partition", "settled_to")),
            ["group", "topic", "partition"],
            "left",
        )
        .groupBy("group", "topic", "partition")
        .agg(
            F.max(F.col("settled_to").isNotNull()).alias("marked"),
            _count_if(F.col("offset") < F.col("settled_to")).alias("events"),
        )
    )


def settle_candidates(outcomes: DataFrame, visible: DataFrame) -> DataFrame:
    """Per (group, topic, partition) of ``outcomes``: ``open_from``, the first offset whose
    outcome may still change (not finished, or no record while one may still come: at or
    after the partition's ``visible_to`` in ``visible``, where the log's whole batches
    end), and ``last_offset``."""
    joined = outcomes.join(F.broadcast(visible), ["topic", "partition"], "left")
    may_change = F.col("finished_at").isNull() | (
        F.col("held_back").isNull() & (F.col("offset") >= F.coalesce(F.col("visible_to"), F.lit(0)))
    )
    return joined.groupBy("group", "topic", "partition").agg(
        F.min(F.when(may_change, F.col("offset"))).alias("open_from"),
        F.max("offset").alias("last_offset"),
    )


def key_finishes(outcomes: DataFrame) -> DataFrame:
    """Per (group, topic, partition, key): the latest finish among ``outcomes`` (which are
    all finished), as delivery_outcomes' ``key_finishes``."""
    return (
        outcomes.where(F.col("key").isNotNull())
        .groupBy("group", "topic", "partition", "key")
        .agg(F.max("finished_at").alias("finished_at"))
    )


def at_or_after(ends: dict[tuple[str, int], int], *, others: bool) -> Column:
    """A filter of literals: rows (with topic, partition and offset) of each (topic,
    partition) of ``ends`` at or after its offset, and with ``others`` every row of the
    other partitions. Parquet applies it to each row group's statistics, so the job reads
    only the groups that may hold such rows."""
    known: Column = F.lit(False)
    after: Column = F.lit(False)
    for (topic, partition), offset in sorted(ends.items()):
        here = (F.col("topic") == topic) & (F.col("partition") == partition)
        known = known | here
        after = after | (here & (F.col("offset") >= offset))
    return after | ~known if others else after


def sum_counts(counts: DataFrame) -> DataFrame:
    """``outcome_counts`` rows of several sets, summed into one."""
    return counts.groupBy("topic", "group", "kind", "value").agg(F.sum("n").cast("long").alias("n"))


def latency(outcomes: DataFrame) -> DataFrame:
    """Per topic and group, and per topic over every group's outcomes pooled (``group``
    null): messages, p50, p90, p99, max in ms of three waits from publish:

    - ``first_delivery``: to the first delivery (e2e latency), every message;
    - ``queue``: the same, only for messages not ``held_back`` (due at once, no earlier
      message of their key unfinished): the time the queue itself took;
    - ``ack``: to the ACK;
    - ``lateness``: for delayed messages, from when they were due (``due_at``) to their
      first delivery (never negative: the broker does not deliver early).
    """
    return latency_from_counts(outcome_counts(outcomes))


def latency_from_counts(counts: DataFrame) -> DataFrame:
    """``latency`` from ``outcome_counts``: the percentiles of the waits' value counts (the
    same as of the values themselves: Spark's percentile counts each distinct value)."""
    waits = counts.where(F.col("kind").isin(*MEASURES)).withColumnRenamed("kind", "measure")
    fractions = F.array(*(F.lit(f) for f in PERCENTILES))
    values = F.percentile(F.col("value").cast("double"), fractions, F.col("n"))
    # Grouping sets: one pass gives both the per-group and the pooled rows.
    return (
        waits.groupingSets(
            [["topic", "measure", "group"], ["topic", "measure"]], "topic", "measure", "group"
        )
        .agg(
            F.sum("n").cast("long").alias("messages"),
            values[0].alias("p50"),
            values[1].alias("p90"),
            values[2].alias("p99"),
            F.max("value").cast("double").alias("max"),
        )
        .select("topic", "group", "measure", "messages", "p50", "p90", "p99", "max")
    )


def processing_time(events: DataFrame) -> DataFrame:
    """Delivery to ACK per group and consumer: ACKs, mean, p50, p90, p99, max in ms."""
    return processing_from_counts(processing_counts(events))


def processing_counts(events: DataFrame) -> DataFrame:
    """``processing_time``'s partial aggregates: per group, consumer and processing time,
    how many ACKs took it (``n``)."""
    return (
        events.where((F.col("type") == EventType.ACKED) & F.col("processing_ms").isNotNull())
        .groupBy("group", "consumer", "processing_ms")
        .agg(F.count(F.lit(1)).alias("n"))
    )


def merge_processing_counts(counts: DataFrame) -> DataFrame:
    return counts.groupBy("group", "consumer", "processing_ms").agg(
        F.sum("n").cast("long").alias("n")
    )


def processing_from_counts(counts: DataFrame) -> DataFrame:
    """``processing_time`` from ``processing_counts`` (of several sets: merged). The mean
    sums the times as decimals (to the microsecond), so that it does not depend on the
    order of the rows (a sum of doubles does); with a time no decimal holds (NaN, an
    infinity or above 10^31 ms, from a damaged line), or a sum that overflows one, it
    sums doubles."""
    fractions = F.array(*(F.lit(f) for f in PERCENTILES))
    ms, n = F.col("processing_ms"), F.col("n")
    values = F.percentile(ms, fractions, n)
    scaled = F.try_multiply(ms.try_cast("decimal(38,6)"), n)
    exact = F.when(F.count_if(scaled.isNull()) == 0, F.try_sum(scaled)).cast("double")
    return counts.groupBy("group", "consumer").agg(
        F.sum("n").cast("long").alias("acked"),
        (F.coalesce(exact, F.sum(ms * n)) / F.sum("n")).alias("mean"),
        values[0].alias("p50"),
        values[1].alias("p90"),
        values[2].alias("p99"),
        F.max(ms).cast("double").alias("max"),
    )


def failure_reasons(events: DataFrame) -> DataFrame:
    """Per topic, group, event type (``nacked``, ``dead_lettered``) and ``reason``: how many
    events. A NACK's reason is what the consumer gave (null when it gave none); a dead
    letter's is why it went to the DLQ."""
    kinds = (EventType.NACKED, EventType.DEAD_LETTERED)
    return (
        events.where(F.col("type").isin(*kinds))
        .groupBy("topic", "group", "type", "reason")
        .agg(F.count(F.lit(1)).alias("events"))
    )


def attempts_histogram(outcomes: DataFrame) -> DataFrame:
    """How many messages needed 1, 2, … delivery attempts, per topic and group."""
    return attempts_from_counts(outcome_counts(outcomes))


def attempts_from_counts(counts: DataFrame) -> DataFrame:
    """``attempts_histogram`` from ``outcome_counts``."""
    return counts.where(F.col("kind") == "attempts").select(
        "topic", "group", F.col("value").alias("attempts"), F.col("n").alias("messages")
    )


def outcome_rates(outcomes: DataFrame) -> DataFrame:
    """Per topic and group: messages with events, and how many were ACKed, retried (more
    than one delivery attempt), dead-lettered, expired and cancelled, as counts and rates."""
    return rates_from_counts(outcome_counts(outcomes))


def rates_from_counts(counts: DataFrame) -> DataFrame:
    """``outcome_rates`` from ``outcome_counts``."""
    counted = (
        counts.where(F.col("kind").isin(*COUNTERS))
        .groupBy("topic", "group")
        .agg(
            *(
                F.coalesce(F.sum(F.when(F.col("kind") == name, F.col("n"))), F.lit(0))
                .cast("long")
                .alias(name)
                for name in COUNTERS
            )
        )
    )
    return counted.select(
        "*",
        _ratio("retried", "messages").alias("retry_rate"),
        _ratio("dead_lettered", "messages").alias("dlq_rate"),
        _ratio("expired", "messages").alias("expiry_rate"),
    )


def merge_failure_reasons(counts: DataFrame) -> DataFrame:
    """``failure_reasons`` of several sets of events, summed."""
    return counts.groupBy("topic", "group", "type", "reason").agg(
        F.sum("events").cast("long").alias("events")
    )


_CONSUMER_COUNTS = ("deliveries", "acked", "nacked", "lease_expired", "released")


def consumer_stats(events: DataFrame) -> DataFrame:
    """Per group and consumer: deliveries, ACKs, failures (NACKs, expired leases, releases
    on disconnect), failure rate per delivery, and ACKs per second over its active span."""
    return consumer_stats_from_counts(consumer_counts(events))


def merge_consumer_counts(counts: DataFrame) -> DataFrame:
    return counts.groupBy("group", "consumer").agg(
        *(F.sum(name).cast("long").alias(name) for name in _CONSUMER_COUNTS),
        F.min("first_ts").alias("first_ts"),
        F.max("last_ts").alias("last_ts"),
    )


def consumer_counts(events: DataFrame) -> DataFrame:
    """``consumer_stats``' partial aggregates (merged by ``merge_consumer_counts``)."""
    kind = F.col("type")
    return (
        events.where(
            F.col("consumer").isNotNull()
            & kind.isin(EventType.DELIVERED, EventType.ACKED, *FAILURE_TYPES)
        )
        .groupBy("group", "consumer")
        .agg(
            _count_if(kind == EventType.DELIVERED).alias("deliveries"),
            _count_if(kind == EventType.ACKED).alias("acked"),
            _count_if(kind == EventType.NACKED).alias("nacked"),
            _count_if(kind == EventType.LEASE_EXPIRED).alias("lease_expired"),
            _count_if(kind == EventType.RELEASED).alias("released"),
            F.min("ts").alias("first_ts"),
            F.max("ts").alias("last_ts"),
        )
    )


def consumer_stats_from_counts(counted: DataFrame) -> DataFrame:
    """``consumer_stats`` from ``consumer_counts``."""
    return counted.select(
        "*",
        (F.col("nacked") + F.col("lease_expired") + F.col("released")).alias("failures"),
    ).select(
        "*",
        _ratio("failures", "deliveries").alias("failure_rate"),
        F.when(
            F.col("last_ts") > F.col("first_ts"),
            F.col("acked") * 1000.0 / (F.col("last_ts") - F.col("first_ts")),
        ).alias("acked_per_s"),
    )


def consumer_activity(events: DataFrame) -> DataFrame:
    """Per group and consumer, from its first delivery to the last end of one: ``busy_ms``,
    the time it held at least one message (the union of its deliveries' spans, each from
    the delivery to the ACK, NACK, lease expiry or release that ended that attempt; a
    delivery with no end yet counts as a moment), ``idle_ms``, the rest (waiting for work),
    and ``idle_share``, idle over the whole span.

    In steps, so that a re-run can start from what it kept (analytics/kept.py):
    ``activity_attempts``, ``activity_spans``, ``activity_gaps``, ``activity_summary``,
    ``activity_from_summary``.
    """
    spans = activity_spans(activity_attempts(events))
    return activity_from_summary(activity_summary(activity_gaps(spans)))


def activity_attempts(events: DataFrame) -> DataFrame:
    """Per delivery attempt (group, consumer, topic, partition, offset, attempt): ``start``,
    when it was delivered, ``end``, when the ACK, NACK, lease expiry or release that ended
    it came (null while none has), and ``open``, whether it has fewer ends than deliveries
    (after a broker restart a consumer id and an attempt number can come again: the two
    deliveries are one row here)."""
    kind = F.col("type")
    ends = (EventType.ACKED, *FAILURE_TYPES)
    delivered = kind == EventType.DELIVERED
    ended = kind.isin(*ends)
    return (
        events.where(
            F.col("consumer").isNotNull()
            & F.col("offset").isNotNull()
            & kind.isin(EventType.DELIVERED, *ends)
        )
        .groupBy("group", "consumer", "topic", "partition", "offset", "attempt")
        .agg(
            F.min(F.when(delivered, F.col("ts"))).alias("start"),
            F.max(F.when(ended, F.col("ts"))).alias("end"),
            (F.count(F.when(delivered, 1)) > F.count(F.when(ended, 1))).alias("open"),
        )
        .where(F.col("start").isNotNull())
    )


def activity_spans(attempts: DataFrame) -> DataFrame:
    """Per group, consumer and ``start``, the attempts (``activity_attempts``) that started
    then (a frame's deliveries), as one span ending where the longest of them ended
    (``start`` for one with no end yet), ``open`` if one of them is. Deliveries that
    started together cover, together, what the longest covers: one row each, so that
    ``activity_gaps`` sorts a row per frame, not per message (the same union, hence the
    same busy and idle time)."""
    return attempts.groupBy("group", "consumer", "start").agg(
        F.max(F.greatest("start", "end")).alias("end"), F.bool_or("open").alias("open")
    )


def activity_resume(attempts: DataFrame) -> DataFrame:
    """One row, ``start``: where the next run's consumer activity reads from (kept.py's
    ``activity_from``). The start of the oldest ``open`` attempt (``activity_attempts``),
    else of the newest: a later span can only add to what the spans before it sum to.

    An open attempt that a later delivery of the same message to the group followed has
    ended without a record of how (its broker stopped, then delivered the message again;
    a message is with one consumer at a time, and a late ACK is refused without an event),
    so it does not hold the point back. Later means a later start, not a higher attempt
    number: numbers younger than a checkpoint come again after a restart."""
    message = ["group", "topic", "partition", "offset"]
    attempt = [*message, "consumer", "attempt", "start"]
    open_ = attempts.where(F.col("open")).select(*attempt)
    # Few attempts are open: they go to every task, and the attempts are read once, with
    # no shuffle. (A null key matches nothing: such an attempt holds the point, as before.)
    followed = (
        attempts.select(*message, F.col("start").alias("later"))
        .join(F.broadcast(open_), on=message)
        .where(F.col("later") > F.col("start"))
        .select(*attempt)
    )
    waiting = open_.join(followed, on=attempt, how="left_anti")
    return (
        waiting.agg(F.min("start").alias("oldest"))
        .crossJoin(attempts.agg(F.max("start").alias("newest")))
        .select(F.coalesce("oldest", "newest").alias("start"))
    )


def activity_gaps(spans: DataFrame, before: DataFrame | None = None) -> DataFrame:
    """Each span of ``activity_spans`` with ``idle``: the time from every earlier span's
    end to its start (0 when an earlier one had not ended yet). ``before`` (an
    ``activity_summary`` of the spans before these) enters as one span per group and
    consumer, from its ``first`` start to its ``reach``, with its ``idle``."""
    rows = spans.select("group", "consumer", "start", "end", F.lit(0).cast("long").alias("idle"))
    if before is not None:
        rows = rows.unionByName(
            before.select(
                "group",
                "consumer",
                F.col("first").alias("start"),
                F.col("reach").alias("end"),
                "idle",
            )
        )
    earlier = (
        Window.partitionBy("group", "consumer")
        .orderBy("start", "end")
        .rowsBetween(Window.unboundedPreceding, -1)
    )
    # A gap: this span started after every earlier one had ended (greatest skips the null
    # of the first row).
    return rows.select(
        "group",
        "consumer",
        "start",
        "end",
        (F.greatest(F.col("start") - F.max("end").over(earlier), F.lit(0)) + F.col("idle")).alias(
            "idle"
        ),
    )


def activity_summary(gaps: DataFrame) -> DataFrame:
    """Per group and consumer, of ``activity_gaps`` rows: the ``first`` start, the
    ``reach`` (the last end) and the ``idle`` time between."""
    return gaps.groupBy("group", "consumer").agg(
        F.min("start").alias("first"),
        F.max("end").alias("reach"),
        F.sum("idle").cast("long").alias("idle"),
    )


def activity_from_summary(summary: DataFrame) -> DataFrame:
    """``consumer_activity`` from ``activity_summary``."""
    return summary.select(
        "group",
        "consumer",
        (F.col("reach") - F.col("first") - F.col("idle")).alias("busy_ms"),
        F.col("idle").alias("idle_ms"),
        F.when(
            F.col("reach") > F.col("first"), F.col("idle") / (F.col("reach") - F.col("first"))
        ).alias("idle_share"),
    )


# -- lag ---------------------------------------------------------------------------------


def lag_now(group_offsets: DataFrame, partitions: DataFrame) -> DataFrame:
    """Each group's committed offset per partition against the log end offset."""
    ends = partitions.select("topic", "partition", "log_end_offset")
    joined = group_offsets.join(ends, ["topic", "partition"], "left")
    end = F.greatest(F.coalesce(F.col("log_end_offset"), F.col("committed")), F.col("committed"))
    return joined.select(
        "group",
        "topic",
        "partition",
        "committed",
        end.alias("log_end_offset"),
        (end - F.col("committed")).alias("lag"),
    )


def lag_over_time(events: DataFrame) -> DataFrame:
    """The broker's periodic lag snapshots (``lag`` events); a snapshot without its ``lag``
    field gets ``log_end_offset - committed``."""
    derived = F.greatest(F.col("log_end_offset") - F.col("committed"), F.lit(0))
    return events.where(F.col("type") == EventType.LAG).select(
        "group",
        "topic",
        "partition",
        "ts",
        F.timestamp_millis("ts").alias("time"),
        "committed",
        "log_end_offset",
        F.coalesce(F.col("lag"), derived).alias("lag"),
    )


def lag_by_bucket(snapshots: DataFrame, bucket_ms: int) -> DataFrame:
    """Per group and time bucket: the highest lag each partition showed, summed."""
    per_partition = snapshots.groupBy(
        "group", "topic", "partition", _bucket(F.col("ts"), bucket_ms)
    ).agg(F.max("lag").alias("lag"))
    return (
        per_partition.groupBy("group", "bucket_start_ms")
        .agg(F.sum("lag").cast("long").alias("lag"))
        .where(F.col("lag").isNotNull())
    )


def rebucket(table: DataFrame, bucket_ms: int, keys: Sequence[str]) -> DataFrame:
    """A time-bucketed table (``throughput`` or ``worked_by`` rows) summed into buckets of
    ``bucket_ms``, a whole multiple of its own: the same rows as computing it again from
    the records and events at ``bucket_ms``."""
    counts = [c for c in table.columns if c not in (*keys, "bucket_start_ms", "bucket_start")]
    return (
        table.groupBy(*keys, _bucket(F.col("bucket_start_ms"), bucket_ms))
        .agg(*(F.sum(c).cast("long").alias(c) for c in counts))
        .select(
            *keys,
            "bucket_start_ms",
            F.timestamp_millis("bucket_start_ms").alias("bucket_start"),
            *counts,
        )
    )
