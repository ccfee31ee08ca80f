"""Reading a topic straight from the store, with no consumer group: where to start, which
records to keep, and how much to scan.

A consumer group remembers what it has read and leases what it delivers; an operator
looking at a topic wants neither. ``spoolmq read`` and the web console's message browser
and search read the segment files the way kcat ``-C`` reads Kafka: pick partitions, a start
(an offset, a time, or N from the end), optional filters, and stream what matches. Nothing
here writes to ``state.db`` or the log, so it works with the broker stopped or running.

:func:`browse` is a generator: a search over a large topic yields each match as it finds it
instead of collecting them, and ``scan_limit`` bounds how many records a search reads, so a
search for a key that is not there costs a known amount. The caller passes a
:class:`BrowseCounts` to learn how many records were scanned and matched, and whether the
bound cut the scan short.
"""

from __future__ import annotations

import heapq
import itertools
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from spoolmq.errors import InvalidArgumentError
from spoolmq.store import Reader, Record, Store

StartKind = Literal["earliest", "latest", "offset", "time", "from_end"]

# How many records a reader returns per poll: large enough that a scan is not a call per
# record, small enough that the first match of a search streams out quickly.
_BATCH = 500


def json_shown(value: Any) -> Any:
    """A key, value or header value as a JSON output carries it: raw bytes as
    ``{"hex": ...}``, so that they cannot be mistaken for a text that looks like hex
    (the console's API, ``read --json``, ``consume``, ``dlq list --json``); anything else
    as stored."""
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    return value


def text_shown(value: Any) -> Any:
    """A key, value or header value as a person reads it (tables, the default ``read``
    output, ``--format``): raw bytes as bare hex; anything else as stored."""
    return value.hex() if isinstance(value, bytes) else value


@dataclass(frozen=True, slots=True)
class Start:
    """Where each partition is read from: the log start (``earliest``), the log end
    (``latest``: only what is written next), ``offset`` (``value``, clamped into the log,
    as ``kcat -o`` does rather than failing on a trimmed log), ``time`` (the first record
    at or after ``value`` epoch ms) or ``from_end`` (the last ``value`` records of each
    partition)."""

    kind: StartKind = "earliest"
    value: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("earliest", "latest", "offset", "time", "from_end"):
            raise InvalidArgumentError(f"unknown start {self.kind!r}")
        if isinstance(self.value, bool) or not isinstance(self.value, int) or self.value < 0:
            raise InvalidArgumentError(
                f"the start of a read must be a whole number of at least 0, not {self.value!r}"
            )


