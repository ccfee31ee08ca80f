"""``spoolmq topics delete`` while a broker runs (issue 12, point 9): the broker stops serving
the topic, its consumers are told, then the files go; other topics flow on; a topic created
again under the name starts afresh, and an old producer sequence is never answered with an
offset of the deleted log. And the store's crash-safe deletion."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import threading
import time
from pathlib import Path

import pytest

from spoolmq import AsyncConsumer, Consumer, Publisher, Store
from spoolmq.errors import TopicDeletedError
from spoolmq.store.names import TRASH_DIR
from spoolmq.testing import BrokerProcess, run_spoolmq, wait_until


def cli(data: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_spoolmq(*args, "--data", str(data))


def receive_until(consumer: Consumer, wanted: object, seconds: float = 60) -> object:
    """Receive (and ACK) until a message with value ``wanted`` arrives."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        message = consumer.receive(timeout=1)
        if message is not None:
            message.ack()
            if message.value == wanted:
                return message.value
    raise AssertionError(f"{wanted!r} did not arrive in {seconds} s")


def test_deleting_a_topic_while_the_broker_runs(tmp_path: Path, data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("doomed", partitions=2)
        store.create_topic("kept")
    with (
        BrokerProcess(data_dir, log_file=tmp_path / "broker.log"),
        Publisher(data=data_dir) as publisher,
    ):
        for n in range(20):
            publisher.publish("doomed", {"n": n}, partition=n % 2)
        publisher.publish("kept", "before")
        mixed = Consumer(["doomed", "kept"], "mixed", data=data_dir, prefetch=10)
        solo = Consumer("doomed", "solo", data=data_dir, prefetch=10)
        told = threading.Event()  # the async consumer holds a message of the topic

        async def async_solo() -> str:
            async with AsyncConsumer("doomed", "async-solo", data=data_dir) as consumer:
                first = await consumer.receive(timeout=60)
                assert first is not None
                told.set()
                with pytest.raises(TopicDeletedError):
                    while True:  # bounded by the deletion below, which the test waits for
                        message = await consumer.receive(timeout=1)
                        if message is not None:
                            await message.ack()
                await first.ack()  # a message of a deleted topic settles as a no-op
                return "told"

        # The async consumer runs on its own loop in a thread, as an application would.
        outcome: list[str] = []
        runner = threading.Thread(target=lambda: outcome.append(asyncio.run(async_solo())))
        runner.start()
        # Messages of the doomed topic in the consumers' hands, not ACKed.
        held = wait_until(
            lambda: (m := mixed.receive(timeout=1)) is not None and m.topic == "doomed" and m,
            60,
            "a doomed message in the mixed consumer",
        )
        solo_held = solo.receive(timeout=60)
        assert solo_held is not None
        assert told.wait(60)

        deleted = cli(data_dir, "topics", "delete", "doomed", "--json")
        assert deleted.returncode == 0, deleted.stderr
        answer = json.loads(deleted.stdout)
        assert answer["deleted"] == "doomed" and answer["partitions"] == 2
        assert sorted(answer["groups"]) == ["async-solo", "mixed", "solo"]
        assert answer["consumers_told"] == 3

        # The files and the state are gone; nothing is left in the trash.
        assert not (data_dir / "logs" / "doomed").exists()
        assert list((data_dir / TRASH_DIR).iterdir()) == []
        with Store(data_dir) as store:
            assert "doomed" not in store.topics()
            for group in ("mixed", "solo", "async-solo"):
                assert all(tp.topic != "doomed" for tp in store.state.committed_offsets(group))
        listed = cli(data_dir, "topics", "list", "--json")
        assert [t["name"] for t in json.loads(listed.stdout)] == ["kept"]

        # The consumer of that topic alone is told: nothing more can come.
        def solo_told() -> bool:
            try:
                message = solo.receive(timeout=0.5)
            except TopicDeletedError:
                return True
            if message is not None:
                message.ack()
            return False

        wait_until(solo_told, 60, "the solo consumer to be told")
        assert solo.deleted_topics == {"doomed"}
        solo_held.ack()  # nothing to settle any more: no error
        runner.join(90)
        assert outcome == ["told"]

        # The mixed consumer reads on: its other topic flows, its doomed message settles.
        def mixed_told() -> bool:
            message = mixed.receive(timeout=0.2)
            if message is not None and message.topic == "kept":
                message.ack()
            return mixed.deleted_topics == {"doomed"}

        wait_until(mixed_told, 60, "the mixed consumer to be told")
        held.ack()
        assert mixed.topics == ["kept"]
        publisher.publish("kept", "after")
        assert receive_until(mixed, "after") == "after"

        # Created again on publish: offsets from 0. Sequence 0 of this publisher stored
        # doomed/0@0 before; resent now, it is stored anew, not answered with that offset.
        publisher.set_next_sequence(0)
        position = publisher.publish("doomed", {"again": True})
        assert (position.partition, position.offset, position.duplicate) == (0, 0, False)
        with Store(data_dir) as store:
            assert store.topics()["doomed"].partitions == 1
            assert [r.value for r in store.reader("doomed", 0)] == [{"again": True}]
        mixed.close()
        solo.close()


def test_deleting_an_unknown_topic_changes_nothing(tmp_path: Path, data_dir: Path) -> None:
    with BrokerProcess(data_dir, log_file=tmp_path / "broker.log"):
        with Publisher(data=data_dir) as publisher:
            publisher.publish("kept", 1)
        refused = cli(data_dir, "topics", "delete", "nope")
        assert refused.returncode != 0
        lines = refused.stderr.strip().splitlines()
        assert len(lines) == 1 and "nope" in lines[0] and "Traceback" not in refused.stderr
        with Store(data_dir) as store:
            assert list(store.topics()) == ["kept"]


def test_a_deletion_a_crash_interrupted_is_finished_at_the_next_start(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("gone")
        store.create_topic("back")
        store.create_topic("kept")
        for topic in ("gone", "back", "kept"):
            store.append(topic, "x")
    # A crash right after the rename (the point of no return) of two deletions: "gone"
    # stays deleted, "back" was created again since, and keeps its new rows.
    trash = data_dir / TRASH_DIR
    trash.mkdir(mode=0o700)
    os.replace(data_dir / "logs" / "gone", trash / "gone.1")
    os.replace(data_dir / "logs" / "back", trash / "back.2")
    (data_dir / "logs" / "back").mkdir(mode=0o700)
    with Store(data_dir) as store:
        assert sorted(store.finish_deletions()) == ["back", "gone"]
        assert sorted(store.topics()) == ["back", "kept"]
        assert [r.value for r in store.reader("kept", 0)] == ["x"]
    assert list(trash.iterdir()) == []
    # The broker does it when it starts.
    os.replace(data_dir / "logs" / "kept", trash / "kept.3")
    with BrokerProcess(data_dir), Store(data_dir) as store:
        assert sorted(store.topics()) == ["back"]
        assert list(trash.iterdir()) == []


def test_offline_delete_when_no_broker_runs(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("gone", partitions=3)
        store.append("gone", "x")
    done = cli(data_dir, "topics", "delete", "gone")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "deleted topic gone (3 partition(s))"
    with Store(data_dir) as store:
        assert store.topics() == {}
