"""A broker stopped and started again under its clients: publishes in flight ride through
with no duplicates, unacknowledged deliveries come back, and a publisher with no broker
gives up with a clear error after its delivery timeout."""

from __future__ import annotations

import collections
import re
import threading
import time
from pathlib import Path

import pytest
from e2e_workers import (
    client_processes,
    join_all,
    publish_all,
    publish_worker,
    read_lines,
    start,
)

from spoolmq import Consumer, Publisher, Store
from spoolmq.errors import BrokerUnavailableError, PublishTimeoutError, UnknownDeliveryError
from spoolmq.testing import BrokerProcess, wait_until


def test_publishes_in_flight_ride_through_a_broker_restart(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path
) -> None:
    workers, count = 2, 300
    outputs = [tmp_path / f"p{w}" for w in range(workers)]
    with client_processes() as processes:
        processes += [
            # 10 publishes in flight at a time, paced so that the restart falls mid-stream.
            start(
                publish_worker, str(data_dir), "ride", w, count, str(out), 0, "all", 120.0, 0.02, 10
            )
            for w, out in enumerate(outputs)
        ]
        wait_until(lambda: all(len(read_lines(out)) >= 30 for out in outputs), 60, "the first ACKs")
        assert broker.stop() == 0
        stopped_at = [len(read_lines(out)) for out in outputs]
        time.sleep(1.0)  # the broker stays down a while; publishers keep trying
        broker.start()
        join_all(processes, 180)
    assert broker.stats()["restarts"] == {"publisher": 0, "consumer": 0}
    acked = {}
    for out in outputs:
        lines = read_lines(out)
        assert [line.get("error") for line in lines] == [None] * count
        for line in lines:
            acked[(line["partition"], line["offset"])] = {"w": line["w"], "i": line["i"]}
    assert all(n < count for n in stopped_at), "the restart came after the workload"
    with Store(data_dir) as store:
        stored = {(0, r.offset): r.value for r in store.reader("ride", 0)}
    # Every message is stored exactly once, where its publisher was told.
    values = collections.Counter((v["w"], v["i"]) for v in stored.values())
    assert set(values.values()) == {1}, "a resent publish was stored twice"
    assert len(stored) == workers * count
    assert stored == acked


