"""A Kafka record's publish-frame record (``batch_bodies``, built from byte strings) against
the rules of docs/KAFKA.md applied the plain way: a dict of the stored fields dumped by
orjson. The two must be the same bytes for every key, value and header, since the broker
stores what the frame says and a Kafka consumer must get the producer's bytes back."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from json_strategies import JSON_VALUES, TEXT
from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka.core import batch_bodies
from spoolmq.kafka.records import OutRecord, _decode_records, decode_batches, encode_batch
from spoolmq.kafka.wire import Reader
from spoolmq.store.message import PRIORITY_HEADER

VALUES = (
    st.none()
    | st.binary(max_size=200)
    | JSON_VALUES.map(orjson.dumps)  # canonical JSON: stored as JSON
    | JSON_VALUES.map(lambda v: json.dumps(v).encode())  # with spaces: base64 unless compact
)
KEYS = st.none() | st.binary(max_size=40) | TEXT.map(str.encode)
HEADERS = st.lists(st.tuples(TEXT.filter(bool), st.none() | st.binary()), max_size=3)
# Without the reserved priority header, where the two forms of the publish frame part on
# purpose: Hypothesis draws string constants from the code under test, that name too.
UNRESERVED_HEADERS = st.lists(
    st.tuples(
        TEXT.filter(lambda name: bool(name) and name != PRIORITY_HEADER), st.none() | st.binary()
    ),
    max_size=3,
)


Entry = tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]


def payload_of(entries: list[Entry], timestamps: list[int] | None = None) -> tuple[bytes, int]:
    """The records block of a batch a producer would send, and its count."""
    out = [
        OutRecord(i, (timestamps or [1000] * len(entries))[i], key, value, headers)
        for i, (key, value, headers) in enumerate(entries)
    ]
    (batch,) = decode_batches(encode_batch(out), 1 << 30, produced=True, records=False)
    return batch.payload, batch.count


def record_bodies(
    entries: list[Entry], first: int | None = None, producer: str = ""
) -> list[bytes]:
    return batch_bodies(*payload_of(entries), first, producer)


def reference(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], seq: int | None
) -> bytes:
    record: dict[str, Any] = {}
    if key is None:
        record["key"] = None
    else:
        try:
            record["key"] = key.decode("utf-8")
        except UnicodeDecodeError:
            record["key_b64"] = base64.b64encode(key).decode()
    if value is None:
        record["value"] = None
    else:
        try:
            parsed = orjson.loads(value)
            canonical = parsed is not None and orjson.dumps(parsed) == value
        except orjson.JSONDecodeError:
            canonical = False
        if canonical:
            record["value"] = parsed
        else:
            record["value_b64"] = base64.b64encode(value).decode()
    record["headers"] = [
        [name, ""]
        if hv is None
        else [name, hv.decode()]
        if _is_utf8(hv)
        else [name, base64.b64encode(hv).decode(), "b64"]
        for name, hv in headers
    ]
    if seq is not None:
        record["sequence"] = seq
        record["producer_id"] = "kafka-7.0.orders.2"
    return orjson.dumps(record)


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@settings(max_examples=400, deadline=None)
@given(KEYS, VALUES, HEADERS, st.none() | st.integers(0, 2**40))
@example(None, b"null", [], None)  # JSON null: base64, never confused with a tombstone
@example(b"\xff", b'{"a": 1}', [("h", b"\xfe"), ("n", None)], 5)
@example("ключ".encode(), '{"é":"\u2028"}'.encode(), [], 0)
def test_the_record_is_what_the_fields_dump_to(
    key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]], seq: int | None
) -> None:
    (body,) = record_bodies([(key, value, headers)], seq, "kafka-7.0.orders.2")
    assert body == reference(key, value, headers, seq)
    stored = orjson.loads(body)
    if value is not None and "value" in stored:
        assert orjson.dumps(stored["value"]) == value  # the bytes a Kafka consumer gets back


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.tuples(KEYS, VALUES, HEADERS), min_size=1, max_size=20),
    st.none() | st.integers(0, 2**40),
)
def test_a_batch_s_records_are_numbered_from_its_first_sequence(
    entries: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    first: int | None,
) -> None:
    bodies = record_bodies(entries, first, "kafka-7.0.orders.2")
    assert bodies == [
        reference(key, value, headers, None if first is None else first + i)
        for i, (key, value, headers) in enumerate(entries)
    ]


def test_a_producer_id_is_stored_as_given_whatever_its_characters() -> None:
    for producer in ("p%d%s%%", 'quo"te\\', "ключ"):
        bodies = record_bodies([(None, b"1", []), (None, b"2", [])], 9, producer)
        assert [orjson.loads(b) for b in bodies] == [
            {"key": None, "value": n, "headers": [], "sequence": 9 + n - 1, "producer_id": producer}
            for n in (1, 2)
        ]


def _decoded(values: list[bytes], headers: list[tuple[str, bytes | None]], **ids: int) -> Any:
    batch = encode_batch(
        [OutRecord(i, 1000, None, v, headers) for i, v in enumerate(values)], **ids
    )
    return decode_batches(batch, 1 << 20, produced=True, records=False)[0]


def test_a_batch_becomes_its_producer_s_frame_records_or_one_error() -> None:
    """Produce's framing of one decoded batch: an idempotent producer's records carry their
    Kafka sequences under a spoolmq producer id of their own, a plain producer's none; a
    record one byte past the topic's message limit, or with a header without a name,
    makes the whole batch an error."""
    from spoolmq.kafka.api import ErrorCode
    from spoolmq.kafka.produce import _frame_records
    from spoolmq.store.record import RECORD_OVERHEAD

    values = [b'{"n":1}', b"\x00\x01", b"x" * 300]
    ids = {"producer_id": 7, "producer_epoch": 0, "base_sequence": 40}
    producer, bodies, first, identities, headed = _frame_records(  # type: ignore[misc]
        _decoded(values, [], **ids), "orders", 2, 1 << 20
    )
    assert producer == "kafka-7.0.orders.2"
    assert (first, identities, headed) == (40, None, [])
    assert [orjson.loads(b)["sequence"] for b in bodies] == [40, 41, 42]
    assert bodies == [reference(None, v, [], 40 + i) for i, v in enumerate(values)]

    plain, bodies, first, _, _ = _frame_records(_decoded(values, []), "orders", 2, 1 << 20)  # type: ignore[misc]
    assert (plain, first) == ("kafka-front", None)
    assert bodies == [reference(None, v, [], None) for v in values]

    largest = max(map(len, bodies))
    fits = largest + RECORD_OVERHEAD
    assert not isinstance(_frame_records(_decoded(values, []), "orders", 2, fits), int)
    too_small = _frame_records(_decoded(values, []), "orders", 2, fits - 1)
    assert too_small == ErrorCode.MESSAGE_TOO_LARGE

    unnamed = _frame_records(_decoded(values, [("ok", b"1"), ("", b"2")]), "orders", 2, 1 << 20)
    assert unnamed == ErrorCode.INVALID_RECORD  # a producer does not retry it


def test_a_batch_more_than_one_publish_frame_carries_is_message_too_large(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each record within the topic's limit, all of them past what one publish frame
    carries (64 MiB less room for its head; here made exactly these three records): sent, the
    PublisherBroker would end the link at the frame's length."""
    from spoolmq.kafka import produce
    from spoolmq.kafka.api import ErrorCode
    from spoolmq.protocol import publish

    values = [b"x" * 300] * 3
    bodies = produce._frame_records(_decoded(values, []), "orders", 2, 1 << 20)
    assert not isinstance(bodies, int)
    total = sum(map(len, bodies[1])) + len(bodies[1])
    monkeypatch.setattr(publish, "MAX_FRAME_RECORDS_BYTES", total)
    assert not isinstance(produce._frame_records(_decoded(values, []), "orders", 2, 1 << 20), int)
    monkeypatch.setattr(publish, "MAX_FRAME_RECORDS_BYTES", total - 1)
    refused = produce._frame_records(_decoded(values, []), "orders", 2, 1 << 20)
    assert refused == ErrorCode.MESSAGE_TOO_LARGE


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(KEYS, VALUES, UNRESERVED_HEADERS), min_size=1, max_size=20),
    st.none() | st.integers(0, 2**31 - 1),  # a Kafka batch's base sequence is an int32
)
def test_the_pre_checked_frame_gives_the_broker_what_checking_the_plain_one_gives(
    entries: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]],
    first: int | None,
) -> None:
    """The Kafka child's pre-checked frame, as the PublisherBroker decodes it, against the
    plain publish frame of the same batch as the PublisherBroker checks it: the same stored
    bodies, key identities, sequences and extras, so what is stored and what the
    ConsumerBroker is told do not depend on the form."""
    from spoolmq.kafka.produce import _frame_records
    from spoolmq.protocol.publish import (
        check_records,
        decode_checked_frame,
        encode_checked_frame,
        encode_publish_frame,
    )

    ids = {} if first is None else {"producer_id": 7, "producer_epoch": 0, "base_sequence": first}
    out = [
        OutRecord(i, 1000, key, value, headers) for i, (key, value, headers) in enumerate(entries)
    ]
    (batch,) = decode_batches(encode_batch(out, **ids), 1 << 20, produced=True, records=False)
    built = _frame_records(batch, "orders", 2, 1 << 20)
    bare = _frame_records(batch, "orders", 2, 1 << 20, braces=False)
    assert not isinstance(built, int) and not isinstance(bare, int)
    producer, records, first_sequence, identities, headed = built
    assert bare == (producer, [r[1:-1] for r in records], first_sequence, identities, headed)
    plain = orjson.loads(encode_publish_frame(3, "all", producer, "orders", 2, records))
    expected = check_records(plain["records"], producer, 0, 1 << 20)
    head, checked = decode_checked_frame(
        encode_checked_frame(
            3, "all", producer, "orders", 2, bare[1], first_sequence, identities, headed
        )
    )
    assert {k: head[k] for k in ("op", "id", "acks", "producer_id", "topic", "partition")} == {
        "op": "publish_checked",
        "id": 3,
        "acks": "all",
        "producer_id": producer,
        "topic": "orders",
        "partition": 2,
    }
    assert checked.bodies == expected.bodies
    assert checked.identities == expected.identities
    assert checked.sequences == expected.sequences
    assert checked.extras == expected.extras
    assert checked.errors is expected.errors is None
    assert [k is None for k in checked.keys] == [k is None for k in expected.keys]


