"""Encoding and decoding of one record line (the on-disk and on-the-wire message format).

A record is one JSON object on one line, fields in this order::

    {"offset":7,"timestamp":1763830000123,"key":"customer-7","value":{"order_id":1},
     "headers":[["trace","abc"]],"tags":["vip"],"deliver_at":1763830005123,
     "expires_at":1763830060123,"sequence":41,"producer_id":"p-1","batch_records":3,
     "crc":580266162}

``key``/``value`` hold JSON; a raw-bytes key or value is stored as ``key_b64``/``value_b64``
(standard base64) instead, so bytes round-trip exactly. Optional fields are left out when
unset. ``batch_records`` is on the first record of a multi-record batch only: recovery uses
it to keep a batch whole or drop it whole. ``crc`` is the CRC-32 (zlib) of every byte of the
line before ``,"crc":``. See docs/FORMAT.md for the full schema.

This module is the one home of a record's fields, from a :class:`~spoolmq.store.message.Message`
to the stored line and back (base64, headers, tags, the key's identity); the wire codec
(``spoolmq.protocol.publish``) reuses it rather than judging a message its own way.
"""

from __future__ import annotations

import base64
import binascii
import math
import re
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import orjson

from spoolmq.errors import (
    CorruptRecordError,
    InvalidArgumentError,
    MessageTooLargeError,
    SerializationError,
    SpoolError,
)
from spoolmq.store.message import (
    PRIORITY_HEADER,
    PRIORITY_VALUES,
    Headers,
    HeadersInput,
    Message,
)

_CRC_MARK = b',"crc":'
_OFFSET_PREFIX = b'{"offset":'


class Record(NamedTuple):
    """One stored message, as a reader returns it."""

    offset: int
    timestamp: int
    key: str | bytes | None
    value: Any
    headers: Headers
    tags: tuple[str, ...] = ()
    deliver_at: int | None = None
    expires_at: int | None = None
    producer_id: str | None = None
    sequence: int | None = None


def to_base64(data: bytes) -> str:
    """Raw bytes as the standard base64 text of the ``*_b64`` fields."""
    return base64.b64encode(data).decode("ascii")


def from_base64(text: Any, what: str, error: type[SpoolError] = CorruptRecordError) -> bytes:
    """The bytes of a ``*_b64`` field; ``error`` (a bad record by default) if it is not
    strict base64 text."""
    if not isinstance(text, str):
        raise error(f"{what} must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise error(f"{what} is not valid base64") from None


def has_non_finite(value: Any) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, list | tuple):
        return any(has_non_finite(v) for v in value)
    return False


def normalize_headers(headers: HeadersInput) -> list[list[str]]:
    """Headers as stored: ordered ``[name, text]`` or ``[name, base64, "b64"]`` lists."""
    if not headers:
        return []
    pairs: Iterable[Any] = headers.items() if isinstance(headers, Mapping) else headers
    stored: list[list[str]] = []
    for pair in pairs:
        try:
            name, value = pair
        except (TypeError, ValueError):
            raise SerializationError(
                f"a header must be a (name, value) pair, not {pair!r}"
            ) from None
        if not isinstance(name, str) or not name:
            raise SerializationError(f"a header name must be a non-empty string, not {name!r}")
        if name == PRIORITY_HEADER:
            check_priority_header(value)
        if isinstance(value, str):
            stored.append([name, value])
        elif isinstance(value, bytes | bytearray | memoryview):
            stored.append([name, to_base64(bytes(value)), "b64"])
        else:
            raise SerializationError(
                f"header {name!r} must have a str or bytes value, not {type(value).__name__}"
            )
    return stored


def check_priority_header(value: Any) -> None:
    """The reserved priority header holds one digit as text: anything else is refused where
    a message comes in (the Kafka front excepted: there delivery counts it as 0)."""
    if not isinstance(value, str) or value not in PRIORITY_VALUES:
        raise InvalidArgumentError(
            f"header {PRIORITY_HEADER!r} must be one digit 0-9 as text, not {value!r}"
        )


def normalize_tags(tags: Sequence[str] | str) -> list[str]:
    """Tags as stored: a list of non-empty strings (one string is one tag)."""
    if isinstance(tags, str):
        return normalize_tags([tags])
    if isinstance(tags, bytes | bytearray | memoryview | Mapping) or not isinstance(
        tags, Iterable
    ):  # bytes would be taken as numbers, a dict as its keys
        raise SerializationError(
            f"tags must be a string or a list of strings, not {type(tags).__name__}"
        )
    stored = list(tags)
    for tag in stored:
        if not isinstance(tag, str) or not tag:
            raise SerializationError(f"a tag must be a non-empty string, not {tag!r}")
    return stored


