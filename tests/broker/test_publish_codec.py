"""The publish message codec, both ends with no processes: what the client encodes, the broker
decodes into the record the store writes; the client refuses bad options in the caller; the
broker refuses bad messages with a per-message error, never an exception that would stop it."""

from __future__ import annotations

import functools
from typing import Any

import orjson
import pytest

from spoolmq.errors import InvalidArgumentError, SerializationError, SpoolError
from spoolmq.protocol.publish import (
    check_publish_frame,
    check_record,
    encode_publish_frame,
    encode_publish_message,
    numbered,
)
from spoolmq.store.message import PublishOptions
from spoolmq.store.record import decode_line, frame_record

NOW = 1_700_000_000_000


def through_the_wire(
    value: Any, options: PublishOptions, *, sequence: int | None = 4
) -> tuple[str, Any, int | None, Any]:
    """Encode as the client does, parse as the broker does, check; and read the record back."""
    body, client_key, asked = encode_publish_message(
        "t", value, options, sequence=sequence, producer_id="p-1"
    )
    frame = encode_publish_frame(1, "all", "p-1", "t", asked, [body])
    _, producer_id, topic, partition, [raw] = check_publish_frame(orjson.loads(frame))
    checked = check_record(raw, producer_id, NOW, 1_000_000)
    assert checked.key == client_key
    record = decode_line(frame_record(10, NOW, checked.body))
    return topic, checked.key, partition, record


def test_a_plain_message_arrives_as_sent() -> None:
    topic, key, partition, record = through_the_wire({"order": 1, "items": [1.5, None]}, {})
    assert (topic, key, partition) == ("t", None, None)
    assert record.value == {"order": 1, "items": [1.5, None]}
    assert (record.key, record.headers, record.tags) == (None, [], ())
    assert (record.producer_id, record.sequence) == ("p-1", 4)
    assert (record.deliver_at, record.expires_at) == (None, None)


def test_every_option_arrives_as_given() -> None:
    options: PublishOptions = {
        "key": b"\x00\xffk",
        "headers": {"trace": "abc", "blob": b"\x01\x02"},
        "tags": ["vip", "eu"],
        "partition": 3,
        "delay": 4.35,
        "ttl": 60,
    }
    topic, key, partition, record = through_the_wire(b"\xde\xad", options)
    assert (topic, key, partition) == ("t", b"\x00\xffk", 3)
    assert (record.value, record.key) == (b"\xde\xad", b"\x00\xffk")
    assert record.headers == [("trace", "abc"), ("blob", b"\x01\x02")]
    assert record.tags == ("vip", "eu")
    # 4.35 s is 4350 ms exactly (not 4349 from 4.35 * 1000 truncated); the ttl counts
    # from delivery.
    assert record.deliver_at == NOW + 4_350
    assert record.expires_at == NOW + 4_350 + 60_000


def test_an_absolute_deliver_at_is_kept() -> None:
    _, key, _, record = through_the_wire("x", {"key": "text", "deliver_at": NOW + 5, "ttl": 0.5})
    assert (key, record.key) == ("text", "text")
    assert (record.deliver_at, record.expires_at) == (NOW + 5, NOW + 5 + 500)


def test_a_message_without_a_sequence_is_stored_without_a_producer_id() -> None:
    _, _, _, record = through_the_wire(1, {}, sequence=None)
    assert (record.producer_id, record.sequence) == (None, None)


@pytest.mark.parametrize("producer_id", ['we"ird\\id', "line\nbreak", "é", "}]"])
def test_any_producer_id_makes_a_valid_frame(producer_id: str) -> None:
    frame = encode_publish_frame(7, "1", producer_id, "t", None, [b'{"value":1}'])
    parsed = orjson.loads(frame)
    assert parsed == {
        "op": "publish",
        "id": 7,
        "acks": "1",
        "producer_id": producer_id,
        "topic": "t",
        "partition": None,
        "records": [{"value": 1}],
    }
    assert check_publish_frame(parsed) == ("1", producer_id, "t", None, [{"value": 1}])


