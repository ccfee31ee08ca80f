"""The test harness itself: a real broker subprocess starts, serves and stops cleanly."""

from __future__ import annotations

import os
from pathlib import Path

from spoolmq import Consumer, Publisher
from spoolmq.testing import BrokerProcess


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
