"""The analytics job: extract the store's files, transform them with Spark, load the results.

Runs as ``spoolmq analytics [--data DIR] [--out DIR] [--master URL]`` and, unchanged, as
``spark-submit src/spoolmq/analytics/job.py --data DIR --out DIR`` (``--master`` then goes to
``spark-submit``). Outputs in ``--out``: ``tables/<name>/`` (Parquet), ``summary.json``,
``charts/*.png`` and ``report.html``. Only aggregates ever reach the driver.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import datetime as dt
import functools
import hashlib
import os
import re
import socket
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import orjson

if __package__ in (None, ""):  # run as a file by spark-submit: import the installed package
    sys.path.pop(0)  # this directory holds modules named like others (report, schemas, ...)

from py4j.protocol import Py4JError, Py4JJavaError  # type: ignore[import-untyped]
from pyspark import StorageLevel
from pyspark import __version__ as PYSPARK_VERSION
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from spoolmq import types as spool_types
from spoolmq.analytics import extract, report, schemas, transform
from spoolmq.analytics import kept as kept_module
from spoolmq.analytics import settled as settled_module
from spoolmq.analytics.cache import ParseCache, Staged, bytes_to_parse
from spoolmq.analytics.jvm_cache import ClassArchive
from spoolmq.analytics.kept import MAX_FILTER_PARTITIONS, KeptTables
from spoolmq.analytics.session import SMALL_INPUT_BYTES, build_session
from spoolmq.analytics.settled import SettledOutcomes, Where
from spoolmq.analytics.summary import build_summary, chart_bucket_ms, needs_attention
from spoolmq.config import resolve_data_dir
from spoolmq.errors import InvalidArgumentError, SpoolError
from spoolmq.files import DIR_MODE, FILE_MODE
from spoolmq.types import EventType

TOP_KEYS = 20
MINUTE_MS = 60_000
SECOND_MS = 1_000
# Queries submitted at once. Two cores run a query's tasks; a third query in flight is
# being planned on the driver meanwhile (measured on the demo's store: 30 s -> 26 s).
TABLE_THREADS = 3
Step = Callable[[str], None]
Rows = list[dict[str, Any]]


@dataclass(frozen=True)
class Result:
    out_dir: Path
    summary: dict[str, Any]
    report: Path


def default_out_dir(data_dir: Path) -> Path:
    """``analytics_out`` next to the data directory (``./analytics_out`` for ``./queue_data``)."""
    return data_dir.resolve().parent / "analytics_out"


def _rows(frame: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in frame.collect()]


def _save(frame: DataFrame, out_dir: Path, name: str) -> list[dict[str, Any]]:
    """Compute a small aggregate table once, write it as Parquet, return its rows (read
    back from the few-kilobyte file, rather than recomputed or sent back from Python)."""
    _write_table(frame, out_dir, name)
    return _rows(_table(frame.sparkSession, out_dir, name))


def _table(spark: SparkSession, out_dir: Path, name: str) -> DataFrame:
    """A table this run wrote."""
    return spark.read.parquet(str(out_dir / "tables" / name))


def _write_table(frame: DataFrame, out_dir: Path, name: str) -> None:
    """Write a table as Parquet without collecting it (the time series, which grow with
    the store's age, are only written)."""
    frame.coalesce(1).write.mode("overwrite").parquet(str(out_dir / "tables" / name))


@contextlib.contextmanager
def _pool(spark: SparkSession, threads: int, name: str) -> Iterator[ThreadPoolExecutor]:
    """A thread pool for queries, shut down as the block ends. When the block fails (an
    error, or Ctrl-C), the queries queued in it are dropped, not run first, the session's
    Spark jobs are cancelled, and the failure goes on once the running queries have ended
    (a query between two jobs as they were cancelled runs its next one to the end).
    Spark's log is turned off meanwhile (the failure says what happened), and set back as
    it was once they have ended: a library caller's session goes on logging."""
    pool = ThreadPoolExecutor(threads, thread_name_prefix=name)
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        level = None
        with contextlib.suppress(Exception):  # a JVM that is gone has no jobs left
            level = _log_level(spark)
            # Spark's log of each cancelled job would say nothing the failure does not.
            spark.sparkContext.setLogLevel("OFF")
            spark.sparkContext.cancelAllJobs()
        try:
            pool.shutdown(wait=True)
        finally:
            if level is not None:
                with contextlib.suppress(Exception):
                    spark.sparkContext.setLogLevel(level)
        raise
    pool.shutdown()


def _log_level(spark: SparkSession) -> str:
    """The root level of the driver's log4j (what ``setLogLevel`` sets; PySpark has no
    getter)."""
    jvm = spark.sparkContext._jvm
    assert jvm is not None
    return str(jvm.org.apache.logging.log4j.LogManager.getRootLogger().getLevel().name())


def _write_atomically(path: Path, data: bytes) -> None:
    """``path`` replaced by ``data`` (0600: the figures name keys and consumers)."""
    partial = path.with_name(path.name + ".partial")
    fd = os.open(partial, os.O_CREAT | os.O_WRONLY | os.O_TRUNC, FILE_MODE)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(partial, FILE_MODE)  # one left by an older run may have had a wider mode
    os.replace(partial, path)


# Row groups of the parse cache's Parquet: small enough that a filter on the offset
# (analytics/kept.py, analytics/settled.py) skips most of a file's rows by their groups'
# statistics (the rows are in the order of the lines: by time, and so by offset).
CACHE_ROW_GROUP_BYTES = 4 * 2**20
# Event fields the job never uses (the record has them): not parsed into the cache.
_UNUSED_EVENT_FIELDS = ("key", "key_b64", "bytes")


def _parsers(
    spark: SparkSession, kind: str
) -> tuple[Callable[..., DataFrame], Callable[[DataFrame], DataFrame]]:
    if kind == "segments":
        return extract.segment_lines, transform.parse_records
    return extract.event_lines, lambda lines: transform.parse_events(lines).drop(
        *_UNUSED_EVENT_FIELDS
    )


@functools.cache  # the code does not change while the process runs; asked twice a run
def _fingerprint() -> str:
    """What made the parsed rows the cache holds, and what it keeps beside them: the code
    that reads and parses the lines and computes from them (this module, extract, schemas,
    transform, the event types, kept and settled) and pyspark's version.
    A cache written by other code (another spoolmq, or one with a parse fixed) is not read,
    but started again.
    Hashing the code, not the rows' schema, also catches a change in how a field is parsed
    that keeps its type, and asks nothing of Spark (analysing the two parse plans for their
    schemas took a cold JVM 1 s before any other work)."""
    digest = hashlib.sha1(PYSPARK_VERSION.encode())
    modules = (extract, schemas, transform, spool_types, kept_module, settled_module)
    for source in (__file__, *(m.__file__ for m in modules)):
        digest.update(Path(str(source)).read_bytes())
    return digest.hexdigest()


def _parse(
    spark: SparkSession, cache: ParseCache, kind: str, files: list[Path]
) -> tuple[DataFrame, Staged]:
    """The parsed rows of every file of ``kind``: those kept from earlier runs, plus the new
    bytes parsed now (and added to the cache), plus unfinished last lines (parsed each run)."""
    lines, parse = _parsers(spark, kind)
    staged = cache.plan(kind, files)
    if staged.keep:
        fresh = parse(lines(spark, staged.keep, staged=True))
        fresh.write.partitionBy("file_id").mode("append").option(
            "parquet.block.size", CACHE_ROW_GROUP_BYTES
        ).parquet(str(cache.table(kind)))
        cache.record(kind)
    if cache.holds_rows(kind):
        rows = spark.read.parquet(str(cache.table(kind))).drop("file_id")
    else:
        rows = _no_rows(spark, kind)
    if staged.fragments:
        rows = rows.unionByName(_fragments(spark, kind, staged))
    return rows, staged


def _no_rows(spark: SparkSession, kind: str) -> DataFrame:
    lines, parse = _parsers(spark, kind)
    return parse(lines(spark, [], staged=True)).drop("file_id")


def _fragments(spark: SparkSession, kind: str, staged: Staged) -> DataFrame:
    lines, parse = _parsers(spark, kind)
    return parse(lines(spark, staged.fragments))


def _read_parts(spark: SparkSession, cache: ParseCache, kind: str, parts: list[Path]) -> DataFrame:
    """The rows of some of the cache's part files of ``kind``."""
    if not parts:
        return _no_rows(spark, kind)
    return (
        spark.read.option("basePath", str(cache.table(kind)))
        .parquet(*(str(part) for part in parts))
        .drop("file_id")
    )


def _new_events(
    spark: SparkSession, cache: ParseCache, kept: KeptTables, staged: Staged
) -> DataFrame:
    """The event rows what ``kept`` covers does not: the cache's part files written since,
    and the unfinished last lines."""
    rows = _read_parts(spark, cache, "events", kept.new_event_parts(cache))
    if staged.fragments:
        rows = rows.unionByName(_fragments(spark, "events", staged))
    return rows


def _consumer_activity(
    spark: SparkSession,
    kept: KeptTables | None,
    cache: ParseCache,
    events: DataFrame,
    new_events: DataFrame,
    *,
    advance: bool,
) -> tuple[DataFrame, DataFrame]:
    """transform.consumer_activity of ``events``: with ``kept``, from the summary it keeps
    of the spans before its ``activity_from`` and the event rows at or after it (of the
    part files it covers; ``new_events`` are the others), writing the next (kept.py).
    Also returns the spans, cached until the caller unpersists them."""
    start = kept.activity_from if kept is not None and "activity" in kept.names else None
    before: DataFrame | None = None
    if kept is not None and start is not None:
        late = new_events.where(
            (F.col("type") == EventType.DELIVERED)
            & F.col("consumer").isNotNull()
            & F.col("offset").isNotNull()
            & (F.col("ts") < start)
        )
        if late.isEmpty():  # else a clock went back: every row
            seen = _read_parts(spark, cache, "events", kept.seen_event_parts(cache))
            events = seen.where(F.col("problem").isNull() & (F.col("ts") >= start)).unionByName(
                new_events
            )
            before = kept.read(spark, "activity", schemas.ACTIVITY)
    spans = transform.activity_spans(transform.activity_attempts(events)).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    gaps = transform.activity_gaps(spans, before)
    if kept is not None and advance:
        found = spans.agg(F.min(F.when(F.col("open"), F.col("start"))), F.max("start")).first()
        resume = None if found is None else found[1]
        if found is not None and found[0] is not None:
            # Deliveries not ended yet, or that lost their end: the attempts again to tell
            # which (only then: most runs end with every delivery ended).
            row = transform.activity_resume(transform.activity_attempts(events)).first()
            resume = None if row is None else row[0]
        after = start if resume is None else int(resume)
        if after is not None:
            kept.write(
                spark, "activity", transform.activity_summary(gaps.where(F.col("start") < after))
            )
            kept.next_activity_from = after
    return transform.activity_from_summary(transform.activity_summary(gaps)), spans


def _outcome_counts(
    spark: SparkSession,
    settled: SettledOutcomes,
    cache: ParseCache,
    events_run: Staged,
    events: DataFrame,
    records: DataFrame,
    visible: list[tuple[str, int, int]],
    committed: dict[Where, int],
    *,
    settle: bool,
    keep: bool,
) -> tuple[DataFrame, DataFrame]:
    """The outcome counts (transform.outcome_counts) of every message with delivery events:
    those ``settled`` keeps, plus those of the other messages, computed now. Moves the
    marks on and writes the next state (``settled.save`` swaps it in once the run no
    longer reads the one before). Also returns this run's counts, cached until the caller
    unpersists them. Without ``keep``, every outcome is computed and nothing is kept."""
    if not keep:
        every = transform.delivery_outcomes(events, records).persist(StorageLevel.MEMORY_AND_DISK)
        return transform.outcome_counts(every), every
    kept_counts: DataFrame | None = None
    kept_keys: DataFrame | None = None
    marks: DataFrame | None = None
    if settled.holds():
        # The event rows of part files the state has not seen (and unfinished lines): none
        # may be about a settled message.
        fresh = _read_parts(
            spark, cache, "events", cache.parts_not_in("events", settled.events_parts)
        )
        if events_run.fragments:
            fresh = fresh.unionByName(_fragments(spark, "events", events_run))
        fresh = fresh.where("problem IS NULL")
        marks = extract.local_frame(spark, settled.rows(), schemas.SETTLED_TO)
        seen = transform.events_below(fresh, marks).collect()
        if settled.check(sum(row.events for row in seen if row.marked)):
            kept_counts = spark.read.schema(schemas.OUTCOME_COUNTS).parquet(str(settled.counts))
            kept_keys = spark.read.schema(schemas.KEY_FINISHES).parquet(str(settled.keys))
            floors = settled.floors()
            if len(floors) <= MAX_FILTER_PARTITIONS:  # else the join below filters alone
                # Of the part files seen, the row groups that may hold events at or after
                # a mark; every new row.
                seen_rows = _read_parts(
                    spark, cache, "events", cache.parts_in("events", settled.events_parts)
                )
                events = (
                    seen_rows.where("problem IS NULL")
                    .where(transform.at_or_after(floors, others=False))
                    .unionByName(fresh)
                )
                # A group without a mark needs all of its partitions' records.
                unmarked = {(row.topic, row.partition) for row in seen if not row.marked}
                records = records.where(
                    transform.at_or_after(
                        {where: to for where, to in floors.items() if where not in unmarked},
                        others=True,
                    )
                )
        else:
            marks = None
    outcomes = transform.delivery_outcomes(
        events, records, settled_to=marks, key_finishes=kept_keys
    ).persist(StorageLevel.MEMORY_AND_DISK)
    candidates = transform.settle_candidates(
        outcomes, extract.local_frame(spark, visible, schemas.VISIBLE)
    ).collect()
    settled_to = settled.advance(
        (
            ((row.group, row.topic, row.partition), row.open_from, row.last_offset)
            for row in candidates
        ),
        committed,
        settle=settle,
    )
    flagged = outcomes.join(
        F.broadcast(
            extract.local_frame(
                spark, [(*where, to) for where, to in settled_to.items()], schemas.SETTLED_TO
            )
        ),
        ["group", "topic", "partition"],
        "left",
    ).withColumn("settled", F.col("offset") < F.coalesce(F.col("settled_to"), F.lit(0)))
    counts = transform.outcome_counts(flagged, "settled").persist(StorageLevel.MEMORY_AND_DISK)
    now_settled = counts.where("settled").drop("settled")
    transform.sum_counts(
        now_settled if kept_counts is None else kept_counts.unionByName(now_settled)
    ).coalesce(1).write.parquet(str(settled.next / "counts"))
    keys = transform.key_finishes(flagged.where("settled"))
    if kept_keys is not None:
        keys = transform.key_finishes(kept_keys.unionByName(keys))
    keys.coalesce(1).write.parquet(str(settled.next / "keys"))
    settled.prepare(settled_to, cache.parts("events") if settle else settled.events_parts)
    outcomes.unpersist()
    every = spark.read.schema(schemas.OUTCOME_COUNTS).parquet(str(settled.next / "counts"))
    return transform.sum_counts(
        every.unionByName(counts.where("NOT settled").drop("settled"))
    ), counts


def run(
    spark: SparkSession,
    data_dir: Path,
    out_dir: Path,
    step: Step | None = None,
    *,
    full: bool = False,
    keep: bool = True,
) -> Result:
    """Run the job over ``data_dir`` into ``out_dir``; ``step`` is told what happens next.
    It parses only what is new since the last run into ``out_dir`` (analytics/cache.py);
    ``full`` parses everything again. With ``keep`` (the default; a small store's run goes
    without) it also keeps the tables' aggregates and the settled delivery outcomes, and
    computes only what the new rows add to them (analytics/kept.py, analytics/settled.py)."""
    tell = step or (lambda _: None)
    if not data_dir.is_dir():
        raise InvalidArgumentError(f"no data directory at {data_dir}")
    _make_out_dir(out_dir)

    tell("listing the store's files")
    inputs = extract.list_inputs(data_dir)
    state = extract.read_state(data_dir)
    cache = ParseCache(out_dir / "cache", data_dir, fingerprint=_fingerprint(), full=full)

    tell("parsing message segments and delivery events")
    settled = SettledOutcomes(cache.root / "outcomes")
    kept_tables = KeptTables(cache.root / "kept")
    kept = kept_tables if keep else None

    def parse_segments() -> tuple[DataFrame, DataFrame, DataFrame, Staged, list[Any], int]:
        """The records (incomplete batches marked), every parsed line, the lines that what
        is kept does not cover, the run's figures, where each partition ends, and how many
        records the incomplete batches hold (of every partition)."""
        parsed, staged = _parse(spark, cache, "segments", inputs.segment_files)
        if kept is None:
            new_lines = parsed
            ends = transform.merge_ends({}, transform.end_partials(parsed).collect())
        else:  # the partition ends kept, and the new part files' (and fragments')
            fresh = not kept.holds() or "segments" in cache.dropped
            new_lines = _read_parts(
                spark,
                cache,
                "segments",
                cache.parts_not_in("segments", {}) if fresh else kept.new_segment_parts(cache),
            )
            ends = transform.merge_ends(
                {} if fresh else kept.ends, transform.end_partials(new_lines).collect()
            )
            kept.next_ends = ends
            if staged.fragments:
                fragments = _fragments(spark, "segments", staged)
                ends = transform.merge_ends(ends, transform.end_partials(fragments).collect())
                new_lines = new_lines.unionByName(fragments)
        cut = {
            where: to for where, end in ends.items() if (to := transform.cut_from(end)) is not None
        }
        cuts = extract.local_frame(spark, [(*where, to) for where, to in cut.items()], schemas.CUTS)
        incomplete = (
            parsed.where(
                F.col("problem").isNull() & transform.at_or_after(cut, others=False)
            ).count()
            if cut
            else 0
        )
        visible = [(*where, transform.visible_to(end)) for where, end in sorted(ends.items())]
        records = transform.mark_incomplete_batches(parsed, cuts)
        return records, parsed, new_lines, staged, visible, incomplete

    # Side by side: each is a few Spark jobs, mostly on one core for a small store (the
    # cache's bookkeeping keeps the two kinds apart); beside them, the state tables' small
    # frames (built alone before the parses, their plans took a cold JVM 1 s).
    # The rows are not persisted: they come from the cache's Parquet, which a query reads
    # (a few columns, vectorised) faster than Spark builds an in-memory copy of them
    # (measured on 1M records: a re-run took 95 s instead of 104 s).
    with _pool(spark, 3, "spoolmq-parse") as pool:
        segments_parsed = pool.submit(parse_segments)
        events_parsed = pool.submit(_parse, spark, cache, "events", inputs.event_files)
        state_frames = pool.submit(extract.state_frames, spark, state)
        topics, state_partitions, group_offsets = state_frames.result()
        records_all, lines_all, new_lines, segments_run, visible, incomplete = (
            segments_parsed.result()
        )
        events_all, events_run = events_parsed.result()
    if cache.rewound:  # before the manifest says so: a stop in between must not keep them
        settled.clear()
        kept_tables.clear()
    cache.commit()
    records = records_all.where("problem IS NULL").drop("problem", "batch_records")
    events = events_all.where("problem IS NULL")
    # A half-written last line is counted in this run's figures, and kept by none.
    whole = not (segments_run.fragments or events_run.fragments)
    # The outcomes' counts, on a thread of their own: a chain of queries, each waiting for
    # the one before, beside the tables' pool.
    with _pool(spark, 1, "spoolmq-outcomes") as outcome_pool:
        counting = outcome_pool.submit(
            _outcome_counts,
            spark,
            settled,
            cache,
            events_run,
            events,
            records,
            visible,
            {(g, t, p): c for g, t, p, c in state.group_offsets},
            settle=whole,
            keep=keep,
        )
        # The rows what is kept does not cover (all of them when nothing is).
        if kept is not None and kept.holds():
            new_records = kept.new_records(spark, records)
            new_events_all = _new_events(spark, cache, kept, events_run)
        else:
            new_records, new_events_all, new_lines = records, events_all, lines_all
        new_events = new_events_all.where("problem IS NULL")
        cached: list[DataFrame] = []  # unpersisted once every table is written

        def activity() -> DataFrame:
            frame, spans = _consumer_activity(spark, kept, cache, events, new_events, advance=whole)
            cached.append(spans)
            return frame

        def kept_or_all(
            name: str,
            partial: Callable[[DataFrame, DataFrame], DataFrame],
            merge: Callable[[DataFrame], DataFrame],
            *,
            fresh: bool = False,
        ) -> DataFrame:
            """A table's merged partial aggregates (``partial`` of records and events): kept
            ones plus the new rows' (kept.py; with ``fresh``, every row's and none kept), or
            every row's when the job keeps nothing (a small store: one set of rows' partials
            are merged already)."""
            if kept is None:
                return partial(records, events)
            rows = (records, events) if fresh else (new_records, new_events)
            return kept.keep(spark, name, partial(*rows), merge, advance=whole, fresh=fresh)

        tell(f"computing the tables, {TABLE_THREADS} at a time")
        tables: dict[str, list[dict[str, Any]]] = {}
        task_tables = extract.read_tasks(data_dir)
        small: dict[str, tuple[str, Callable[[], DataFrame]]] = {
            "partitions": (
                "partitions",
                lambda: transform.partition_stats_from_counts(
                    kept_or_all(
                        "partition_counts",
                        lambda rows, _: transform.partition_counts(rows),
                        transform.merge_partition_counts,
                    ),
                    topics,
                    state_partitions,
                ),
            ),
            "lines": (
                "lines",
                lambda: transform.with_incomplete(
                    transform.line_counts(lines_all, events_all)
                    if kept is None
                    else kept.keep(
                        spark,
                        "line_counts",
                        transform.line_counts(new_lines, new_events_all),
                        transform.merge_line_counts,
                        advance=whole,
                    ),
                    incomplete,
                ),
            ),
            "processing": (
                "processing_time",
                lambda: transform.processing_from_counts(
                    kept_or_all(
                        "processing_counts",
                        lambda _, rows: transform.processing_counts(rows),
                        transform.merge_processing_counts,
                    )
                ),
            ),
            "failure_reasons": (
                "failure_reasons",
                lambda: kept_or_all(
                    "failure_reasons",
                    lambda _, rows: transform.failure_reasons(rows),
                    transform.merge_failure_reasons,
                ),
            ),
            "consumers": (
                "consumers",
                lambda: transform.consumer_stats_from_counts(
                    kept_or_all(
                        "consumer_counts",
                        lambda _, rows: transform.consumer_counts(rows),
                        transform.merge_consumer_counts,
                    )
                ).join(activity(), ["group", "consumer"], "left"),
            ),
            "tasks": (
                "tasks",
                lambda: extract.local_frame(spark, task_tables.tasks, schemas.TASKS),
            ),
            "periodic": (
                "periodic",
                lambda: extract.local_frame(spark, task_tables.periodic, schemas.PERIODIC),
            ),
            "top_keys": (
                "top_keys",
                lambda: transform.top_keys_from_counts(
                    kept_or_all(
                        "key_counts",
                        lambda rows, _: transform.key_counts(rows),
                        transform.merge_key_counts,
                    ),
                    TOP_KEYS,
                ),
            ),
            "payload_sizes": (
                "payload_sizes",
                lambda: transform.payload_from_counts(
                    kept_or_all(
                        "size_counts",
                        lambda rows, _: transform.size_counts(rows),
                        transform.merge_size_counts,
                    )
                ),
            ),
        }
        # The time series: per-minute table, what is kept of it, its keys, and its counts per
        # bucket of some milliseconds from records and events.
        series: dict[
            str, tuple[str, tuple[str, ...], Callable[[DataFrame, DataFrame, int], DataFrame]]
        ]
        series = {
            "throughput_per_minute": (
                "throughput",
                ("topic",),
                lambda r, e, ms: transform.throughput(r, e, ms),
            ),
            "throughput_by_group_per_minute": (
                "throughput_by_group",
                ("topic", "group"),
                lambda _, e, ms: transform.worked_by(e, ms, "topic", "group"),
            ),
            "throughput_by_consumer_per_minute": (
                "throughput_by_consumer",
                ("group", "consumer"),
                lambda _, e, ms: transform.worked_by(e, ms, "group", "consumer"),
            ),
        }
        # Independent queries side by side: while one is planned on the driver (fixed costs
        # that dominate a small store), another runs on the executors. The charts' queries are
        # queued behind the tables, and the charts drawn here (the driver's Python) as their
        # data comes, while the executors still compute the last tables.
        with _pool(spark, TABLE_THREADS, "spoolmq-table") as pool:
            span = pool.submit(
                lambda: kept_or_all(
                    "event_span",
                    lambda _, rows: rows.agg(F.min("ts").alias("first"), F.max("ts").alias("last")),
                    lambda spans: spans.agg(
                        F.min("first").alias("first"), F.max("last").alias("last")
                    ),
                ).first()
            )
            saved = {
                key: pool.submit(lambda name, build: _save(build(), out_dir, name), name, build)
                for key, (name, build) in small.items()
            }
            written = {
                "lag_over_time": pool.submit(
                    lambda: _write_table(
                        kept_or_all(
                            "lag_over_time",
                            lambda _, rows: transform.lag_over_time(rows),
                            lambda rows: rows,
                        ),
                        out_dir,
                        "lag_over_time",
                    )
                )
            }
            # The kept time series: counted in the resolution the last run asked for (the span
            # only grows, so this one's can only be as coarse or coarser), before the bucket is
            # known, beside the other tables.
            counted: dict[str, Future[DataFrame]] = {}

            def count_series(resolution: int, *, fresh: bool = False) -> None:
                for name, (kept_name, keys, partial) in series.items():
                    counted[name] = pool.submit(
                        lambda kept_name, keys, partial: kept_or_all(
                            kept_name,
                            lambda rows, events: partial(rows, events, resolution),
                            lambda table: transform.rebucket(table, resolution, keys),
                            fresh=fresh,
                        ),
                        kept_name,
                        keys,
                        partial,
                    )
                    written[name] = pool.submit(
                        lambda name, keys: _write_table(
                            transform.rebucket(counted[name].result(), MINUTE_MS, keys),
                            out_dir,
                            name,
                        ),
                        name,
                        keys,
                    )

            early = kept.resolution if kept is not None and kept.holds() else None
            if early is not None:
                count_series(early)
            if kept is None:  # every row, per minute: needs no bucket (written early)
                for name, (_, _, partial) in series.items():
                    written[name] = pool.submit(
                        lambda name, partial: _write_table(
                            partial(records, events, MINUTE_MS), out_dir, name
                        ),
                        name,
                        partial,
                    )
            from_counts = {
                "latency": ("latency", transform.latency_from_counts),
                "attempts": ("delivery_attempts", transform.attempts_from_counts),
                "outcomes": ("outcomes", transform.rates_from_counts),
            }
            for key, (name, query) in from_counts.items():
                saved[key] = pool.submit(
                    lambda name, query: _save(query(counting.result()[0]), out_dir, name),
                    name,
                    query,
                )
            report.pyplot()  # the driver's Python is idle until the first tables come
            partitions = saved["partitions"].result()  # lag_now reads its log end offsets
            saved["lag_now"] = pool.submit(
                lambda: _save(
                    transform.lag_now(group_offsets, _table(spark, out_dir, "partitions")),
                    out_dir,
                    "lag_now",
                )
            )

            # One bucket size for the whole time span (records and events), so that no chart
            # has more than a few hundred points however long the store's history is.
            stamps = [
                stamp
                for row in partitions
                for stamp in (row["first_timestamp"], row["last_timestamp"])
                if stamp is not None
            ] + [stamp for stamp in (span.result() or {}) if stamp is not None]
            bucket = chart_bucket_ms(max(stamps) - min(stamps) if stamps else 0)
            lag_bucket = max(bucket, 5_000)  # the broker snapshots lag every 5 s
            # Kept time series are counted per second, or per minute once the charts' buckets
            # are whole minutes; the per-minute tables and the charts sum those.
            resolution = MINUTE_MS if bucket % MINUTE_MS == 0 else SECOND_MS
            if kept is not None and early is None:
                # Kept per minute, wanted per second (cannot be: the span only grows): count again.
                count_series(resolution, fresh=(kept.resolution or 0) > resolution)
            # What the charts' buckets are summed from: the counts above, or (kept per minute,
            # wanted per second, as above, keeping the coarser counts) the rows' own. A dict of
            # its own: the per-minute writes queued above wait for ``counted``'s futures.
            charted = dict(counted)
            if early is not None and early > resolution:
                for name, (_, _, partial) in series.items():
                    charted[name] = pool.submit(partial, records, events, resolution)

            def from_table(name: str, query: Callable[[DataFrame], DataFrame]) -> Future[Rows]:
                """The rows of ``query`` over a table this run writes, once it is written (the
                pool starts tasks in order: the write is under way or done)."""

                def rows() -> Rows:
                    written[name].result()
                    return _rows(query(_table(spark, out_dir, name)))

                return pool.submit(rows)

            def per_bucket(name: str) -> Future[Rows]:
                _, keys, partial = series[name]
                if kept is not None:
                    return pool.submit(
                        lambda: _rows(transform.rebucket(charted[name].result(), bucket, keys))
                    )
                if bucket % MINUTE_MS == 0:  # whole minutes: from the per-minute table
                    return from_table(name, lambda table: transform.rebucket(table, bucket, keys))
                return pool.submit(lambda: _rows(partial(records, events, bucket)))

            throughput = per_bucket("throughput_per_minute")
            by_group = per_bucket("throughput_by_group_per_minute")
            by_consumer = per_bucket("throughput_by_consumer_per_minute")
            lag = from_table(
                "lag_over_time", lambda table: transform.lag_by_bucket(table, lag_bucket)
            )

            tell("charts")  # in the order their data comes: the lag's query is queued last
            chart_dir = out_dir / "charts"
            charts = {
                "attempts": report.attempts_chart(
                    saved["attempts"].result(), chart_dir / "attempts.png"
                ),
                "latency": report.latency_chart(
                    saved["latency"].result(), chart_dir / "latency.png"
                ),
                "throughput": report.throughput_chart(
                    throughput.result(), by_group.result(), bucket, chart_dir / "throughput.png"
                ),
                "consumers": report.consumers_chart(
                    by_consumer.result(), bucket, chart_dir / "consumers.png"
                ),
            }
            lag_buckets = lag.result()
            charts["lag"] = report.lag_chart(lag_buckets, lag_bucket, chart_dir / "lag.png")
            tables.update({key: future.result() for key, future in saved.items()})
            for future in written.values():
                future.result()
        counting.result()[1].unpersist()
        for frame in cached:
            frame.unpersist()
    if keep:
        settled.save()
    if kept is not None:
        kept.prepare(
            advance=whole,
            records_to={(t, p): to for t, p, to in visible},
            cache=cache,
            resolution=max(early or resolution, resolution),
        )
        kept.save()
    cache.close()

    tell("summary and report")
    summary = build_summary(
        data_dir=str(data_dir),
        partitions=tables["partitions"],
        latency=tables["latency"],
        attempts=tables["attempts"],
        outcomes=tables["outcomes"],
        payload_sizes=tables["payload_sizes"],
        lag_now=tables["lag_now"],
        consumers=tables["consumers"],
        processing=tables["processing"],
        lines=tables["lines"],
        files={"segments": len(inputs.segment_files), "events": len(inputs.event_files)},
        reasons=tables["failure_reasons"],
        tasks=tables["tasks"],
        periodic=tables["periodic"],
    )
    summary["attention"] = needs_attention(summary, lag_buckets, tables["processing"])
    summary["run"] = {
        "full": full,
        **{
            f"{kind}_{figure}": getattr(staged, figure)
            for kind, staged in (("segments", segments_run), ("events", events_run))
            for figure in (
                "files_parsed", "files_reused", "files_dropped", "parsed_bytes", "reused_bytes"
            )
        },
    }  # fmt: skip
    _write_atomically(
        out_dir / "summary.json", orjson.dumps(summary, option=orjson.OPT_INDENT_2) + b"\n"
    )
    times = {(r["group"], r["consumer"]): r for r in tables["processing"]}
    consumers = [
        {
            **row,
            **{k: times.get((row["group"], row["consumer"]), {}).get(k) for k in ("p50", "p99")},
        }
        for row in tables["consumers"]
    ]
    page = report.render_html(
        summary,
        charts,
        {
            "latency": sorted(
                tables["latency"], key=lambda r: (r["topic"], r["group"] or "", r["measure"])
            ),
            "lag_now": sorted(
                tables["lag_now"], key=lambda r: (r["group"], r["topic"], r["partition"])
            ),
            "outcomes": sorted(tables["outcomes"], key=lambda r: (r["topic"], r["group"])),
            "consumers": sorted(consumers, key=lambda r: (r["group"], r["consumer"])),
            "partitions": sorted(tables["partitions"], key=lambda r: (r["topic"], r["partition"])),
            "top_keys": sorted(tables["top_keys"], key=lambda r: (r["topic"], r["rank"])),
            "payload_sizes": sorted(tables["payload_sizes"], key=lambda r: r["topic"]),
            "tasks": sorted(tables["tasks"], key=lambda r: (r["task"], r["state"])),
            "periodic": sorted(tables["periodic"], key=lambda r: r["job"]),
        },
        dt.datetime.now(dt.UTC),
    )
    report_path = out_dir / "report.html"
    _write_atomically(report_path, page.encode("utf-8"))
    return Result(out_dir=out_dir, summary=summary, report=report_path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="spoolmq analytics", description="Spark analytics over a spoolmq store."
    )
    parser.add_argument("--data", help="data directory (default: $SPOOLMQ_DATA or ./queue_data)")
    parser.add_argument(
        "--out", help="output directory (default: analytics_out next to the data directory)"
    )
    parser.add_argument(
        "--full",
        action="store_true",
        help="parse the whole store again (default: only what is new since the last run "
        "into the same output directory)",
    )
    parser.add_argument(
        "--master",
        help="Spark master URL, e.g. local[2] or spark://HOST:7077 (default: local[*], or "
        "what spark-submit was given)",
    )
    return parser


def _under_spark_submit() -> bool:
    # spark-submit starts the Python driver with the gateway it already launched.
    return "PYSPARK_GATEWAY_PORT" in os.environ


# The master URLs Spark takes (SparkSubmit refuses anything else, after starting a JVM).
# local[N] and local[N,F] need N >= 1: Spark takes local[0] and fails as it starts.
_SPARK_MASTER = re.compile(
    r"local(\[(\*|0*[1-9]\d*)(,\d+)?\])?|local-cluster\[.+\]|(spark|k8s|mesos)://.+|yarn"
)


# How long a spark:// master's address has to take a TCP connection (_check_reachable).
MASTER_CONNECT_TIMEOUT = 10.0


def _check_reachable(master: str) -> None:
    """An InvalidArgumentError (one line from the CLI) for a spark:// master none of whose
    addresses takes a TCP connection. Spark itself finds that out only after its fixed three
    registration attempts of 20 s each (StandaloneAppClient; no setting changes them), and
    then says "Cannot call methods on a stopped SparkContext". A URL this cannot read is
    left to Spark."""
    if not master.startswith("spark://"):
        return
    reasons: list[str] = []
    for address in master.removeprefix("spark://").split(","):  # spark://h1:p1,h2:p2 (HA)
        try:
            host, port = (parts := urlsplit(f"spark://{address}")).hostname, parts.port
        except ValueError:
            return
        if not host or port is None:
            return
        try:
            with socket.create_connection((host, port), timeout=MASTER_CONNECT_TIMEOUT):
                return
        except OSError as exc:
            reasons.append(f"{host}:{port}: {exc.strerror or exc}")
    raise InvalidArgumentError(f"cannot reach Spark master {master}: {'; '.join(reasons)}")


def _spark_error(exc: Exception) -> str:
    """The first line of why a Spark session did not start: for an error in the JVM its
    Java exception's message, not py4j's "An error occurred while calling ..."."""
    text = str(exc)
    if isinstance(exc, Py4JJavaError):
        with contextlib.suppress(Exception):  # the JVM may be gone
            text = str(exc.java_exception.getMessage() or exc.java_exception.toString())
    return (text.strip().splitlines() or [type(exc).__name__])[0]


def _make_out_dir(out_dir: Path) -> None:
    """The output directory and its ``tables`` and ``charts``, made if missing; an
    InvalidArgumentError (one line from the CLI) for one that cannot be: a file there, no
    permission. What the job writes names keys, consumers and failure reasons, so it is as
    private as the store: an output directory the job makes is 0700, and ``tables`` and
    ``charts`` are 0700 in any (the files Spark writes in them take its umask). An existing
    ``--out`` keeps its mode: it may be a directory the user shares on purpose."""
    if out_dir.exists() and not out_dir.is_dir():
        raise InvalidArgumentError(f"--out {out_dir} exists and is not a directory")
    try:
        if not out_dir.is_dir():
            out_dir.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileExistsError):
                os.mkdir(out_dir, DIR_MODE)
                os.chmod(out_dir, DIR_MODE)
        for inner in ("tables", "charts"):
            (out_dir / inner).mkdir(mode=DIR_MODE, exist_ok=True)
            os.chmod(out_dir / inner, DIR_MODE)  # made by an older run with the umask's mode
    except OSError as exc:
        raise InvalidArgumentError(
            f"cannot make the output directory {out_dir}: {exc.strerror or exc}"
        ) from None


