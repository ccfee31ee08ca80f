"""Append/read round trips: arbitrary JSON values, raw-bytes keys and values, headers."""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from spoolmq import Message, Store
from spoolmq.errors import CorruptRecordError
from spoolmq.store.message import PRIORITY_HEADER
from spoolmq.store.record import (
    check_line,
    decode_line,
    encode_message,
    frame_batch,
    frame_record,
    verified_fields,
)

text = st.text(st.characters(exclude_categories=("Cs",)), max_size=20)
json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | text
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(text, children, max_size=4),
    max_leaves=12,
)
keys = st.none() | text | st.binary(max_size=24)
header_values = text | st.binary(max_size=12)
# Not the reserved priority header, which holds one digit and is refused otherwise (its own
# tests say so): Hypothesis draws string constants from the code under test, that name too.
header_names = text.filter(lambda name: bool(name) and name != PRIORITY_HEADER)
headers = st.lists(st.tuples(header_names, header_values), max_size=4)
values = json_values | st.binary(max_size=64)

messages = st.builds(
    Message,
    value=values,
    key=keys,
    headers=headers,
    tags=st.none() | st.lists(text.filter(bool), max_size=3),
    deliver_at=st.none() | st.integers(min_value=0, max_value=2**53),
    producer_id=st.none(),
)


@settings(max_examples=100, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch=st.lists(messages, min_size=1, max_size=12),
    offset=st.integers(0, 2**62),
    timestamp=st.integers(0, 2**50),
)
def test_a_batch_is_its_records_framed_line_by_line(
    batch: list[Message], offset: int, timestamp: int
) -> None:
    """``frame_batch`` builds a batch's lines from pieces: the same bytes as framing each
    record alone, the first with ``batch_records`` when there is more than one."""
    bodies = [encode_message(message).body for message in batch]
    lines = frame_batch(offset, timestamp, bodies).splitlines(keepends=True)
    assert len(lines) == len(bodies)
    if len(bodies) == 1:
        assert lines == [frame_record(offset, timestamp, bodies[0])]
    assert lines[1:] == [
        frame_record(offset + i, timestamp, body) for i, body in enumerate(bodies) if i
    ]
    first = check_line(lines[0])
    assert (first["offset"], first["timestamp"]) == (offset, timestamp)
    assert first.get("batch_records", 1) == len(bodies)


def expected_value(value: Any) -> Any:
    return value  # JSON values and bytes must come back exactly as given


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(message=messages, offset=st.integers(0, 2**62), timestamp=st.integers(0, 2**50))
def test_record_codec_round_trip(message: Message, offset: int, timestamp: int) -> None:
    encoded = encode_message(message)
    line = frame_record(offset, timestamp, encoded.body)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    fields = orjson.loads(line)
    assert list(fields)[:2] == ["offset", "timestamp"]  # readable names, fixed order
    record = decode_line(line)
    assert (record.offset, record.timestamp) == (offset, timestamp)
    assert record.value == expected_value(message.value)
    assert type(record.value) is type(message.value)
    assert record.key == message.key
    assert record.headers == [(name, value) for name, value in message.headers or []]
    assert record.tags == tuple(message.tags or ())
    assert record.deliver_at == message.deliver_at


@pytest.mark.parametrize(
    ("value", "stored_field", "stored"),
    [
        ({"order_id": 1, "amount": 12.5}, "value", {"order_id": 1, "amount": 12.5}),
        ([1, "two", None], "value", [1, "two", None]),
        (b"\x00\xff\n raw", "value_b64", "AP8KIHJhdw=="),
    ],
)
def test_values_are_stored_as_readable_json(
    store: Store, data_dir: Path, value: Any, stored_field: str, stored: Any
) -> None:
    store.append("orders", value, key="customer-7", headers={"trace": "abc"})
    line = next((data_dir / "logs" / "orders" / "0").glob("*.jsonl")).read_bytes()
    fields = orjson.loads(line)
    assert fields[stored_field] == stored
    assert fields["key"] == "customer-7"
    assert fields["headers"] == [["trace", "abc"]]
    assert fields["offset"] == 0


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batches=st.lists(st.lists(messages, min_size=1, max_size=5), min_size=1, max_size=5))
def test_log_round_trip_through_files(tmp_path_factory: pytest.TempPathFactory, batches) -> None:
    data_dir = tmp_path_factory.mktemp("rt")
    sent: list[Message] = []
    with Store(data_dir) as store:
        store.create_topic("t", partitions=1, segment_bytes=1024)  # rolls often
        for batch in batches:
            positions = store.append_batch("t", batch, acks="1")
            assert [p.offset for p in positions] == list(range(len(sent), len(sent) + len(batch)))
            sent.extend(batch)
    with Store(data_dir) as store:  # a fresh process's view: everything from the files
        got = list(store.reader("t", 0))
    assert [r.offset for r in got] == list(range(len(sent)))
    for record, message in zip(got, sent, strict=True):
        assert record.value == message.value
        assert type(record.value) is type(message.value)
        assert record.key == message.key
        assert record.headers == list(message.headers or [])


@pytest.mark.parametrize("position", [2, 12, 25, 31])
def test_a_changed_byte_fails_the_checksum(position: int) -> None:
    line = frame_record(3, 1000, encode_message(Message(value="abcdef")).body)
    assert check_line(line)["offset"] == 3
    damaged = bytearray(line)
    damaged[position] = ord("7") if damaged[position] != ord("7") else ord("8")
    with pytest.raises(CorruptRecordError, match="checksum"):
        check_line(bytes(damaged))


def test_the_fast_check_takes_only_whole_good_lines() -> None:
    """``verified_fields`` (the readers' and the consumers' check) gives the fields of a
    line as the writer framed it, and None for any line cut or changed at its end, where
    the checksum is: never the fields of a line that is not whole."""
    line = frame_record(3, 1000, encode_message(Message(value={"a": 1}, key="k")).body)
    assert line.endswith(b"}\n")
    fields = verified_fields(line)
    assert fields is not None
    assert (fields["offset"], fields["key"], fields["value"]) == (3, "k", {"a": 1})
    crc = line[line.rindex(b":") + 1 : -2]
    assert int(crc) == zlib.crc32(line[: line.rindex(b',"crc":')])  # the framing tested
    bad = [
        line[:-1],  # no newline: a torn last line
        line[:-2] + b"\n",  # no closing brace
        line[:-3] + b"}\n",  # the checksum's last digit cut
        line.replace(b',"crc":', b',"cr":'),  # no checksum field
        line.replace(b'"k"', b'"K"'),  # a changed byte under the checksum
        b"\n",
        b"",
    ]
    # Whole lines with a good checksum over everything before it, refused by the newline
    # check or by the parse (not the checksum): what follows the checksum is not `}\n`.
    head = line[: line.rindex(b',"crc":')]
    crc = b',"crc":%d' % zlib.crc32(head)
    bad += [head + crc + end for end in (b"} ", b"}\r", b"}\t", b"}", b" \n", b"\n")]
    # A good checksum, but not a record: not JSON, an offset that is not an integer, none.
    for text in (b'[1,"x"', b'{"offset":"3"', b'{"timestamp":1'):
        bad.append(text + b',"crc":%d}\n' % zlib.crc32(text))
    for damaged in bad:
        assert verified_fields(damaged) is None, damaged
