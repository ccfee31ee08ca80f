"""The ConsumerBroker takes batches the PublisherBroker just wrote from its notice (entries
``b``: where the bytes are, the keys and extras), checking CRCs but parsing nothing; a notice
that does not match the file falls back to the reader, which verifies everything. Driven
in-process as in test_child_loop: the test writes with a Store and sends the notice."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from test_child_loop import Manager, answer, next_frame, pipes_for_test, step_until, subscribe

from spoolmq import Message, Store, protocol
from spoolmq.broker.child import ChildChannels
from spoolmq.broker.consumer_broker import ConsumerBroker
from spoolmq.clock import ManualClock
from spoolmq.store import reader as reader_module


@pytest.fixture
def pipes() -> Iterator[tuple[Manager, ChildChannels]]:
    with pipes_for_test() as both:
        yield both


def segment(data_dir: Path) -> Path:
    [path] = (data_dir / "logs" / "jobs" / "0").glob("*.jsonl")
    return path


def append(data_dir: Path, messages: list[Message]) -> tuple[int, int, int]:
    """Append a batch; return its byte position and length and its timestamp."""
    with Store(data_dir) as store:
        before = segment(data_dir).stat().st_size if store.topics() else 0
        [first, *_] = store.append_batch("jobs", messages)
    return before, segment(data_dir).stat().st_size - before, first.timestamp


def started(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> tuple[ConsumerBroker, Any, ManualClock]:
    """A consumer broker with one subscribed consumer that has received and ACKed the one
    message already stored, so the group is caught up."""
    append(data_dir, [Message(value="old")])
    manager, channels = pipes
    clock = ManualClock(time.time_ns() // 1_000_000)
    broker = ConsumerBroker(data_dir, channels, clock=clock)
    client = manager.hand_over("c1-1")
    subscribe(broker, client, prefetch=10)
    header, _ = protocol.split_frame(next_frame(broker, client))
    protocol.send(client, {"op": "ack", "id": 2, "runs": [[header["r"][0][5], 1]]})
    assert answer(broker, client)["refused"] == []
    return broker, client, clock


def notice(*entries: list[Any]) -> bytes:
    return orjson.dumps(
        {"op": "appended", "a": [["jobs", 0, e[5] + e[6]] for e in entries], "b": list(entries)}
    )


def test_a_noticed_batch_is_delivered_without_a_parse(
    pipes: tuple[Manager, ChildChannels], data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    broker, client, _ = started(pipes, data_dir)
    batch = [Message(value=0), Message(value=1, key="k"), Message(value=2, key="k")]
    position, length, timestamp = append(data_dir, batch)

    def no_parse(line: bytes) -> Any:
        raise AssertionError("a fresh batch the notice described was parsed")

    monkeypatch.setattr(reader_module, "verified_fields", no_parse)
    keys = [None, "s:k", "s:k"]
    pipes[0].notices.send_bytes(
        notice(["jobs", 0, 0, position, length, 1, 3, timestamp, keys, None])
    )
    header, lines = protocol.split_frame(next_frame(broker, client))
    # The second "k" waits behind the first: per-key order holds with the notice's keys.
    assert [run[:5] for run in header["r"]] == [["jobs", 0, 1, 2, 1]]
    assert [orjson.loads(line)["value"] for line in lines] == [0, 1]
    protocol.send(client, {"op": "ack", "id": 3, "runs": [[header["r"][0][5] + 1, 1]]})
    assert answer(broker, client)["refused"] == []
    header, lines = protocol.split_frame(next_frame(broker, client))
    assert [run[:5] for run in header["r"]] == [["jobs", 0, 3, 1, 1]]
    broker.close()


def test_a_notice_that_does_not_match_the_file_falls_back_to_the_reader(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    broker, client, _ = started(pipes, data_dir)
    position, length, timestamp = append(data_dir, [Message(value=5), Message(value=6)])
    # One byte short: the line count and CRC check fails, so the reader reads it.
    pipes[0].notices.send_bytes(
        notice(["jobs", 0, 0, position, length - 1, 1, 2, timestamp, None, None])
    )
    values: list[Any] = []

    def received() -> bool:
        while client.poll(0):
            _, lines = protocol.split_frame(client.recv_bytes())
            values.extend(orjson.loads(line)["value"] for line in lines)
        return len(values) >= 2

    step_until(broker, received, "the batch, read by the reader")
    assert values == [5, 6]
    broker.close()


def test_a_noticed_delay_holds_the_message_until_it_is_due(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    broker, client, clock = started(pipes, data_dir)
    due = clock.now_ms() + 10_000
    position, length, timestamp = append(data_dir, [Message(value="later"), Message(value="now")])
    extra = {"0": [due, None, None, False]}
    pipes[0].notices.send_bytes(
        notice(["jobs", 0, 0, position, length, 1, 2, timestamp, None, extra])
    )
    header, _ = protocol.split_frame(next_frame(broker, client))
    assert [run[:4] for run in header["r"]] == [["jobs", 0, 2, 1]]
    for _ in range(5):
        broker.loop(0.01)
    assert not client.poll(0)
    clock.advance(10_000)
    header, _ = protocol.split_frame(next_frame(broker, client))
    assert [run[:4] for run in header["r"]] == [["jobs", 0, 1, 1]]
    broker.close()


def test_deliveries_and_acks_go_on_while_another_process_holds_state_db(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    """Checkpoints are written by a thread: while another connection holds state.db's
    write lock (as the PublisherBroker may), ACKs are answered and the next messages go
    out; the committed offset is saved once the lock is released."""
    broker, client, _ = started(pipes, data_dir)
    broker._checkpoint_timer.seconds = 0.0  # a checkpoint is due at every step
    append(data_dir, [Message(value=n) for n in range(3)])
    pipes[0].notices.send_bytes(orjson.dumps({"op": "appended", "a": [["jobs", 0, 4]]}))
    holder = sqlite3.connect(data_dir / "state.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    began = time.monotonic()
    try:
        header, lines = protocol.split_frame(next_frame(broker, client))
        tags = [header["r"][0][5] + n for n in range(header["r"][0][3])]
        assert [orjson.loads(line)["value"] for line in lines] == [0, 1, 2]
        for n, tag in enumerate(tags):
            protocol.send(client, {"op": "ack", "id": 10 + n, "runs": [[tag, 1]]})
            # The 30 s busy timeout would hold a loop that wrote to state.db itself.
            step_until(broker, lambda: client.poll(0), "the ACK's answer", timeout=20)
            assert protocol.decode(client.recv_bytes())["refused"] == []
        # Not a speed: a loop that waited on the lock would have taken the whole 30 s busy
        # timeout at the first checkpoint.
        assert time.monotonic() - began < 25, "the loop waited for state.db's lock"
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    with Store(data_dir) as store:
        step_until(
            broker,
            lambda: store.state.committed_offsets("g") == {("jobs", 0): 4},
            "the committed offset in state.db",
        )
    broker.close()


def test_the_rescan_leaves_a_noticed_partition_to_its_notices(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    """While notices flow, the file is often ahead of the last one (the PublisherBroker
    writes the next batch while the last one syncs): the 1-second rescan must not read that
    unsynced batch. Only a partition with no notice since the last rescan is re-read."""
    broker, client, _ = started(pipes, data_dir)
    broker._rescan_timer.seconds = 0.0  # every step is a rescan step in this test
    position, length, timestamp = append(data_dir, [Message(value=1)])
    append(data_dir, [Message(value=2)])  # written, not noticed: its sync has not returned
    pipes[0].notices.send_bytes(
        notice(["jobs", 0, 0, position, length, 1, 1, timestamp, None, None])
    )
    # The step that takes the notice rescans too, and leaves the noticed partition alone.
    _, lines = protocol.split_frame(next_frame(broker, client))
    assert [orjson.loads(line)["value"] for line in lines] == [1]
    # The next rescans (no notice since) find it grown and read the rest.
    _, lines = protocol.split_frame(next_frame(broker, client))
    assert [orjson.loads(line)["value"] for line in lines] == [2]
    broker.close()
