"""The shortcuts taken on the hot paths behave exactly like the general code they skip.

Each test compares a fast path with what the general path (or the standard library) does,
or checks that input the fast path must refuse still is refused.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, as_completed, wait

import orjson
import pytest

from spoolmq.client.publisher import _PublishFuture
from spoolmq.errors import InvalidArgumentError, InvalidTopicError, SerializationError
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
