"""Kafka's RecordBatch v2 (magic 2): decoding what producers send, encoding what Fetch returns.

A batch is a fixed header (base offset, length, epoch, magic, CRC-32C, attributes,
offset/timestamp ranges, producer id/epoch/base sequence, record count) then the
records, possibly compressed as one block (gzip, snappy, lz4, zstd: attribute bits
0-2). Each record is varint-framed: length, attributes, timestamp delta, offset
delta, key, value, headers. See the "Record Batch" section of Kafka's protocol
guide.

Decoding is hostile-input safe: the CRC is checked before anything else is
trusted, every count is bounded by the bytes left (``wire.Reader``), and the
compressed blocks of a record set may not inflate past ``max_bytes`` together (a
compression bomb), nor is more than that ever allocated for them. Encoding
(Fetch) writes uncompressed batches with CreateTime timestamps: the timestamp of
each record is the one the store gave it.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka.wire import MAX_VARINT32_BYTES as _VARINT32
from spoolmq.kafka.wire import MAX_VARINT_BYTES as _VARINT64
from spoolmq.kafka.wire import Reader, Writer

MAGIC = 2
# Offsets of the v2 header fields, from the batch's first byte.
_HEADER = struct.Struct(">qiibIhiqqqhii")
HEADER_BYTES = _HEADER.size  # 61
_CRC_START = 21  # attributes begin here: the CRC covers from here to the end
LENGTH_OVERHEAD = 12  # base offset + batch length fields, not counted in batch length

COMPRESSION_NONE = 0
COMPRESSION_GZIP = 1
COMPRESSION_SNAPPY = 2
COMPRESSION_LZ4 = 3
COMPRESSION_ZSTD = 4
_TIMESTAMP_TYPE_BIT = 0x08
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20

# -- CRC-32C (Castagnoli) ---------------------------------------------------------------
# zlib's crc32 uses another polynomial. The `kafka` extra brings google-crc32c (C, with the
# CPU's CRC32 instruction where there is one): about 0.06 ns a byte against ~90 ns for the
# classic table-driven form below (reflected, 0x82F63B78), which stays as the reference and
# the fallback when the extra is not installed.


def _make_table() -> list[int]:
    table = []
    for n in range(256):
        c = n
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c_python(data: bytes | memoryview, crc: int = 0) -> int:
    """The CRC-32C of ``data`` (continuing from ``crc``), in pure Python."""
    table = _TABLE
    c = crc ^ 0xFFFFFFFF
    for byte in bytes(data):
        c = table[(c ^ byte) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


try:
    from google_crc32c import extend as _extend_c
except ImportError:  # the `kafka` extra is not installed
    _extend_c = None


def crc32c(data: bytes | memoryview, crc: int = 0) -> int:
    """The CRC-32C of ``data`` (continuing from ``crc``)."""
    if _extend_c is not None:
        return int(_extend_c(crc, bytes(data)))
    return crc32c_python(data, crc)


# -- decoding ---------------------------------------------------------------------------


@dataclass(slots=True)
class KafkaRecord:
    """One record of a batch, as its producer sent it."""

    offset_delta: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Sequence[tuple[str, bytes | None]] = ()


# One record as the decoding reads it, a plain tuple (Produce's per-record work makes no
# object): offset delta, timestamp delta, key, value, headers (an empty tuple for none).
RawRecord = tuple[int, int, bytes | None, bytes | None, Sequence[tuple[str, bytes | None]]]
_NO_HEADERS: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(slots=True)
class RecordBatch:
    """One decoded batch: its header fields and records."""

    base_offset: int
    attributes: int
    last_offset_delta: int
    first_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    raw: list[RawRecord]
    inflated: int = 0  # the bytes its compressed block inflated to (0: not compressed)
    # Its records' bytes (inflated) and count, as they came: for Produce, which reads the
    # records as it makes their publish-frame records (``kafka.core.batch_bodies``) and
    # decodes with ``records=False`` (``raw`` is then empty).
    payload: bytes = b""
    count: int = 0

    @property
    def records(self) -> list[KafkaRecord]:
        """The records as objects, their timestamps whole (``raw`` holds their deltas)."""
        first = self.first_timestamp
        return [KafkaRecord(o, first + t, k, v, h) for o, t, k, v, h in self.raw]

    @property
    def compression(self) -> int:
        return self.attributes & 0x07

    @property
    def transactional(self) -> bool:
        return bool(self.attributes & _TRANSACTIONAL_BIT)

    @property
    def control(self) -> bool:
        return bool(self.attributes & _CONTROL_BIT)


class UnsupportedCompression(KafkaDecodeError):
    """A batch names a compression codec outside Kafka's five (answered, not dropped)."""


