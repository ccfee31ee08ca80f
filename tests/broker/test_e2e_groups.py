"""Consumer groups through a real broker: where a new group starts, committed positions
surviving a restart, and per-key order with four consumer processes."""

from __future__ import annotations

import collections
import itertools
from pathlib import Path
from typing import Any

import pytest
from e2e_workers import (
    SPAWN,
    client_processes,
    consume_worker,
    join_all,
    publish_all,
    read_lines,
    start,
)

from event_shapes import events_of
from spoolmq import Consumer, Publisher, Store
from spoolmq.testing import BrokerProcess, wait_until


def drain(data_dir: Path, group: str, count: int, **options: Any) -> list[int]:
    """The offsets of "jobs" the group is given: ``count`` of them, each waited for with a
    generous bound, then any that come within a second more (none, if all is well)."""
    offsets = []
    with Consumer("jobs", group=group, data=data_dir, prefetch=10, **options) as consumer:
        while (
            message := consumer.receive(timeout=60 if len(offsets) < count else 1.0)
        ) is not None:
            offsets.append(message.offset)
            message.ack()
    return offsets


def test_a_new_group_starts_at_earliest_unless_it_asks_for_latest(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publish_all(data_dir, "jobs", range(6))  # before any worker of any group exists
    assert drain(data_dir, "workers", 6) == [0, 1, 2, 3, 4, 5]
    with Consumer("jobs", group="tail", data=data_dir, start="latest") as tail:
        assert tail.receive(timeout=1.5) is None
        with Publisher(data=data_dir) as publisher:
            publisher.publish("jobs", "new")
        message = tail.receive(timeout=30)
        assert message is not None and (message.offset, message.value) == (6, "new")
        message.ack()
    # "latest" is only where a new group begins; a known group resumes where it was.
    assert drain(data_dir, "workers", 1, start="latest") == [6]


def test_committed_positions_survive_a_broker_restart(
    broker: BrokerProcess, data_dir: Path
) -> None:
    publish_all(data_dir, "jobs", range(10))
    with Consumer("jobs", group="resume", data=data_dir) as consumer:
        for expected in range(4):
            message = consumer.receive(timeout=30)
            assert message is not None and message.offset == expected
            message.ack()
    assert broker.stop() == 0
    broker.start()
    assert drain(data_dir, "resume", 6) == [4, 5, 6, 7, 8, 9]
    with Store(data_dir) as store:
        assert store.state.committed_offsets("resume") == {("jobs", 0): 10}


def test_same_key_in_order_one_at_a_time_while_keys_run_in_parallel(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path
) -> None:
    keys, per_key = 4, 10
    with Store(data_dir) as store:
        store.create_topic("keyed", partitions=2)
    published: dict[str, list[int]] = collections.defaultdict(list)
    with Publisher(data=data_dir) as publisher:
        for n in range(keys * per_key):
            key = f"customer-{n % keys}"
            position = publisher.publish("keyed", {"n": n}, key=key)
            published[key].append(position.offset)
    subscribed = SPAWN.Barrier(4)
    with client_processes() as processes:
        processes += [
            start(
                consume_worker,
                str(data_dir),
                ["keyed"],
                "ordered",
                str(tmp_path / f"c{i}"),
                10.0,  # idle this long: done (generous, as on a busy machine)
                {"prefetch": 2},
                0.02,
                None,
                subscribed,
            )
            for i in range(4)
        ]
        join_all(processes, 120)
    seen = [line for i in range(4) for line in read_lines(tmp_path / f"c{i}")]
    assert len(seen) == keys * per_key
    by_key: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for line in seen:
        by_key[str(line["key"])].append(line)
    assert set(by_key) == set(published)
    for key, lines in by_key.items():
        lines.sort(key=lambda line: line["received"])
        assert [line["offset"] for line in lines] == published[key], f"{key} out of order"
        for before, after in itertools.pairwise(lines):
            # The next message of a key reached its consumer only after the previous one's
            # ACK was sent (by whichever process had it).
            assert after["received"] > before["acked"], (
                f"{key}: offsets {before['offset']} and {after['offset']} were in flight at once"
            )
    assert len({line["pid"] for line in seen}) >= 2

    def overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
        return a["received"] < b["acked"] and b["received"] < a["acked"]

    parallel = [
        (a["key"], b["key"])
        for a in seen
        for b in seen
        if a["pid"] != b["pid"] and a["key"] != b["key"] and overlaps(a, b)
    ]
    assert parallel, "no two keys were ever handled at the same time"


@pytest.mark.parametrize("restart", [False, True], ids=["while-running", "after-restart"])
def test_a_group_that_lags_past_retention_is_told_what_it_lost(
    broker: BrokerProcess, data_dir: Path, restart: bool
) -> None:
    """Retention deletes by size whatever a group has not read yet (Kafka's rule). The
    group then goes on from the log start, and every offset is either delivered or
    reported as skipped (an event, the broker's stats), never neither and never both."""
    with Store(data_dir) as store:
        store.create_topic("short", segment_bytes=16_384, retention_bytes=32_768)
    with Publisher(data=data_dir) as publisher:
        for n in range(100):
            publisher.publish_async("short", n)
        publisher.flush()
    delivered = set(range(10))
    with Consumer("short", group="lagging", data=data_dir) as consumer:
        for offset in sorted(delivered):
            message = consumer.receive(timeout=30)
            assert message is not None and message.offset == offset
            message.ack()
    with Publisher(data=data_dir) as publisher:
        for n in range(100, 3100):
            publisher.publish_async("short", n)
        publisher.flush()
    with Store(data_dir) as store:
        end = store.log_end_offset("short", 0)
        wait_until(lambda: store.log_start_offset("short", 0) > 1000, 60, "retention")
    if restart:  # the group's position then comes from state.db, below the log start
        broker.stop()
        broker.start()
    with Consumer("short", group="lagging", data=data_dir, prefetch=100) as consumer:
        # Up to the last message (never retired: it is in the active segment), each waited
        # for with a generous bound; then nothing more within a second.
        while (
            message := consumer.receive(timeout=60 if end - 1 not in delivered else 1.0)
        ) is not None:
            assert message.offset not in delivered
            delivered.add(message.offset)
            message.ack()
    skipped: set[int] = set()
    for event in wait_until(lambda: events_of(data_dir, "skipped"), 60, "a skipped event"):
        assert (event["group"], event["topic"], event["partition"]) == ("lagging", "short", 0)
        lost = set(range(int(event["offset"]), int(event["committed"])))
        assert lost and not lost & skipped and not lost & delivered
        skipped |= lost
    wait_until(lambda: broker.stats()["consumer"].get("skipped") == len(skipped), 60, "stats")
    # Per topic too (the metrics' spoolmq_messages_skipped_total), as the figures came.
    assert broker.stats()["consumer"]["by_topic"]["short"]["skipped"] == len(skipped)
    assert delivered | skipped == set(range(end))
    with Store(data_dir) as store:
        assert store.state.committed_offsets("lagging") == {("short", 0): end}
