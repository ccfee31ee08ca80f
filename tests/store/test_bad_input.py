"""Bad input raises a specific error that says what is allowed, and writes nothing."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from store_helpers import tree_snapshot

from spoolmq import Message, Store
from spoolmq.clock import ManualClock
from spoolmq.config import DAY_MS
from spoolmq.errors import (
    ConfigError,
    InvalidArgumentError,
    InvalidTopicError,
    MessageTooLargeError,
    OffsetOutOfRangeError,
    SerializationError,
    SpoolError,
    UnknownPartitionError,
    UnknownTopicError,
)


@pytest.mark.parametrize(
    "name",
    [
        "",
        ".hidden",
        "-x",
        "a/b",
        "../etc",
        "a b",
        "é",
        "x" * 129,
        "a\x00b",
        7,
        None,
        "x" * 129 + ".dlq",
        ".dlq",
        "a/b.dlq",
    ],
)
def test_invalid_topic_names_are_refused_before_any_path(
    store: Store, data_dir: Path, name: Any
) -> None:
    before = tree_snapshot(data_dir)
    with pytest.raises(InvalidTopicError, match="A-Z a-z 0-9"):
        store.append(name, {"n": 1})
    with pytest.raises(InvalidTopicError):
        store.create_topic(name)
    with pytest.raises(InvalidTopicError):
        store.reader(name, 0)
    assert tree_snapshot(data_dir) == before


# The DLQ of a 128-character name, and the DLQ of a DLQ: dead letters must go somewhere.
@pytest.mark.parametrize(
    "name", ["a", "A.b_c-9", "0" * 128, "orders.dlq", "0" * 128 + ".dlq", "0" * 128 + ".dlq.dlq"]
)
def test_valid_topic_names_are_accepted(store: Store, name: str) -> None:
    assert store.append(name, 1).topic == name


class Unserialisable:
    pass


@pytest.mark.parametrize(
    ("value", "what"),
    [
        (math.nan, "NaN"),
        ({"deep": [1.0, math.inf]}, "NaN or infinity"),
        ({1, 2}, "set"),
        ({1: "x"}, "key must be str"),
        ({"x": "\ud800"}, "surrogates"),
        ("\udfff lone", "surrogates"),
        (Unserialisable(), "not JSON serializable"),
        (2**64, "64-bit"),
        ({"raw": b"bytes inside JSON"}, "JSON"),
    ],
)
@pytest.mark.parametrize("topic_exists", [True, False])
def test_unserialisable_values_write_nothing(
    store: Store, data_dir: Path, value: Any, what: str, topic_exists: bool
) -> None:
    if topic_exists:
        store.create_topic("orders", partitions=2)
        store.append("orders", "before")
    before = tree_snapshot(data_dir)
    with pytest.raises(SerializationError, match=what):
        store.append("orders", value)
    # a good message in the same batch is not written either
    with pytest.raises(SerializationError):
        store.append_batch("orders", [Message("fine"), Message(value)])
    assert tree_snapshot(data_dir) == before
    if topic_exists:
        # the failed appends took no round-robin turn: "before" went to 0, next is 1
        assert store.append("orders", "after").partition == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "what"),
    [
        ({"key": 12}, SerializationError, "key must be str, bytes or None"),
        ({"key": "\ud800"}, SerializationError, "surrogates"),
        ({"headers": {"h": 1}}, SerializationError, "str or bytes value"),
        ({"headers": [("", "v")]}, SerializationError, "non-empty string"),
        ({"tags": ["ok", 3]}, SerializationError, "tag must be a non-empty string"),
        ({"sequence": -1, "producer_id": "p"}, InvalidArgumentError, "whole number from 0 to"),
        ({"sequence": 2**63, "producer_id": "p"}, InvalidArgumentError, "whole number from 0 to"),
        ({"producer_id": ""}, InvalidArgumentError, "non-empty string"),
        ({"delay": -1}, InvalidArgumentError, "at least 0"),
        ({"ttl": 0}, InvalidArgumentError, "more than 0"),
        ({"acks": "2"}, InvalidArgumentError, "'0', '1' or 'all'"),
        ({"partition": 2}, UnknownPartitionError, "partitions 0 to 1"),
        ({"partition": -1}, UnknownPartitionError, "partitions 0 to 1"),
        ({"partition": True}, UnknownPartitionError, "no partition"),
    ],
)
def test_bad_arguments_write_nothing(
    store: Store, data_dir: Path, kwargs: dict[str, Any], error: type[SpoolError], what: str
) -> None:
    store.create_topic("orders", partitions=2)
    before = tree_snapshot(data_dir)
    with pytest.raises(error, match=what):
        store.append("orders", {"n": 1}, **kwargs)
    assert tree_snapshot(data_dir) == before


def test_bad_partition_on_a_new_topic_creates_no_topic(store: Store, data_dir: Path) -> None:
    before = tree_snapshot(data_dir)
    with pytest.raises(UnknownPartitionError, match="partitions 0 to 0"):
        store.append("fresh", 1, partition=1)
    assert "fresh" not in store.topics()
    assert tree_snapshot(data_dir) == before


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"lock_timeout_s": "30"}, "lock_timeout_s must be a positive number, not '30'"),
        ({"busy_timeout_ms": 0}, "busy_timeout_ms must be a positive number, not 0"),
        ({"lock_timeout_s": math.nan}, "lock_timeout_s must be a positive number, not nan"),
        ({"auto_create_topics": "no"}, "auto_create_topics must be True or False, not 'no'"),
        ({"max_message_bytes": "1 GiB"}, "max_message_bytes must be from 64 to"),
        ({"index_interval_bytes": 8}, "index_interval_bytes must be at least 64, not 8"),
        ({"bogus": 1}, "bogus"),
    ],
)
def test_bad_store_settings_are_refused_before_anything_is_opened(
    tmp_path: Path, settings: dict[str, Any], expected: str
) -> None:
    """A setting of the wrong type was a TypeError from deep inside (comparing a string with
    0), or nothing at all until the store used it."""
    with pytest.raises(ConfigError, match=re.escape(expected)):
        Store(tmp_path / "q", config=settings)
    assert not (tmp_path / "q").exists()


@pytest.mark.parametrize("limit", [1024, 4096])
def test_message_over_the_size_limit(data_dir: Path, limit: int) -> None:
    with Store(data_dir, config={"max_message_bytes": limit}) as store:
        store.append("orders", "x" * (limit // 2))
        before = tree_snapshot(data_dir)
        with pytest.raises(MessageTooLargeError, match=f"limit of {limit} bytes"):
            store.append("orders", "x" * limit)
        assert tree_snapshot(data_dir) == before


def test_default_size_limit_is_one_mebibyte(store: Store) -> None:
    store.append("big", "x" * (1024 * 1024 - 500))
    with pytest.raises(MessageTooLargeError, match="1048576"):
        store.append("big", "x" * (1024 * 1024))


@pytest.fixture
def filled(store: Store) -> Store:
    store.create_topic("orders", partitions=2, segment_bytes=1024)
    for i in range(30):
        store.append("orders", {"i": i}, partition=0)
    return store


@pytest.mark.parametrize("offset", [-1, 31, 10**6])
def test_offsets_outside_the_log(filled: Store, data_dir: Path, offset: int) -> None:
    before = tree_snapshot(data_dir)
    with pytest.raises(OffsetOutOfRangeError, match=r"valid offsets are 0 \(log start\) to 30"):
        filled.reader("orders", 0, offset=offset)
    assert tree_snapshot(data_dir) == before


def test_offset_below_the_log_start_after_retention(filled: Store, clock: ManualClock) -> None:
    clock.advance(15 * DAY_MS)  # past the default retention of 14 days
    filled.enforce_retention("orders")
    start = filled.log_start_offset("orders", 0)
    assert start > 0
    with pytest.raises(OffsetOutOfRangeError, match=f"valid offsets are {start}"):
        filled.reader("orders", 0, offset=start - 1)
    assert filled.reader("orders", 0, offset=start).poll().offset == start  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("call", "error", "what"),
    [
        (lambda store: store.reader("orders", 2), UnknownPartitionError, "partitions 0 to 1"),
        (lambda store: store.reader("orders", -1), UnknownPartitionError, "no partition -1"),
        (lambda store: store.reader("nope", 0), UnknownTopicError, "'nope' does not exist"),
        (
            lambda store: store.reader("orders", 0, offset="middle"),
            InvalidArgumentError,
            "earliest",
        ),
        (lambda store: store.log_end_offset("orders", 5), UnknownPartitionError, "no partition 5"),
        (lambda store: store.alter_topic("orders", partitions=3), InvalidArgumentError, "cannot"),
    ],
)
def test_bad_reads_raise_specific_errors(
    filled: Store, data_dir: Path, call: Callable[[Store], Any], error: type[SpoolError], what: str
) -> None:
    before = tree_snapshot(data_dir)
    with pytest.raises(error, match=what):
        call(filled)
    assert tree_snapshot(data_dir) == before
