"""The test harness itself: a real broker subprocess starts, serves and stops cleanly; a
restarted child counts as back once it is ready; the shared bounded poll."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from spoolmq import Consumer, Publisher
from spoolmq.testing import BrokerProcess, wait_until


def test_broker_serves_and_stops_cleanly(broker: BrokerProcess, data_dir: Path) -> None:
    children = broker.child_pids()
    assert set(children) == {"publisher", "consumer"}
    assert len({broker.pid, *children.values()}) == 3
    with Publisher(data=data_dir) as pub:
        position = pub.publish("smoke", {"n": 1})
    assert position.offset == 0
    with Consumer("smoke", group="g", data=data_dir) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None and message.value == {"n": 1}
        message.ack()
    assert broker.stop() == 0
    for pid in children.values():
        # The children are gone with the manager: signal 0 finds no such process.
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        raise AssertionError(f"child {pid} outlived its manager")


def test_a_restarted_child_is_ready_when_wait_child_replaced_returns(
    broker: BrokerProcess,
) -> None:
    killed = broker.kill_child("consumer")
    broker.wait_child_replaced("consumer", killed)
    stats = broker.stats()
    assert int(stats["pids"]["consumer"]) != killed
    ready = stats["ready_s"]
    # Ready (not None, as while it starts), and since after the kill: the publisher, up
    # since the broker started, has been ready longer.
    assert ready["consumer"] is not None and ready["publisher"] is not None
    assert ready["consumer"] < ready["publisher"]
    assert stats["restarts"] == {"publisher": 0, "consumer": 1}


def test_wait_until_returns_what_it_waited_for_or_says_what_did_not_come() -> None:
    answers = iter([None, 0, [], "here"])
    assert wait_until(lambda: next(answers), 30, "an answer") == "here"
    with pytest.raises(TimeoutError, match=r"after 0\.2 s waiting for the impossible"):
        wait_until(lambda: False, 0.2, "the impossible")
