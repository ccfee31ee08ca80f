"""Taking and settling many messages at once against a real broker: ``receive_many`` and
``ack_many`` of the threaded and the asyncio consumer."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from spoolmq import AsyncConsumer, Consumer, Publisher
from spoolmq.errors import InvalidArgumentError, LeaseExpiredError
from spoolmq.operations import group_rows
from spoolmq.testing import BrokerProcess, wait_until

WAIT = 60  # seconds: a generous bound on a busy machine, never a sleep


def publish(data_dir: Path, topic: str, count: int) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish_many(topic, [{"n": n} for n in range(count)])


def delivered(broker: BrokerProcess) -> int:
    return int(broker.stats()["consumer"].get("delivered", 0))


def committed(data_dir: Path, group: str, topic: str) -> int | None:
    rows = [row for row in group_rows(data_dir).get(group, []) if row["topic"] == topic]
    return rows[0]["committed"] if rows else None


def test_receive_many_takes_what_was_pushed_in_order_and_ack_many_commits_it(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publish(data_dir, "batches", 250)
    with Consumer("batches", "g", data=data_dir, prefetch=100) as consumer:
        # Once the broker has pushed the whole window, one call takes all of it, however
        # many frames it came in.
        wait_until(lambda: delivered(broker) >= 100, WAIT, "the window pushed")
        first = consumer.receive_many(100, timeout=WAIT)
        assert [m.value["n"] for m in first] == list(range(100))
        consumer.ack_many(first)  # waited for: the broker has them
        assert all(m.settled for m in first)
        taken = [m.value["n"] for m in first]
        while len(taken) < 250:
            batch = consumer.receive_many(60, timeout=WAIT)
            assert 1 <= len(batch) <= 60
            taken += [m.value["n"] for m in batch]
            consumer.ack_many(batch, wait=False)
        assert taken == list(range(250))
        assert consumer.receive_many(10, timeout=0.2) == []  # nothing left: the time is up
    wait_until(lambda: committed(data_dir, "g", "batches") == 250, WAIT, "all 250 committed")
    with Consumer("batches", "g", data=data_dir) as again:
        assert again.receive(timeout=0.5) is None  # nothing to redeliver


def test_receive_many_reads_every_frame_that_has_arrived(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """Published one at a time to a waiting consumer, each message comes in a frame of
    its own: one call still takes all that have arrived."""
    with Consumer("live", "g", data=data_dir, prefetch=20) as consumer:
        consumer.receive_many(1, timeout=0)  # subscribed, and nothing there yet
        with Publisher(data=data_dir) as publisher:
            for n in range(20):
                publisher.publish("live", {"n": n})  # each answered before the next
        wait_until(lambda: delivered(broker) >= 20, WAIT, "the 20 pushed")
        batch = consumer.receive_many(50, timeout=WAIT)
        assert [m.value["n"] for m in batch] == list(range(20))
        consumer.ack_many(batch)


def test_an_error_while_reading_more_frames_hands_out_none(
    broker: BrokerProcess, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If reading the frames that arrived fails (an error frame, Ctrl-C), the messages the
    call took go back to the buffer: the next call hands them out, none is lost."""
    with Consumer("interrupted", "g", data=data_dir, prefetch=20) as consumer:
        consumer.receive_many(1, timeout=0)
        with Publisher(data=data_dir) as publisher:
            for n in range(20):
                publisher.publish("interrupted", {"n": n})
        wait_until(lambda: delivered(broker) >= 20, WAIT, "the 20 pushed")
        read_frame = consumer._read_frame
        calls = []

        def failing() -> Any:
            calls.append(1)
            if len(calls) == 2:  # the first read is receive's own; fail the next one
                raise KeyboardInterrupt
            return read_frame()

        monkeypatch.setattr(consumer, "_read_frame", failing)
        with pytest.raises(KeyboardInterrupt):
            consumer.receive_many(50, timeout=WAIT)
        monkeypatch.setattr(consumer, "_read_frame", read_frame)
        batch = consumer.receive_many(50, timeout=WAIT)
        assert [m.value["n"] for m in batch] == list(range(20))
        consumer.ack_many(batch)
    assert committed(data_dir, "g", "interrupted") == 20


