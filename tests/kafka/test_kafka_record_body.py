"""A Kafka record's publish-frame record (``record_body``, built from byte strings) against
the rules of docs/KAFKA.md applied the plain way: a dict of the stored fields dumped by
orjson. The two must be the same bytes for every key, value and header, since the broker
stores what the frame says and a Kafka consumer must get the producer's bytes back."""

from __future__ import annotations

import base64
import json
from typing import Any

import orjson
from hypothesis import example, given, settings
from hypothesis import strategies as st

from json_strategies import JSON_VALUES, TEXT
from spoolmq.kafka.core import record_body

VALUES = (
    st.none()
    | st.binary(max_size=200)
    | JSON_VALUES.map(orjson.dumps)  # canonical JSON: stored as JSON
    | JSON_VALUES.map(lambda v: json.dumps(v).encode())  # with spaces: base64 unless compact
)
KEYS = st.none() | st.binary(max_size=40) | TEXT.map(str.encode)
HEADERS = st.lists(st.tuples(TEXT.filter(bool), st.none() | st.binary()), max_size=3)


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
    tail = b"" if seq is None else b',"sequence":%d,"producer_id":"kafka-7.0.orders.2"' % seq
    body = record_body(key, value, headers, tail)
    assert body == reference(key, value, headers, seq)
    stored = orjson.loads(body)
    if value is not None and "value" in stored:
        assert orjson.dumps(stored["value"]) == value  # the bytes a Kafka consumer gets back