class InflatesTooLarge(KafkaDecodeError):
    """Compressed batches that inflate past what a request may (answered, not dropped)."""


class TooManyRecords(KafkaDecodeError):
    """Batches with more records than a request may hold (answered, not dropped)."""


class ExtraBatch(KafkaDecodeError):
    """A second batch where one is allowed (answered, not dropped)."""


class UnstorableRecord(KafkaDecodeError):
    """A record that decodes but that spoolmq cannot store: a header whose name is empty
    (Kafka allows one; spoolmq's headers all have a name). Answered INVALID_RECORD, which
    producers do not retry, where CORRUPT_MESSAGE would be retried until they time out."""


class Budget:
    """What a request's record sets may still inflate to and hold, drawn as their batches
    decode, whatever the outcome: a batch's records are drawn from its header before they
    are decoded, and a block's inflated bytes as it inflates, so a record set that fails
    late has still used what it took. ``inflated`` and ``records_taken`` are the totals."""

    __slots__ = ("inflate", "inflated", "records", "records_taken")

    def __init__(self, inflate: int, records: int = 2**31 - 1) -> None:
        self.inflate, self.inflated = inflate, 0
        self.records, self.records_taken = records, 0


def decode_batches(
    data: bytes,
    max_bytes: int | Budget,
    max_records: int = 2**31 - 1,
    *,
    produced: bool = False,
    records: bool = True,
) -> list[RecordBatch]:
    """Every batch of a Produce record set; KafkaDecodeError if any is damaged, if its
    compressed blocks inflate past ``max_bytes`` together (InflatesTooLarge), or if its
    batches hold more than ``max_records`` records together (TooManyRecords, checked from
    each batch's header, before its records are decoded: a decoded record takes some 200
    bytes, a sent one as few as 8). A :class:`Budget` in place of ``max_bytes`` is drawn
    from (and shared with the record sets decoded after this one). ``produced``: checked
    as Kafka checks a producer's record set from Produce v3 on, one batch (ExtraBatch,
    before the second is decoded) whose count is its last offset delta plus one (a
    fetched batch of a compacted log may have gaps). Without ``records``, each batch's
    records are left in its ``payload`` for the caller to read, and checked there.

    Old message sets (magic 0/1) are refused: Produce v3+ carries magic 2 only.
    """
    budget = max_bytes if isinstance(max_bytes, Budget) else Budget(max_bytes, max_records)
    batches: list[RecordBatch] = []
    r = Reader(data)
    while r.remaining:
        if r.remaining < HEADER_BYTES:
            raise KafkaDecodeError("record set ends inside a batch header")
        start = r.position
        r.int64()
        length = r.int32()
        if length < HEADER_BYTES - LENGTH_OVERHEAD or length > r.remaining:
            raise KafkaDecodeError(f"batch length {length} does not fit the record set")
        if produced and batches:
            raise ExtraBatch("more than one record batch for a partition")
        body = data[start : start + LENGTH_OVERHEAD + length]
        r.raw(length)
        batches.append(decode_batch(body, budget, produced=produced, records=records))
    return batches


def decode_batch(
    body: bytes, budget: Budget, *, produced: bool = False, records: bool = True
) -> RecordBatch:
    """One whole batch (its length already checked against the record set), drawn from
    ``budget``; one that holds no record is refused. ``produced``: its last offset delta
    must be its count less one, as a Kafka broker requires of a producer's batch. Without
    ``records`` they are not decoded (``payload`` holds them)."""
    (
        base_offset,
        _length,
        _epoch,
        magic,
        crc,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        count,
    ) = _HEADER.unpack_from(body, 0)
    if magic != MAGIC:
        raise KafkaDecodeError(f"record batch magic {magic}: only magic 2 is accepted")
    if crc32c(memoryview(body)[_CRC_START:]) != crc:
        raise KafkaDecodeError("record batch CRC-32C does not match")
    if count < 1 or (produced and last_offset_delta != count - 1):
        raise KafkaDecodeError(f"a batch of {count} records, last offset delta {last_offset_delta}")
    if count > budget.records:
        raise TooManyRecords(f"{count} records past the {budget.records} a request may still hold")
    budget.records -= count
    budget.records_taken += count
    payload = body[HEADER_BYTES:]
    codec = attributes & 0x07
    inflated = 0
    if codec != COMPRESSION_NONE:
        payload = decompress(codec, payload, budget.inflate)
        inflated = len(payload)
        budget.inflate -= inflated
        budget.inflated += inflated
    # A record takes at least 7 bytes (length, attributes, 3 deltas/lengths, headers).
    if count * 7 > len(payload):
        raise KafkaDecodeError(f"{count} records cannot fit in {len(payload)} bytes")
    return RecordBatch(
        base_offset,
        attributes,
        last_offset_delta,
        first_timestamp,
        max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        _decode_records(payload, count) if records else [],
        inflated,
        payload,
        count,
    )