def key_identity(fields: Mapping[str, Any]) -> str | None:
    """A stored record's key as one string, for whatever groups records by key (per-key
    delivery order, compaction): ``"s:"`` + a text key, ``"b:"`` + a raw-bytes key's base64,
    None without a key. The prefix keeps a text key that looks like base64 and a bytes key
    apart.

    >>> key_identity({"key": "b:QUJD"}), key_identity({"key_b64": "QUJD"})
    ('s:b:QUJD', 'b:QUJD')
    """
    key = fields.get("key")
    if key is not None:
        return f"s:{key}"
    key_b64 = fields.get("key_b64")
    return None if key_b64 is None else f"b:{key_b64}"


def key_fields(identity: str | None) -> dict[str, str | None]:
    """A ``key_identity`` as the fields of a record or event line write it: ``key`` for a
    text key (or none), ``key_b64`` for a raw-bytes key, so the two never read alike.

    >>> key_fields("s:QUJD"), key_fields("b:QUJD"), key_fields(None)
    ({'key': 'QUJD'}, {'key_b64': 'QUJD'}, {'key': None})
    """
    if identity is None:
        return {"key": None}
    return {"key_b64" if identity[0] == "b" else "key": identity[2:]}


def decode_headers(stored: Any, error: type[SpoolError] = CorruptRecordError) -> Headers:
    """Headers from their stored form (``[name, text]`` or ``[name, base64, "b64"]``
    lists); ``error`` (a bad record by default) for anything else."""
    if stored is None:
        return []
    if not isinstance(stored, list):
        raise error("headers must be a list of [name, value] pairs")
    headers: Headers = []
    for entry in stored:
        if not isinstance(entry, list) or len(entry) not in (2, 3):
            raise error("each header must be [name, value] or [name, base64, 'b64']")
        if len(entry) == 3:
            if entry[2] != "b64":
                raise error("a 3-item header must end with 'b64'")
            headers.append((entry[0], from_base64(entry[1], "a header value", error)))
        else:
            headers.append((entry[0], entry[1]))
    return headers


def common_fields(
    key: str | None, value: Any, sequence: int | None, producer_id: str | None
) -> dict[str, Any]:
    """The fields of a message with a text key or none, a JSON value, no headers, tags or
    schedule, in the order ``message_fields`` gives them. The caller has checked them."""
    fields: dict[str, Any] = {"key": key, "value": value, "headers": []}
    if sequence is not None:
        fields["sequence"] = sequence
    if producer_id is not None:
        fields["producer_id"] = producer_id
    return fields


def message_fields(message: Message) -> dict[str, Any]:
    """The JSON fields a message contributes (everything but offset, timestamp, batch, crc).

    Raises SerializationError for a key, value, header or tag that can't be stored.
    """
    key, value = message.key, message.value
    sequence, producer_id = message.sequence, message.producer_id
    if (
        (key is None or type(key) is str)
        and not message.headers
        and not message.tags
        and message.deliver_at is None
        and message.expires_at is None
        and (sequence is None or (type(sequence) is int and sequence >= 0))
        and (producer_id is None or (type(producer_id) is str and producer_id))
        and not isinstance(value, bytes | bytearray | memoryview)
    ):
        # The common case (a broker's message carries a sequence and a producer id): the
        # same fields in the same order as below, without the general checks.
        return common_fields(key, value, sequence, producer_id)
    fields: dict[str, Any] = {}
    key = message.key
    if key is None or isinstance(key, str):
        fields["key"] = key
    elif isinstance(key, bytes | bytearray | memoryview):
        fields["key_b64"] = to_base64(bytes(key))
    else:
        raise SerializationError(f"a key must be str, bytes or None, not {type(key).__name__}")
    value = message.value
    if isinstance(value, bytes | bytearray | memoryview):
        fields["value_b64"] = to_base64(bytes(value))
    else:
        fields["value"] = value
    fields["headers"] = normalize_headers(message.headers)
    if message.tags:
        fields["tags"] = normalize_tags(message.tags)
    for name in ("deliver_at", "expires_at", "sequence"):
        number = getattr(message, name)
        if number is not None:
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise InvalidArgumentError(f"{name} must be a non-negative integer, not {number!r}")
            fields[name] = number
    if message.producer_id is not None:
        if not isinstance(message.producer_id, str) or not message.producer_id:
            raise InvalidArgumentError(
                f"producer_id must be a non-empty string, not {message.producer_id!r}"
            )
        fields["producer_id"] = message.producer_id
    return fields


