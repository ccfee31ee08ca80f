"""The shortcuts taken on the hot paths behave exactly like the general code they skip.

Each test compares a fast path with what the general path (or the standard library) does,
or checks that input the fast path must refuse still is refused.
"""

from __future__ import annotations

import threading
from concurrent.futures import FIRST_COMPLETED, as_completed, wait

import pytest

from spoolmq.client.publisher import _PublishFuture
from spoolmq.store.log import Position

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
    for _ in range(3000):
        if "_condition" in future.__dict__:
            break
        threading.Event().wait(0.001)
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
