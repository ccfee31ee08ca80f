"""The publish frame's wire form, both ways: the Publisher client encodes each message and
the frame here, the PublisherBroker checks the frame and decodes each message here, straight
into the store's encoded form (docs/PROTOCOL.md, "Publishing").

A message on the wire is the store's record fields with relative timing: ``delay_ms`` and
``ttl_ms`` instead of ``deliver_at``/``expires_at`` (the broker's clock fixes them), and no
producer id (it is the frame's). Validation, base64 and timing rules are the store's own
(``spoolmq.store.record``), so a message is judged the same way whichever path it takes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from spoolmq.errors import ProtocolError, SerializationError, SpoolError
from spoolmq.store.message import (
    Acks,
    Message,
    PublishOptions,
    check_options,
    check_timing,
    normalize_acks,
    schedule,
    seconds_to_ms,
)
from spoolmq.store.names import check_topic
from spoolmq.store.record import (
    RECORD_OVERHEAD,
    EncodedMessage,
    common_fields,
    decode_headers,
    encode_message,
    from_base64,
    has_non_finite,
    normalize_headers,
    normalize_tags,
    to_base64,
)

# Every field a message of a publish frame may have.
WIRE_FIELDS = frozenset(
    {
        "topic",
        "value",
        "value_b64",
        "key",
        "key_b64",
        "headers",
        "tags",
        "partition",
        "delay_ms",
        "deliver_at",
        "ttl_ms",
        "sequence",
    }
)

# What the common message has: a topic, a JSON value, maybe a text key, and the sequence
# every Publisher client sends. The broker encodes it without building a Message.
_COMMON_FIELDS = frozenset({"topic", "value", "key", "sequence"})


# -- the client's end ---------------------------------------------------------------------


def encode_publish_message(
    topic: str, value: Any, options: PublishOptions, *, sequence: int | None
) -> bytes:
    """One message of a publish frame as JSON bytes, checked here so that bad input fails
    in the caller rather than in the broker."""
    message: dict[str, Any] = {"topic": check_topic(topic)}
    if isinstance(value, bytes | bytearray | memoryview):
        message["value_b64"] = to_base64(bytes(value))
    else:
        message["value"] = value
    if options:
        check_options(options)
        _encode_options(message, options)
    if sequence is not None:
        message["sequence"] = sequence
    try:
        body = orjson.dumps(message)
    except TypeError as exc:
        raise SerializationError(f"value can't be sent as JSON: {exc}") from None
    if b"null" in body and has_non_finite(value):
        raise SerializationError("value contains NaN or infinity, which JSON can't represent")
    return body


def _encode_options(message: dict[str, Any], options: PublishOptions) -> None:
    key = options.get("key")
    if isinstance(key, bytes | bytearray):
        message["key_b64"] = to_base64(bytes(key))
    elif key is not None:
        if not isinstance(key, str):
            raise SerializationError(f"a key must be str, bytes or None, not {type(key).__name__}")
        message["key"] = key
    headers = options.get("headers")
    if headers:
        message["headers"] = normalize_headers(headers)
    tags = options.get("tags")
    if tags:
        message["tags"] = normalize_tags(tags)
    partition = options.get("partition")
    if partition is not None:
        message["partition"] = partition
    delay, deliver_at, ttl = options.get("delay"), options.get("deliver_at"), options.get("ttl")
    check_timing(delay, deliver_at, ttl)
    if delay is not None:
        message["delay_ms"] = seconds_to_ms(delay)
    if deliver_at is not None:
        message["deliver_at"] = deliver_at
    if ttl is not None:
        message["ttl_ms"] = seconds_to_ms(ttl)


def encode_publish_frame(
    frame_id: int, acks: str, producer_id: str, messages: Sequence[bytes]
) -> bytes:
    """A publish frame around messages already encoded by ``encode_publish_message``."""
    head = orjson.dumps({"op": "publish", "id": frame_id, "acks": acks, "producer_id": producer_id})
    return b'%s,"messages":[%s]}' % (head[:-1], b",".join(messages))


# -- the broker's end ---------------------------------------------------------------------


def check_publish_frame(frame: dict[str, Any]) -> tuple[Acks, str | None, list[Any]]:
    """The ACK level, producer id and messages of a publish frame; ProtocolError (or
    InvalidArgumentError for the ACK level) if the frame itself is wrong."""
    acks = normalize_acks(frame.get("acks", "all"))
    messages = frame.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("a publish frame needs a non-empty 'messages' list")
    producer_id = frame.get("producer_id")
    if producer_id is not None and not isinstance(producer_id, str):
        raise ProtocolError("producer_id must be a string")
    return acks, producer_id, messages


def decode_publish_message(
    raw: Any, producer_id: str | None, *, now: int, max_bytes: int
) -> tuple[str, str | bytes | None, int | None, EncodedMessage]:
    """(topic, key, partition asked for, encoded message) of one message of a publish frame,
    validated; SpoolError (a per-message error) if it is wrong. ``now`` fixes its timing."""
    common = encode_common_message(raw, producer_id, max_bytes)
    if common is not None:
        topic, key, encoded = common
        return topic, key, None, encoded
    topic, message = message_from_wire(raw, producer_id, now)
    encoded = encode_message(message, max_bytes=max_bytes, parsed_json=True)
    return topic, message.key, message.partition, encoded


def encode_common_message(
    raw: Any, producer_id: str | None, max_bytes: int
) -> tuple[str, str | None, EncodedMessage] | None:
    """(topic, key, encoded) for the common message of a publish frame, encoded straight
    from the parsed frame; None for any other message and for anything wrong, which
    ``message_from_wire`` then handles or refuses. Building a Message and checking every
    optional field was half of the broker's work per message."""
    if type(raw) is not dict or not _COMMON_FIELDS.issuperset(raw):
        return None
    topic, key, sequence = raw.get("topic"), raw.get("key"), raw.get("sequence")
    if type(topic) is not str or (key is not None and type(key) is not str):
        return None
    if sequence is None:
        producer_id = None  # as in message_from_wire: no sequence, no idempotence
    elif type(sequence) is not int or sequence < 0 or not producer_id:
        return None
    try:
        check_topic(topic)
        body = orjson.dumps(common_fields(key, raw.get("value"), sequence, producer_id))
    except (SpoolError, TypeError):
        return None
    if len(body) + RECORD_OVERHEAD > max_bytes:
        return None
    return topic, key, EncodedMessage(body[1:-1], producer_id, sequence)


