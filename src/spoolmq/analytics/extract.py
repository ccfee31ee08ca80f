"""Extract: find the store's files and read them into DataFrames with explicit schemas.

Segments and events are read as text, one row per line, and parsed by the transformations,
so a line that does not parse is counted and reported instead of failing the job. The
small ``state.db`` tables are read with ``sqlite3`` in the driver.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spoolmq.analytics import schemas
from spoolmq.errors import SchemaVersionError, StorageError

# The newest state.db schema this job understands (spoolmq.store.state.SCHEMA_VERSION).
# Version 2 added the producer runs, version 3 the Kafka group membership, version 4 the
# cancelled messages, version 5 the parked messages; the tables read here are those of
# version 1.
_STATE_SCHEMA_VERSION = 5


@dataclass(frozen=True)
class Inputs:
    """The files one run reads, listed once in the driver (names only, never contents)."""

    segment_files: list[Path]
    event_files: list[Path]


@dataclass(frozen=True)
class StateTables:
    """The rows the job needs from ``state.db``; empty when there is no database yet."""

    topics: list[tuple[str, int]] = field(default_factory=list)
    partitions: list[tuple[str, int, int, int]] = field(default_factory=list)
    group_offsets: list[tuple[str, str, int, int]] = field(default_factory=list)


def list_inputs(data_dir: Path) -> Inputs:
    segments = sorted((data_dir / "logs").glob("*/*/" + "[0-9]" * 20 + ".jsonl"))
    events = sorted((data_dir / "events").glob("date=*/*.jsonl"))
    return Inputs(segment_files=segments, event_files=events)


def size_of(path: Path) -> int:
    """A file's size; 0 when retention deleted it since it was listed."""
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def _snapshot(path: Path, newest: int, queries: Sequence[str]) -> list[list[Any]] | None:
    """Each query's rows from the SQLite database at ``path``, read-only, in one read
    transaction (a consistent snapshot while a broker or worker writes); None when the
    database does not exist or was never migrated (nothing in it yet). A schema newer than
    ``newest`` is refused."""
    if not path.exists():
        return None
    try:
        db = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
    except sqlite3.Error as exc:
        raise StorageError(f"cannot open {path}: {exc}") from None
    try:
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > newest:
            raise SchemaVersionError(
                f"{path} has schema version {version}; this spoolmq reads up to {newest}"
            )
        if version == 0:
            return None
        db.execute("BEGIN")
        rows = [db.execute(query).fetchall() for query in queries]
        db.execute("COMMIT")
    except sqlite3.Error as exc:
        raise StorageError(f"cannot read {path}: {exc}") from None
    finally:
        db.close()
    return rows


def read_state(data_dir: Path) -> StateTables:
    """Topics, partition figures and committed offsets, read-only, while a broker may write."""
    found = _snapshot(
        data_dir / "state.db",
        _STATE_SCHEMA_VERSION,
        [
            "SELECT name, partitions FROM topics",
            "SELECT topic, partition, log_start_offset, log_end_offset FROM partitions",
            "SELECT group_name, topic, partition, committed_offset FROM group_offsets",
        ],
    )
    if found is None:
        return StateTables()
    topics, partitions, offsets = found
    return StateTables(topics=topics, partitions=partitions, group_offsets=offsets)


# The newest tasks.db schema this job understands (spoolmq.tasks.results.SCHEMA_VERSION);
# the columns read here are those of version 1.
_TASKS_SCHEMA_VERSION = 2
# A retrying or running task's started_ms is its new attempt's: no run time yet.
_RAN = "CASE WHEN state IN ('succeeded', 'failed') THEN finished_ms - started_ms END"


@dataclass(frozen=True)
class TaskTables:
    """What the job reports of ``tasks.db`` (the task layer's own state), aggregated by
    SQLite in the driver: a row per task name and state, a row per periodic job."""

    tasks: list[tuple[str, str, int, int, float | None, int | None]] = field(default_factory=list)
    periodic: list[tuple[str, str, str, int | None, int | None, int | None]] = field(
        default_factory=list
    )


