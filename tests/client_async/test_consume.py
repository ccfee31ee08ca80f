"""AsyncConsumer against a real broker: async-for consumption with ACKs, NACK and
redelivery, lease extension, run() with a coroutine handler, the threaded Consumer's
errors, and a broker restart while consuming."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
from aio_helpers import eventually, repeated

from spoolmq import AsyncConsumer, AsyncPublisher, AsyncReceivedMessage, Consumer, Publisher
from spoolmq.errors import (
    BrokerUnavailableError,
    ConfigError,
    InvalidArgumentError,
    UnknownDeliveryError,
)
from spoolmq.testing import BrokerProcess


def publish(data_dir: Path, topic: str, count: int, **options: Any) -> None:
    with Publisher(data=data_dir) as publisher:
        for i in range(count):
            publisher.publish_async(topic, {"id": i}, **options)


def acked(broker: BrokerProcess) -> int:
    return int(broker.stats()["consumer"].get("acked", 0))


def test_async_for_with_acks_delivers_each_message_once(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publish(data_dir, "orders", 300)

    async def main() -> list[int]:
        ids: list[int] = []
        async with AsyncConsumer("orders", group="g", data=data_dir, prefetch=50) as consumer:
            async for message in consumer:
                assert isinstance(message, AsyncReceivedMessage)
                assert message.attempt == 1
                ids.append(message.value["id"])
                # Half answered one by one, half batched without waiting.
                await message.ack(wait=message.offset % 2 == 0)
                if len(ids) == 300:
                    break
        return ids

    ids = asyncio.run(main())
    assert sorted(ids) == list(range(300))
    # Every ACK reached the broker (the batched ones on close): nothing is left to redeliver.
    assert broker.wait_ready() and eventually_sync(lambda: acked(broker) >= 300)

    async def again() -> Any:
        async with AsyncConsumer("orders", group="g", data=data_dir) as consumer:
            return await consumer.receive(timeout=2)

    assert asyncio.run(again()) is None


def eventually_sync(predicate: Any) -> bool:
    from spoolmq.testing import wait_until

    return bool(wait_until(predicate, 30, "the broker's count"))


def test_nack_redelivers_with_the_next_attempt(broker: BrokerProcess, data_dir: Path) -> None:
    publish(data_dir, "jobs", 1)

    async def main() -> list[tuple[int, int]]:
        seen: list[tuple[int, int]] = []
        async with AsyncConsumer("jobs", group="g", data=data_dir, retry_backoff=0.1) as c:
            async for message in c:
                seen.append((message.value["id"], message.attempt))
                if message.attempt == 1:
                    await message.nack(delay=0.1, reason="try again")
                else:
                    await message.ack()
                    break
        return seen

    assert asyncio.run(main()) == [(0, 1), (0, 2)]


def test_extend_keeps_a_message_past_its_lease(broker: BrokerProcess, data_dir: Path) -> None:
    publish(data_dir, "long", 1)

    async def main() -> Any:
        options: dict[str, Any] = {"group": "g", "data": data_dir, "lease": 3.0}
        async with AsyncConsumer("long", **options) as first:
            message = await first.receive(timeout=30)
            assert message is not None
            await message.extend_lease(60)
            async with AsyncConsumer("long", **options) as second:
                # Well past the 3 s lease (3 s leave room for a busy machine between the
                # delivery and the extension): not redelivered to the other member.
                stolen = await second.receive(timeout=8)
            # The lease held, so the ACK is accepted (an expired one is refused).
            await message.ack()
            return stolen

    assert asyncio.run(main()) is None


def test_run_acks_on_return_and_nacks_on_raise(broker: BrokerProcess, data_dir: Path) -> None:
    publish(data_dir, "work", 4)
    attempts: list[tuple[int, int]] = []

    async def handler(message: AsyncReceivedMessage) -> None:
        attempts.append((message.value["id"], message.attempt))
        await asyncio.sleep(0)
        if message.value["id"] == 2 and message.attempt == 1:
            raise ValueError("the first attempt of 2 fails")

    async def main() -> int:
        async with AsyncConsumer(
            "work", group="g", data=data_dir, prefetch=4, retry_backoff=0.1
        ) as consumer:
            return await consumer.run(handler, max_messages=5)

    assert asyncio.run(main()) == 5
    assert sorted(attempts) == [(0, 1), (1, 1), (2, 1), (2, 2), (3, 1)]


def test_errors_are_the_threaded_consumers(broker: BrokerProcess, data_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"prefech.*prefetch"):
        AsyncConsumer("orders", group="g", data=data_dir, prefech=5)
    for cls in (AsyncConsumer, Consumer):
        with pytest.raises(InvalidArgumentError):
            cls([], group="g", data=data_dir)  # type: ignore[operator]
    publish(data_dir, "orders", 1)

    async def main() -> list[type[BaseException]]:
        raised: list[type[BaseException]] = []
        async with AsyncConsumer("orders", group="g", data=data_dir) as consumer:
            message = await consumer.receive(timeout=30)
            assert message is not None
            await message.ack()
            try:
                await message.ack()
            except InvalidArgumentError as exc:
                raised.append(type(exc))
        async with AsyncConsumer("orders", group="auto", data=data_dir, auto_ack=True) as c:
            message = await c.receive(timeout=30)
            assert message is not None
            try:
                await message.nack()
            except InvalidArgumentError as exc:
                raised.append(type(exc))
        return raised

    assert asyncio.run(main()) == [InvalidArgumentError, InvalidArgumentError]


def test_missing_broker_fails_on_entering(data_dir: Path, tmp_path: Path) -> None:
    with BrokerProcess(data_dir, log_file=tmp_path / "b.log"):
        pass  # leaves the authkey behind, and no broker

    async def main() -> None:
        async with AsyncConsumer("orders", group="g", data=data_dir):
            pass

    with pytest.raises(BrokerUnavailableError):
        asyncio.run(main())


def test_consuming_through_a_broker_restart(broker: BrokerProcess, data_dir: Path) -> None:
    publish(data_dir, "stream", 100)

    async def main() -> list[int]:
        ids: list[int] = []
        async with AsyncConsumer("stream", group="g", data=data_dir, prefetch=10) as consumer:
            async for message in consumer:
                ids.append(message.value["id"])
                if len(ids) == 50:
                    # Unsettled: void once the broker goes; the broker redelivers it.
                    await asyncio.to_thread(broker.kill)
                    with pytest.raises(UnknownDeliveryError):
                        await eventually(lambda: consumer._stream is None, 30, "the loss")
                        await message.ack()
                    await asyncio.to_thread(broker.start)
                    async with AsyncPublisher(data=data_dir) as pub:
                        for i in range(100, 150):
                            pub.publish_nowait("stream", {"id": i})
                    continue
                await message.ack(wait=False)
                if set(ids) >= set(range(150)):
                    break
        return ids

    ids = asyncio.run(main())
    assert set(ids) == set(range(150))
    # At-least-once: what was received before the broker was killed may come again (its
    # ACKs were not all checkpointed), nothing received after the restart.
    assert set(repeated(ids)) <= set(ids[:50])


def test_a_receive_ends_on_time_while_the_broker_is_away(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """As for Consumer: the timeout holds while reconnecting, the consumer comes back with
    the broker, and gives up once ``reconnect_timeout`` has passed since the loss."""

    async def main() -> list[float]:
        waits = []
        async with AsyncConsumer("away", group="g", data=data_dir, reconnect_timeout=600) as c:
            assert await c.receive(timeout=0.2) is None
            assert await asyncio.to_thread(broker.stop) == 0
            await eventually(lambda: c._stream is None, 30, "the loss")
            for _ in range(3):
                started = time.monotonic()
                assert await c.receive(timeout=0.3) is None
                waits.append(time.monotonic() - started)
            await asyncio.to_thread(broker.start)
            async with AsyncPublisher(data=data_dir) as publisher:
                await publisher.publish("away", "back")
            message = await c.receive(timeout=60)
            assert message is not None and message.value == "back"
            await message.ack()
        async with AsyncConsumer("away", group="g", data=data_dir, reconnect_timeout=1.5) as c:
            # The loss may be seen while the broker stops: count from before it.
            started = time.monotonic()
            assert await asyncio.to_thread(broker.stop) == 0
            with pytest.raises(BrokerUnavailableError, match=r"could not reconnect in 1\.5 s"):
                while time.monotonic() - started < 60:
                    await c.receive(timeout=0.2)
            assert time.monotonic() - started >= 1.4
        return waits

    waits = asyncio.run(main())
    # Before, the first one waited out the reconnect timeout (600 s).
    assert max(waits) < 30, f"receive(0.3) waits with the broker away: {waits}"


def test_pause_gives_back_what_was_pushed_ahead(broker: BrokerProcess, data_dir: Path) -> None:
    publish(data_dir, "paused", 4)
    delivered = lambda: broker.stats()["consumer"].get("delivered", 0)  # noqa: E731

    async def main() -> tuple[int, list[tuple[int, int]], Any]:
        # A 300 s lease: what the other member gets came back through the pause.
        options: dict[str, Any] = {"group": "g", "data": data_dir, "lease": 300}
        async with AsyncConsumer("paused", prefetch=4, **options) as first:
            held = await first.receive(timeout=30)
            assert held is not None
            await eventually(lambda: delivered() >= 4, 30, "the three pushed ahead")
            released = await first.pause()
            # A receive waiting out the pause gets nothing buffered before it was paused.
            nothing = await first.receive(timeout=0.2)
            async with AsyncConsumer("paused", prefetch=10, **options) as second:
                others = []
                for _ in range(3):
                    message = await second.receive(timeout=30)
                    assert message is not None
                    others.append((message.value["id"], message.attempt))
                    await message.ack()
                await held.ack()  # still its own to settle while paused
                await second.pause()
                publish(data_dir, "paused", 1)
                await first.resume()
                fresh = await first.receive(timeout=30)
                assert fresh is not None
                await fresh.ack()
            return released, sorted(others), (nothing, fresh.value, fresh.attempt)

    released, others, (nothing, fresh, attempt) = asyncio.run(main())
    assert released == 3
    assert others == [(1, 1), (2, 1), (3, 1)]  # first attempts, not failed ones
    assert nothing is None and fresh == {"id": 0} and attempt == 1
