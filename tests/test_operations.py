"""The operator's library (spoolmq.operations) with no broker running: what the CLI's
`groups reset` and `dlq` commands call."""

from __future__ import annotations

from pathlib import Path

import pytest

from spoolmq.broker.dead_letter import DeadLetterHeader
from spoolmq.broker.manager import LOCK_FILE, broker_lock, broker_running
from spoolmq.clock import ManualClock
from spoolmq.errors import InvalidArgumentError
from spoolmq.operations import (
    ResetChange,
    ResetTo,
    apply_reset,
    dead_letters,
    group_rows,
    plan_reset,
    replay_dead_letters,
)
from spoolmq.store import Store
from spoolmq.types import TopicPartition


@pytest.fixture
def filled(data_dir: Path) -> Store:
    """orders/0 holds offsets 0-9 stored at t = 1000, 1100, ... 1900 ms; billing has
    committed 4."""
    clock = ManualClock(1_000)
    store = Store(data_dir, clock=clock)
    store.create_topic("orders", partitions=1)
    for n in range(10):
        store.append("orders", {"n": n})
        clock.advance(100)
    store.state.commit_offsets("billing", {TopicPartition("orders", 0): 4})
    return store


@pytest.mark.parametrize(
    ("to", "target"),
    [
        (ResetTo("earliest"), 0),
        (ResetTo("latest"), 10),
        (ResetTo("offset", 7), 7),
        (ResetTo("offset", 99), 10),  # clamped to the log end
        (ResetTo("time", 1_250), 3),  # the first record at or after 1250 ms (stored at 1300)
    ],
)
def test_a_reset_plan_says_where_each_partition_goes(
    filled: Store, to: ResetTo, target: int
) -> None:
    assert plan_reset(filled, "billing", "orders", to) == [ResetChange("orders", 0, 4, target)]
    assert filled.state.committed_offsets("billing") == {TopicPartition("orders", 0): 4}


def test_applying_a_plan_with_no_broker_writes_state_db(filled: Store, data_dir: Path) -> None:
    changes = plan_reset(filled, "billing", "orders", ResetTo("offset", 7))
    filled.close()
    apply_reset(data_dir, "billing", changes)
    rows = group_rows(data_dir, "billing")["billing"]
    assert [(r["committed"], r["log_end_offset"], r["lag"]) for r in rows] == [(7, 10, 3)]
    with pytest.raises(InvalidArgumentError, match="no consumer group 'nobody'"):
        group_rows(data_dir, "nobody")


def test_dead_letters_replay_once_without_their_dlq_headers(data_dir: Path) -> None:
    with Store(data_dir) as store:
        for n in range(3):
            store.append(
                "jobs.dlq",
                {"job": n},
                key=b"\x00k",
                headers=[
                    ("trace", f"t{n}"),
                    (DeadLetterHeader.REASON, "boom"),
                    (DeadLetterHeader.TOPIC, "jobs"),
                    (DeadLetterHeader.OFFSET, str(10 + n)),
                ],
            )
        letters = dead_letters(store, "jobs")
        assert [(d.dlq_offset, d.topic, d.offset, d.reason) for d in letters] == [
            (0, "jobs", "10", "boom"),
            (1, "jobs", "11", "boom"),
            (2, "jobs", "12", "boom"),
        ]
        first = replay_dead_letters(store, "jobs")
        again = replay_dead_letters(store, "jobs")
        assert (first.replayed, first.already_replayed) == (3, 0)
        assert (again.replayed, again.already_replayed) == (0, 3)
        replayed = list(store.reader("jobs", 0))
    assert [(r.value, r.key, r.headers) for r in replayed] == [
        ({"job": n}, b"\x00k", [("trace", f"t{n}")]) for n in range(3)
    ]
    assert dead_letters(Store(data_dir), "never-failed") == []


def test_broker_running_is_the_lock_not_a_leftover_file(data_dir: Path) -> None:
    data_dir.mkdir(mode=0o700)
    assert not broker_running(data_dir)
    (data_dir / LOCK_FILE).touch()  # left behind by a killed broker: nobody holds it
    assert not broker_running(data_dir)
    held = broker_lock(data_dir)
    held.acquire()
    try:
        # filelock locks per open file description, so a second lock object in this
        # process sees it held, as another process would.
        assert broker_running(data_dir)
    finally:
        held.release()
    assert not broker_running(data_dir)
