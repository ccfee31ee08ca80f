"""Per-topic limits of a consumer group from real clients of a real broker: a concurrency
cap across two consumers, a rate that paces an AsyncConsumer, and consumers that disagree
on a group's limits refused."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from spoolmq import AsyncConsumer, Consumer, Publisher
from spoolmq.errors import InvalidArgumentError, SpoolError
from spoolmq.testing import BrokerProcess


def test_a_concurrency_cap_holds_across_two_consumers(
    broker: BrokerProcess, data_dir: Path
) -> None:
    limits = {"jobs": {"concurrency": 2}}
    with Publisher(data=data_dir) as publisher:
        for i in range(6):
            publisher.publish("jobs", i)
    with (
        Consumer("jobs", group="g", data=data_dir, prefetch=5, limits=limits) as a,
        Consumer("jobs", group="g", data=data_dir, prefetch=5, limits=limits) as b,
    ):
        held = []
        deadline = time.monotonic() + 60
        while len(held) < 2 and time.monotonic() < deadline:
            for consumer in (a, b):
                if (message := consumer.receive(timeout=0.2)) is not None:
                    held.append(message)
        assert len(held) == 2
        # Two in flight: neither consumer gets a third, whatever its prefetch.
        assert a.receive(timeout=1.0) is None and b.receive(timeout=1.0) is None
        held.pop().ack()
        third = None
        deadline = time.monotonic() + 60
        while third is None and time.monotonic() < deadline:
            third = a.receive(timeout=0.2) or b.receive(timeout=0.2)
        assert third is not None


def test_a_rate_paces_an_async_consumer(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        for i in range(9):
            publisher.publish("paced", i, partition=0)

    async def consume() -> list[float]:
        arrived = []
        limits = {"paced": {"rate": "3/s"}}
        async with AsyncConsumer("paced", group="g", data=data_dir, prefetch=9, limits=limits) as c:
            async for message in c:
                arrived.append(time.monotonic())
                await message.ack()
                if len(arrived) == 9:
                    break
        return arrived

    arrived = asyncio.run(asyncio.wait_for(consume(), 120))
    # 3 at once, 3 a second later, 3 a second after that: 2 s at least from first to last.
    assert arrived[-1] - arrived[0] >= 1.9


def test_consumers_of_a_group_must_agree_on_its_limits(
    broker: BrokerProcess, data_dir: Path
) -> None:
    with (
        Consumer("jobs", group="g", data=data_dir, limits={"jobs": {"rate": "5/s"}}),
        pytest.raises(InvalidArgumentError, match="other settings"),
    ):
        Consumer("jobs", group="g", data=data_dir, limits={"jobs": {"rate": "6/s"}})
    with pytest.raises(SpoolError, match="a rate limit is a whole number"):
        Consumer("jobs", group="h", data=data_dir, limits={"jobs": {"rate": "lots"}})