def test_a_value_too_deep_for_its_record_is_stored_as_bytes() -> None:
    """orjson writes 254 levels at most: a JSON value that deep is canonical alone but not
    inside its record, one level deeper (storing it as JSON left a record nothing could
    write out again). It goes in as bytes, which a Kafka consumer gets back unchanged; one
    level less is still stored as JSON."""
    deepest = b"[" * 253 + b"]" * 253
    too_deep = b"[" * 254 + b"]" * 254
    (fits, falls_back) = record_bodies([(None, deepest, []), (None, too_deep, [])])
    assert fits == b'{"key":null,"value":' + deepest + b',"headers":[]}'
    assert orjson.loads(falls_back) == {
        "key": None,
        "value_b64": base64.b64encode(too_deep).decode(),
        "headers": [],
    }
    orjson.dumps(orjson.loads(fits))  # the stored record can be written out again


@settings(max_examples=1000, deadline=None)
@given(
    # values past 8 KiB have lengths of three bytes
    st.lists(
        st.tuples(KEYS, VALUES | st.binary(min_size=8190, max_size=8300), HEADERS),
        min_size=1,
        max_size=8,
    ),
    st.lists(st.integers(-(2**40), 2**40), min_size=8, max_size=8),
    # (a record, a byte from its start, the new byte): its length, deltas, key and value
    # lengths and the first bytes of its fields are where the two readers could part
    st.lists(
        st.tuples(
            st.integers(0, 7),
            st.integers(0, 15) | st.integers(0, 10_000),
            st.sampled_from([0x00, 0x01, 0x02, 0x03, 0x7F, 0x80, 0x81, 0xFF]) | st.integers(0, 255),
        ),
        max_size=4,
    ),
    st.integers(-3, 3),
)
@example([(None, b"1", [])], [1000] * 8, [], 0)
# a record of 7 bytes: length, attributes, two deltas, null key (0x01), value length, value,
# no headers (0x00); said to be 6 long, its fields run a byte past it
@example([(None, b"1", [])], [1000] * 8, [(0, 0, 0x0C)], 0)
@example([(None, b"1", [])], [1000] * 8, [(0, 4, 0x03)], 0)  # a key length of -2
@example([(None, b"1", [])], [1000] * 8, [(0, 5, 0x03)], 0)  # a value length of -2
def test_one_pass_accepts_and_refuses_what_decoding_the_records_does(
    entries: list[Entry],
    timestamps: list[int],
    changes: list[tuple[int, int, int]],
    count_change: int,
) -> None:
    """Produce reads a batch's records as it makes their publish-frame records, with its
    own inline varints. On any bytes (a producer's, with long and short timestamp deltas,
    then bytes changed and the count moved), it must refuse what the plain decoding of
    the records refuses and make, of what that accepts, the records the fields give."""
    data, count = payload_of(entries, timestamps[: len(entries)])
    starts, r = [], Reader(data)
    while r.remaining:
        starts.append(r.position)
        r.raw(r.varint())
    damaged = bytearray(data)
    for record, position, byte in changes:
        damaged[(starts[record % len(starts)] + position) % len(damaged)] = byte
    count = max(count + count_change, 1)
    try:
        decoded: list[Any] | None = _decode_records(bytes(damaged), count)
    except KafkaDecodeError:
        decoded = None
    if decoded is None or any(name == "" for _, _, _, _, hs in decoded for name, _ in hs):
        with pytest.raises(KafkaDecodeError):
            batch_bodies(bytes(damaged), count, 5, "kafka-7.0.orders.2")
        return
    bodies = batch_bodies(bytes(damaged), count, 5, "kafka-7.0.orders.2")
    assert bodies == [
        reference(key, value, list(headers), 5 + i)
        for i, (_, _, key, value, headers) in enumerate(decoded)
    ]


def test_a_kafka_priority_header_that_is_not_one_digit_is_kept_as_a_header() -> None:
    """Where the two forms part on purpose (docs/FORMAT.md, "Reserved headers"): a Kafka
    record's ``x-spoolmq-priority`` header that is not one digit is kept as a plain header
    (the message has priority 0), where a native publisher's record with it is refused."""
    from spoolmq.errors import SpoolError
    from spoolmq.protocol.publish import check_records, decode_checked_frame, encode_checked_frame

    entries: list[Entry] = [(None, b"1", [(PRIORITY_HEADER, b"")]), (None, b"2", [])]
    data, count = payload_of(entries)
    headed: list[int] = []
    bare = batch_bodies(data, count, 0, "p", headed=headed, braces=False)
    _, checked = decode_checked_frame(
        encode_checked_frame(1, "all", "p", "orders", 0, bare, 0, None, headed)
    )
    assert [orjson.loads(b"{" + b + b"}")["headers"] for b in checked.bodies] == [
        [[PRIORITY_HEADER, ""]],
        [],
    ]
    plain = check_records([orjson.loads(b"{" + b + b"}") for b in bare], "p", 0, 1 << 20)
    assert plain.errors is not None and isinstance(plain.errors[0], SpoolError)
