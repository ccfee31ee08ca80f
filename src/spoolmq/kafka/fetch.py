"""Fetch (api key 1, v4-v8) and ListOffsets (2, v1-v3): Kafka reads straight from the store.

Fetch reads each partition with a ``spoolmq.store`` Reader (kept per connection
and partition, so a consumer reading on from where it stopped costs no seek),
turns the stored records into uncompressed RecordBatch v2 (``stored_batch``)
and answers once ``min_bytes`` are there or ``max_wait_ms`` has passed. The wait
is a long poll woken by the partitions' files growing (``watch.GrowthWatcher``):
no sleeping and re-reading.

Fetch sessions (KIP-227, v7+) are not kept: every answer has session id 0, which
tells the client the session was not created, so it goes on sending full requests.
"""

from __future__ import annotations

import time
from typing import Any

import orjson

from spoolmq.errors import SpoolError
from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.core import KafkaCore, core_of, error_code_of, fields_to_kafka
from spoolmq.kafka.records import NULL, batch_of, encode_record, zigzag_bytes
from spoolmq.kafka.wire import Reader, Writer
from spoolmq.store.reader import Reader as StoreReader

_RECORDS_PER_BATCH = 500
# A RecordBatch v2 header: base offset, length, leader epoch, magic, CRC, attributes,
# last offset delta, first and max timestamps, producer id and epoch, base sequence, count.
_BATCH_OVERHEAD = 61
# A batch's last offset delta is an int32: a compacted log's gaps can be wider.
_MAX_OFFSET_DELTA = 2**31 - 1
MAX_WAIT_MS = 30_000
# What one answer may hold, whatever the request's max_bytes says (Kafka's broker setting
# fetch.max.bytes, 55 MiB by default): an answer is built in memory, and a client asking
# for 2 GiB of a large topic must not make the child allocate that much.
MAX_FETCH_BYTES = 57_671_680
_EARLIEST = -2
_LATEST = -1


class _Part:
    """One partition of a Fetch: what was asked, and the answer so far (a long poll adds
    to ``data`` on each wake, reading on from ``next``)."""

    __slots__ = ("data", "error", "high", "max_bytes", "next", "offset", "partition", "start")

    def __init__(self, partition: int, offset: int, max_bytes: int) -> None:
        self.partition = partition
        self.offset = offset
        self.next = offset
        self.max_bytes = max_bytes
        self.error = int(ErrorCode.NONE)
        self.high = -1
        self.start = -1
        self.data = bytearray()


async def handle_fetch(ctx: RequestContext, version: int, r: Reader) -> bytes:
    core = core_of(ctx)
    r.int32()  # replica_id: always a consumer (-1) here
    max_wait_ms = r.int32()
    min_bytes = r.int32()
    max_bytes = min(r.int32(), MAX_FETCH_BYTES)
    r.int8()  # isolation_level: no transactions, so both levels read the same
    if version >= 7:
        r.int32()  # session_id
        r.int32()  # session_epoch
    topics: list[tuple[str, list[_Part]]] = []
    for _ in range(r.array_count(min_size=6)):
        topic = r.string()
        parts = []
        for _ in range(r.array_count(min_size=16)):
            partition = r.int32()
            offset = r.int64()
            if version >= 5:
                r.int64()  # log_start_offset: a follower's, unused
            parts.append(_Part(partition, offset, r.int32()))
        topics.append((topic, parts))
    # v7's forgotten_topics_data only matters to sessions, which we do not keep.

    readers: dict[tuple[str, int], StoreReader] = ctx.conn.setdefault("readers", {})
    # A client's wait is bounded (clients use 500 ms by default) so that a hostile
    # max_wait_ms of days cannot park a connection's task that long.
    deadline = time.monotonic() + min(max(max_wait_ms, 0), MAX_WAIT_MS) / 1000
    total = 0
    while True:
        dirs = [core.partition_dir(t, p.partition) for t, parts in topics for p in parts]
        armed = core.watcher.arm(dirs)
        # Each wake reads on from where the answer so far ends: what was read before is
        # kept, not read and verified again.
        total = _read_all(core, readers, topics, max_bytes, total)
        errors = any(p.error for _, parts in topics for p in parts)
        left = deadline - time.monotonic()
        if total >= min_bytes or errors or left <= 0:
            core.watcher.disarm(armed)
            break
        await core.watcher.wait(armed, left)

    w = Writer().int32(0)  # throttle_time_ms
    if version >= 7:
        w.int16(ErrorCode.NONE).int32(0)  # error_code, session_id (no session)
    w.int32(len(topics))
    for topic, parts in topics:
        w.string(topic).int32(len(parts))
        for p in parts:
            w.int32(p.partition).int16(p.error).int64(p.high).int64(p.high)
            if version >= 5:
                w.int64(p.start)
            w.int32(0)  # aborted_transactions: none
            w.bytes_(p.data)
    return w.getvalue()