def test_unacked_deliveries_are_redelivered_after_a_restart(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publish_all(data_dir, "work", range(3))
    # prefetch 1: nothing is buffered in the client beyond the message it holds, so the
    # first thing received after the restart is the broker's redelivery.
    with Consumer("work", group="g", data=data_dir, prefetch=1) as consumer:
        first = consumer.receive(timeout=30)
        assert first is not None and (first.offset, first.attempt) == (0, 1)
        first.ack()
        held = consumer.receive(timeout=30)
        assert held is not None and (held.offset, held.attempt) == (1, 1)
        assert broker.stop() == 0
        broker.start()
        # On the lost connection: as for an ACK, not a raw BrokenPipeError.
        with pytest.raises(UnknownDeliveryError):
            held.extend_lease(5)
        # The same consumer reconnects; the delivery it never ACKed comes back.
        again = consumer.receive(timeout=60)
        assert again is not None
        assert (again.offset, again.value, again.attempt) == (1, 1, 2)
        with pytest.raises(UnknownDeliveryError):
            held.ack()  # it came on the old connection
        again.ack()
        last = consumer.receive(timeout=30)
        assert last is not None and (last.offset, last.attempt) == (2, 1)
        last.ack()
        assert consumer.receive(timeout=1.0) is None


def test_a_publisher_gives_up_after_its_delivery_timeout(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir, delivery_timeout=2.0) as publisher:
        publisher.publish("gone", "stored")
        assert broker.stop() == 0
        started = time.monotonic()
        with pytest.raises(PublishTimeoutError, match="not acknowledged within 2 s"):
            publisher.publish("gone", "never")
        waited = time.monotonic() - started
        assert 1.9 <= waited < 60, f"gave up after {waited:.1f} s"
    # With no broker at all a Publisher fails at once, saying what to do.
    with pytest.raises(BrokerUnavailableError, match="spoolmq broker"):
        Publisher(data=data_dir)
    with pytest.raises(BrokerUnavailableError, match=r"^no broker is listening"):
        # At once: the reconnect timeout is for a broker that went away later.
        Consumer("gone", group="g", data=data_dir, reconnect_timeout=5)


def test_idle_clients_carry_on_after_a_restart(broker: BrokerProcess, data_dir: Path) -> None:
    with (
        Publisher(data=data_dir) as publisher,
        Consumer("idle", group="g", data=data_dir) as consumer,
    ):
        assert publisher.publish("idle", "before").offset == 0
        message = consumer.receive(timeout=30)
        assert message is not None and message.value == "before"
        message.ack()
        assert broker.stop() == 0
        broker.start()
        # Neither client had anything outstanding; both reconnect when next used.
        assert publisher.publish("idle", "after").offset == 1
        assert publisher.reconnects == 1
        message = consumer.receive(timeout=60)
        assert message is not None and (message.offset, message.value) == (1, "after")
        message.ack()


def test_a_child_that_served_before_it_was_killed_comes_back_at_once(
    broker: BrokerProcess, tmp_path: Path
) -> None:
    """Kills of a child that was up and serving are not a crash loop: each restart waits
    the minimum (0.1 s), not a backoff that doubles up to 5 s."""
    for _ in range(4):
        # Ready for well over the 1 s after which the manager counts a child as having
        # started well, however slowly it came up.
        wait_until(
            lambda: broker.ready_seconds("consumer") >= 1.5, 60, "a consumer broker up 1.5 s"
        )
        broker.wait_child_replaced("consumer", broker.kill_child("consumer"))
    broker_log = (tmp_path / "broker.log").read_text()
    waits = re.findall(
        r"the consumer broker \(pid \d+\) exited .*; restarting in ([\d.]+)s", broker_log
    )
    assert waits == ["0.1"] * 4
    assert broker.stats()["restarts"]["consumer"] == 4


def test_the_clients_of_a_killed_child_leave_the_registry(broker: BrokerProcess) -> None:
    """A killed child's connections die with it; its clients reconnect to the new one and
    are counted once, not once per incarnation."""
    with Publisher(data=broker.data) as pub:
        pub.publish("reg", {"n": 0})
        assert broker.stats()["clients"]["publisher"] == 1
        broker.wait_child_replaced("publisher", broker.kill_child("publisher"))
        pub.publish("reg", {"n": 1})  # answered by the new child: the client reconnected
        assert broker.stats()["clients"]["publisher"] == 1


def test_polling_with_a_timeout_of_0_reconnects_after_a_restart(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """receive(timeout=0) with its connection lost returned None before trying to
    reconnect: a loop polling with it never took a message again."""
    with Consumer("polled-restart", group="g", data=data_dir) as consumer:
        assert consumer.receive(timeout=0.5) is None  # subscribed
        assert broker.stop() == 0
        broker.start()
        publish_all(data_dir, "polled-restart", ["after"])
        message = wait_until(lambda: consumer.receive(timeout=0), 60, "a polled message")
        assert message.value == "after"
        message.ack()


def test_a_receive_ends_on_time_while_the_broker_is_away(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """A receive's timeout holds while the consumer reconnects (a worker loop must stay able
    to stop); the consumer still reconnects when the broker is back, and gives up with
    BrokerUnavailableError once ``reconnect_timeout`` has passed since the loss."""
    with Consumer("away", group="g", data=data_dir, reconnect_timeout=600) as consumer:
        assert consumer.receive(timeout=0.2) is None  # connected, nothing there
        assert broker.stop() == 0
        for _ in range(3):
            started = time.monotonic()
            assert consumer.receive(timeout=0.3) is None
            waited = time.monotonic() - started
            # Before, the first one waited out the reconnect timeout (600 s).
            assert waited < 30, f"receive(0.3) took {waited:.1f} s with the broker away"
        broker.start()
        with Publisher(data=data_dir) as publisher:
            publisher.publish("away", "back")
        message = wait_until(lambda: consumer.receive(timeout=0.5), 60, "a message after it")
        assert message.value == "back"
        message.ack()
    with Consumer("away", group="g", data=data_dir, reconnect_timeout=1.5) as consumer:
        # The loss may be seen while the broker stops: count from before it.
        started = time.monotonic()
        assert broker.stop() == 0
        with pytest.raises(BrokerUnavailableError, match=r"could not reconnect in 1\.5 s"):
            while time.monotonic() - started < 60:
                consumer.receive(timeout=0.2)
        assert time.monotonic() - started >= 1.4


def test_wakeup_ends_a_receive_that_waits_for_the_broker(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Consumer("away", group="g", data=data_dir, reconnect_timeout=600) as consumer:
        assert consumer.receive(timeout=0.2) is None
        assert broker.stop() == 0
        results: list[object] = []
        waiting = threading.Thread(target=lambda: results.append(consumer.receive()))
        waiting.start()
        # Once the thread is in the reconnect loop (the broker's socket is gone, so the
        # first attempt fails at once), wake it; a wakeup that comes earlier works too.
        consumer.wakeup()
        waiting.join(30)
        assert not waiting.is_alive(), "wakeup() did not end a receive() waiting to reconnect"
        assert results == [None]