@pytest.mark.parametrize(
    ("options", "error", "what"),
    [
        ({"delay": -1}, InvalidArgumentError, "delay must be at least 0"),
        ({"delay": float("nan")}, InvalidArgumentError, "delay must be at least 0"),
        ({"delay": "soon"}, InvalidArgumentError, "delay must be at least 0"),
        ({"ttl": 0}, InvalidArgumentError, "ttl must be more than 0"),
        ({"delay": 1, "deliver_at": NOW}, InvalidArgumentError, "not both"),
        ({"deliver_at": "tomorrow"}, InvalidArgumentError, "deliver_at must be"),
        ({"key": 5}, SerializationError, "a key must be"),
        ({"tags": ["ok", ""]}, SerializationError, "a tag must be"),
        # Not "a tag must be a non-empty string, not 97" (bytes taken as numbers).
        (
            {"tags": b"ab"},
            SerializationError,
            "tags must be a string or a list of strings, not bytes",
        ),
        ({"tags": {"a": 1}}, SerializationError, "a list of strings, not dict"),
        ({"tags": 5}, SerializationError, "a list of strings, not int"),
        ({"headers": {"h": 1}}, SerializationError, "str or bytes value"),
        ({"bogus": 1}, TypeError, "bogus"),
    ],
)
def test_bad_options_fail_in_the_caller(
    options: dict[str, Any], error: type[Exception], what: str
) -> None:
    with pytest.raises(error, match=what):
        encode_publish_message("t", 1, options, sequence=0, producer_id="p")  # type: ignore[arg-type]


BASE = {"key": None, "value": 1, "headers": []}


@pytest.mark.parametrize(
    "raw",
    [
        # deliver_at that is not a number, with a ttl to add to it: a TypeError once, which
        # stopped the PublisherBroker.
        {**BASE, "deliver_at": "tomorrow", "ttl_ms": 5},
        {**BASE, "deliver_at": True, "ttl_ms": 5},
        {**BASE, "delay_ms": "5"},
        {**BASE, "deliver_at": NOW, "delay_ms": 5},
        {**BASE, "ttl_ms": 0},
        {**BASE, "headers": [["h", "AAA", "hex"]]},
        {**BASE, "headers": [["h", "***", "b64"]]},
        {**BASE, "headers": [["h", 5]]},
        {**BASE, "headers": [["", "v"]]},
        {**BASE, "headers": "h"},
        {**BASE, "headers": [["x-spoolmq-priority", "10"]]},  # one digit only
        {**BASE, "headers": [["x-spoolmq-priority", "OQ==", "b64"]]},  # text only
        {"key_b64": 5, "value": 1, "headers": []},
        {"key": 5, "value": 1, "headers": []},
        {"key": None, "value_b64": "***", "headers": []},
        {**BASE, "tags": "vip"},
        {**BASE, "tags": []},
        {**BASE, "tags": ["ok", ""]},
        {**BASE, "extra": 1},
        {"value": 1, "key": None, "headers": []},  # out of the store's order
        {"value": 1, "headers": []},  # no key field
        {"key": None, "value": 1, "value_b64": "AA==", "headers": []},
        {"key": None, "value": 1},  # no headers
        {**BASE, "sequence": 1},  # a sequence without a producer id
        {**BASE, "sequence": -1, "producer_id": "p"},
        {**BASE, "sequence": True, "producer_id": "p"},
        {**BASE, "sequence": 1, "producer_id": "another"},  # not the frame's producer
        {**BASE, "value": "x" * 2_000},  # too large
        ["t", 1],
    ],
)
def test_bad_records_are_refused_with_a_per_record_error(raw: Any) -> None:
    with pytest.raises(SpoolError):
        check_record(raw, "p", NOW, 1_500)


def test_what_is_stored_is_what_was_checked() -> None:
    """The broker stores its own dump of the parsed record: duplicate keys and padding a
    client sent do not reach the segment."""
    frame = (
        b'{"op":"publish","id":1,"topic":"t","records":[{"key":null, "value":1,'
        b'"value":2,"headers":[]}]}'
    )
    _, producer_id, _, _, [raw] = check_publish_frame(orjson.loads(frame))
    checked = check_record(raw, producer_id, NOW, 1_000_000)
    assert checked.body == b'"key":null,"value":2,"headers":[]'


