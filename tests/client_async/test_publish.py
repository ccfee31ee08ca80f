"""AsyncPublisher against a real broker: answers, batching of many concurrent
publish_nowait futures, the threaded Publisher's errors, a broker restart mid-stream
(idempotent resends: each message stored once) and both cases of cancellation."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from aio_helpers import eventually, repeated, stored_ids

from spoolmq import AsyncPublisher, Position, Publisher, Store
from spoolmq.errors import (
    AuthenticationError,
    BrokerUnavailableError,
    ConfigError,
    InvalidArgumentError,
    InvalidTopicError,
    SerializationError,
    SpoolError,
)
from spoolmq.testing import BrokerProcess


def test_publish_answers_positions_and_stores_the_message(
    broker: BrokerProcess, data_dir: Path
) -> None:
    async def main() -> list[Position]:
        async with AsyncPublisher(data=data_dir) as pub:
            first = await pub.publish("orders", {"id": 1}, key="customer-7")
            second = await pub.publish("orders", {"id": 2}, key="customer-7")
            raw = await pub.publish("orders", b"\x00\xff", headers={"trace": "abc"})
            return [first, second, raw]

    first, second, _ = asyncio.run(main())
    assert (first.topic, first.partition, first.duplicate) == ("orders", 0, False)
    assert second.offset == first.offset + 1
    with Store(data_dir) as store:
        records = list(store.reader("orders", 0))
    assert [r.value for r in records] == [{"id": 1}, {"id": 2}, b"\x00\xff"]
    assert records[0].key == "customer-7"
    assert list(records[2].headers) == [("trace", "abc")]


def test_many_concurrent_publish_nowait_are_batched_and_all_answered(
    broker: BrokerProcess, data_dir: Path
) -> None:
    count = 5000

    async def main() -> tuple[list[Position], int]:
        async with AsyncPublisher(data=data_dir, batch_size=100) as pub:
            futures = [pub.publish_nowait("bulk", {"id": i}) for i in range(count)]
            positions = await asyncio.gather(*futures)
            return list(positions), pub._frame_ids

    positions, frames = asyncio.run(main())
    assert len({(p.partition, p.offset) for p in positions}) == count
    # Batched: 100 to a frame at most, so at least 50 frames and far fewer than 5,000.
    assert count // 100 <= frames < count // 10
    ids = stored_ids(data_dir, "bulk")
    assert sorted(ids) == list(range(count))


def test_errors_are_the_threaded_publishers(broker: BrokerProcess, data_dir: Path) -> None:
    with pytest.raises(ConfigError, match=r"lingr_ms.*linger_ms"):
        AsyncPublisher(data=data_dir, lingr_ms=5)
    with pytest.raises(InvalidArgumentError):
        AsyncPublisher(data=data_dir, batch_size=0)
    with pytest.raises(InvalidArgumentError):
        Publisher(data=data_dir, batch_size=0)

    async def main() -> dict[str, type[BaseException]]:
        raised: dict[str, type[BaseException]] = {}
        async with AsyncPublisher(data=data_dir) as pub:
            for name, call in {
                "topic": lambda: pub.publish_nowait("bad topic/name", {"id": 1}),
                "json": lambda: pub.publish_nowait("orders", {"id": object()}),
                "nan": lambda: pub.publish_nowait("orders", {"id": float("nan")}),
            }.items():
                try:
                    call()
                except SpoolError as exc:
                    raised[name] = type(exc)
            try:
                await pub.publish("bad topic/name", {"id": 1})
            except SpoolError as exc:
                raised["publish"] = type(exc)
        return raised

    raised = asyncio.run(main())
    with Publisher(data=data_dir) as threaded, pytest.raises(InvalidTopicError):
        threaded.publish("bad topic/name", {"id": 1})
    assert raised == {
        "topic": InvalidTopicError,
        "json": SerializationError,
        "nan": SerializationError,
        "publish": InvalidTopicError,
    }


def test_no_broker_and_wrong_key_fail_on_entering(data_dir: Path, tmp_path: Path) -> None:
    async def enter(**options: object) -> None:
        async with AsyncPublisher(data=data_dir, **options):  # type: ignore[arg-type]
            pass

    with pytest.raises(BrokerUnavailableError):
        asyncio.run(enter(authkey=b"k" * 32))
    with BrokerProcess(data_dir, log_file=tmp_path / "broker.log"):
        with pytest.raises(AuthenticationError):
            asyncio.run(enter(authkey=b"not the key at all, 32 bytes...."))
        asyncio.run(enter())  # the right key from <data>/.authkey


def test_over_tcp(data_dir: Path, tmp_path: Path) -> None:
    with BrokerProcess(
        data_dir, args=["--listen", "127.0.0.1:0"], log_file=tmp_path / "b.log"
    ) as b:
        address = b.tcp_address()
        assert address is not None

        async def main() -> int:
            async with AsyncPublisher(data=data_dir, address=address) as pub:
                return (await pub.publish("tcp", {"id": 1})).offset

        assert asyncio.run(main()) == 0


def test_broker_restart_mid_stream_stores_each_message_once(
    broker: BrokerProcess, data_dir: Path
) -> None:
    count = 3000

    async def main() -> int:
        async with AsyncPublisher(data=data_dir, batch_size=50, max_in_flight=4) as pub:
            futures = []
            for i in range(count):
                futures.append(pub.publish_nowait("restart", {"id": i}))
                if i == count // 3:
                    # Some frames answered, some in flight, most still queued: the broker
                    # goes away without warning and comes back.
                    await asyncio.sleep(0)
                    await asyncio.to_thread(broker.kill)
                    await asyncio.to_thread(broker.start)
                if i % 100 == 0:
                    await asyncio.sleep(0)
            await asyncio.gather(*futures)
            return pub.reconnects

    reconnects = asyncio.run(main())
    assert reconnects >= 1
    ids = stored_ids(data_dir, "restart")
    assert repeated(ids) == []
    assert sorted(ids) == list(range(count))


def test_cancelled_before_it_was_sent_is_never_stored(
    broker: BrokerProcess, data_dir: Path
) -> None:
    async def main() -> None:
        # A long linger keeps publish_nowait's message in the queue: not sent yet.
        async with AsyncPublisher(data=data_dir, linger_ms=60_000) as pub:
            await pub.publish("cancel", {"id": "before"})  # creates the topic
            lingering = pub.publish_nowait("cancel", {"id": "nowait-cancelled"})
            lingering.cancel()
            # A publish cancelled while its message waits for the writer task.
            task = asyncio.create_task(pub.publish("cancel", {"id": "publish-cancelled"}))
            await asyncio.sleep(0)  # the task queues its message and waits
            assert pub._queued == 2
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # A publish_many cancelled the same way: none of its messages is sent.
            many = asyncio.create_task(pub.publish_many("cancel", [{"id": "m1"}, {"id": "m2"}]))
            await asyncio.sleep(0)  # the task queues both messages and waits
            queued = [item.body for queue in pub._groups.values() for item in queue]
            ours = [body for body in queued if b'"m1"' in body or b'"m2"' in body]
            assert len(ours) == 2
            many.cancel()
            with pytest.raises(asyncio.CancelledError):
                await many
            await pub.publish("cancel", {"id": "after"})
            await pub.flush()
            assert pub._outstanding == 0

    asyncio.run(main())
    assert stored_ids(data_dir, "cancel") == ["before", "after"]


def test_cancelled_after_it_was_sent_is_stored_once_and_answered(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publisher_pid = broker.child_pids()["publisher"]

    async def main() -> None:
        async with AsyncPublisher(data=data_dir) as pub:
            await pub.publish("cancel", {"id": "before"})
            # The PublisherBroker (a process of this test's broker) is paused: the frame
            # is written to the socket and no answer can come.
            os.kill(publisher_pid, signal.SIGSTOP)
            try:
                task = asyncio.create_task(pub.publish("cancel", {"id": "sent-cancelled"}))
                await eventually(lambda: pub._in_flight, 30, "the frame to be written")
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
                assert pub._outstanding == 1  # kept until the broker answers
            finally:
                os.kill(publisher_pid, signal.SIGCONT)
            await pub.flush(60)
            assert pub._outstanding == 0 and not pub._in_flight

    asyncio.run(main())
    assert stored_ids(data_dir, "cancel") == ["before", "sent-cancelled"]


def test_cancelled_after_it_was_sent_survives_a_broker_restart_once(
    broker: BrokerProcess, data_dir: Path
) -> None:
    async def main() -> None:
        async with AsyncPublisher(data=data_dir) as pub:
            await pub.publish("cancel", {"id": "before"})
            publisher_pid = broker.child_pids()["publisher"]
            os.kill(publisher_pid, signal.SIGSTOP)
            task = asyncio.create_task(pub.publish("cancel", {"id": "sent-cancelled"}))
            await eventually(lambda: pub._in_flight, 30, "the frame to be written")
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            # The whole broker goes (the paused child included) and comes back: the
            # message, written once and never answered, is sent again and stored once.
            await asyncio.to_thread(broker.kill)
            if _alive(publisher_pid):  # paused, it cannot see its parent go: ended here
                os.kill(publisher_pid, signal.SIGKILL)
            await asyncio.to_thread(broker.start)
            await pub.flush(60)
            assert pub.reconnects >= 1

    asyncio.run(main())
    ids = stored_ids(data_dir, "cancel")
    assert sorted(ids) == ["before", "sent-cancelled"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_many_concurrent_publish_awaits_share_frames(broker: BrokerProcess, data_dir: Path) -> None:
    count = 1000

    async def main() -> tuple[list[Position], int]:
        async with AsyncPublisher(data=data_dir) as pub:
            positions = await asyncio.gather(
                *(pub.publish("tasks", {"id": i}) for i in range(count))
            )
            return list(positions), pub._frame_ids

    positions, frames = asyncio.run(main())
    assert len({p.offset for p in positions}) == count
    # Every task's publish is "urgent", yet those queued in one turn of the loop go together.
    assert frames <= count // 10
    assert sorted(stored_ids(data_dir, "tasks")) == list(range(count))


def test_a_timeout_while_frames_are_in_flight_never_sends_the_message(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publisher_pid = broker.child_pids()["publisher"]

    async def main() -> None:
        async with AsyncPublisher(data=data_dir, max_in_flight=1) as pub:
            await pub.publish("timeout", {"id": "before"})
            os.kill(publisher_pid, signal.SIGSTOP)
            try:
                first = asyncio.create_task(pub.publish("timeout", {"id": "in-flight"}))
                await eventually(lambda: pub._in_flight, 30, "the first frame to be written")
                # The one frame allowed in flight is out: this message waits in the queue
                # until asyncio.timeout cancels it.
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(0.5):
                        await pub.publish("timeout", {"id": "timed-out"})
            finally:
                os.kill(publisher_pid, signal.SIGCONT)
            await first
            await pub.publish("timeout", {"id": "after"})

    asyncio.run(main())
    assert stored_ids(data_dir, "timeout") == ["before", "in-flight", "after"]


def test_publish_many_and_publish_many_nowait(broker: BrokerProcess, data_dir: Path) -> None:
    async def main() -> tuple[list[Position], list[Position], int]:
        async with AsyncPublisher(data=data_dir, batch_size=100, max_buffered=150) as pub:
            # More than max_buffered: queued a frame at a time, waiting for room.
            many = await pub.publish_many("bulk", [{"id": i} for i in range(250)])
            with pytest.raises(SerializationError, match=r"values\[1\]"):
                await pub.publish_many("bulk", [{"id": -1}, {"id": {1, 2}}])
            futures = pub.publish_many_nowait("bulk", [{"id": i} for i in range(250, 400)])
            nowait = list(await asyncio.gather(*futures))
            return many, nowait, pub._frame_ids

    many, nowait, frames = asyncio.run(main())
    offsets = [p.offset for p in many + nowait]
    assert offsets == list(range(offsets[0], offsets[0] + 400))
    assert frames < 40  # frames of up to 100, not one per message
    assert sorted(stored_ids(data_dir, "bulk")) == list(range(400))  # the refused one: none


def test_the_threaded_publish_many_against_a_broker(broker: BrokerProcess, data_dir: Path) -> None:
    with Publisher(data=data_dir, max_buffered=150) as pub:
        positions = pub.publish_many("many", [{"id": i} for i in range(300)], key="k")
        futures = pub.publish_many_async("many", ({"id": i} for i in range(300, 350)), key="k")
        pub.flush(30)
    offsets = [p.offset for p in positions] + [f.result(timeout=0).offset for f in futures]
    assert offsets == list(range(350))  # one key: one partition, in order
    assert stored_ids(data_dir, "many") == list(range(350))


def test_publish_many_keeps_to_max_buffered_and_a_cancel_sends_nothing_unwritten(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """Waiting for room between frames, publish_many never has more than ``max_buffered``
    out; cancelled there, what it queued and did not write is never sent."""
    publisher_pid = broker.child_pids()["publisher"]

    async def main() -> None:
        settings = {"batch_size": 2, "max_buffered": 5, "max_in_flight": 1}
        async with AsyncPublisher(data=data_dir, **settings) as pub:
            await pub.publish("room", {"id": "before"})
            os.kill(publisher_pid, signal.SIGSTOP)  # no answer can come
            try:
                values = [{"id": f"m{i}"} for i in range(8)]
                task = asyncio.create_task(pub.publish_many("room", values))
                # Frames of 2: the first written (1 in flight), the second queued behind
                # it; a third would make 6 > 5, so the call waits for room.
                await eventually(lambda: pub._in_flight and pub._queued == 2, 30, "2 frames")
                await asyncio.sleep(0.2)  # a chance to go past max_buffered, which it must not
                assert pub._outstanding == 4 and not task.done()
                task.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await task
            finally:
                os.kill(publisher_pid, signal.SIGCONT)
            await pub.flush(60)
            await pub.publish("room", {"id": "after"})

    asyncio.run(main())
    # The written frame cannot be called back: stored once; the queued one never sent.
    assert stored_ids(data_dir, "room") == ["before", "m0", "m1", "after"]


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"linger_ms": -1}, "linger_ms must be a finite number of milliseconds, 0 or more"),
        ({"linger_ms": float("nan")}, "linger_ms must be a finite number"),
        ({"delivery_timeout": 0}, "delivery_timeout must be a finite number of seconds, more"),
        ({"delivery_timeout": float("inf")}, "delivery_timeout must be a finite number"),
        ({"max_buffered": 1.5}, "max_buffered must be a whole number of at least 1"),
        ({"batch_size": "10"}, "batch_size must be a whole number of at least 1"),
        ({"max_in_flight": True}, "max_in_flight must be a whole number"),
    ],
)
def test_publisher_settings_are_checked(
    data_dir: Path, setting: dict[str, object], says: str
) -> None:
    """Accepted before (a NaN linger, a zero or infinite delivery timeout, a fractional
    buffer), or a TypeError from deep inside: now InvalidArgumentError, before connecting."""
    for make in (Publisher, AsyncPublisher):
        with pytest.raises(InvalidArgumentError, match=says):
            make(data=data_dir, **setting)


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ({"lease": float("nan")}, "lease must be a finite number of seconds, more than 0"),
        ({"lease": True}, "lease must be a finite number"),
        ({"lease": 0}, "lease must be a finite number of seconds, more than 0"),
        ({"retry_backoff": float("nan")}, "retry_backoff must be a finite number"),
        ({"retry_backoff_max": -1}, "retry_backoff_max must be a finite number"),
        ({"reconnect_timeout": -1}, "reconnect_timeout must be a finite number"),
        ({"reconnect_timeout": float("nan")}, "reconnect_timeout must be a finite number"),
        ({"filter": "x"}, "filter must be a mapping"),
    ],
)
def test_consumer_settings_are_checked(
    data_dir: Path, setting: dict[str, object], says: str
) -> None:
    """A NaN lease or backoff raised "cannot convert float NaN to integer"; a NaN
    reconnect_timeout made a consumer that never gave up; lease=True was one second."""
    from spoolmq import Consumer
    from spoolmq.client import AsyncConsumer

    for make in (Consumer, AsyncConsumer):
        with pytest.raises(InvalidArgumentError, match=says):
            make("orders", "g", data=data_dir, **setting)


def test_records_near_the_limit_go_in_frames_the_broker_reads(
    broker: BrokerProcess, data_dir: Path
) -> None:
    # 100 records of 900,000 bytes (each under the 1 MiB max_message_bytes) are 90 MB: more
    # than one 64 MiB frame. Sent as one, the broker dropped the connection at its length.
    values = [{"id": n, "pad": "x" * 900_000} for n in range(100)]

    async def main() -> list[Position]:
        async with AsyncPublisher(data=data_dir, delivery_timeout=60) as publisher:
            return await publisher.publish_many("big", values)

    positions = asyncio.run(main())
    assert [p.offset for p in positions] == list(range(100))
    assert stored_ids(data_dir, "big") == list(range(100))