def _split_pair(text: str, what: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise InvalidArgumentError(f"{what} must be NAME=VALUE, not {text!r}")
    return name, value


def _field_path(path: str) -> tuple[str, ...]:
    parts = tuple(path.split("."))
    if any(not part for part in parts):
        raise InvalidArgumentError(f"a JSON field path is names joined by dots, not {path!r}")
    return parts


@dataclass(frozen=True, slots=True)
class Filters:
    """What a record must have to be kept (every given filter must hold): its key; each
    header ``name=value``; each tag; each JSON field of the value at a dotted path
    (``customer.id=42``: list items by index, ``items.0.sku=A1``)."""

    key: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    tags: tuple[str, ...] = ()
    fields: tuple[tuple[tuple[str, ...], str], ...] = ()

    @classmethod
    def parse(
        cls,
        *,
        key: str | None = None,
        headers: Iterable[str] = (),
        tags: Iterable[str] = (),
        fields: Iterable[str] = (),
    ) -> Filters:
        """Filters from the text a user typed (``name=value`` pairs), checked here so the
        CLI and the web console refuse the same input with the same message."""
        header_pairs = tuple(_split_pair(text, "a header filter") for text in headers)
        field_pairs = tuple(
            (_field_path(path), value)
            for path, value in (_split_pair(text, "a field filter") for text in fields)
        )
        tag_list = tuple(tags)
        if any(not tag for tag in tag_list):
            raise InvalidArgumentError("a tag filter must not be empty")
        return cls(key=key, headers=header_pairs, tags=tag_list, fields=field_pairs)

    @property
    def empty(self) -> bool:
        return self.key is None and not self.headers and not self.tags and not self.fields

    def matches(self, record: Record) -> bool:
        if self.key is not None and not _text_equals(record.key, self.key):
            return False
        for name, wanted in self.headers:
            if not any(h == name and _text_equals(v, wanted) for h, v in record.headers):
                return False
        if any(tag not in record.tags for tag in self.tags):
            return False
        if self.fields:
            value = _as_json(record.value)
            for path, wanted in self.fields:
                if not _field_equals(value, path, wanted):
                    return False
        return True


def _text_equals(stored: str | bytes | None, wanted: str) -> bool:
    """A key or header compared with what was typed: bytes as their UTF-8 text."""
    if isinstance(stored, bytes):
        return stored == wanted.encode()
    return stored == wanted


def _as_json(value: Any) -> Any:
    """The value to look fields up in: a text value that holds a JSON object or array
    (a producer that serialised its own JSON) is looked into too."""
    if isinstance(value, str) and value[:1] in ("{", "["):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


_MISSING = object()


def _lookup(value: Any, path: Sequence[str]) -> Any:
    for part in path:
        if isinstance(value, dict):
            value = value.get(part, _MISSING)
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return _MISSING
        if value is _MISSING:
            return _MISSING
    return value


def _field_equals(value: Any, path: Sequence[str], wanted: str) -> bool:
    """Does the field hold what was typed? ``42`` matches the number 42 and the text
    "42"; ``true``/``null`` match JSON true/null; any other text matches that string."""
    found = _lookup(value, path)
    if found is _MISSING:
        return False
    if isinstance(found, str):
        return found == wanted
    try:
        parsed = json.loads(wanted)
    except ValueError:
        return False
    if isinstance(found, bool) or isinstance(parsed, bool) or found is None or parsed is None:
        return parsed is found  # bool is an int in Python: 1 must not match true
    if isinstance(found, int | float) and isinstance(parsed, int | float):
        return found == parsed
    return type(parsed) is type(found) and bool(parsed == found)


def parse_time(text: str, *, zoneless: str = "local") -> int:
    """Epoch milliseconds of an ISO 8601 time (``2026-11-23T21:00:00Z``, or with an
    offset). A time without a zone is this machine's local time, as a person typing one at
    a terminal means it (and as Kafka's ``--to-datetime`` reads it): every command that
    takes a time reads it so. ``zoneless="utc"`` reads it as UTC instead (the console, whose
    page labels its times UTC)."""
    try:
        moment = datetime.fromisoformat(text.strip())
    except ValueError:
        raise InvalidArgumentError(
            f"a time must be ISO 8601, like 2026-11-23T21:00:00Z or "
            f"2026-11-23T22:00:00+01:00, not {text!r}"
        ) from None
    try:
        if moment.tzinfo is None:
            moment = moment.replace(tzinfo=UTC) if zoneless == "utc" else moment.astimezone()
        ms = int(moment.timestamp() * 1000)
    except (ValueError, OverflowError, OSError):  # year 1 in a zone west of UTC, say
        raise InvalidArgumentError(f"the time {text!r} is out of range") from None
    # Nothing is stored before 1970: an earlier time means the start, as it does for
    # ``groups reset --to-datetime``.
    return max(ms, 0)


@dataclass(slots=True)
class BrowseCounts:
    """Filled in as :func:`browse` runs: records read, records kept, and whether
    ``scan_limit`` stopped the scan before the end of the log (then a search that found
    nothing has not shown the match is absent)."""

    scanned: int = 0
    matched: int = 0
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class Found:
    """A kept record and the partition it is in."""

    topic: str
    partition: int
    record: Record


def start_offset(store: Store, topic: str, partition: int, start: Start) -> int:
    """The offset ``start`` means in one partition."""
    first = store.log_start_offset(topic, partition)
    end = store.log_end_offset(topic, partition)
    if start.kind == "earliest":
        return first
    if start.kind == "latest":
        return end
    if start.kind == "offset":
        return min(max(start.value, first), end)
    if start.kind == "time":
        return store.offset_for_timestamp(topic, partition, start.value)
    return max(first, end - start.value)


def _partitions(store: Store, topic: str, partitions: Sequence[int] | None) -> list[int]:
    count = store.topic_config(topic).partitions
    if partitions is None:
        return list(range(count))
    for partition in partitions:
        store.partition_log(topic, partition)  # UnknownPartitionError for a bad number
    return sorted(set(partitions))


def _records(reader: Reader, until: int | None) -> Iterator[Record]:
    """The reader's records up to the end of the log as it is now (or ``until``)."""
    while True:
        batch = reader.poll_batch(_BATCH)
        if not batch:
            return
        for record in batch:
            if until is not None and record.offset >= until:
                return
            yield record


def _keyed(partition: int, records: Iterator[Record]) -> Iterator[tuple[int, int, int, Record]]:
    """Records with their merge key: time first, then partition and offset (unique, so
    records themselves are never compared)."""
    for record in records:
        yield record.timestamp, partition, record.offset, record


def browse(
    store: Store,
    topic: str,
    *,
    partitions: Sequence[int] | None = None,
    start: Start = Start(),
    until: int | None = None,
    filters: Filters = Filters(),
    limit: int | None = None,
    scan_limit: int | None = None,
    counts: BrowseCounts | None = None,
    follow: Callable[[], bool] | None = None,
) -> Iterator[Found]:
    """Stream ``topic``'s records that pass ``filters``, from ``start`` in each of
    ``partitions`` (all by default).

    The read goes to the log end as it is when each partition is reached (or below
    offset ``until``), and records of several partitions come out in timestamp order (a
    merge, so one partition at a time is held in memory, a batch each). With ``follow``,
    after the partitions are caught up it calls ``follow()``, which waits for the log to
    grow and returns False to stop; the records polled then come out in timestamp order
    within each poll of every partition. ``limit`` stops after that many matches;
    ``scan_limit`` after reading that many records (``counts.truncated`` then says so).
    """
    if limit is not None and limit < 0:
        raise InvalidArgumentError(f"limit must be at least 0, not {limit}")
    if scan_limit is not None and scan_limit < 0:
        raise InvalidArgumentError(f"scan limit must be at least 0, not {scan_limit}")
    tally = counts if counts is not None else BrowseCounts()
    chosen = _partitions(store, topic, partitions)
    readers = [store.reader(topic, p, offset=start_offset(store, topic, p, start)) for p in chosen]
    try:
        streams = [
            _keyed(p, _records(reader, until)) for p, reader in zip(chosen, readers, strict=True)
        ]
        pairs: Iterator[tuple[int, Record]] = (
            (p, record) for _, p, _, record in heapq.merge(*streams)
        )
        if follow is not None:  # what is there merged, then what comes
            pairs = itertools.chain(pairs, _followed(chosen, readers, follow))
        if limit == 0:
            return
        for partition, record in pairs:
            if scan_limit is not None and tally.scanned >= scan_limit:
                tally.truncated = True
                return
            tally.scanned += 1
            if filters.matches(record):
                tally.matched += 1
                yield Found(topic, partition, record)
                if limit is not None and tally.matched >= limit:
                    return
    finally:
        for reader in readers:
            reader.close()


def _followed(
    partitions: Sequence[int], readers: Sequence[Reader], follow: Callable[[], bool]
) -> Iterator[tuple[int, Record]]:
    while True:
        polled = [
            (record.timestamp, partition, record.offset, record)
            for partition, reader in zip(partitions, readers, strict=True)
            for record in reader.poll_batch(_BATCH)
        ]
        polled.sort(key=lambda row: row[:3])
        for _, partition, _, record in polled:
            yield partition, record
        if not polled and not follow():
            return