class EncodedMessage(NamedTuple):
    """A message whose fields are already JSON: ``body`` is the line between the
    timestamp and the batch/crc fields. ``producer_id``/``sequence`` are kept beside it
    for deduplication."""

    body: bytes
    producer_id: str | None = None
    sequence: int | None = None


def encode_message(
    message: Message, *, max_bytes: int | None = None, parsed_json: bool = False
) -> EncodedMessage:
    """Validate and serialise a message once; SerializationError / MessageTooLargeError.

    ``parsed_json`` says the value was parsed from JSON text (the broker's case), so it
    cannot hold NaN or infinity and is not searched for them.
    """
    fields = message_fields(message)
    try:
        body = orjson.dumps(fields)
    except TypeError as exc:
        raise SerializationError(f"value can't be stored as JSON: {exc}") from None
    # orjson writes NaN and infinities as null; refuse them instead of changing the data.
    if not parsed_json and b"null" in body and has_non_finite(fields.get("value")):
        raise SerializationError("value contains NaN or infinity, which JSON can't represent")
    if max_bytes is not None and len(body) + RECORD_OVERHEAD > max_bytes:
        raise MessageTooLargeError(
            f"message encodes to about {len(body) + RECORD_OVERHEAD} bytes, over the limit of "
            f"{max_bytes} bytes (max_message_bytes)"
        )
    return EncodedMessage(body[1:-1], message.producer_id, message.sequence)


# The most a record line adds around the message's own fields (offset, timestamp,
# batch_records and crc at their widest).
RECORD_OVERHEAD = len(b'{"offset":,"timestamp":,"batch_records":,"crc":}\n') + 19 + 19 + 19 + 10


def frame_record(offset: int, timestamp: int, body: bytes, batch_records: int = 1) -> bytes:
    """One complete record line, newline included."""
    if batch_records > 1:
        head = b'{"offset":%d,"timestamp":%d,%s,"batch_records":%d' % (
            offset,
            timestamp,
            body,
            batch_records,
        )
    else:
        head = b'{"offset":%d,"timestamp":%d,%s' % (offset, timestamp, body)
    return b'%s,"crc":%d}\n' % (head, zlib.crc32(head))


def frame_batch(offset: int, timestamp: int, bodies: Sequence[bytes]) -> bytes:
    """The record lines of one batch, joined: the same bytes as ``frame_record`` gives
    line by line, with the per-batch parts formatted once.

    After the first line, each line is three pieces joined once at the end: its head's
    start (``{"offset":N,"timestamp":T,``), its body, and its checksum's tail, whose CRC
    runs on from the start's over the body. The starts are made by one format of the whole
    batch, and the tails by another: a format and a copy of the body per line cost more."""
    count = len(bodies)
    head = b'{"offset":%d,"timestamp":%d,%s' % (offset, timestamp, bodies[0])
    if count == 1:
        return b'%s,"crc":%d}\n' % (head, zlib.crc32(head))
    head = b'%s,"batch_records":%d' % (head, count)
    first = b'%s,"crc":%d}\n' % (head, zlib.crc32(head))
    rest = count - 1
    # Split on bytes the pieces cannot hold: digits and fixed text around them.
    starts = (
        (b'{"offset":%%d,"timestamp":%d,\n' % timestamp)
        * rest
        % (*range(offset + 1, offset + count),)
    ).split(b"\n")
    del starts[rest]
    later = bodies[1:]
    crc32 = zlib.crc32
    crcs = (*map(crc32, later, map(crc32, starts)),)
    tails = ((b',"crc":%d}\n\0') * rest % crcs).split(b"\0")
    pieces = [first] * (3 * rest + 1)
    pieces[1::3] = starts
    pieces[2::3] = later
    pieces[3::3] = tails[:rest]
    return b"".join(pieces)


_TIMESTAMP_MARK = b',"timestamp":'
_BATCH_FIELD = re.compile(rb',"batch_records":\d+$')


