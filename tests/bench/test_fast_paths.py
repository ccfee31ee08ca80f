"""The shortcuts taken on the hot paths behave exactly like the general code they skip.

Each test compares a fast path with what the general path (or the standard library) does,
or checks that input the fast path must refuse still is refused.
"""

from __future__ import annotations

import dataclasses
import datetime
import gc
import threading
import uuid
import weakref
from concurrent.futures import FIRST_COMPLETED, as_completed, wait
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from json_strategies import JSON_VALUES
from spoolmq.client.common import delivered_messages, encode_many
from spoolmq.client.publisher import _PublishFuture
from spoolmq.errors import (
    InvalidArgumentError,
    InvalidTopicError,
    ProtocolError,
    SerializationError,
)
from spoolmq.protocol.publish import encode_publish_message, plain_body
from spoolmq.store.message import Message, Position
from spoolmq.store.names import check_topic
from spoolmq.store.record import encode_message, message_fields
from spoolmq.testing import wait_until

POSITION = Position("t", 0, 7, 1000)


def test_publish_future_resolved_untouched_gives_its_result() -> None:
    future = _PublishFuture()
    future.resolve(POSITION, None)
    assert future.done()
    assert future.result(timeout=0) == POSITION
    assert future.exception(timeout=0) is None


def test_publish_future_resolved_with_an_error_raises_it() -> None:
    future = _PublishFuture()
    future.resolve(None, ValueError("refused"))
    with pytest.raises(ValueError, match="refused"):
        future.result(timeout=0)
    assert isinstance(future.exception(timeout=0), ValueError)


def test_a_publish_future_that_raised_is_freed_at_once() -> None:
    """result() raising a future's error leaves no cycle (the traceback's frame holding
    the future, which holds the error): the future and its message's bytes go when the
    last reference does, not at the next collection, as with Future's own result()."""
    gc.disable()
    try:
        for watched in (False, True):
            future = _PublishFuture(body=b"x" * 1000)
            if watched:
                future.add_done_callback(lambda _: None)
            future.resolve(None, ValueError("refused"))
            with pytest.raises(ValueError, match="refused"):
                future.result()
            gone = weakref.ref(future)
            del future
            assert gone() is None, watched
    finally:
        gc.enable()


def test_an_answered_publish_future_is_read_without_a_condition() -> None:
    """result() and exception() of an answered future read it as Future's own would, but
    make no Condition (publish_many reads a frame's futures so: 9 -> 3 µs a message)."""
    stored, refused, watched = _PublishFuture(), _PublishFuture(), _PublishFuture()
    watched.add_done_callback(lambda _: None)  # this one made its Condition
    stored.resolve(POSITION, None)
    refused.resolve(None, ValueError("refused"))
    watched.resolve(POSITION, None)
    assert stored.exception() is None and watched.exception() is None
    assert isinstance(refused.exception(), ValueError)
    assert stored.result() == POSITION and watched.result() == POSITION
    with pytest.raises(ValueError, match="refused"):
        refused.result()
    assert "_condition" not in stored.__dict__ and "_condition" not in refused.__dict__


def test_publish_future_wakes_a_thread_already_waiting() -> None:
    future = _PublishFuture()
    results: list[Position] = []
    waiter = threading.Thread(target=lambda: results.append(future.result(timeout=30)))
    waiter.start()
    # The waiter is inside result() once the future has its Condition; resolve after that.
    wait_until(lambda: "_condition" in future.__dict__, 60, "the waiter inside result()")
    future.resolve(POSITION, None)
    waiter.join(30)
    assert results == [POSITION]


def test_publish_future_runs_callbacks_added_before_and_after() -> None:
    future = _PublishFuture()
    seen: list[int] = []
    future.add_done_callback(lambda f: seen.append(f.result().offset))
    future.resolve(POSITION, None)
    future.add_done_callback(lambda f: seen.append(f.result().offset + 1))
    assert seen == [7, 8]


def test_publish_future_resolves_once() -> None:
    future = _PublishFuture()
    future.resolve(POSITION, None)
    future.resolve(None, ValueError("late"))
    assert future.result(timeout=0) == POSITION
    waited = _PublishFuture()
    assert not waited.done()  # creates its Condition: the general path
    waited.resolve(POSITION, None)
    waited.resolve(None, ValueError("late"))
    assert waited.result(timeout=0) == POSITION