def _read_all(
    core: KafkaCore,
    readers: dict[tuple[str, int], StoreReader],
    topics: list[tuple[str, list[_Part]]],
    max_bytes: int,
    total: int,
) -> int:
    """Add to each partition's answer what fits after the ``total`` bytes of the answer so
    far; the new total."""
    for topic, parts in topics:
        for p in parts:
            if p.error != ErrorCode.NONE:
                continue
            budget = min(p.max_bytes - len(p.data), max_bytes - total)
            # KIP-74: the first non-empty partition gets at least one batch even
            # past the budget, so a record larger than the limits still goes out.
            more = _read_partition(core, readers, topic, p, budget, force=total == 0)
            if more is None:  # an error answers the partition with no records
                total -= len(p.data)
                p.data.clear()
                continue
            p.data += more
            total += len(more)
    return total


def _read_partition(
    core: KafkaCore,
    readers: dict[tuple[str, int], StoreReader],
    topic: str,
    p: _Part,
    budget: int,
    *,
    force: bool,
) -> bytes | None:
    """More records of the partition from ``p.next``, in ``budget`` bytes; None when the
    partition answers with an error (set in ``p.error``)."""
    try:
        log = core.store.partition_log(topic, p.partition)
        p.start, p.high = log.log_start_offset(), log.log_end_offset()
        if not p.start <= p.next <= p.high:
            p.error = int(ErrorCode.OFFSET_OUT_OF_RANGE)
            return None
        if p.next == p.high or (budget <= 0 and not force):
            return b""
        key = (topic, p.partition)
        reader = readers.get(key)
        if reader is None:
            reader = readers[key] = core.store.reader(topic, p.partition, offset=p.next)
        elif reader.position != p.next:
            reader.seek(p.next)
        data = _encode_entries(reader, budget, p, force=force)
        p.next = reader.position  # the first record not sent
        return data
    except SpoolError as exc:
        p.error = error_code_of(exc)
        return None


def _encode_entries(reader: StoreReader, budget: int, p: _Part, *, force: bool) -> bytes:
    """Batches of the records from the reader's position that fit in ``budget`` bytes
    (with ``force``, at least one record). What was read and not sent stays with the
    reader, which stands at the first record not sent: the next Fetch names that offset
    and reads on without a seek."""
    out = bytearray()
    while True:
        entries = reader.read_entries(_RECORDS_PER_BATCH)
        if not entries:
            break
        # A record in Kafka's form is never longer than its stored line (the field
        # names, quotes and the CRC's digits are gone; base64 shrinks back to bytes),
        # so lines that fit make a batch that fits.
        room = budget - len(out) - _BATCH_OVERHEAD
        fit = 0
        base = entries[0][0]["offset"]
        for fields, line in entries:
            if fields["offset"] - base > _MAX_OFFSET_DELTA:
                break  # past what one batch can say: the next batch starts here
            room -= len(line)
            if room < 0:
                break
            fit += 1
        if not fit and force and not out:
            fit = 1  # KIP-74: a first record larger than the limits still goes out
        if fit < len(entries):
            reader.unread(entries[fit:])
            entries = entries[:fit]
            if not entries:
                break
        out += stored_batch(entries)
        p.high = max(p.high, entries[-1][0]["offset"] + 1)
        if room < 0:
            break
    return bytes(out)