def read_zigzag(data: bytes, pos: int, max_bytes: int) -> tuple[int, int]:
    """The zigzag varint at ``pos`` (at most ``max_bytes`` long) and the position after
    it. IndexError past the end of ``data``. Callers on a hot path read the one- and
    two-byte forms inline and call this for longer ones."""
    byte = data[pos]
    if byte < 0x80:
        return (byte >> 1) ^ -(byte & 1), pos + 1
    result = (byte & 0x7F) | (data[pos + 1] << 7)
    if result < 0x4000:
        return (result >> 1) ^ -(result & 1), pos + 2
    result &= 0x3FFF
    shift = 14
    for i in range(pos + 2, pos + max_bytes):
        byte = data[i]
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return (result >> 1) ^ -(result & 1), i + 1
        shift += 7
    raise KafkaDecodeError(f"varint longer than {max_bytes} bytes at offset {pos}")


def read_var_bytes(data: bytes, pos: int, end: int, what: str) -> tuple[bytes | None, int]:
    """A record's key or value at ``pos`` (a length, -1 for null, then the bytes, which
    must end by ``end``) and the position after it."""
    size, pos = read_zigzag(data, pos, _VARINT32)
    if size == -1:
        return None, pos
    if not 0 <= size <= end - pos:
        raise KafkaDecodeError(f"{what} length {size} at offset {pos}")
    return data[pos : pos + size], pos + size


def _decode_records(data: bytes, count: int) -> list[RawRecord]:
    """The ``count`` records of a batch's (inflated) payload: each record's length is
    checked against what is left, and its fields against its length, before anything is
    sliced. The plain form of what Produce does in one pass with the records' publish-frame
    form (``kafka.core.batch_bodies``), which must accept and refuse the same bytes."""
    records: list[RawRecord] = []
    pos, end = 0, len(data)
    try:
        for _ in range(count):
            length, pos = read_zigzag(data, pos, _VARINT32)
            if length < 0 or length > end - pos:
                raise KafkaDecodeError(f"record length {length} at offset {pos}")
            record_end = pos + length
            # pos: the attributes byte, unused in v2
            timestamp_delta, pos = read_zigzag(data, pos + 1, _VARINT64)
            offset_delta, pos = read_zigzag(data, pos, _VARINT32)
            key, pos = read_var_bytes(data, pos, record_end, "key")
            value, pos = read_var_bytes(data, pos, record_end, "value")
            headers: Sequence[tuple[str, bytes | None]] = _NO_HEADERS
            if data[pos] == 0:
                pos += 1
            else:
                headers, pos = read_headers(data, pos, record_end)
            if pos > record_end:
                raise KafkaDecodeError(f"a record runs past its length at offset {pos}")
            pos = record_end  # bytes a record has beyond its fields are not read
            records.append((offset_delta, timestamp_delta, key, value, headers))
    except IndexError:
        raise KafkaDecodeError("a record runs past the end of its batch") from None
    return records


def read_headers(
    data: bytes, pos: int, record_end: int
) -> tuple[list[tuple[str, bytes | None]], int]:
    """A record's headers at ``pos`` (their count first) and the position after them."""
    n, pos = read_zigzag(data, pos, _VARINT32)
    if n < 0 or n * 2 > record_end - pos:
        raise KafkaDecodeError(f"{n} headers cannot fit in {record_end - pos} bytes")
    r = Reader(data[pos:record_end])
    headers = []
    for _ in range(n):
        name = r.var_bytes()
        if name is None:
            raise KafkaDecodeError("a header without a name")
        try:
            text = name.decode("utf-8")
        except UnicodeDecodeError:
            raise KafkaDecodeError("a header name that is not UTF-8") from None
        headers.append((text, r.var_bytes()))
    return headers, record_end