def test_the_common_record_and_the_general_path_store_the_same_bytes() -> None:
    """A record the fast check takes is stored exactly as the store's own encoder writes it."""
    from spoolmq.store.message import Message
    from spoolmq.store.record import encode_message

    for key in (None, "customer-7"):
        body, _, _ = encode_publish_message(
            "t", {"id": 1, "é": [1.5, None]}, {"key": key}, sequence=9, producer_id="p"
        )
        checked = check_record(orjson.loads(body), "p", NOW, 1_000_000)
        expected = encode_message(
            Message({"id": 1, "é": [1.5, None]}, key=key, producer_id="p", sequence=9)
        )
        assert checked.body == expected.body
        assert checked.identity == (None if key is None else f"s:{key}")


def test_a_priority_arrives_as_its_reserved_header() -> None:
    _, _, _, record = through_the_wire("x", {"priority": 9, "headers": {"trace": "t"}})
    assert record.headers == [("trace", "t"), ("x-spoolmq-priority", "9")]
    _, _, _, record = through_the_wire("x", {"priority": 0})
    assert record.headers == []
    raw = {**BASE, "headers": [["x-spoolmq-priority", "4"]]}
    assert check_record(raw, None, NOW, 10_000).extra == [None, None, None, True]


def test_extras_tell_the_consumer_broker_what_a_record_has() -> None:
    checked = check_record({**BASE, "tags": ["vip"], "delay_ms": 10}, None, NOW, 1_000_000)
    assert checked.extra == [NOW + 10, None, ["vip"], False]
    assert check_record({**BASE, "headers": [["a", "b"]]}, None, NOW, 10_000).extra == [
        None,
        None,
        None,
        True,
    ]
    assert check_record(BASE, None, NOW, 10_000).extra is None