def test_publish_futures_work_with_concurrent_futures_wait_and_as_completed() -> None:
    futures = [_PublishFuture() for _ in range(3)]
    timer = threading.Timer(
        0.05, lambda: [f.resolve(Position("t", 0, i, 1), None) for i, f in enumerate(futures)]
    )
    timer.start()
    done, _ = wait(futures, timeout=30, return_when=FIRST_COMPLETED)
    assert done
    assert sorted(f.result().offset for f in as_completed(futures, timeout=30)) == [0, 1, 2]
    timer.join()


def test_publish_future_resolved_before_anyone_waits_works_with_wait_and_as_completed() -> None:
    """The waiter lists are made only when read: wait() and as_completed() on futures
    resolved untouched (no Condition, no lists yet) still see them done."""
    futures = [_PublishFuture() for _ in range(3)]
    for offset, future in enumerate(futures):
        future.resolve(Position("t", 0, offset, 1), None)
    assert not any("_waiters" in future.__dict__ for future in futures)
    done, not_done = wait(futures, timeout=0)
    assert (len(done), not_done) == (3, set())
    assert sorted(f.result().offset for f in as_completed(futures, timeout=0)) == [0, 1, 2]
    # wait() made each one's waiter list (with its Condition), used and emptied it.
    assert all("_waiters" in future.__dict__ for future in futures)
    assert all(future.__dict__["_waiters"] == [] for future in futures)


def test_publish_future_cannot_be_cancelled_and_resolves_as_answered() -> None:
    """A queued message is sent whatever happens: cancel() says no, as for a running
    future, and the future resolves with the answer and runs its callbacks."""
    future = _PublishFuture()
    seen: list[int] = []
    future.add_done_callback(lambda f: seen.append(f.result().offset))
    assert future.cancel() is False
    assert not future.cancelled() and not future.done()
    future.resolve(POSITION, None)
    assert seen == [7]
    assert future.cancel() is False and not future.cancelled()


@dataclasses.dataclass
class _Point:
    x: int
    y: float


@given(value=JSON_VALUES, sequence=st.integers(0, 2**63 - 1), producer_id=st.text(min_size=1))
def test_a_plain_value_encodes_like_the_record_dict_dumped(
    value: Any, sequence: int, producer_id: str
) -> None:
    """A plain publish's record is the value's JSON written into a fixed frame: the same
    bytes as orjson writing the whole record as a dict, numbered or not."""
    record: dict[str, Any] = {"key": None, "value": value, "headers": []}
    assert plain_body(value) == orjson.dumps(record)
    assert encode_many("t", [value], {}, {}) == (None, [orjson.dumps(record)])
    body, key, partition = encode_publish_message(
        "t", value, {}, sequence=sequence, producer_id=producer_id
    )
    numbered = {**record, "sequence": sequence, "producer_id": producer_id}
    assert (body, key, partition) == (orjson.dumps(numbered), None, None)


@pytest.mark.parametrize(
    "value",
    [
        datetime.datetime(2026, 11, 27, 13, 30, tzinfo=datetime.UTC),
        uuid.UUID(int=7),
        _Point(1, 2.5),
        (1, "two", None),
        {"nested": [{"deep": [1.5, None, True]}]},
        2**64 - 1,
    ],
)
def test_values_orjson_knows_beyond_plain_json_encode_alike(value: Any) -> None:
    record = {"key": None, "value": value, "headers": []}
    assert plain_body(value) == orjson.dumps(record)


def _nested(levels: int) -> Any:
    value: Any = 1
    for level in range(levels):
        value = [value] if level % 2 else {"a": value}
    return value


def test_a_value_as_deep_as_a_record_can_hold_is_checked_as_the_record() -> None:
    """orjson dumps at most 254 levels: a value 254 deep passes alone and fails in its
    record, which the broker writes; the client refuses it, as when it dumped the record,
    and publish_many publishes none of the list."""
    record = {"key": None, "value": _nested(253), "headers": []}
    assert plain_body(_nested(253)) == orjson.dumps(record)
    with pytest.raises(SerializationError, match="Recursion limit"):
        plain_body(_nested(254))
    with pytest.raises(SerializationError, match=r"^values\[1\]: .*Recursion limit"):
        encode_many("t", ["ok", _nested(254), "ok"], {}, {})
    # Brackets inside strings look deep and are not: the record dumped gives the same bytes.
    text = "[{" * 400
    assert plain_body(text) == orjson.dumps({"key": None, "value": text, "headers": []})


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ({"a": [1, float("nan")], "b": None}, "NaN or infinity"),
        ({1, 2}, "can't be sent as JSON"),
        ({"when": object()}, "can't be sent as JSON"),
        (2**64, "can't be sent as JSON"),
    ],
)
def test_a_plain_value_that_cannot_be_sent_is_refused_naming_its_index(
    value: Any, error: str
) -> None:
    with pytest.raises(SerializationError, match=error):
        plain_body(value)
    with pytest.raises(SerializationError, match=rf"^values\[2\]: .*{error}"):
        encode_many("t", [1, b"\x00", value, 3], {}, {})