def read_tasks(data_dir: Path) -> TaskTables:
    """Per task name and state: how many tasks, and of the finished ones (succeeded or
    failed) how many ran and their mean and longest run (the last attempt's start to its
    finish) in ms; the periodic jobs with their last tick and next run. Empty when no task
    was ever sent."""
    found = _snapshot(
        data_dir / "tasks.db",
        _TASKS_SCHEMA_VERSION,
        [
            f"SELECT name, state, COUNT(*), COUNT({_RAN}), AVG({_RAN}), MAX({_RAN}) "
            "FROM tasks GROUP BY name, state",
            "SELECT name, task, schedule, last_tick, last_fired_ms, next_ms FROM periodic",
        ],
    )
    if found is None:
        return TaskTables()
    tasks, periodic = found
    return TaskTables(tasks=tasks, periodic=periodic)


def local_frame(
    spark: SparkSession, rows: Sequence[Sequence[Any]], schema: StructType
) -> DataFrame:
    """A small DataFrame of driver-side rows, built from literals in the query plan.

    ``spark.createDataFrame(rows)`` would ship the rows as pickled Python objects, which
    the executors must unpickle in Python workers: a cluster whose hosts have no Python (or
    not the driver's virtualenv) fails there. Literals are evaluated by the JVM alone.
    """
    if not rows:
        return spark.range(0).select(
            *(F.lit(None).cast(f.dataType).alias(f.name) for f in schema.fields)
        )
    structs = [
        F.struct(
            *(
                F.lit(value).cast(f.dataType).alias(f.name)
                for value, f in zip(row, schema.fields, strict=True)
            )
        )
        for row in rows
    ]
    return spark.range(1).select(F.inline(F.array(*structs)))


def _file_id(path: Column) -> Column:
    """The parse cache's id of a staged file: its name without ``.jsonl`` (cache.py)."""
    return F.substring_index(F.substring_index(path, "/", -1), ".", 1).alias("file_id")


def segment_lines(spark: SparkSession, files: list[Path], *, staged: bool = False) -> DataFrame:
    """One row per segment line: topic and partition (from the path) and the line's text;
    with ``staged``, also the parse cache's ``file_id`` (from the staged file's name)."""
    if not files:
        empty = local_frame(spark, [], schemas.SEGMENT_LINES)
        return empty.select("*", F.lit(None).cast("string").alias("file_id")) if staged else empty
    raw = spark.read.text([str(path) for path in files])
    # .../<topic>/<partition>/<file> (cheaper per line than a regular expression)
    path = F.col("_metadata.file_path")
    return raw.select(
        F.substring_index(F.substring_index(path, "/", -3), "/", 1).alias("topic"),
        F.substring_index(F.substring_index(path, "/", -2), "/", 1).cast("int").alias("partition"),
        F.col("value").alias("line"),
        *([_file_id(path)] if staged else []),
    )


def event_lines(spark: SparkSession, files: list[Path], *, staged: bool = False) -> DataFrame:
    """One row per delivery event line (its text); with ``staged``, also ``file_id``."""
    if not files:
        empty = local_frame(spark, [], schemas.EVENT_LINES)
        return empty.select("*", F.lit(None).cast("string").alias("file_id")) if staged else empty
    raw = spark.read.text([str(path) for path in files])
    path = F.col("_metadata.file_path")
    return raw.select(F.col("value").alias("line"), *([_file_id(path)] if staged else []))


def state_frames(spark: SparkSession, state: StateTables) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The state tables as small DataFrames: topics, partitions, group offsets."""
    return (
        local_frame(spark, state.topics, schemas.STATE_TOPICS),
        local_frame(spark, state.partitions, schemas.STATE_PARTITIONS),
        local_frame(spark, state.group_offsets, schemas.STATE_GROUP_OFFSETS),
    )