def message_from_wire(raw: Any, producer_id: str | None, now: int) -> tuple[str, Message]:
    """Validate one message of a publish frame and build the store's Message."""
    if not isinstance(raw, dict):
        raise ProtocolError("each message must be a JSON object")
    if not WIRE_FIELDS.issuperset(raw):
        unknown = set(raw) - WIRE_FIELDS
        raise ProtocolError(f"unknown message field(s): {', '.join(sorted(unknown))[:200]}")
    topic = check_topic(raw.get("topic"))
    value: Any = raw.get("value")
    if "value_b64" in raw:
        value = from_base64(raw["value_b64"], "value_b64", SerializationError)
    key: Any = raw.get("key")
    if "key_b64" in raw:
        key = from_base64(raw["key_b64"], "key_b64", SerializationError)
    delay_ms, deliver_at, ttl_ms = raw.get("delay_ms"), raw.get("deliver_at"), raw.get("ttl_ms")
    expires_at = None
    if delay_ms is not None or deliver_at is not None or ttl_ms is not None:
        delay, ttl = _ms_to_seconds(delay_ms), _ms_to_seconds(ttl_ms)
        deliver_at, expires_at = schedule(delay, deliver_at, ttl, now)
    sequence = raw.get("sequence")
    return topic, Message(
        value=value,
        key=key,
        headers=decode_headers(raw.get("headers"), SerializationError),
        tags=raw.get("tags"),
        deliver_at=deliver_at,
        expires_at=expires_at,
        producer_id=producer_id if sequence is not None else None,
        sequence=sequence,
        partition=raw.get("partition"),
    )


def _ms_to_seconds(ms: Any) -> Any:
    """``delay_ms``/``ttl_ms`` in seconds for ``schedule``; anything else as it is, for
    ``check_timing`` to refuse."""
    if isinstance(ms, int | float) and not isinstance(ms, bool):
        return ms / 1000
    return ms
