"""The publish message codec, both ends with no processes: what the client encodes, the broker
decodes into the record the store writes; the client refuses bad options in the caller; the
broker refuses bad messages with a per-message error, never an exception that would stop it."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from spoolmq.errors import InvalidArgumentError, SerializationError, SpoolError
from spoolmq.protocol.publish import (
    check_publish_frame,
    decode_publish_message,
    encode_publish_frame,
    encode_publish_message,
)
from spoolmq.store.message import PublishOptions
from spoolmq.store.record import decode_line, frame_record

NOW = 1_700_000_000_000


def through_the_wire(
    value: Any, options: PublishOptions, *, sequence: int | None = 4
) -> tuple[str, Any, int | None, Any]:
    """Encode as the client does, parse as the broker does, decode; and read the record back."""
    frame = encode_publish_frame(
        1, "all", "p-1", [encode_publish_message("t", value, options, sequence=sequence)]
    )
    _, producer_id, [raw] = check_publish_frame(orjson.loads(frame))
    topic, key, partition, encoded = decode_publish_message(
        raw, producer_id, now=NOW, max_bytes=1_000_000
    )
    record = decode_line(frame_record(10, NOW, encoded.body))
    return topic, key, partition, record


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
    frame = encode_publish_frame(7, "1", producer_id, [b'{"topic":"t","value":1}'])
    parsed = orjson.loads(frame)
    assert parsed == {
        "op": "publish",
        "id": 7,
        "acks": "1",
        "producer_id": producer_id,
        "messages": [{"topic": "t", "value": 1}],
    }
    assert check_publish_frame(parsed) == ("1", producer_id, [{"topic": "t", "value": 1}])


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
        ({"headers": {"h": 1}}, SerializationError, "str or bytes value"),
        ({"bogus": 1}, TypeError, "bogus"),
    ],
)
def test_bad_options_fail_in_the_caller(
    options: dict[str, Any], error: type[Exception], what: str
) -> None:
    with pytest.raises(error, match=what):
        encode_publish_message("t", 1, options, sequence=0)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "raw",
    [
        # deliver_at that is not a number, with a ttl to add to it: a TypeError once, which
        # stopped the PublisherBroker.
        {"topic": "t", "value": 1, "deliver_at": "tomorrow", "ttl_ms": 5},
        {"topic": "t", "value": 1, "deliver_at": True, "ttl_ms": 5},
        {"topic": "t", "value": 1, "delay_ms": "5"},
        {"topic": "t", "value": 1, "delay_ms": 5, "deliver_at": NOW},
        {"topic": "t", "value": 1, "ttl_ms": 0},
        {"topic": "t", "value": 1, "headers": [["h", "AAA", "hex"]]},
        {"topic": "t", "value": 1, "headers": [["h", "***", "b64"]]},
        {"topic": "t", "value": 1, "headers": "h"},
        {"topic": "t", "key_b64": 5},
        {"topic": "t", "value": 1, "tags": "vip", "extra": 1},
    ],
)
def test_bad_messages_are_refused_with_a_per_message_error(raw: dict[str, Any]) -> None:
    with pytest.raises(SpoolError):
        decode_publish_message(raw, "p", now=NOW, max_bytes=1_000_000)