def analyse(
    data_dir: Path,
    out_dir: Path | None = None,
    master: str | None = None,
    *,
    full: bool = False,
) -> Result:
    """Start Spark, run the job with its progress on stderr, stop Spark: what ``spoolmq
    analytics`` and the demo do (the demo prints the figures this returns, so its summary
    and the report are the same numbers). ``master`` None: local[*], or what spark-submit
    was given."""
    from rich.console import Console
    from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    if not data_dir.is_dir():
        raise InvalidArgumentError(f"no data directory at {data_dir}")
    out = out_dir or default_out_dir(data_dir)
    _make_out_dir(out)  # before Spark's start: a mistake here costs no JVM
    if master is not None and not _SPARK_MASTER.fullmatch(master):
        raise InvalidArgumentError(
            f"--master {master!r} is not a Spark master URL (local, local[N] with N >= 1, "
            "local[*], spark://HOST:PORT, yarn, k8s://...)"
        )
    if master is not None:
        _check_reachable(master)
    console = Console(stderr=True)
    with Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        TimeElapsedColumn(),
        console=console,
        transient=False,
    ) as progress:
        task = progress.add_task("starting Spark", total=None)

        def step(text: str) -> None:
            progress.update(task, description=text)
            if not console.is_terminal:
                console.print(f"  {text}")

        inputs = extract.list_inputs(data_dir)
        size = sum(extract.size_of(path) for path in (*inputs.segment_files, *inputs.event_files))
        small = size < SMALL_INPUT_BYTES
        archive = ClassArchive.for_this_machine(large=not small)
        new_bytes = None if full else bytes_to_parse(
            out / "cache",
            data_dir,
            {"segments": inputs.segment_files, "events": inputs.event_files},
            fingerprint=_fingerprint(),
        )  # fmt: skip
        try:
            spark = build_session(
                master or (None if _under_spark_submit() else "local[*]"),
                small=small,
                rerun=not small
                and new_bytes is not None
                and new_bytes < SMALL_INPUT_BYTES
                and KeptTables.present(out / "cache" / "kept"),
                class_archive=archive,
            )
        except (RuntimeError, ValueError, Py4JError) as exc:  # no Java, a bad master, the JVM's
            first = _spark_error(exc)
            if isinstance(exc, Py4JJavaError) and (master or "").startswith("spark://"):
                # e.g. a port that takes connections but is no Spark master: Spark gave up
                # after 60 s ("All masters are unresponsive", logged above).
                if "stopped SparkContext" in first:
                    first = "no answer to Spark's three 20 s registration attempts"
                raise InvalidArgumentError(
                    f"cannot start the application on Spark master {master}: {first}"
                ) from None
            raise InvalidArgumentError(
                f"Spark did not start (master {master or 'local[*]'}; Java 17 is needed): {first}"
            ) from None
        try:
            result = run(spark, data_dir, out, step, full=full, keep=not small)
        finally:
            gateway = spark.sparkContext._gateway
            spark.stop()
            if archive is not None and archive.writing is not None:
                # Once the caller has printed its results: the JVM writes the archive
                # as it exits, which takes seconds.
                atexit.register(_save_classes, archive, gateway)
        progress.update(task, description="done")
    return result


