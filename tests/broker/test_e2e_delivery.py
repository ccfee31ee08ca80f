"""Delivery rules seen from a real client of a real broker: delayed messages are never early,
expired ones are not delivered (and are recorded as expired), and subscription filters."""

from __future__ import annotations

import time
from pathlib import Path

from e2e_workers import read_lines, wait_until

from spoolmq import Admin, Consumer, Publisher
from spoolmq.testing import BrokerProcess


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def events_of(data_dir: Path, kind: str) -> list[dict[str, object]]:
    found = []
    for path in sorted((data_dir / "events").glob("date=*/*.jsonl")):
        found += [e for e in read_lines(path) if e["type"] == kind]
    return found


def test_delayed_messages_are_never_delivered_early(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        before = now_ms()
        by_delay = publisher.publish("later", {"kind": "delay"}, delay=1.5)
        at = now_ms() + 1000
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
    assert [m.value["kind"] for _, m in received] == ["now", "deliver_at", "delay"]
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
        time.sleep(1.0)  # let the ttl pass while the consumer's slot is taken
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

    def take(group: str, spec: dict[str, object] | None) -> list[int]:
        values = []
        with Consumer("f", group=group, data=data_dir, filter=spec, prefetch=10) as consumer:
            while (message := consumer.receive(timeout=2)) is not None:
                values.append(message.value)
                message.ack()
        return values

    assert take("vips", {"tags": ["vip"]}) == [0, 3]
    assert take("refunds", {"headers": {"kind": "refund"}}) == [1, 3]
    assert take("both", {"tags": ["eu", "basic"], "headers": {"kind": "refund"}}) == [3]
    assert take("all", None) == [0, 1, 2, 3, 4]
    # Skipped messages are final for a filtered group: nothing is left to do.
    with Admin(data_dir) as admin:
        groups = admin.describe_groups()
    for name in ("vips", "refunds", "both", "all"):
        (row,) = groups[name]["partitions"]
        assert (row["committed"], row["lag"], row["in_flight"]) == (5, 0, 0), name