def test_ack_many_refuses_bad_input_before_acking_any(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publish(data_dir, "checked", 4)
    with (
        Consumer("checked", "g", data=data_dir, prefetch=4) as consumer,
        Consumer("other", "g", data=data_dir) as stranger,
    ):
        wait_until(lambda: delivered(broker) >= 4, WAIT, "the four pushed")
        batch = consumer.receive_many(4, timeout=WAIT)
        assert len(batch) == 4
        for wrong in (0, -1, True, "5", 2.0):
            with pytest.raises(InvalidArgumentError, match="max_messages"):
                consumer.receive_many(wrong)
        batch[0].ack()
        with pytest.raises(InvalidArgumentError, match="already acknowledged"):
            consumer.ack_many(batch)
        with pytest.raises(InvalidArgumentError, match="twice"):
            consumer.ack_many([batch[1], batch[1]])
        with pytest.raises(InvalidArgumentError, match="not received by this consumer"):
            stranger.ack_many(batch[1:])
        with pytest.raises(InvalidArgumentError, match="not received by this consumer"):
            consumer.ack_many([batch[1], {"n": 2}])  # type: ignore[list-item]
        assert not any(m.settled for m in batch[1:])  # none of the refused calls ACKed one
        consumer.ack_many([])  # nothing to do
        consumer.ack_many(batch[1:])
    assert committed(data_dir, "g", "checked") == 4
    with Consumer("checked", "auto", data=data_dir, auto_ack=True, prefetch=4) as auto:
        taken = auto.receive_many(4, timeout=WAIT)
        assert taken
        with pytest.raises(InvalidArgumentError, match="auto_ack"):
            auto.ack_many(taken)


def test_ack_many_acks_the_rest_when_some_leases_ran_out(
    broker: BrokerProcess, data_dir: Path
) -> None:
    # The second message's lease is extended before it runs out, and the first's is left
    # to run out: a lease long enough for the first step on a busy machine is tried,
    # each time longer (each in a group of its own: a group's lease is one setting).
    for lease in (2, 6, 20, 60):
        topic, group = f"leases-{lease}", f"g{lease}"
        publish(data_dir, topic, 2)
        options: dict[str, Any] = {"group": group, "data": data_dir, "lease": lease}
        with Consumer(topic, prefetch=2, **options) as slow:
            batch = []
            while len(batch) < 2:
                batch += slow.receive_many(2 - len(batch), timeout=WAIT)
            assert [m.value["n"] for m in batch] == [0, 1]
            try:
                batch[1].extend_lease(300)
            except LeaseExpiredError:
                continue  # this machine took longer than the lease: a longer one
            with Consumer(topic, **options) as other:
                again = other.receive(timeout=WAIT + lease)
                # (It may have gone back to the first member, and run out there, before.)
                assert again is not None and again.value["n"] == 0 and again.attempt >= 2
                with pytest.raises(LeaseExpiredError, match="1 of 2 ACKs refused"):
                    slow.ack_many(batch)
                assert batch[1].settled and not batch[0].settled
                again.ack()
        done = lambda g=group, t=topic: committed(data_dir, g, t) == 2  # noqa: E731
        wait_until(done, WAIT, "both committed")
        return
    raise AssertionError("no lease was long enough to extend the second message in time")


def test_async_receive_many_and_ack_many(broker: BrokerProcess, data_dir: Path) -> None:
    publish(data_dir, "aio", 150)

    async def main() -> list[int]:
        taken: list[int] = []
        async with AsyncConsumer("aio", "g", data=data_dir, prefetch=100) as consumer:
            while len(taken) < 150:
                batch = await consumer.receive_many(70, timeout=WAIT)
                assert 1 <= len(batch) <= 70
                taken += [m.value["n"] for m in batch]
                await consumer.ack_many(batch, wait=len(taken) < 100)
            assert await consumer.receive_many(5, timeout=0.2) == []
            with pytest.raises(InvalidArgumentError, match="max_messages"):
                await consumer.receive_many(0)
            with pytest.raises(InvalidArgumentError, match="already acknowledged"):
                await consumer.ack_many(batch)
        return taken

    assert asyncio.run(main()) == list(range(150))
    wait_until(lambda: committed(data_dir, "g", "aio") == 150, WAIT, "all 150 committed")


def test_a_timeout_of_0_looks_at_what_has_arrived(broker: BrokerProcess, data_dir: Path) -> None:
    """``receive(timeout=0)`` returned None before it looked at the connection, so a loop
    polling with it never took a message (and the asyncio one never let the event loop
    read). Now each call looks once: polling takes every message, in order."""
    publish(data_dir, "polled", 30)

    def poll(take: Any) -> list[int]:
        taken: list[int] = []
        wait_until(lambda: taken.extend(take()) or len(taken) >= 30 or None, WAIT, "all 30")
        return taken

    with Consumer("polled", "threaded", data=data_dir, prefetch=10) as consumer:

        def one() -> list[int]:
            message = consumer.receive(timeout=0)
            if message is None:
                return []
            message.ack()
            return [message.value["n"]]

        assert poll(one) == list(range(30))
    with Consumer("polled", "many", data=data_dir, prefetch=10) as consumer:

        def many() -> list[int]:
            batch = consumer.receive_many(7, timeout=0)
            consumer.ack_many(batch)
            return [message.value["n"] for message in batch]

        assert poll(many) == list(range(30))

    async def main() -> list[int]:
        taken: list[int] = []
        async with AsyncConsumer("polled", "asyncio", data=data_dir, prefetch=10) as consumer:
            for _ in range(1_000_000):  # bounded: WAIT is the real bound
                message = await consumer.receive(timeout=0)
                if message is not None:
                    await message.ack()
                    taken.append(message.value["n"])
                if len(taken) == 30:
                    break  # (no other await: receive(0) alone must let the loop read)
        return taken

    assert asyncio.run(asyncio.wait_for(main(), WAIT)) == list(range(30))


def test_timing_arguments_out_of_range_are_invalid_argument_errors(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """A NaN, a string or a number past 64-bit milliseconds, each named: they were a
    ValueError, a TypeError, or a SerializationError blaming the value."""
    import math

    with Publisher(data=data_dir) as publisher:
        for bad in (
            {"delay": 1e20},
            {"ttl": 1e20},
            {"deliver_at": 2**63},
            {"delay": 10**400},  # past what a float holds: an OverflowError it was
            {"ttl": 10**400},
        ):
            with pytest.raises(InvalidArgumentError, match=next(iter(bad))):
                publisher.publish("timing", 1, **bad)
        publisher.publish("timing", 1)
    with Consumer("timing", "g", data=data_dir) as consumer:
        for bad_timeout in (math.nan, math.inf, "1", True, 10**400):
            with pytest.raises(InvalidArgumentError, match="timeout"):
                consumer.receive(timeout=bad_timeout)  # type: ignore[arg-type]
        message = consumer.receive(timeout=WAIT)
        assert message is not None
        for bad_delay in (math.nan, 1e20, -1, "5", 10**400):
            with pytest.raises(InvalidArgumentError, match="delay"):
                message.nack(delay=bad_delay)  # type: ignore[arg-type]
        assert not message.settled
        message.nack(delay=0)

        class Seconds(float):  # a float of another type (numpy's float64 is one)
            pass

        again = consumer.receive(timeout=Seconds(WAIT))
        assert again is not None
        again.ack()
        # A wait longer than poll() takes (24.8 days): it raised OverflowError. wakeup()
        # ends it here; the point is that it waits at all.
        import threading

        waker = threading.Timer(0.5, consumer.wakeup)
        waker.start()
        try:
            assert consumer.receive(timeout=3_000_000) is None
        finally:
            waker.cancel()

    async def receive_nan() -> None:
        async with AsyncConsumer("timing", "g", data=data_dir) as consumer:
            with pytest.raises(InvalidArgumentError, match="timeout"):
                await consumer.receive(timeout=math.nan)

    asyncio.run(receive_nan())