def test_a_frames_records_are_checked_alike_inline_and_one_by_one() -> None:
    """``check_records`` takes the common record inline: what it stores and refuses is what
    ``check_record`` stores and refuses for each record."""
    records: list[Any] = [
        {"key": None, "value": {"n": 1}, "headers": [], "sequence": 1, "producer_id": "p"},
        {"key": "k", "value": [1.5], "headers": [], "sequence": 2, "producer_id": "p"},
        {"key": 5, "value": 1, "headers": [], "sequence": 3, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": 4, "producer_id": "q"},
        {"key": None, "value": 1, "headers": [], "sequence": 10**30, "producer_id": "p"},
        {"key": None, "value": "x" * 3_000, "headers": [], "sequence": 6, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [["h", "v"]], "sequence": 7, "producer_id": "p"},
        {"key_b64": "AAE=", "value": 1, "headers": [], "tags": ["t"], "delay_ms": 5},
        "nope",
    ]
    checked = _assert_checked_as_one_by_one(records)
    assert checked.errors is not None and sorted(checked.errors) == [2, 3, 4, 5, 8]


def _assert_checked_as_one_by_one(records: list[Any]) -> Any:
    """``check_records`` of the frame stores and refuses what ``check_record`` stores and
    refuses of each record; returns what ``check_records`` gave."""
    from spoolmq.protocol.publish import check_records

    checked = check_records(records, "p", NOW, 2_000)
    for index, record in enumerate(records):
        try:
            one = check_record(record, "p", NOW, 2_000)
        except SpoolError as exc:
            assert checked.errors is not None
            assert type(checked.errors[index]) is type(exc)
            assert checked.bodies[index] is None
            continue
        assert checked.errors is None or index not in checked.errors
        assert checked.bodies[index] == one.body
        assert (checked.keys[index], checked.identities[index]) == (one.key, one.identity)
        assert checked.sequences[index] == one.sequence
        assert type(checked.sequences[index]) is type(one.sequence)
        assert (checked.extras or {}).get(index) == one.extra
    return checked


def _common(sequence: int, key: str | None = None, value: Any = None) -> dict[str, Any]:
    value = {"n": sequence} if value is None else value
    return {"key": key, "value": value, "headers": [], "sequence": sequence, "producer_id": "p"}


@pytest.mark.parametrize(
    "spoiler",
    [
        None,  # every record the common one: the frame is checked a field at a time
        ["key", "value", "headers", "sequence", "producer_id"],  # its tuple is _COMMON's
        "key",
        7,
        {"value": 1, "key": None, "headers": [], "sequence": 9, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [["h", "v"]], "sequence": 9, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": True, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": 9.0, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": -1, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": 2**64, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": 9, "producer_id": "q"},
        {"key": None, "value": 1, "headers": [], "sequence": 9, "producer_id": None},
        {"key": 5, "value": 1, "headers": [], "sequence": 9, "producer_id": "p"},
        {"key": None, "value": 1, "headers": [], "sequence": 9},
        {"key": None, "value": 1, "headers": [], "sequence": 9, "producer_id": "p", "x": 1},
        _common(9, value="x" * 3_000),
        _common(9, value=functools.reduce(lambda inner, _: [inner], range(300), 0)),
        _common(9, key="k"),
    ],
)
def test_a_common_frame_is_checked_alike_at_once_and_one_by_one(spoiler: Any) -> None:
    """``check_records`` checks a frame of common records a field at a time over the
    frame: one record that is not (anywhere in it) sends the frame through the loop, and
    what is stored and refused is what ``check_record`` stores and refuses per record."""
    for at in (0, 3, 7):
        records: list[Any] = [_common(n, key="k" if n == 5 else None) for n in range(8)]
        if spoiler is not None:
            records[at] = spoiler
        _assert_checked_as_one_by_one(records)


@pytest.mark.parametrize(
    ("value", "options"),
    [
        (float("nan"), {}),
        ({"a": [1, float("inf")]}, {}),
        ([None, float("-inf")], {"key": "null"}),
        (float("nan"), {"key": b"k"}),
    ],
)
def test_nan_and_infinity_fail_in_the_caller(value: Any, options: PublishOptions) -> None:
    """orjson would write them as null: the client refuses them, keyless or not."""
    with pytest.raises(SerializationError, match="NaN or infinity"):
        encode_publish_message("t", value, options, sequence=0, producer_id="p")


@pytest.mark.parametrize(
    ("value", "options"),
    [
        ({"order": 1}, {}),
        (b"\x00\xff", {}),
        ("text", {"key": "k", "headers": {"h": "v"}, "tags": ["a"], "priority": 3}),
        ([1, 2], {"partition": 2, "delay": 1.5, "ttl": 60}),
    ],
)
def test_numbering_a_body_later_gives_the_bytes_of_numbering_it_first(
    value: Any, options: Any
) -> None:
    """publish_many encodes every value first and numbers each frame as it queues it."""
    late, _, _ = encode_publish_message("t", value, options, sequence=None)
    first, _, _ = encode_publish_message("t", value, options, sequence=41, producer_id='p-"1')
    assert numbered(late, 41, orjson.dumps('p-"1')) == first


def _checked(*records: bytes, **head: Any) -> bytes:
    """A pre-checked frame of two records (or ``records``) with its head's fields replaced by
    ``head``."""
    fields: dict[str, Any] = {
        "op": "publish_checked",
        "id": 1,
        "acks": "all",
        "producer_id": "kafka-1.0.t.0",
        "topic": "t",
        "partition": 0,
        "count": 2,
        "first_sequence": 5,
        "identities": None,
        "headed": None,
    }
    fields.update(head)
    return b"\n".join((orjson.dumps(fields), *(records or _TWO)))


_NUMBERED_BY = b',"headers":[],"sequence":%d,"producer_id":"kafka-1.0.t.0"'
_TWO = (b'"key":null,"value":1' + _NUMBERED_BY % 5, b'"key":null,"value":2' + _NUMBERED_BY % 6)


def test_a_pre_checked_frame_whose_head_and_records_disagree_is_a_protocol_error() -> None:
    """Only the broker's own Kafka child sends the form, but a frame whose parts disagree
    (a bug, a truncation) fails as a whole, never stores records under the wrong sequence."""
    from spoolmq.errors import ProtocolError
    from spoolmq.protocol.publish import decode_checked_frame

    head, checked = decode_checked_frame(_checked())
    assert head["topic"] == "t"
    assert checked.bodies == list(_TWO)
    assert checked.sequences == [5, 6]
    assert (checked.extras, checked.errors) == (None, None)
    assert decode_checked_frame(_checked(headed=[1]))[1].extras == {1: [None, None, None, True]}
    for bad in (
        {"count": 3},
        {"count": 1},
        {"partition": None},
        {"first_sequence": -1},
        {"first_sequence": "5"},
        {"identities": ["s:a"]},
        {"identities": "s:a"},
        {"headed": [2]},
        {"headed": [-1]},
        {"headed": ["0"]},
        {"op": "publish"},
        {"identities": [5, None]},  # the ConsumerBroker's notice takes each for text
        {"identities": ["x:a", None]},
        {"first_sequence": 6},  # the records say 5 and 6
        {"first_sequence": None},
        {"producer_id": "kafka-2.0.t.0"},
        {"first_sequence": 2**63 - 1},  # the last would be past 2**63 - 1
    ):
        with pytest.raises(ProtocolError):
            decode_checked_frame(_checked(**bad))
    for records in (
        (_TWO[0], b""),  # an empty record: an unreadable line
        (_TWO[0], b'"value":2,"key":null' + _NUMBERED_BY % 6),  # not a record's start
        (_TWO[0], b'"key":null,"value":2,"headers":[]'),  # not numbered
    ):
        with pytest.raises(ProtocolError):
            decode_checked_frame(_checked(*records))
    unnumbered = (b'"key":null,"value":1,"headers":[]', b'"key":"k","value":2,"headers":[]')
    checked = decode_checked_frame(
        _checked(*unnumbered, first_sequence=None, identities=[None, "s:k"])
    )[1]
    assert checked.sequences == [None, None] and checked.identities == [None, "s:k"]
    with pytest.raises(ProtocolError):
        decode_checked_frame(b'{"op":"publish_checked",\n"key":null')  # a head cut short
    with pytest.raises(ProtocolError):
        decode_checked_frame(orjson.dumps({"op": "publish_checked", "partition": 0, "count": 0}))


@pytest.mark.parametrize("common", [True, False])
def test_a_sequence_past_what_state_db_holds_is_refused_per_record(common: bool) -> None:
    """A sequence from 2**63 on dumps as JSON (orjson writes up to 2**64 - 1) but cannot go
    into state.db's producer runs: stored, every producer's runs stopped being saved. It is
    a per-record error, in the common frame (every record a Publisher's) and in any other."""
    from spoolmq.errors import InvalidArgumentError
    from spoolmq.protocol.publish import check_records

    def record(sequence: int) -> dict[str, Any]:
        fields: dict[str, Any] = {"key": None, "value": 1, "headers": []}
        if not common:
            fields["tags"] = ["t"]
        return fields | {"sequence": sequence, "producer_id": "p"}

    checked = check_records([record(2**63 - 1), record(2**63)], "p", NOW, 1 << 20)
    assert checked.sequences[0] == 2**63 - 1 and checked.bodies[0] is not None
    assert checked.errors is not None and set(checked.errors) == {1}
    assert isinstance(checked.errors[1], InvalidArgumentError)
    assert checked.bodies[1] is None


def test_the_embedded_store_refuses_a_sequence_past_2_63(tmp_path: Any) -> None:
    from spoolmq.errors import InvalidArgumentError
    from spoolmq.store import Store

    with Store(tmp_path / "d") as store:
        with pytest.raises(InvalidArgumentError, match="2\\*\\*63"):
            store.append("t", 1, producer_id="p", sequence=2**63)
        assert store.append("t", 1, producer_id="p", sequence=2**63 - 1).offset == 0