def as_single_record(line: bytes) -> bytes:
    """A verified record line re-framed as a batch of its own: ``batch_records`` dropped
    and the checksum recomputed. Compaction needs this when it removes some records of a
    batch, or readers would wait for lines that are gone."""
    head = line[: line.rfind(_CRC_MARK)]
    bare = _BATCH_FIELD.sub(b"", head)
    if bare == head:
        return line
    return b'%s,"crc":%d}\n' % (bare, zlib.crc32(bare))


def record_offset(line: bytes) -> int:
    """The offset of a record line, read without parsing the whole line."""
    if not line.startswith(_OFFSET_PREFIX):
        raise ValueError("not a record line")
    end = line.index(b",", len(_OFFSET_PREFIX))
    return int(line[len(_OFFSET_PREFIX) : end])


def record_offset_and_timestamp(line: bytes) -> tuple[int, int]:
    """Offset and timestamp of a record line, read from its fixed head."""
    if not line.startswith(_OFFSET_PREFIX):
        raise ValueError("not a record line")
    comma = line.index(b",", len(_OFFSET_PREFIX))
    if not line.startswith(_TIMESTAMP_MARK, comma):
        raise ValueError("not a record line")
    start = comma + len(_TIMESTAMP_MARK)
    end = line.index(b",", start)
    return int(line[len(_OFFSET_PREFIX) : comma]), int(line[start:end])


def verified_fields(line: bytes) -> dict[str, Any] | None:
    """The fields of a record line whose checksum and JSON are good, else None: the
    readers' fast path (``check_line`` says what is wrong)."""
    # rpartition, not rfind and two slices: one call with a single argument, and the
    # head it gives is what the CRC covers. Past the newline check, the checksum's digits
    # end two bytes before the end: a line whose object is not closed right there fails
    # the parse, so a line taken ends in `}\n` as the writer framed it.
    head, mark, tail = line.rpartition(_CRC_MARK)
    try:
        if not mark or tail[-1:] != b"\n" or zlib.crc32(head) != int(tail[:-2]):
            return None
        data = orjson.loads(line)
    except ValueError:  # an unreadable checksum, or bad JSON (JSONDecodeError)
        return None
    if type(data) is dict and type(data.get("offset")) is int:
        return data
    return None


def _where(path: str, position: int) -> str:
    return f"{path} at byte {position}" if path else f"byte {position}"


def check_line(line: bytes, *, path: str = "", position: int = -1) -> dict[str, Any]:
    """Parse a record line and verify its checksum; CorruptRecordError if either fails."""
    mark = line.rfind(_CRC_MARK)
    if mark < 0 or not line.endswith(b"}\n"):
        raise CorruptRecordError(
            f"record at {_where(path, position)} is not a complete record line",
            path=path,
            position=position,
        )
    try:
        stored_crc = int(line[mark + 7 : -2])  # 7 == len(_CRC_MARK)
    except ValueError:
        raise CorruptRecordError(
            f"record at {_where(path, position)} has an unreadable checksum",
            path=path,
            position=position,
        ) from None
    if zlib.crc32(line[:mark]) != stored_crc:
        raise CorruptRecordError(
            f"record at {_where(path, position)} failed its checksum", path=path, position=position
        )
    try:
        data = orjson.loads(line)
    except orjson.JSONDecodeError as exc:  # checksum matched but JSON is bad: a writer bug
        raise CorruptRecordError(
            f"record at {_where(path, position)} is not valid JSON: {exc}",
            path=path,
            position=position,
        ) from None
    if type(data) is not dict or type(data.get("offset")) is not int:
        raise CorruptRecordError(
            f"record at {_where(path, position)} has no offset", path=path, position=position
        )
    return data


def record_from_fields(data: Mapping[str, Any]) -> Record:
    """Build a Record from a parsed line."""
    if "key_b64" in data:
        key: str | bytes | None = from_base64(data["key_b64"], "the record's key_b64")
    else:
        key = data.get("key")
    value: Any
    if "value_b64" in data:
        value = from_base64(data["value_b64"], "the record's value_b64")
    else:
        value = data.get("value")
    headers = decode_headers(data.get("headers"))
    # Positional: a NamedTuple built with keywords costs twice as much, once per record read.
    return Record(
        data["offset"],
        data["timestamp"],
        key,
        value,
        headers,
        tuple(data.get("tags") or ()),
        data.get("deliver_at"),
        data.get("expires_at"),
        data.get("producer_id"),
        data.get("sequence"),
    )


def decode_line(line: bytes, *, path: str = "", position: int = -1) -> Record:
    """Verify and decode one record line."""
    return record_from_fields(check_line(line, path=path, position=position))
