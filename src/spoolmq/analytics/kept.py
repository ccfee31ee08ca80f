"""Aggregates kept between runs: a re-run adds only what the new rows add.

Most of the job's tables are sums (counts, byte totals, value counts for percentiles) or
minima and maxima, per some key: what a set of rows gives them can be merged with what
another set gives (``partial`` then ``merge`` in transform.py: the cold computation is the
same two steps over every row). For a store above analytics.session.SMALL_INPUT_BYTES the
job keeps each such table's merged partial aggregates in ``<out>/cache/kept/`` (Parquet, one
directory per table) with what they cover, and a re-run merges them with the partials of
the new rows only:

- records: per topic and partition, those before ``records_to`` (where the log's whole
  batches ended in the run that kept them: a batch written since, or completed since, is
  new), found with a filter Parquet can apply to each file's offset statistics;
- delivery events: the cache's Parquet part files listed in ``events_parts`` (the parse
  cache writes one per run and file: those it wrote since are new);
- segment lines as parsed (for the line counts and where each partition's records end,
  which ``records_to`` cannot say): the part files listed in ``segments_parts``. Where
  the records of those part files end is kept in ``kept.json`` (``ends``).

One table is not a sum: a consumer's busy and idle time is a union of its deliveries' spans
(transform.consumer_activity). What is kept of it is the summary of the spans that started
before ``activity_from`` (the start of the oldest delivery with no end yet, or else of the
newest delivery): each later span can only add to it, in order. A re-run reads the event
rows at or after ``activity_from`` (a filter Parquet applies to the row groups' and pages'
time statistics) and every new one; a new delivery before ``activity_from`` (events from a
clock that went back) makes it compute the table from every row. A delivery with no end that
a later delivery of the same message to its group followed (its broker stopped without a
record of how, then delivered the message again) will not end: it does not hold
``activity_from`` back (transform.activity_resume). This rests on the broker never writing
an end for such a delivery (a late ACK is refused without an event). One with no end and
no later delivery does hold it, as it may still end.

What is kept is dropped, and computed again from every row, when the parse cache dropped
or re-parsed a file (it could count lines that are gone), with ``--full``, or when it was
written by other code (the parse cache's fingerprint). A run that found a file's last line
half-written (the cache's fragments) counts those rows in its figures but keeps nothing
new: the next run covers them once they are whole.

The time series are kept per second while the charts' buckets are shorter than a minute,
else per minute (``resolution``). A re-run counts them in the kept resolution from its
start, before it knows its own span's bucket (which can only be as coarse or coarser: the
span only grows while nothing is dropped); when that bucket asks for minutes, it keeps them
per second once more, with ``resolution`` a minute, and the next run sums them per minute.

Layout: ``kept.json`` (version, ``records_to``, ``events_parts``, ``segments_parts``,
``activity_from``, ``ends``, ``resolution``: what the next run counts the time series in,
the kept rows being at it or finer) and a directory per table. A run writes the next state
to ``kept.next/`` and swaps it in whole.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import orjson
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import StructType

from spoolmq.analytics import extract, schemas, transform
from spoolmq.analytics.cache import ParseCache
from spoolmq.files import start_next_dir, swap_in

KEPT_VERSION = 2
# Above this many distinct partitions, new records are found with a join, not a filter.
MAX_FILTER_PARTITIONS = 256


class KeptTables:
    """The kept aggregates of one output directory's cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.next = start_next_dir(root)
        self.records_to: dict[tuple[str, int], int] = {}
        self.events_parts: dict[str, list[str]] = {}
        self.segments_parts: dict[str, list[str]] = {}
        self.activity_from: int | None = None
        self.next_activity_from: int | None = None
        self.ends: dict[tuple[str, int], transform.PartitionEnd] = {}
        self.next_ends: dict[tuple[str, int], transform.PartitionEnd] = {}
        self.resolution: int | None = None
        self.names: set[str] = set()
        self._load()
        self._next: dict[str, object] | None = None
        self._written: set[str] = set()

    def _load(self) -> None:
        try:
            data = orjson.loads((self.root / "kept.json").read_bytes())
            if data["version"] != KEPT_VERSION:
                raise ValueError("another version")
            names = set(data["names"])
            if not all((self.root / name).is_dir() for name in names):
                raise ValueError("incomplete")
            self.records_to = {(str(t), int(p)): int(to) for t, p, to in data["records_to"]}
            self.events_parts = {str(k): list(v) for k, v in data["events_parts"].items()}
            self.segments_parts = {str(k): list(v) for k, v in data["segments_parts"].items()}
            self.ends = {
                (str(t), int(p)): (int(to), head, size) for t, p, to, head, size in data["ends"]
            }
            start = data["activity_from"]
            self.activity_from = None if start is None else int(start)
            self.resolution = int(data["resolution"])
            self.names = names
        except (OSError, ValueError, KeyError, TypeError):
            self.clear()

    def holds(self) -> bool:
        return bool(self.names)

    @staticmethod
    def present(root: Path) -> bool:
        """Whether a run kept aggregates under ``root`` (without loading them)."""
        return (root / "kept.json").is_file()

    def clear(self) -> None:
        """Forget everything kept (the next run computes from every row). What this run
        prepared for the next state stays: ``next_ends`` is built from the kept ends only
        while the cache dropped no segment rows, so it holds when events were dropped."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.records_to, self.events_parts, self.segments_parts = {}, {}, {}
        self.activity_from, self.resolution, self.names, self.ends = None, None, set(), {}

    # -- the new rows --------------------------------------------------------------------

    def new_records(self, spark: SparkSession, records: DataFrame) -> DataFrame:
        """The rows of ``records`` that what is kept does not cover."""
        if len(self.records_to) > MAX_FILTER_PARTITIONS:
            ends = extract.local_frame(
                spark, [(t, p, to) for (t, p), to in self.records_to.items()], schemas.VISIBLE
            )
            return (
                records.join(F.broadcast(ends), ["topic", "partition"], "left")
                .where(F.col("offset") >= F.coalesce(F.col("visible_to"), F.lit(0)))
                .drop("visible_to")
            )
        # A filter of literals: Parquet skips the row groups whose offsets fall below it.
        return records.where(transform.at_or_after(self.records_to, others=True))

    def new_event_parts(self, cache: ParseCache) -> list[Path]:
        """The parse cache's event part files that what is kept does not cover."""
        return cache.parts_not_in("events", self.events_parts)

    def seen_event_parts(self, cache: ParseCache) -> list[Path]:
        """The parse cache's event part files that what is kept covers."""
        return cache.parts_in("events", self.events_parts)

    def new_segment_parts(self, cache: ParseCache) -> list[Path]:
        """The parse cache's segment part files that what is kept does not cover."""
        return cache.parts_not_in("segments", self.segments_parts)

    # -- keeping -------------------------------------------------------------------------

    def keep(
        self,
        spark: SparkSession,
        name: str,
        partial: DataFrame,
        merge: Callable[[DataFrame], DataFrame],
        *,
        advance: bool,
        fresh: bool = False,
    ) -> DataFrame:
        """What is kept of ``name`` merged with ``partial`` (the new rows' partials; with
        ``fresh``, every row's, and nothing kept is read). With ``advance``, written as the
        next state and read back; without, computed for this run only (the state stays as
        it is)."""
        both = partial
        if name in self.names and not fresh:
            both = self.read(spark, name, partial.schema).unionByName(partial)
        merged = merge(both)
        if not advance:
            return merged
        return self.write(spark, name, merged)

    def read(self, spark: SparkSession, name: str, schema: StructType) -> DataFrame:
        """What is kept of ``name``."""
        return spark.read.schema(schema).parquet(str(self.root / name))

    def write(self, spark: SparkSession, name: str, frame: DataFrame) -> DataFrame:
        """Write ``frame`` as the next state's ``name``; returns it, read back."""
        frame.coalesce(1).write.parquet(str(self.next / name))
        self._written.add(name)
        return spark.read.schema(frame.schema).parquet(str(self.next / name))

    def prepare(
        self,
        *,
        advance: bool,
        records_to: dict[tuple[str, int], int],
        cache: ParseCache,
        resolution: int,
    ) -> None:
        """The next state's bookkeeping (its tables written by ``keep``). Without
        ``advance`` the state stays as it is."""
        if not advance:
            self._next = None
            return
        self._next = {
            "version": KEPT_VERSION,
            "records_to": [[t, p, to] for (t, p), to in sorted(records_to.items())],
            "events_parts": cache.parts("events"),
            "segments_parts": cache.parts("segments"),
            "activity_from": self.next_activity_from,
            "ends": [[t, p, *end] for (t, p), end in sorted(self.next_ends.items())],
            "resolution": resolution,
            "names": sorted(self._written),
        }

    def save(self) -> None:
        """Swap the prepared state in (once nothing reads the one before)."""
        if self._next is None:
            shutil.rmtree(self.next, ignore_errors=True)
            return
        (self.next / "kept.json").write_bytes(orjson.dumps(self._next))
        swap_in(self.next, self.root)
        self._next = None
        self._load()