@pytest.mark.parametrize(
    ("key", "value", "sequence", "producer_id"),
    [
        (None, {"id": 1, "p": "x"}, 5, "p-1"),
        ("k", [1, 2.5, None], 0, "p-2"),
        (None, "text", None, None),
        ("k", None, 9, None),
    ],
)
def test_common_message_encodes_like_the_general_path(
    key: str | None, value: object, sequence: int | None, producer_id: str | None
) -> None:
    message = Message(value=value, key=key, sequence=sequence, producer_id=producer_id)
    # A tag forces the general path; its fields minus the tag are what the fast path
    # must give, in the same order (the order is part of the stored line).
    general = message_fields(
        Message(value=value, key=key, sequence=sequence, producer_id=producer_id, tags=["t"])
    )
    del general["tags"]
    assert list(message_fields(message).items()) == list(general.items())
    assert encode_message(message).body == encode_message(message, parsed_json=True).body


@pytest.mark.parametrize(
    ("sequence", "producer_id", "error"),
    [
        (-1, "p", InvalidArgumentError),
        (True, "p", InvalidArgumentError),
        (1.5, "p", InvalidArgumentError),
        (1, "", InvalidArgumentError),
        (1, 7, InvalidArgumentError),
    ],
)
def test_bad_sequence_or_producer_id_is_refused(
    sequence: object, producer_id: object, error: type[Exception]
) -> None:
    with pytest.raises(error):
        message_fields(Message(value=1, sequence=sequence, producer_id=producer_id))  # type: ignore[arg-type]


def test_non_finite_value_is_refused_unless_parsed_from_json() -> None:
    with pytest.raises(SerializationError):
        encode_message(Message(value={"x": float("nan")}))
    # Parsed JSON cannot hold NaN: orjson refuses it, so the broker skips the search.
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(b'{"x": 1e999}')


def test_topic_check_remembers_only_valid_names() -> None:
    assert check_topic("orders.v2") == "orders.v2"
    assert check_topic("orders.v2") == "orders.v2"  # the remembered answer
    for bad in ("", ".hidden", "a/b", "x" * 129, 7, None, ["orders"]):
        with pytest.raises(InvalidTopicError):
            check_topic(bad)
        with pytest.raises(InvalidTopicError):
            check_topic(bad)


@dataclasses.dataclass
class _Made:
    consumer: Any
    generation: int
    topic: str
    partition: int
    offset: int
    tag: int
    attempt: int
    line: bytes


_LINES = [b"a\n", b"b\n", b"c\n"]


def test_a_deliver_frames_messages_are_made_run_by_run_in_order() -> None:
    """The clients make a deliver frame's messages a run at a time in one comprehension:
    each with its run's topic, partition and attempt, and its own offset, tag and line."""
    frame = {"op": "deliver", "r": [["t", 0, 7, 2, 1, 100], ["u", 3, 40, 1, 2, 900]]}
    made = delivered_messages(_Made, "me", 5, frame, _LINES)
    assert made == [
        _Made("me", 5, "t", 0, 7, 100, 1, b"a\n"),
        _Made("me", 5, "t", 0, 8, 101, 1, b"b\n"),
        _Made("me", 5, "u", 3, 40, 900, 2, b"c\n"),
    ]


@pytest.mark.parametrize(
    "runs",
    [
        [["t", 0, 7, 2, 1, 100]],  # fewer messages than lines
        [["t", 0, 7, 4, 1, 100], ["t", 0, 11, -1, 1, 104]],  # a negative count balancing
        # ... or stepping back over an empty slice: the second line would be handed twice
        [["t", 0, 7, 2, 1, 100], ["t", 0, 9, -1, 1, 102], ["t", 0, 9, 2, 1, 102]],
        [["t", 0, 7, 3, 1, 100], ["t", 0, 10, 0, 1, 103]],  # a run of nothing
        [{}],  # a run that is not a list
        [{3: 3}],
        [["t", 0, 7, 3, 1]],  # a run too short
        [["t", 0, 7, 3, 1, 100, 9]],  # or too long
        [["t", 0, "7", 3, 1, 100]],  # not a number
        None,
    ],
)
def test_a_deliver_frame_whose_runs_do_not_fit_its_lines_is_refused(runs: Any) -> None:
    with pytest.raises(ProtocolError, match="deliver frame"):
        delivered_messages(_Made, "me", 1, {"op": "deliver", "r": runs}, _LINES)