def _save_classes(archive: ClassArchive, gateway: object) -> None:
    sys.stderr.write(
        f"spoolmq: saving the Spark JVM's classes to {archive.path.parent} so that the "
        "next analytics run starts faster (once; SPOOLMQ_JVM_CACHE=off not to)\n"
    )
    archive.finish(gateway)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; print where the report is. SpoolError on bad input (the CLI turns it
    into one line on stderr)."""
    args = build_parser().parse_args(argv)
    data_dir = resolve_data_dir(args.data)
    started = time.monotonic()
    result = analyse(data_dir, Path(args.out) if args.out else None, args.master, full=args.full)
    topics = result.summary["topics"]
    skipped = sum(n for reasons in result.summary["skipped"].values() for n in reasons.values())
    print(
        f"analytics over {sum(t['messages'] for t in topics.values()):,} messages in "
        f"{len(topics)} topic(s) took {time.monotonic() - started:.1f} s"
        + (f"; {skipped:,} unreadable line(s) skipped (see the report)" if skipped else "")
    )
    print(f"tables and summary.json: {result.out_dir}")
    print(f"report: {result.report}")
    return 0


def _script_main() -> int:
    try:
        return main()
    except SpoolError as exc:
        sys.stderr.write(f"spoolmq: {exc}\n")
        return 2


if __name__ == "__main__":
    sys.exit(_script_main())
