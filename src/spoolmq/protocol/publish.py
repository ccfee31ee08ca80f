"""The publish frame's wire form, both ways (protocol version 2): the Publisher client
encodes each message here in the store's own form, and the PublisherBroker checks a frame
and its records here (docs/PROTOCOL.md, "Publishing").

A frame carries one topic and, when the client knows it, one partition. Each record is
the JSON object of a stored record line without ``offset``, ``timestamp``,
``batch_records`` and ``crc``, fields in the store's order (``spoolmq.store.record``), so
the broker adds those four around it and never builds a Message for the common record.
Relative timing is the one thing that is not in the store's form: ``delay_ms`` and
``ttl_ms`` stand where ``deliver_at``/``expires_at`` would, and the broker's clock fixes
them (the slower path, :func:`_fix_timing`).

The broker parses a frame once (``orjson.loads`` of the whole frame, as every frame) and
stores ``orjson.dumps`` of each parsed record, never the bytes the client sent: a client's
bytes could be split or padded so that they parse as the checked records yet store as
something else (two records sharing one line, duplicate keys), and comparing them with the
dump would cost the dump anyway. The one exception is the broker's own Kafka child, whose
records are built in the store's form by spoolmq itself (``encode_checked_frame``, below).
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any, NamedTuple

import orjson

from spoolmq.errors import (
    InvalidArgumentError,
    MessageTooLargeError,
    ProtocolError,
    SerializationError,
    SpoolError,
    UnknownPartitionError,
)
from spoolmq.protocol.frames import MAX_FRAME_BYTES
from spoolmq.store.message import (
    MAX_SEQUENCE,
    PRIORITY_HEADER,
    Acks,
    PublishOptions,
    check_options,
    check_sequence,
    check_timing,
    normalize_acks,
    schedule,
    seconds_to_ms,
    with_priority,
)
from spoolmq.store.names import check_topic
from spoolmq.store.record import (
    RECORD_OVERHEAD,
    check_priority_header,
    from_base64,
    has_non_finite,
    normalize_headers,
    normalize_tags,
    to_base64,
)

# Every field a record of a publish frame may have, in the order the store writes them
# (``delay_ms``/``ttl_ms`` where ``deliver_at``/``expires_at`` go). A record's fields must
# come in this order: what is stored is then the store's own line.
RECORD_FIELDS = (
    "key",
    "key_b64",
    "value",
    "value_b64",
    "headers",
    "tags",
    "deliver_at",
    "delay_ms",
    "expires_at",
    "ttl_ms",
    "sequence",
    "producer_id",
)
_RANK = {name: rank for rank, name in enumerate(RECORD_FIELDS)}
# The record every Publisher sends for a plain publish: checked with one tuple comparison.
_COMMON = ("key", "value", "headers", "sequence", "producer_id")
_COMMON_UNNUMBERED = ("key", "value", "headers")
_KEYLESS = b'{"key":null,'
# A value of one of these types is sent as bytes (``value_b64``).
_BINARY = (bytes, bytearray, memoryview)
_NON_FINITE = "value contains NaN or infinity, which JSON can't represent"
# The records of one publish frame together, in bytes: what MAX_FRAME_BYTES leaves after
# room for the frame's head (its topic, producer id) and a record's sequence. A publisher
# cuts its frames at this size; a single record over it cannot be sent at all.
MAX_FRAME_RECORDS_BYTES = MAX_FRAME_BYTES - 64 * 1024


# -- the client's end ---------------------------------------------------------------------


def encode_publish_message(
    topic: str,
    value: Any,
    options: PublishOptions,
    *,
    sequence: int | None,
    producer_id: str | None = None,
) -> tuple[bytes, str | bytes | None, int | None]:
    """One record of a publish frame as JSON bytes, with its key and the partition asked
    for (``options``' ``partition``), checked here so that bad input fails in the caller
    rather than in the broker. ``topic`` is checked here too; the frame carries it."""
    check_topic(topic)
    if sequence is not None and not producer_id:
        raise InvalidArgumentError("a numbered message needs a producer id")
    if not options:
        # The common case: a record of the value alone (bare_body), numbered last.
        body = bare_body(value)
        if len(body) > MAX_FRAME_RECORDS_BYTES:
            raise too_large(body)
        if sequence is not None:
            body = numbered(body, sequence, orjson.dumps(producer_id))
        return body, None, None
    check_options(options)
    record, key, partition = _encode_options(value, options)
    if sequence is not None:
        record["sequence"] = sequence
        record["producer_id"] = producer_id
    try:
        body = orjson.dumps(record)
    except TypeError as exc:
        raise SerializationError(f"value can't be sent as JSON: {exc}") from None
    # orjson writes NaN and infinities as null: look for them only when a null is there
    # besides the ``{"key":null,`` every keyless record starts with (walking the value
    # for each message was a third of a publisher's CPU).
    start = len(_KEYLESS) if body.startswith(_KEYLESS) else 0
    if body.find(b"null", start) >= 0 and has_non_finite(value):
        raise SerializationError(_NON_FINITE)
    if len(body) > MAX_FRAME_RECORDS_BYTES:
        raise too_large(body)
    return body, key, partition


def too_large(body: bytes) -> MessageTooLargeError:
    """The error for a record no publish frame can carry (over MAX_FRAME_RECORDS_BYTES),
    raised before anything is queued: sent, the broker would end the connection at the
    frame's length, and every resend would again. Callers compare the length inline
    (``if len(body) > MAX_FRAME_RECORDS_BYTES: raise too_large(body)``): a call a record
    costs a publisher more than the comparison does."""
    return MessageTooLargeError(
        f"message encodes to {len(body)} bytes, over the {MAX_FRAME_RECORDS_BYTES} one "
        f"publish frame can carry (a broker stores at most its max_message_bytes: 1 MiB "
        f"unless raised, up to 63 MiB)"
    )


def frame_count(bodies: Sequence[bytes]) -> int:
    """How many of ``bodies`` (a frame's worth of a publisher's queue, oldest first) fit
    one publish frame: all of them unless their bytes pass MAX_FRAME_RECORDS_BYTES (one
    sum, in C, for the usual frame), else as many as fit from the first, at least one
    (``too_large`` kept out any record that fits no frame alone).

    >>> frame_count([b"x" * 10] * 3)
    3
    >>> frame_count([b"x" * (MAX_FRAME_RECORDS_BYTES // 3)] * 3)
    2
    """
    if sum(map(len, bodies)) + len(bodies) <= MAX_FRAME_RECORDS_BYTES:
        return len(bodies)
    total = 0
    count = 0
    for body in bodies:
        total += len(body) + 1
        if total > MAX_FRAME_RECORDS_BYTES and count:
            break
        count += 1
    return count


def bare_body(value: Any) -> bytes:
    """The record of a value published with no options, not numbered: ``plain_body``, or
    for bytes their base64 (``value_b64``)."""
    if isinstance(value, _BINARY):
        return orjson.dumps({"key": None, "value_b64": to_base64(bytes(value)), "headers": []})
    return plain_body(value)


def plain_body(value: Any) -> bytes:
    """The record of a value published with no options and not as bytes: the same bytes
    as ``orjson.dumps({"key": None, "value": value, "headers": []})``, with the value
    dumped alone and the rest written around it (half the cost of building and dumping
    that dict, for every message a Publisher sends).

    >>> plain_body({"id": 7})
    b'{"key":null,"value":{"id":7},"headers":[]}'
    """
    try:
        dumped = orjson.dumps(value)
        if len(dumped) >= 2 * _DEEPEST and dumped.count(b"[") + dumped.count(b"{") >= _DEEPEST:
            # orjson refuses nesting past its limit, and a value this deep may be one level
            # short of it alone and over it in its record (as the broker writes it): the
            # record itself is dumped, to fail here, or give the same bytes.
            orjson.dumps({"key": None, "value": value, "headers": []})
    except TypeError as exc:
        raise SerializationError(f"value can't be sent as JSON: {exc}") from None
    # orjson writes NaN and infinities as null: the value is walked only when one is there.
    if b"null" in dumped and has_non_finite(value):
        raise SerializationError(_NON_FINITE)
    return b'{"key":null,"value":%s,"headers":[]}' % dumped


# The deepest nesting orjson dumps is 254 levels: a value that deep fails in a record.
_DEEPEST = 254


def numbered(body: bytes, sequence: int, producer_id: bytes) -> bytes:
    """A record body ``encode_publish_message`` gave without a sequence, with ``sequence``
    and ``producer_id`` (its JSON string, ``orjson.dumps(id)``) added: the same bytes as
    encoding it with them, which go last in a record. ``publish_many`` encodes (checks)
    every value first, and numbers each frame's worth when it queues it.

    >>> numbered(b'{"key":null,"value":1,"headers":[]}', 7, b'"p-1"')
    b'{"key":null,"value":1,"headers":[],"sequence":7,"producer_id":"p-1"}'
    """
    return b'%s,"sequence":%d,"producer_id":%s}' % (body[:-1], sequence, producer_id)


def _encode_options(
    value: Any, options: PublishOptions
) -> tuple[dict[str, Any], str | bytes | None, int | None]:
    record: dict[str, Any] = {}
    key = options.get("key")
    if isinstance(key, bytes | bytearray):
        key = bytes(key)
        record["key_b64"] = to_base64(key)
    elif key is None or isinstance(key, str):
        record["key"] = key
    else:
        raise SerializationError(f"a key must be str, bytes or None, not {type(key).__name__}")
    if isinstance(value, bytes | bytearray | memoryview):
        record["value_b64"] = to_base64(bytes(value))
    else:
        record["value"] = value
    record["headers"] = normalize_headers(
        with_priority(options.get("headers"), options.get("priority"))
    )
    tags = options.get("tags")
    if tags:
        record["tags"] = normalize_tags(tags)
    delay, deliver_at, ttl = options.get("delay"), options.get("deliver_at"), options.get("ttl")
    check_timing(delay, deliver_at, ttl)
    if deliver_at is not None:
        record["deliver_at"] = deliver_at
    if delay is not None:
        record["delay_ms"] = seconds_to_ms(delay)
    if ttl is not None:
        record["ttl_ms"] = seconds_to_ms(ttl)
    partition = options.get("partition")
    if partition is not None and (
        isinstance(partition, bool) or not isinstance(partition, int) or partition < 0
    ):
        raise UnknownPartitionError(f"partition must be a whole number, not {partition!r}")
    return record, key, partition


def encode_publish_frame(
    frame_id: int,
    acks: str,
    producer_id: str,
    topic: str,
    partition: int | None,
    records: Sequence[bytes],
) -> bytes:
    """A publish frame around records already encoded by ``encode_publish_message``."""
    head = orjson.dumps(
        {
            "op": "publish",
            "id": frame_id,
            "acks": acks,
            "producer_id": producer_id,
            "topic": topic,
            "partition": partition,
        }
    )
    return b'%s,"records":[%s]}' % (head[:-1], b",".join(records))


# -- the Kafka child's pre-checked form -------------------------------------------------------
#
# The Kafka child builds each record in the store's form itself (``kafka.core.batch_bodies``:
# exactly ``orjson.dumps`` of the record), so the PublisherBroker's parse, check and dump of
# every record would only make the same bytes again. From the child's connection alone (the
# manager marks it "trusted" once its hello shows the key the manager gave the child at
# spawn; docs/PROTOCOL.md, "The Kafka child's pre-checked frame") a publish frame may come in
# this form: a JSON head, then each record's middle (its JSON without the outer braces, as
# the stored line holds it), each after a newline. A record holds no raw newline (JSON
# escapes them), so one split gives the records.

CHECKED_OP = "publish_checked"
_CHECKED_START = b'{"op":"publish_checked",'
_HEADERS_ONLY: tuple[None, None, None, bool] = (None, None, None, True)
_IDENTITY = ("s:", "b:")  # ``key_identity``'s prefixes
_RECORD_START = (b'"key":', b'"key_b64":')
_SEQUENCE_FIELD = b',"sequence":'
_NUMBERED = b',"sequence":%d,"producer_id":%s'


def encode_checked_frame(
    frame_id: int,
    acks: str,
    producer_id: str,
    topic: str,
    partition: int,
    records: Sequence[bytes],
    first_sequence: int | None,
    identities: Sequence[str | None] | None,
    headed: Sequence[int] | None,
) -> bytes:
    """A publish frame of records in the store's form (each exactly ``orjson.dumps`` of its
    record without the outer braces), numbered from ``first_sequence`` when not None, with
    their key identities (None: no record has a key) and the indexes of those with
    headers."""
    head = orjson.dumps(
        {
            "op": CHECKED_OP,
            "id": frame_id,
            "acks": acks,
            "producer_id": producer_id,
            "topic": topic,
            "partition": partition,
            "count": len(records),
            "first_sequence": first_sequence,
            "identities": identities,
            "headed": headed or None,
        }
    )
    return b"\n".join((head, *records))


def _ends_agree(bodies: list[Any], first: int | None, producer_id: str) -> bool:
    """Whether the first and the last record start as a record does and end with the
    sequence and producer id the head gives them (or with neither): a check of the child's
    own work at both ends of the frame, not of every record."""
    ends = (bodies[0], bodies[-1])
    if not all(body.startswith(_RECORD_START) for body in ends):
        return False
    if first is None:
        return not any(_SEQUENCE_FIELD in body for body in ends)
    owner = orjson.dumps(producer_id)
    last = first + len(bodies) - 1
    return bool(
        ends[0].endswith(_NUMBERED % (first, owner)) and ends[1].endswith(_NUMBERED % (last, owner))
    )


def is_checked_frame(data: bytes) -> bool:
    """Whether ``data`` is a frame in the pre-checked form (by its start alone)."""
    return data.startswith(_CHECKED_START)


def decode_checked_frame(data: bytes) -> tuple[dict[str, Any], CheckedRecords]:
    """The head and records of a pre-checked frame (:func:`encode_checked_frame`), with
    their bodies (the stored lines' middles), sequences and extras as :func:`check_records`
    gives them; ProtocolError if its parts do not agree. The records themselves are not
    checked: only the broker's own Kafka child may send this form."""
    # One split of the whole frame, the head included: a copy of the records less.
    bodies: list[bytes | None] = data.split(b"\n")  # type: ignore[assignment]
    try:
        head = orjson.loads(bodies[0])  # type: ignore[arg-type]
    except orjson.JSONDecodeError as exc:
        raise ProtocolError(f"a pre-checked frame's head is not JSON: {exc}") from None
    if type(head) is not dict or head.get("op") != CHECKED_OP:
        raise ProtocolError(f"a pre-checked frame's head must be {CHECKED_OP!r}")
    del bodies[0]
    count = len(bodies)
    first, identities, headed = (
        head.get("first_sequence"),
        head.get("identities"),
        head.get("headed"),
    )
    producer_id = head.get("producer_id")
    if (
        not count
        or head.get("count") != count
        or type(head.get("partition")) is not int
        or type(producer_id) is not str
        or not (first is None or (type(first) is int and 0 <= first <= MAX_SEQUENCE - count + 1))
        or not (
            identities is None
            or (
                type(identities) is list
                and len(identities) == count
                and all(i is None or (type(i) is str and i[:2] in _IDENTITY) for i in identities)
            )
        )
        or not (
            headed is None
            or (type(headed) is list and all(type(i) is int and 0 <= i < count for i in headed))
        )
        or bodies.count(b"")
        or not _ends_agree(bodies, first, producer_id)
    ):
        raise ProtocolError("a pre-checked frame's head does not match its records")
    if first is None:
        sequences: list[int | None] = [None] * count
    else:
        sequences = list(range(first, first + count))
    if identities is None:
        identities = [None] * count
    extras = None if headed is None else {index: list(_HEADERS_ONLY) for index in headed}
    return head, CheckedRecords(bodies, list(identities), identities, sequences, extras, None)


# -- the broker's end ---------------------------------------------------------------------


def check_publish_frame(
    frame: dict[str, Any],
) -> tuple[Acks, str | None, str, int | None, list[Any]]:
    """The ACK level, producer id, topic, partition asked for and records of a publish
    frame; ProtocolError (InvalidArgumentError for the ACK level, InvalidTopicError for the
    topic) if the frame itself is wrong: every record of it then fails alike."""
    head = check_publish_head(frame)
    records = frame.get("records")
    if not isinstance(records, list) or not records:
        raise ProtocolError("a publish frame needs a non-empty 'records' list")
    return (*head, records)


def check_publish_head(frame: dict[str, Any]) -> tuple[Acks, str | None, str, int | None]:
    """The ACK level, producer id, topic and partition asked for of a publish frame, as
    :func:`check_publish_frame` checks them."""
    acks = normalize_acks(frame.get("acks", "all"))
    producer_id = frame.get("producer_id")
    if producer_id is not None and (not isinstance(producer_id, str) or not producer_id):
        raise ProtocolError("producer_id must be a non-empty string")
    topic = check_topic(frame.get("topic"))
    partition = frame.get("partition")
    if partition is not None and (type(partition) is not int or partition < 0):
        raise UnknownPartitionError(f"partition must be a whole number, not {partition!r}")
    return acks, producer_id, topic, partition


class Checked(NamedTuple):
    """One record of a publish frame, checked: what the broker stores and tells."""

    body: bytes  # the record's JSON without its braces: the stored line's middle
    key: str | bytes | None  # for the partitioner: a text key, a raw-bytes key's bytes
    identity: str | None  # ``spoolmq.store.record.key_identity`` of the record
    sequence: int | None
    # [deliver_at, expires_at, tags, has_headers] when the record has any of them
    extra: list[Any] | None


def check_record(record: Any, producer_id: str | None, now: int, max_bytes: int) -> Checked:
    """One record of a publish frame, checked as the store judges a message; a SpoolError
    (a per-record error) if it is wrong. ``now`` fixes ``delay_ms``/``ttl_ms``."""
    if type(record) is not dict:
        raise ProtocolError("each record must be a JSON object")
    fields = tuple(record)
    key = record.get("key")
    sequence = record.get("sequence")
    if (
        fields == _COMMON
        and (key is None or type(key) is str)
        and record["headers"] == []
        and type(sequence) is int
        and 0 <= sequence <= MAX_SEQUENCE
        and record["producer_id"] == producer_id
    ) or (
        fields == _COMMON_UNNUMBERED
        and (key is None or type(key) is str)
        and record["headers"] == []
    ):
        extra = None  # the common record: nothing else to check
    else:
        key, sequence = _check_general(record, producer_id)
        if "delay_ms" in record or "ttl_ms" in record:
            record = _fix_timing(record, now)
        extra = _extra(record)
    try:
        body = orjson.dumps(record)
    except TypeError as exc:  # an integer past 64 bits: JSON has it, the store does not
        raise SerializationError(f"record can't be stored: {exc}") from None
    if len(body) + RECORD_OVERHEAD > max_bytes:
        raise MessageTooLargeError(
            f"message encodes to about {len(body) + RECORD_OVERHEAD} bytes, over the limit of "
            f"{max_bytes} bytes (max_message_bytes)"
        )
    if key is None:
        identity = None
    elif type(key) is str:
        identity = "s:" + key
    else:
        identity = "b:" + record["key_b64"]
    return Checked(body[1:-1], key, identity, sequence, extra)


class CheckedRecords(NamedTuple):
    """The records of a publish frame, checked (:func:`check_records`): per record, in
    frame order, its body, key, key identity and sequence (None for a record in
    ``errors``), and ``extra`` by index for the records that have one."""

    bodies: list[bytes | None]
    keys: list[str | bytes | None]
    identities: list[str | None]
    sequences: list[int | None]
    extras: dict[int, list[Any]] | None
    errors: dict[int, SpoolError] | None


def check_records(
    records: list[Any], producer_id: str | None, now: int, max_bytes: int
) -> CheckedRecords:
    """Every record of a frame checked as :func:`check_record` does: the common frame
    (every record the common one) a field at a time over all its records
    (:func:`_common_frame`), else the common record inline (one loop, no object per
    record: half the cost of a call per record)."""
    limit = max_bytes - RECORD_OVERHEAD
    common = _common_frame(records, producer_id, limit)
    if common is not None:
        return common
    bodies: list[bytes | None] = []
    keys: list[str | bytes | None] = []
    identities: list[str | None] = []
    sequences: list[int | None] = []
    extras: dict[int, list[Any]] | None = None
    errors: dict[int, SpoolError] | None = None
    dumps = orjson.dumps
    for index, record in enumerate(records):
        if type(record) is dict and tuple(record) == _COMMON:
            key, sequence = record["key"], record["sequence"]
            if (
                (key is None or type(key) is str)
                and record["headers"] == []
                and type(sequence) is int
                and 0 <= sequence <= MAX_SEQUENCE
                and record["producer_id"] == producer_id
            ):
                try:
                    body = dumps(record)
                except TypeError:  # a sequence past 64 bits: check_record says so
                    body = b""
                if body and len(body) <= limit:
                    bodies.append(body[1:-1])
                    keys.append(key)
                    identities.append(None if key is None else "s:" + key)
                    sequences.append(sequence)
                    continue
        try:
            checked = check_record(record, producer_id, now, max_bytes)
        except SpoolError as exc:
            if errors is None:
                errors = {}
            errors[index] = exc
            bodies.append(None)
            keys.append(None)
            identities.append(None)
            sequences.append(None)
            continue
        bodies.append(checked.body)
        keys.append(checked.key)
        identities.append(checked.identity)
        sequences.append(checked.sequence)
        if checked.extra is not None:
            if extras is None:
                extras = {}
            extras[index] = checked.extra
    return CheckedRecords(bodies, keys, identities, sequences, extras, errors)


def _common_frame(records: list[Any], producer_id: str | None, limit: int) -> CheckedRecords | None:
    """The records of the common frame checked a field at a time over the whole frame, in
    C (``map``, ``list.count``), where the loop of :func:`check_records` checks a record
    at a time in Python: the records a Publisher sends, every one numbered ``_COMMON``,
    that the loop would take inline. None when any record is not: the loop then checks
    them one by one (and names the bad ones), as if this had not run."""
    count = len(records)
    fields = tuple(records[0]) if count and type(records[0]) is dict else None
    if fields != _COMMON:
        return None
    try:
        # ``fields`` holds orjson's cached keys: the other records' tuples compare by
        # identity. A record that is not a dict fails here or in a getter (TypeError).
        if list(map(tuple, records)).count(fields) != count:
            return None
        keys = list(map(_KEY, records))
        sequences = list(map(_SEQUENCE, records))
        if (
            list(map(_HEADERS, records)).count(_NO_HEADERS) != count
            or list(map(_PRODUCER_ID, records)).count(producer_id) != count
            or list(map(type, sequences)).count(int) != count
            or min(sequences) < 0
            or max(sequences) > MAX_SEQUENCE
        ):
            return None
        dumped = list(map(orjson.dumps, records))
    except TypeError:  # not a dict; a sequence past 64 bits, a value too deep to dump
        return None
    if keys.count(None) == count:
        identities: list[str | None] = [None] * count
    elif all(key is None or type(key) is str for key in keys):
        identities = [None if key is None else "s:" + key for key in keys]
    else:
        return None
    if max(map(len, dumped)) > limit:
        return None
    bodies: list[bytes | None] = [body[1:-1] for body in dumped]
    return CheckedRecords(bodies, keys, identities, sequences, None, None)


_HEADERS = operator.itemgetter("headers")
_PRODUCER_ID = operator.itemgetter("producer_id")
_SEQUENCE = operator.itemgetter("sequence")
_KEY = operator.itemgetter("key")
_NO_HEADERS: list[Any] = []  # compared with, never changed


def _extra(record: dict[str, Any]) -> list[Any] | None:
    """What the ConsumerBroker needs of a record besides its key (interfaces.md §1)."""
    deliver_at, expires_at = record.get("deliver_at"), record.get("expires_at")
    tags, headers = record.get("tags"), bool(record.get("headers"))
    if deliver_at is None and expires_at is None and tags is None and not headers:
        return None
    return [deliver_at, expires_at, tags, headers]


def _check_general(record: dict[str, Any], producer_id: str | None) -> tuple[Any, int | None]:
    """Check a record field by field as the store judges a message; its key for the
    partitioner (bytes for ``key_b64``) and its sequence."""
    last = -1
    for name in record:
        rank = _RANK.get(name)
        if rank is None:
            raise ProtocolError(f"unknown record field {name[:40]!r}")
        if rank <= last:
            raise ProtocolError(f"record field {name!r} is out of the store's order")
        last = rank
    for pair in (("key", "key_b64"), ("value", "value_b64")):
        if sum(name in record for name in pair) != 1:
            raise ProtocolError(f"a record needs exactly one of {pair[0]!r} and {pair[1]!r}")
    key: Any = record.get("key")
    if "key_b64" in record:
        key = from_base64(record["key_b64"], "key_b64", SerializationError)
    elif key is not None and type(key) is not str:
        raise SerializationError(f"a key must be a string or null, not {type(key).__name__}")
    if "value_b64" in record:
        from_base64(record["value_b64"], "value_b64", SerializationError)
    _check_headers(record.get("headers"))
    if "tags" in record:
        tags = record["tags"]
        if type(tags) is not list or not tags:
            raise SerializationError("tags must be a non-empty list of strings")
        normalize_tags(tags)
    for name in ("deliver_at", "expires_at"):
        number = record.get(name)
        if number is not None and (type(number) is not int or number < 0):
            raise InvalidArgumentError(f"{name} must be a non-negative integer, not {number!r}")
    if ("deliver_at" in record and "delay_ms" in record) or (
        "expires_at" in record and "ttl_ms" in record
    ):
        raise InvalidArgumentError("give a relative or an absolute time, not both")
    sequence = record.get("sequence")
    if ("sequence" in record) != ("producer_id" in record):
        raise ProtocolError("a record has both sequence and producer_id or neither")
    if sequence is not None:
        check_sequence(sequence)
        if record["producer_id"] != producer_id:
            raise ProtocolError("a record's producer_id must be its frame's")
    return key, sequence


def _check_headers(headers: Any) -> None:
    if type(headers) is not list:
        raise SerializationError("headers must be a list of [name, value] pairs")
    for entry in headers:
        if type(entry) is not list or len(entry) not in (2, 3):
            raise SerializationError("each header must be [name, value] or [name, base64, 'b64']")
        name, text = entry[0], entry[1]
        if type(name) is not str or not name or type(text) is not str:
            raise SerializationError("a header is a non-empty name and a string value")
        if name == PRIORITY_HEADER:
            check_priority_header(text if len(entry) == 2 else None)
        if len(entry) == 3:
            if entry[2] != "b64":
                raise SerializationError("a 3-item header must end with 'b64'")
            from_base64(text, "a header value", SerializationError)


def _fix_timing(record: dict[str, Any], now: int) -> dict[str, Any]:
    """The record with ``delay_ms``/``ttl_ms`` turned into absolute ``deliver_at`` and
    ``expires_at`` by the broker's clock, in the store's field order."""
    delay, ttl = _ms_to_seconds(record.get("delay_ms")), _ms_to_seconds(record.get("ttl_ms"))
    deliver_at, expires_at = schedule(delay, record.get("deliver_at"), ttl, now)
    fixed = {n: v for n, v in record.items() if n not in ("delay_ms", "ttl_ms")}
    if deliver_at is not None:
        fixed["deliver_at"] = deliver_at
    if expires_at is not None:
        fixed["expires_at"] = expires_at
    return {name: fixed[name] for name in RECORD_FIELDS if name in fixed}


def _ms_to_seconds(ms: Any) -> Any:
    """``delay_ms``/``ttl_ms`` in seconds for ``schedule``; anything else as it is, for
    ``check_timing`` to refuse."""
    if isinstance(ms, int | float) and not isinstance(ms, bool):
        return ms / 1000
    return ms