_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_CHUNK_CHARGE = 1024


def decompress(codec: int, data: bytes, max_bytes: int) -> bytes:
    """A batch's compressed records block, refused past ``max_bytes`` once inflated
    (InflatesTooLarge), or as damaged (KafkaDecodeError).

    No buffer larger than ``max_bytes + 1`` is ever allocated for it (with the copy the
    block is returned as, its peak is twice that): a few kilobytes of zstd can claim
    gigabytes, so no codec is asked to inflate a block whole and then checked."""
    if codec == COMPRESSION_GZIP:
        # zlib (not cramjam) so the output is bounded while inflating.
        inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = inflater.decompress(data, max_bytes + 1)
        except zlib.error as exc:
            raise KafkaDecodeError(f"gzip block does not inflate: {exc}") from None
        if len(out) > max_bytes:
            raise InflatesTooLarge(f"gzip block inflates past {max_bytes} bytes")
        if not inflater.eof or inflater.unused_data:
            raise KafkaDecodeError("gzip block is cut short, or has bytes after its end")
        return out
    try:
        import cramjam
    except ImportError:  # pragma: no cover - the kafka extra installs it
        raise UnsupportedCompression("install spoolmq[kafka] for compressed batches") from None
    try:
        if codec == COMPRESSION_SNAPPY:
            return _snappy(cramjam, data, max_bytes)
        if codec == COMPRESSION_LZ4:
            return _into_bounded(cramjam.lz4.decompress_into, data, max_bytes, "lz4")
        if codec == COMPRESSION_ZSTD:
            return _into_bounded(cramjam.zstd.decompress_into, data, max_bytes, "zstd")
    except cramjam.DecompressionError as exc:
        raise KafkaDecodeError(f"compressed block does not inflate: {exc}") from None
    raise UnsupportedCompression(f"unknown compression codec {codec}")


def _into_bounded(
    into: Callable[[bytes, bytearray], int], data: bytes, max_bytes: int, name: str
) -> bytes:
    """Inflate ``data`` with ``into`` (a codec's decompress-into-a-buffer) into buffers
    that grow eightfold from a few times its size, up to ``max_bytes + 1``: a codec
    stops with an error at a buffer's end, so a bomb costs one such buffer at most. Only
    that error makes a larger buffer worth trying; a damaged block is refused at once."""
    size = min(max_bytes + 1, 4 * len(data) + 65536)
    while True:
        out = bytearray(size)
        try:
            n = into(data, out)
        except Exception as exc:  # cramjam.DecompressionError
            # What cramjam 2 says when the buffer is full (the round-trip tests of blocks
            # larger than the first buffer fail if another version words it otherwise).
            if "failed to write whole buffer" not in str(exc):
                raise KafkaDecodeError(f"{name} block does not inflate: {exc}") from None
            if size > max_bytes:
                raise InflatesTooLarge(f"{name} block inflates past {max_bytes} bytes") from None
            del out  # before the next one: never two buffers at once
            size = min(max_bytes + 1, size * 8)
            continue
        if n > max_bytes:
            raise InflatesTooLarge(f"{name} block inflates past {max_bytes} bytes")
        del out[n:]
        return bytes(out)


def _snappy(cramjam: Any, data: bytes, max_bytes: int) -> bytes:
    """Raw snappy (librdkafka) or the xerial framing of Java's SnappyOutputStream. A raw
    block states its inflated length first; it is checked before anything is allocated."""
    snappy = cramjam.snappy

    def block(raw: bytes, room: int) -> bytes:
        if snappy.decompress_raw_len(raw) > room:
            raise InflatesTooLarge(f"snappy block inflates past {max_bytes} bytes")
        return bytes(snappy.decompress_raw(raw))

    if not data.startswith(_XERIAL_MAGIC):
        return block(data, max_bytes)
    r = Reader(data, 16)  # magic (8), version (4), compatible version (4)
    out = bytearray()
    # Each chunk costs a pass of this loop: it is charged 1 KiB at least (Java's chunks are
    # 32 KiB but the last), so a record set of tiny chunks is refused early.
    charged = 0
    while r.remaining:
        chunk = block(r.raw(r.int32()), max_bytes - len(out))
        if not chunk:
            raise KafkaDecodeError("an empty snappy chunk")
        out += chunk
        charged += max(len(chunk), _XERIAL_CHUNK_CHARGE)
        if charged > max_bytes:
            raise InflatesTooLarge(f"snappy chunks past {max_bytes} bytes, at 1 KiB a chunk")
    return bytes(out)


