"""What the core Kafka handlers share: the child's services, and the mapping between a
Kafka record's bytes and a spoolmq record's fields.

One store, two kinds of client (docs/KAFKA.md, "Bytes"): a Kafka value whose bytes
are canonical JSON (``orjson.dumps(orjson.loads(v)) == v``) is stored as that JSON
``value``, so the Spark job and spoolmq consumers read it as data; any other value
is stored as ``value_b64``; a Kafka null value is a JSON ``null``. Keys that are
UTF-8 text are stored as ``key`` (their bytes are what murmur2 hashes on both
sides), others as ``key_b64``. Going out, a stored JSON value is sent as its
``orjson.dumps`` bytes, which for a value that came from Kafka are exactly the
bytes the producer sent.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from spoolmq.errors import KafkaDecodeError, SpoolError
from spoolmq.kafka.api import ErrorCode, RequestContext
from spoolmq.kafka.link import PublisherLink
from spoolmq.kafka.records import UnstorableRecord, read_headers, read_var_bytes, read_zigzag
from spoolmq.kafka.watch import GrowthWatcher
from spoolmq.kafka.wire import MAX_VARINT32_BYTES as VARINT32
from spoolmq.kafka.wire import MAX_VARINT_BYTES as VARINT64
from spoolmq.store import Store
from spoolmq.store.names import partition_dir
from spoolmq.types import TopicPartition

# The first bytes a JSON text can start with; anything else is not worth a parse.
_JSON_START = frozenset(b'{["-0123456789tfn')
# The shortest value nested as deep as orjson writes (254 levels: ``[[...]]``). Only a
# value this long may be too deep to be written inside its record, one level deeper; it
# is then stored as bytes (``value_b64``), as any value that is not JSON the store keeps.
_DEEP_ENOUGH = 2 * 254


@dataclass
class KafkaCore:
    """The services of one Kafka child: the store (reads, topics), the publisher link
    (writes), the growth watcher (long polls)."""

    store: Store
    link: PublisherLink
    watcher: GrowthWatcher
    figures: dict[str, int] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return self.store.path

    def partition_dir(self, topic: str, partition: int) -> Path:
        return partition_dir(self.store.path, TopicPartition(topic, partition))

    def count(self, name: str, n: int = 1) -> None:
        self.figures[name] = self.figures.get(name, 0) + n


def core_of(ctx: RequestContext) -> KafkaCore:
    core = ctx.shared.get("core")
    if not isinstance(core, KafkaCore):  # pragma: no cover - the child always sets it
        raise RuntimeError("the Kafka core services are not set up")
    return core


# -- bytes <-> stored fields --------------------------------------------------------------


def batch_bodies(
    data: bytes,
    count: int,
    first_sequence: int | None = None,
    producer_id: str = "",
    *,
    keyed: list[tuple[int, str]] | None = None,
    headed: list[int] | None = None,
    braces: bool = True,
) -> list[bytes]:
    """The ``count`` Kafka records of a batch's (inflated) payload ``data`` as publish-frame
    records in the store's form: each exactly ``orjson.dumps`` of its fields (``key`` or
    ``key_b64``, ``value`` or ``value_b64``, ``headers``, in store order, then ``sequence``
    and ``producer_id`` when ``first_sequence`` numbers them). Built from byte strings: a
    canonical JSON value goes in as its own bytes, not dumped again from its parse.

    One pass over the bytes, reading each record and making its publish-frame record at
    once: this is Produce's per-record work in the Kafka child, so nothing is made per
    record that is not sent (no tuple, no object), positions are plain integers, and the
    usual one- and two-byte varints (lengths below 8 KiB, deltas, a null key, no headers)
    are read inline. It accepts and refuses the bytes ``records._decode_records`` does:
    every length is checked against the record's own before anything is sliced, and
    KafkaDecodeError says what is wrong (UnstorableRecord for a header with an empty name:
    spoolmq's headers all have one).

    ``keyed`` and ``headed``, when given, get the index and key identity
    (``spoolmq.store.record.key_identity``) of each record with a key, and the index of
    each record with headers: what the pre-checked publish frame carries beside them.
    Without ``braces``, each record comes without its outer ``{`` and ``}``: the stored
    line's middle, as that frame carries it."""
    bodies: list[bytes] = []
    append = bodies.append
    loads, dumps, b64encode = orjson.loads, orjson.dumps, base64.b64encode
    json_start = _JSON_START
    opening, closing = (b"{", b"}") if braces else (b"", b"")
    keyless, text_key, bytes_key = (
        opening + b'"key":null',
        opening + b'"key":',
        opening + b'"key_b64":"',
    )
    # The tail of a numbered record, formatted with its sequence alone.
    numbered = b',"sequence":%d,"producer_id":' + dumps(producer_id).replace(b"%", b"%%") + closing
    sequence = first_sequence
    tail = closing
    pos = 0
    end = len(data)
    try:
        for _ in range(count):
            # The record's length, then its attributes byte (unused in v2) and its
            # timestamp and offset deltas (unused: the store stamps and numbers records).
            byte = data[pos]
            if byte < 0x80:
                length, pos = (byte >> 1) ^ -(byte & 1), pos + 1
            elif (n := (byte & 0x7F) | (data[pos + 1] << 7)) < 0x4000:
                length, pos = (n >> 1) ^ -(n & 1), pos + 2
            else:
                length, pos = read_zigzag(data, pos, VARINT32)
            if length < 0 or length > end - pos:
                raise KafkaDecodeError(f"record length {length} at offset {pos}")
            record_end = pos + length
            pos += 1
            if data[pos] < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                pos += 2
            else:
                pos = read_zigzag(data, pos, VARINT64)[1]
            if data[pos] < 0x80:
                pos += 1
            elif data[pos + 1] < 0x80:
                pos += 2
            else:
                pos = read_zigzag(data, pos, VARINT32)[1]
            # The key: null (zigzag -1), text, or bytes.
            if data[pos] == 1:
                head, pos = keyless, pos + 1
            else:
                key, pos = read_var_bytes(data, pos, record_end, "key")
                if key is None:
                    head = keyless
                else:
                    try:
                        text = key.decode("utf-8")
                        head = text_key + dumps(text)
                        identity = "s:" + text
                    except UnicodeDecodeError:
                        encoded_key = b64encode(key)
                        head = bytes_key + encoded_key + b'"'
                        identity = "b:" + encoded_key.decode("ascii")
                    if keyed is not None:
                        keyed.append((len(bodies), identity))
            # The value: null (a tombstone), or its bytes.
            byte = data[pos]
            if byte == 1:
                value, pos = None, pos + 1
            else:
                if byte < 0x80:
                    size, pos = (byte >> 1) ^ -(byte & 1), pos + 1
                elif (n := (byte & 0x7F) | (data[pos + 1] << 7)) < 0x4000:
                    size, pos = (n >> 1) ^ -(n & 1), pos + 2
                else:
                    size, pos = read_zigzag(data, pos, VARINT32)
                if size == -1:  # null, its -1 written longer than it needs (Kafka reads it)
                    value = None
                elif not 0 <= size <= record_end - pos:
                    raise KafkaDecodeError(f"value length {size} at offset {pos}")
                else:
                    value, pos = data[pos : pos + size], pos + size
            # The headers: none (a zero count), or each name and value.
            if data[pos] == 0:
                stored, pos = b"[]", pos + 1
            else:
                headers, pos = read_headers(data, pos, record_end)
                if headers:
                    stored = _headers_json(headers)
                    if headed is not None:
                        headed.append(len(bodies))
                else:
                    stored = b"[]"
            if pos > record_end:
                raise KafkaDecodeError(f"a record runs past its length at offset {pos}")
            pos = record_end  # bytes a record has beyond its fields are not read
            if sequence is not None:
                # Kafka sequences wrap at 2^31; spoolmq's do not need to.
                tail = numbered % sequence
                sequence += 1
            # A canonical JSON value is exactly what dumping its parse gives (and not
            # null, which must not be confused with Kafka's null value, a tombstone).
            canonical = False
            if value and value[0] in json_start:
                try:
                    parsed = loads(value)
                    canonical = parsed is not None and dumps(parsed) == value
                    if canonical and len(value) >= _DEEP_ENOUGH:
                        dumps([parsed])  # a level deeper, as in its record: TypeError if too deep
                except (orjson.JSONDecodeError, TypeError):  # not JSON; or not orjson's
                    canonical = False
            if value is None:
                append(b"".join((head, b',"value":null,"headers":', stored, tail)))
            elif canonical:
                append(b"".join((head, b',"value":', value, b',"headers":', stored, tail)))
            else:
                encoded = b64encode(value)
                append(b"".join((head, b',"value_b64":"', encoded, b'","headers":', stored, tail)))
    except IndexError:
        raise KafkaDecodeError("a record runs past the end of its batch") from None
    return bodies


def _headers_json(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    entries: list[list[str]] = []
    for name, value in headers:
        if not name:
            raise UnstorableRecord("a header with an empty name")
        if value is None:
            entries.append([name, ""])
            continue
        try:
            entries.append([name, value.decode("utf-8")])
        except UnicodeDecodeError:
            entries.append([name, base64.b64encode(value).decode("ascii"), "b64"])
    return orjson.dumps(entries)


def fields_to_kafka(
    fields: dict[str, Any],
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]:
    """Key, value and headers bytes of a stored record's parsed fields."""
    if "key_b64" in fields:
        key: bytes | None = base64.b64decode(fields["key_b64"])
    else:
        text = fields.get("key")
        key = None if text is None else str(text).encode("utf-8")
    if "value_b64" in fields:
        value: bytes | None = base64.b64decode(fields["value_b64"])
    else:
        raw = fields.get("value")
        value = None if raw is None else orjson.dumps(raw)
    headers: list[tuple[str, bytes | None]] = []
    for entry in fields.get("headers") or ():
        if len(entry) == 3:
            headers.append((entry[0], base64.b64decode(entry[1])))
        else:
            headers.append((entry[0], str(entry[1]).encode("utf-8")))
    return key, value, headers


# -- errors -------------------------------------------------------------------------------

_BY_CODE = {
    "message_too_large": ErrorCode.MESSAGE_TOO_LARGE,
    "unknown_topic": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    "unknown_partition": ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
    "invalid_topic": ErrorCode.INVALID_TOPIC_EXCEPTION,
    "topic_exists": ErrorCode.TOPIC_ALREADY_EXISTS,
    "offset_out_of_range": ErrorCode.OFFSET_OUT_OF_RANGE,
    "serialization": ErrorCode.CORRUPT_MESSAGE,
    "protocol": ErrorCode.CORRUPT_MESSAGE,
    "invalid_argument": ErrorCode.INVALID_REQUEST,
    "config": ErrorCode.INVALID_CONFIG,
    "storage": ErrorCode.KAFKA_STORAGE_ERROR,
    "corrupt_record": ErrorCode.KAFKA_STORAGE_ERROR,
    # Retriable: the producer retries (idempotently when it is an idempotent one).
    "broker_unavailable": ErrorCode.REQUEST_TIMED_OUT,
    "publish_timeout": ErrorCode.REQUEST_TIMED_OUT,
}


def error_code_for(code: str) -> int:
    """The Kafka error code for a spoolmq error code (docs/KAFKA.md, "Errors")."""
    return int(_BY_CODE.get(code, ErrorCode.UNKNOWN_SERVER_ERROR))


def error_code_of(exc: SpoolError) -> int:
    return error_code_for(exc.code)