def stored_batch(entries: list[tuple[dict[str, Any], bytes]]) -> bytes:
    """One RecordBatch v2 of stored records (a reader's entries: non-empty, ascending
    offsets). The same bytes as ``encode_batch`` of their ``fields_to_kafka`` forms; a
    record with a text key or none, a JSON value and no headers (the usual one) is put
    together here in one piece, the others through ``encode_record``."""
    first = entries[0][0]
    base = first["offset"]
    first_ts = max_ts = first["timestamp"]
    parts: list[bytes] = []
    append = parts.append
    varint = zigzag_bytes
    dumps = orjson.dumps
    for fields, _line in entries:
        timestamp = fields["timestamp"]
        if timestamp > max_ts:
            max_ts = timestamp
        if fields.get("headers") or "key_b64" in fields or "value_b64" in fields:
            key_bytes, value_bytes, headers = fields_to_kafka(fields)
            offset_delta = fields["offset"] - base
            encode_record(
                parts, offset_delta, timestamp - first_ts, key_bytes, value_bytes, headers
            )
            continue
        # attributes, timestamp delta, offset delta, key, value, no headers
        head = b"\x00" + varint(timestamp - first_ts) + varint(fields["offset"] - base)
        key = fields.get("key")
        if key is None:
            head += NULL
        else:
            encoded = str(key).encode("utf-8")
            head += varint(len(encoded)) + encoded
        value = fields.get("value")
        if value is None:
            append(varint(len(head) + 2) + head + NULL + b"\x00")
            continue
        data = dumps(value)
        head += varint(len(data))
        append(varint(len(head) + len(data) + 1) + head)
        append(data)
        append(b"\x00")
    return batch_of(
        parts,
        base=base,
        last_offset_delta=entries[-1][0]["offset"] - base,
        first_timestamp=first_ts,
        max_timestamp=max_ts,
        count=len(entries),
    )


# -- ListOffsets --------------------------------------------------------------------------


async def handle_list_offsets(ctx: RequestContext, version: int, r: Reader) -> bytes:
    core = core_of(ctx)
    r.int32()  # replica_id
    if version >= 2:
        r.int8()  # isolation_level
    topics: list[tuple[str, list[tuple[int, int]]]] = []
    for _ in range(r.array_count(min_size=6)):
        topic = r.string()
        parts = [(r.int32(), r.int64()) for _ in range(r.array_count(min_size=12))]
        topics.append((topic, parts))
    w = Writer()
    if version >= 2:
        w.int32(0)  # throttle_time_ms
    w.int32(len(topics))
    for topic, parts in topics:
        w.string(topic).int32(len(parts))
        for partition, timestamp in parts:
            error, ts, offset = _list_offset(core, topic, partition, timestamp)
            w.int32(partition).int16(error).int64(ts).int64(offset)
    return w.getvalue()


def _list_offset(
    core: KafkaCore, topic: str, partition: int, timestamp: int
) -> tuple[int, int, int]:
    """(error, timestamp, offset) for one partition: earliest, latest or by time."""
    try:
        log = core.store.partition_log(topic, partition)
        if timestamp == _LATEST:
            return ErrorCode.NONE, -1, log.log_end_offset()
        if timestamp == _EARLIEST:
            return ErrorCode.NONE, -1, log.log_start_offset()
        if timestamp < 0:
            return ErrorCode.INVALID_REQUEST, -1, -1
        offset = core.store.offset_for_timestamp(topic, partition, timestamp)
        if offset >= log.log_end_offset():
            return ErrorCode.NONE, -1, -1  # no record at or after that time (as Kafka)
        found = _timestamp_at(core, topic, partition, offset)
        return ErrorCode.NONE, found, offset
    except SpoolError as exc:
        return error_code_of(exc), -1, -1


def _timestamp_at(core: KafkaCore, topic: str, partition: int, offset: int) -> int:
    reader = core.store.reader(topic, partition, offset=offset)
    try:
        entries: list[tuple[dict[str, Any], bytes]] = reader.read_entries(1)
    finally:
        reader.close()
    return int(entries[0][0]["timestamp"]) if entries else -1


APIS = [
    ApiHandler(ApiKey.FETCH, 4, 8, handle_fetch, name="Fetch"),
    ApiHandler(ApiKey.LIST_OFFSETS, 1, 3, handle_list_offsets, name="ListOffsets"),
]
