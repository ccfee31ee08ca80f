"""Delivery rules seen from a real client of a real broker: delayed messages are never early,
expired ones are not delivered (and are recorded as expired), and subscription filters."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path
from typing import Any

import orjson
import pytest

from event_shapes import events_of, per_message
from spoolmq import Admin, Consumer, Publisher, Store, protocol
from spoolmq.errors import InvalidArgumentError, UnknownDeliveryError
from spoolmq.testing import BrokerProcess, wait_until


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def test_delayed_messages_are_never_delivered_early(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        before = now_ms()
        at = before + 1000  # absolute, so it is due before the delay whatever publishing takes
        by_delay = publisher.publish("later", {"kind": "delay"}, delay=1.5)
        by_time = publisher.publish("later", {"kind": "deliver_at"}, deliver_at=at)
        publisher.publish("later", {"kind": "now"})
    received = []
    with Consumer("later", group="g", data=data_dir, prefetch=3) as consumer:
        deadline = time.monotonic() + 60
        while len(received) < 3 and time.monotonic() < deadline:
            message = consumer.receive(timeout=5)
            if message is not None:
                received.append((now_ms(), message))
                message.ack()
    # Arrival order is only what the clock makes it: on a machine slow enough for the
    # consumer to subscribe after both are due, they come in offset order. What is
    # guaranteed is that none comes early (below).
    assert sorted(m.value["kind"] for _, m in received) == ["delay", "deliver_at", "now"]
    arrival = {m.value["kind"]: (t, m) for t, m in received}
    t_delay, m_delay = arrival["delay"]
    t_time, m_time = arrival["deliver_at"]
    assert m_delay.offset == by_delay.offset and m_time.offset == by_time.offset
    assert m_time.deliver_at == at
    assert m_delay.deliver_at is not None and m_delay.deliver_at >= before + 1500
    assert t_time >= at, f"delivered {at - t_time} ms early"
    assert t_delay >= before + 1500, f"delivered {before + 1500 - t_delay} ms early"


def test_a_message_past_its_ttl_is_not_delivered_and_is_recorded(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with (
        Publisher(data=data_dir) as publisher,
        Consumer("ttl", group="g", data=data_dir, prefetch=1) as consumer,
    ):
        first = publisher.publish("ttl", "hold the only slot")
        held = consumer.receive(timeout=30)
        assert held is not None and held.offset == first.offset
        doomed = publisher.publish("ttl", "expires while waiting", ttl=0.3)
        survivor = publisher.publish("ttl", "no ttl")
        # Let the ttl pass while the consumer's slot is taken: the ttl runs by the clock from
        # the publish, so the sleep itself makes it true.
        time.sleep(1.0)
        held.ack()
        nxt = consumer.receive(timeout=30)
        assert nxt is not None and nxt.offset == survivor.offset
        nxt.ack()
        assert consumer.receive(timeout=1.0) is None

    expired = wait_until(lambda: events_of(data_dir, "expired"), 30, "an expired event")
    assert [(e["topic"], e["offset"], e["group"]) for e in expired] == [("ttl", doomed.offset, "g")]
    delivered = {e["offset"] for e in events_of(data_dir, "delivered")}
    assert doomed.offset not in delivered
    assert {first.offset, survivor.offset} <= delivered


def test_filters_deliver_only_matching_messages(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("f", 0, tags=["vip"])
        publisher.publish("f", 1, headers={"kind": "refund"})
        publisher.publish("f", 2, tags=["basic"], headers={"kind": "order"})
        publisher.publish("f", 3, tags=["vip", "eu"], headers={"kind": "refund"})
        publisher.publish("f", 4)

    def take(group: str, spec: dict[str, object] | None, count: int) -> list[int]:
        """``count`` values, each waited for with a generous bound, then any that come
        within a second more (none, if the filter is right)."""
        values = []
        with Consumer("f", group=group, data=data_dir, filter=spec, prefetch=10) as consumer:
            while (
                message := consumer.receive(timeout=60 if len(values) < count else 1.0)
            ) is not None:
                values.append(message.value)
                message.ack()
        return values

    assert take("vips", {"tags": ["vip"]}, 2) == [0, 3]
    assert take("refunds", {"headers": {"kind": "refund"}}, 2) == [1, 3]
    assert take("both", {"tags": ["eu", "basic"], "headers": {"kind": "refund"}}, 1) == [3]
    assert take("all", None, 5) == [0, 1, 2, 3, 4]
    # Skipped messages are final for a filtered group: nothing is left to do.
    with Admin(data_dir) as admin:
        groups = admin.describe_groups()
    for name in ("vips", "refunds", "both", "all"):
        (row,) = groups[name]["partitions"]
        assert (row["committed"], row["lag"], row["in_flight"]) == (5, 0, 0), name


def test_a_nack_delay_and_the_backoff_are_never_cut_short(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("retry", "flaky")
    with Consumer(
        "retry", group="g", data=data_dir, retry_backoff=0.2, retry_backoff_max=0.5
    ) as consumer:
        arrivals = []
        for step in range(4):
            message = consumer.receive(timeout=30)
            assert message is not None and message.attempt == step + 1
            arrivals.append(time.monotonic())
            if step == 0:
                message.nack(delay=1.0, reason="asked for 1 s")
            elif step < 3:
                message.nack(reason="backoff")
            else:
                message.ack()
    gaps = [later - earlier for earlier, later in itertools.pairwise(arrivals)]
    # The asked delay, then the backoff after attempt 2 (0.2 * 2) and after attempt 3 (0.2 * 4,
    # capped at 0.5).
    for gap, least in zip(gaps, (1.0, 0.4, 0.5), strict=True):
        assert gap >= least - 0.01, f"redelivered after {gap:.3f} s, before {least} s"
    nacked = wait_until(
        lambda: len(events_of(data_dir, "nacked")) == 3 and events_of(data_dir, "nacked"),
        30,
        "the nack events",
    )
    assert [(e["attempt"], e["reason"]) for e in nacked] == [
        (1, "asked for 1 s"),
        (2, "backoff"),
        (3, "backoff"),
    ]


def test_an_extended_lease_keeps_the_message(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("long", "work")
    # The extension must reach the broker within the original lease: 10 s leaves room for a
    # busy machine.
    with Consumer("long", group="g", data=data_dir, lease=10.0) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None
        message.extend_lease(60.0)
        # Past the original lease (it began before the receive), inside the extended one:
        # the broker judges by the clock, so the sleep itself is what makes it late.
        time.sleep(10.5)
        message.ack()  # not refused
    assert [e["offset"] for e in wait_until(lambda: events_of(data_dir, "acked"), 30, "ack")] == [0]
    assert events_of(data_dir, "lease_expired") == []


def test_wakeup_ends_a_wait_in_receive_and_messages_still_come(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Consumer("waking", group="g", data=data_dir) as consumer:
        results: list[Any] = []
        waiting = threading.Thread(target=lambda: results.append(consumer.receive(timeout=600)))
        waiting.start()
        # The wakeup can come before the wait begins: the next receive returns then.
        consumer.wakeup()
        waiting.join(60)
        assert not waiting.is_alive() and results == [None]  # woken, not the 600 s timeout
        consumer.wakeup()
        consumer.wakeup()  # twice before a wait: one early return, not two
        assert consumer.receive(timeout=600) is None
        with Publisher(data=data_dir) as publisher:
            publisher.publish("waking", "after")
        message = consumer.receive(timeout=30)
        assert message is not None and message.value == "after"
        message.ack()
    consumer.wakeup()  # after close: nothing happens


@pytest.mark.parametrize("seconds", [1e20, float("nan"), float("inf"), 0, -1, "5", True])
def test_a_lease_extension_out_of_range_is_refused_and_the_consumer_goes_on(
    broker: BrokerProcess, data_dir: Path, seconds: Any
) -> None:
    """extend_lease(1e20) reached the broker, whose answer could not be encoded: it dropped
    the consumer (its messages were redelivered) and the client got a raw EOFError."""
    with Publisher(data=data_dir) as publisher:
        publisher.publish("extend-range", "job")
    with Consumer("extend-range", group="g", data=data_dir) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None
        with pytest.raises(InvalidArgumentError, match="a lease extension must be a number"):
            message.extend_lease(seconds)
        message.extend_lease(60)  # the connection is still there
        message.ack()
    # Sent as a raw frame, the broker refuses it, and keeps the connection.
    key = (data_dir / protocol.AUTHKEY_FILE).read_bytes()
    with Client(str(data_dir / protocol.SOCKET_FILE), family="AF_UNIX", authkey=key) as raw:
        hello = {"op": "hello", "version": protocol.PROTOCOL_VERSION, "role": "consumer"}
        protocol.send(raw, {**hello, "pid": os.getpid()})
        assert protocol.receive(raw)["op"] == "welcome"
        protocol.send(raw, {"op": "subscribe", "id": 1, "group": "g", "topics": ["extend-range"]})
        assert protocol.receive(raw)["id"] == 1
        for frame_id in (2, 3):  # a second answer: the connection was kept
            protocol.send(raw, {"op": "extend", "id": frame_id, "tags": [1], "seconds": 1e300})
            answer = protocol.receive(raw)
            assert (answer["op"], answer["id"]) == ("extend_result", frame_id)
            [refused] = answer["refused"]
            assert refused["code"] == "invalid_argument"
            assert "a lease extension must be a number" in refused["message"]


def test_close_from_another_thread_ends_its_receive_and_never_reconnects(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """A receive waiting in one thread while another closed the consumer took the closed
    socket for a lost broker and connected again: a hidden member of the group, which
    took messages no one would read, and a thread (Consumer.run's) that never returned."""
    consumer = Consumer("closing", group="g", data=data_dir, prefetch=5)
    results: list[Any] = []
    waiting = threading.Thread(target=lambda: results.append(consumer.receive(timeout=None)))
    waiting.start()
    wait_until(lambda: _members(data_dir, "g") == 1 or None, 60, "the consumer joined")
    consumer.close()
    waiting.join(60)
    assert not waiting.is_alive() and results == [None]
    # Nobody in the group: a message published now stays for the next consumer.
    with Publisher(data=data_dir) as publisher:
        publisher.publish("closing", "kept")
    assert _members(data_dir, "g") == 0
    with Consumer("closing", group="g", data=data_dir) as next_one:
        message = next_one.receive(timeout=30)
        assert message is not None and (message.value, message.attempt) == ("kept", 1)
        message.ack()
    with pytest.raises(Exception, match="closed"):
        consumer.receive(timeout=0)


def test_close_from_another_thread_while_a_handler_runs_ends_run_quietly(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """run()'s ACK after the handler met the closed consumer: SpoolError out of run()."""
    with Publisher(data=data_dir) as publisher:
        publisher.publish_many("closing-run", [1, 2, 3])
    consumer = Consumer("closing-run", group="g", data=data_dir)
    handled: list[int] = []

    def handle(message: Any) -> None:
        closer = threading.Thread(target=consumer.close)
        closer.start()
        closer.join(60)
        handled.append(message.value)

    assert consumer.run(handle, idle_timeout=60) == 0  # the message in hand goes back
    assert handled == [1]
    with Consumer("closing-run", group="g", data=data_dir) as again:
        message = again.receive(timeout=60)
        assert message is not None and message.value == 1
        message.ack()


def _members(data_dir: Path, group: str) -> int:
    with Admin(data=data_dir) as admin:
        return len(admin.describe_groups().get(group, {}).get("members", []))


def test_a_consumer_that_leaves_has_its_messages_redelivered_at_once(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("handover", "job")
    first = Consumer("handover", group="g", data=data_dir, lease=300)
    message = first.receive(timeout=30)
    assert message is not None and message.attempt == 1
    with Consumer("handover", group="g", data=data_dir, lease=300) as second:
        first.close()  # without an ACK; the 300 s lease does not hold the message back
        again = second.receive(timeout=30)
        assert again is not None and (again.offset, again.attempt) == (0, 2)
        again.ack()


def test_prefetched_messages_a_closing_consumer_never_read_are_not_attempts(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir) as publisher:
        for n in range(6):
            publisher.publish("one-by-one", n)
    # One message per connection with a large prefetch: each connection is pushed several
    # messages and reads one. The others must come back as they were, not as failures that
    # lead to the DLQ after max_deliveries.
    handled = []
    for _ in range(6):
        with Consumer(
            "one-by-one", group="g", data=data_dir, prefetch=5, max_deliveries=2
        ) as consumer:
            message = consumer.receive(timeout=30)
            assert message is not None
            handled.append((message.value, message.attempt))
            message.ack()
    assert handled == [(n, 1) for n in range(6)]
    with Consumer("one-by-one", group="g", data=data_dir) as consumer:
        assert consumer.receive(timeout=1.0) is None
    assert events_of(data_dir, "dead_lettered") == []
    # A message the application got and left unsettled still counts as an attempt.
    with Publisher(data=data_dir) as publisher:
        publisher.publish("one-by-one", "held")
    for attempt in (1, 2):
        with Consumer("one-by-one", group="g", data=data_dir, prefetch=5) as consumer:
            message = consumer.receive(timeout=30)
            assert message is not None and (message.value, message.attempt) == ("held", attempt)


def test_a_push_that_finds_the_consumer_gone_still_honours_its_bye(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """A consumer ACKs, lets credit go and says ``bye``, then closes; the broker pushes to
    the closed socket before it has read the ``bye``. The push fails, and the ``bye`` waiting
    in the socket must still be honoured: nothing it never read counts as an attempt."""
    with Publisher(data=data_dir) as publisher:
        for n in range(6):
            publisher.publish("gone", n)
    key = (data_dir / protocol.AUTHKEY_FILE).read_bytes()
    conn = Client(str(data_dir / protocol.SOCKET_FILE), family="AF_UNIX", authkey=key)
    protocol.send(
        conn,
        {
            "op": "hello",
            "version": protocol.PROTOCOL_VERSION,
            "role": "consumer",
            "pid": os.getpid(),
        },
    )
    assert protocol.receive(conn)["op"] == "welcome"
    protocol.send(
        conn, {"op": "subscribe", "id": 1, "group": "g", "topics": ["gone"], "prefetch": 5}
    )
    tags: list[int] = []
    while len(tags) < 5:
        header, _ = protocol.split_frame(conn.recv_bytes())
        if header["op"] == "deliver":
            tags += [tag + step for _, _, _, count, _, tag in header["r"] for step in range(count)]
    consumer_broker = broker.child_pids()["consumer"]
    os.kill(consumer_broker, signal.SIGSTOP)
    try:
        # More frames than the broker reads from one connection in one turn (64), so it
        # dispatches the sixth message, for the credit, before it reaches the ``bye``.
        protocol.send(conn, {"op": "ack", "tags": tags[:1]})
        protocol.send(conn, {"op": "credit", "n": 1})
        for _ in range(100):
            protocol.send(conn, {"op": "credit", "n": 0})
        protocol.send(conn, {"op": "bye", "seen": []})
        conn.close()
    finally:
        os.kill(consumer_broker, signal.SIGCONT)
    handled = []
    with Consumer("gone", group="g", data=data_dir, prefetch=1) as consumer:
        for _ in range(5):
            message = consumer.receive(timeout=30)
            assert message is not None
            handled.append((message.value, message.attempt))
            message.ack()
        assert consumer.receive(timeout=0.5) is None
    assert handled == [(n, 1) for n in range(1, 6)]


def test_damage_inside_a_segment_stops_that_partition_only(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path
) -> None:
    """A record damaged inside a segment is never delivered nor skipped: the group stops on
    that partition with an error in the broker log, and the ConsumerBroker goes on serving
    everything else."""
    with Store(data_dir) as store:
        store.create_topic("damaged", segment_bytes=1024)  # several segments
    with Publisher(data=data_dir) as publisher:
        for n in range(10):
            publisher.publish("damaged", {"n": n, "text": "some text"})
            publisher.publish("healthy", n)
    broker.stop()
    first = sorted((data_dir / "logs" / "damaged" / "0").glob("*.jsonl"))[0]
    data = bytearray(first.read_bytes())
    assert b'"n":3' in data and len(list(first.parent.glob("*.jsonl"))) > 1
    at = data.index(b'"n":3')
    data[at + 4] ^= 0x01  # 3 -> 2: the record no longer matches its checksum
    first.write_bytes(bytes(data))
    broker.start()
    consumer_broker = broker.child_pids()["consumer"]
    with Consumer(["damaged", "healthy"], group="g", data=data_dir, prefetch=20) as consumer:
        got: dict[str, list[int]] = {"damaged": [], "healthy": []}
        # The 13 messages before the damage and of "healthy", each waited for with a
        # generous bound; then 3 s in which nothing past the damage may come.
        while (
            message := consumer.receive(timeout=60 if sum(map(len, got.values())) < 13 else 3.0)
        ) is not None:
            got[message.topic].append(
                message.value["n"] if message.topic == "damaged" else message.value
            )
            message.ack()
    assert sorted(got["damaged"]) == [0, 1, 2]  # what comes before the damage
    assert sorted(got["healthy"]) == list(range(10))
    assert broker.child_pids()["consumer"] == consumer_broker  # it did not crash
    assert broker.stats()["restarts"] == {"publisher": 0, "consumer": 0}
    broker_log = (tmp_path / "broker.log").read_text()
    assert "group g stops reading damaged/0" in broker_log


def test_delivered_and_acked_events_are_one_line_per_frame(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """A real run writes ``delivered``/``acked`` as frame lines (runs, no offset) that
    cover every message exactly once, with one processing time per ACKed message."""
    with Publisher(data=data_dir) as publisher:
        for n in range(60):
            publisher.publish("framed", n)
    with Consumer("framed", group="g", data=data_dir, prefetch=25) as consumer:
        assert consumer.run(lambda m: None, max_messages=60, idle_timeout=30) == 60

    def frame_lines() -> list[dict[str, Any]] | None:
        lines = [e for e in event_lines(data_dir) if e["type"] in ("delivered", "acked")]
        acked = sum(run[3] for e in lines if e["type"] == "acked" for run in e["runs"])
        return lines if acked >= 60 else None

    lines = wait_until(frame_lines, 30, "acked events for 60 messages")
    for line in lines:
        assert "offset" not in line and line["group"] == "g"
        assert all(run[:2] == ["framed", 0] and run[3] >= 1 for run in line["runs"])
        if line["type"] == "acked":
            assert len(line["processing_ms"]) == sum(run[3] for run in line["runs"])
    delivered = [e for e in lines if e["type"] == "delivered"]
    assert len(delivered) < 60  # frames, not messages
    for kind in ("delivered", "acked"):
        messages = [e for e in per_message(lines) if e["type"] == kind]
        assert sorted(e["offset"] for e in messages) == list(range(60)), kind
        assert {e["attempt"] for e in messages} == {1}


def event_lines(data_dir: Path) -> list[dict[str, Any]]:
    """Every events/ line as it is written."""
    return [
        orjson.loads(line)
        for path in sorted((data_dir / "events").glob("date=*/*.jsonl"))
        for line in path.read_bytes().splitlines()
    ]


def test_acks_without_waiting_are_acks_and_a_second_settle_is_refused(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """``ack(wait=False)`` (ACKs sent 100 to a frame, or when the consumer waits) commits
    every message it settles; settling one of them again is refused, by either call, and
    one from a lost connection is not taken as an ACK."""
    with Publisher(data=data_dir) as publisher:
        publisher.publish_many("quick", list(range(250)))
    seen: list[int] = []
    with Consumer("quick", group="g", data=data_dir, prefetch=100) as consumer:
        first = None
        while len(seen) < 250:
            message = consumer.receive(timeout=30)
            assert message is not None, f"only {len(seen)} of 250 arrived"
            seen.append(message.value)
            message.ack(wait=False)
            first = first or message
        assert first is not None
        with pytest.raises(InvalidArgumentError, match="already acknowledged"):
            first.ack(wait=False)
        with pytest.raises(InvalidArgumentError, match="already acknowledged"):
            first.ack()
    assert sorted(seen) == list(range(250))

    def settled() -> bool:
        with Admin(data_dir) as admin:
            (row,) = admin.describe_groups()["g"]["partitions"]
        return (row["committed"], row["lag"], row["in_flight"]) == (250, 0, 0)

    wait_until(settled, timeout=30, what="the 250 ACKs sent without waiting to be committed")

    with Publisher(data=data_dir) as publisher:
        publisher.publish("quick", "after")
    with Consumer("quick", group="g", data=data_dir) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None and message.value == "after"
        consumer._drop()  # as if the broker went away: the next receive reconnects
        with pytest.raises(UnknownDeliveryError, match="connection this message came on"):
            message.ack(wait=False)
        again = consumer.receive(timeout=30)  # redelivered on the new connection
        assert again is not None and again.value == "after" and again.attempt == 2
        with pytest.raises(UnknownDeliveryError, match="connection this message came on"):
            message.ack(wait=False)  # connected again, but not the connection it came on
        again.ack()
    with Consumer("quick", group="auto", data=data_dir, auto_ack=True) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None
        with pytest.raises(InvalidArgumentError, match="auto_ack"):
            message.ack(wait=False)


def test_pause_gives_back_what_was_pushed_ahead_and_keeps_what_is_held(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir) as publisher:
        for n in range(5):
            publisher.publish("paused", n)
    # A 300 s lease: a message the other member gets within the bounds below came back
    # through the pause, not through a lease running out.
    options: dict[str, Any] = {"group": "g", "data": data_dir, "lease": 300}
    with Consumer("paused", prefetch=5, **options) as first:
        held = first.receive(timeout=30)
        assert held is not None and held.value == 0
        # The other four are pushed ahead with it (prefetch 5), once the broker has them.
        delivered = lambda: broker.stats()["consumer"].get("delivered", 0)  # noqa: E731
        wait_until(lambda: delivered() >= 5, 30, "the four pushed ahead")
        assert first.pause() == 4
        assert first.receive(timeout=0.2) is None  # paused: nothing buffered is handed out
        with Consumer("paused", prefetch=10, **options) as second:
            taken = [second.receive(timeout=30) for _ in range(4)]
            assert [(m.value, m.attempt) for m in taken if m is not None] == [
                (1, 1),
                (2, 1),
                (3, 1),
                (4, 1),
            ]
            for message in taken:
                assert message is not None
                message.ack()
            held.ack(wait=True)  # still its own to settle while paused
            with Publisher(data=data_dir) as publisher:
                publisher.publish("paused", 5)
            # Paused, the first takes nothing; the second gets the new one.
            fresh = second.receive(timeout=30)
            assert fresh is not None and (fresh.value, fresh.attempt) == (5, 1)
            second.pause()
            first.resume()
            fresh.nack(delay=0)  # back to the group: only the resumed member takes it
            again = first.receive(timeout=30)
            assert again is not None and (again.value, again.attempt) == (5, 2)
            again.ack(wait=True)
    assert events_of(data_dir, "dead_lettered") == []


def test_a_paused_auto_ack_consumer_that_reconnects_keeps_its_messages_and_resumes(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with Publisher(data=data_dir) as publisher:
        for n in range(20):
            publisher.publish("paused-auto", n)
    with Consumer("paused-auto", "g", data=data_dir, auto_ack=True, prefetch=5) as consumer:
        consumer.pause()
        broker.stop()
        broker.start()
        # Paused, it hands out what it holds (auto_ack: final), the first connection's
        # prefetch; the reconnect's new subscription is paused too, and what the broker
        # pushed on it before the pause reached it (usually a prefetch's worth) is final
        # as well, so the consumer keeps that too.
        got: list[int] = []
        while (message := consumer.receive(timeout=1.0)) is not None:
            got.append(message.value)
            assert len(got) <= 10, "a paused consumer got more than two prefetches"
        consumer.resume()
        while 19 not in got:
            message = consumer.receive(timeout=30)
            assert message is not None, f"stalled after {got}"  # credit was lost
            got.append(message.value)
    assert got == sorted(got) and len(set(got)) == len(got)