def compress(codec: int, data: bytes) -> bytes:
    """The inverse of :func:`decompress` (tests and ``spoolmq export`` use it)."""
    if codec == COMPRESSION_NONE:
        return data
    if codec == COMPRESSION_GZIP:
        return zlib.compress(data, wbits=16 + zlib.MAX_WBITS)
    import cramjam

    if codec == COMPRESSION_SNAPPY:
        return bytes(cramjam.snappy.compress_raw(data))
    if codec == COMPRESSION_LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == COMPRESSION_ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise ValueError(f"unknown compression codec {codec}")


# -- encoding ---------------------------------------------------------------------------


# The varints of 0 .. 2047, made once (~90 KB): the zigzag forms of every delta and length
# below 1,024, which is most of them in a Fetch answer.
_SMALL = [bytes([n]) for n in range(0x80)] + [
    bytes(((n & 0x7F) | 0x80, n >> 7)) for n in range(0x80, 0x800)
]
NULL = _SMALL[1]  # the zigzag varint of -1: a null key, value or header value


def zigzag_bytes(v: int) -> bytes:
    """The zigzag varint of ``v`` (32- or 64-bit: the encoding is the same); one and two
    bytes (every delta and length below 8 KiB) without a loop."""
    n = (v << 1) ^ (v >> 63)
    if n < 0x800:
        return _SMALL[n]
    if n < 0x4000:
        return bytes(((n & 0x7F) | 0x80, n >> 7))
    return Writer().uvarint(n).getvalue()  # three bytes and more: rare


def encode_record(
    parts: list[bytes],
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: list[tuple[str, bytes | None]],
) -> None:
    """Append one record of a v2 batch, its length first, to ``parts`` (joined once per
    batch: Fetch's per-record work copies each key and value once)."""
    fields = [b"\x00", zigzag_bytes(timestamp_delta), zigzag_bytes(offset_delta)]
    for data in (key, value):
        if data is None:
            fields.append(NULL)
        else:
            fields += (zigzag_bytes(len(data)), data)
    fields.append(zigzag_bytes(len(headers)))
    for name, hvalue in headers:
        encoded = name.encode("utf-8")
        fields += (zigzag_bytes(len(encoded)), encoded)
        if hvalue is None:
            fields.append(NULL)
        else:
            fields += (zigzag_bytes(len(hvalue)), hvalue)
    parts.append(zigzag_bytes(sum(map(len, fields))))
    parts += fields


@dataclass(slots=True)
class OutRecord:
    """A stored message ready to go out in a Fetch answer."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


def encode_batch(
    records: list[OutRecord],
    *,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: int = COMPRESSION_NONE,
) -> bytes:
    """One RecordBatch v2 holding ``records`` (non-empty, ascending offsets; gaps allowed)."""
    base = records[0].offset
    first_ts = records[0].timestamp
    parts: list[bytes] = []
    for rec in records:
        encode_record(
            parts, rec.offset - base, rec.timestamp - first_ts, rec.key, rec.value, rec.headers
        )
    return batch_of(
        parts,
        base=base,
        last_offset_delta=records[-1].offset - base,
        first_timestamp=first_ts,
        max_timestamp=max(r.timestamp for r in records),
        count=len(records),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        compression=compression,
    )


def batch_of(
    parts: list[bytes],
    *,
    base: int,
    last_offset_delta: int,
    first_timestamp: int,
    max_timestamp: int,
    count: int,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    compression: int = COMPRESSION_NONE,
) -> bytes:
    """A RecordBatch v2 around encoded records (``parts``, joined: what ``encode_record``
    appends), its header and CRC-32C computed here."""
    payload = compress(compression, b"".join(parts))
    tail = (
        struct.pack(
            ">hiqqqhii",
            compression & 0x07,  # attributes
            last_offset_delta,
            first_timestamp,
            max_timestamp,
            producer_id,
            producer_epoch,
            base_sequence,
            count,
        )
        + payload
    )
    length = 4 + 1 + 4 + len(tail)  # partition leader epoch, magic, crc, then the rest
    return struct.pack(">qiibI", base, length, 0, MAGIC, crc32c(tail)) + tail
