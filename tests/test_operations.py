"""The operator's library (spoolmq.operations) with no broker running: what the CLI's
`groups reset` and `dlq` commands call."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolmq.broker.dead_letter import DeadLetterHeader
from spoolmq.broker.delivery import ONLY_GROUP_HEADER
from spoolmq.broker.manager import LOCK_FILE, broker_lock, broker_running
from spoolmq.clock import ManualClock
from spoolmq.errors import InvalidArgumentError, UnknownTopicError
from spoolmq.operations import (
    ResetChange,
    ResetTo,
    apply_reset,
    dead_letters,
    group_rows,
    plan_reset,
    purge_dead_letters,
    replay_dead_letters,
)
from spoolmq.store import Store
from spoolmq.types import TopicPartition


@pytest.fixture
def filled(data_dir: Path) -> Iterator[Store]:
    """orders/0 holds offsets 0-9 stored at t = 1000, 1100, ... 1900 ms; billing has
    committed 4."""
    clock = ManualClock(1_000)
    store = Store(data_dir, clock=clock)
    store.create_topic("orders", partitions=1)
    for n in range(10):
        store.append("orders", {"n": n})
        clock.advance(100)
    store.state.commit_offsets("billing", {TopicPartition("orders", 0): 4})
    yield store
    store.close()


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
            (0, "jobs", 10, "boom"),
            (1, "jobs", 11, "boom"),
            (2, "jobs", 12, "boom"),
        ]
        first = replay_dead_letters(store, "jobs")
        again = replay_dead_letters(store, "jobs")
        assert (first.replayed, first.already_replayed) == (3, 0)
        assert (again.replayed, again.already_replayed) == (0, 3)
        replayed = list(store.reader("jobs", 0))
    assert [(r.value, r.key, r.headers) for r in replayed] == [
        ({"job": n}, b"\x00k", [("trace", f"t{n}")]) for n in range(3)
    ]
    with Store(data_dir) as store:
        store.create_topic("never-failed")
        assert dead_letters(store, "never-failed") == []
        with pytest.raises(UnknownTopicError, match="'nope' does not exist"):
            dead_letters(store, "nope")
        with pytest.raises(UnknownTopicError):
            replay_dead_letters(store, "nope")
        with pytest.raises(UnknownTopicError):
            purge_dead_letters(store, "nope")


def _dead_letter(store: Store, n: int, reason: str) -> None:
    store.append(
        "jobs.dlq",
        {"job": n},
        headers=[
            (DeadLetterHeader.REASON, reason),
            (DeadLetterHeader.TOPIC, "jobs"),
            (DeadLetterHeader.PARTITION, "0"),
            (DeadLetterHeader.OFFSET, str(n)),
            (DeadLetterHeader.ATTEMPTS, "5"),
            (DeadLetterHeader.GROUP, "billing"),
        ],
    )


@pytest.fixture
def letters(data_dir: Path) -> Iterator[Store]:
    """jobs.dlq holds 4 dead letters stored at t = 1000, 1100, 1200, 1300 ms; reasons
    alternate "timeout" and "KeyError: 'id'"."""
    clock = ManualClock(1_000)
    store = Store(data_dir, clock=clock)
    store.create_topic("jobs")
    for n in range(4):
        _dead_letter(store, n, "timeout" if n % 2 == 0 else "KeyError: 'id'")
        clock.advance(100)
    yield store
    store.close()


def test_a_replay_picks_by_offset_and_reason_and_a_dry_run_writes_nothing(
    letters: Store,
) -> None:
    dry = replay_dead_letters(letters, "jobs", reason="^Key", dry_run=True)
    assert [d.dlq_offset for d in dry.letters] == [1, 3]
    assert (dry.replayed, dry.dry_run) == (0, True)
    assert letters.log_end_offset("jobs", 0) == 0
    picked = replay_dead_letters(letters, "jobs", offsets=[(0, 2), (0, 3)], reason="time")
    assert [d.dlq_offset for d in picked.letters] == [2]
    assert [r.value for r in letters.reader("jobs", 0)] == [{"job": 2}]
    with pytest.raises(InvalidArgumentError, match="no dead letter at partition@offset 0@9"):
        replay_dead_letters(letters, "jobs", offsets=[(0, 9)])
    with pytest.raises(InvalidArgumentError, match="not a regular expression"):
        replay_dead_letters(letters, "jobs", reason="(")


def test_a_replay_to_one_group_carries_the_header_and_is_its_own_redrive(
    letters: Store,
) -> None:
    everyone = replay_dead_letters(letters, "jobs", offsets=[(0, 0)])
    billing = replay_dead_letters(letters, "jobs", offsets=[(0, 0)], to_group="billing")
    again = replay_dead_letters(letters, "jobs", offsets=[(0, 0)], to_group="billing")
    assert (everyone.replayed, billing.replayed, again.already_replayed) == (1, 1, 1)
    records = list(letters.reader("jobs", 0))
    assert [r.headers for r in records] == [[], [(ONLY_GROUP_HEADER, "billing")]]


def test_a_replay_to_a_group_that_does_not_read_the_topic_is_refused(letters: Store) -> None:
    """A typo in --to-group stored copies no group would ever be given; a group that gave
    up on a letter, or has a committed offset in the topic, is taken."""
    with pytest.raises(
        InvalidArgumentError, match="--to-group 'biling': no group of that name reads 'jobs'"
    ) as refused:
        replay_dead_letters(letters, "jobs", to_group="biling")
    assert str(refused.value).endswith("groups that do: billing")
    assert letters.log_end_offset("jobs", 0) == 0
    letters.state.commit_offsets("audit", {TopicPartition("jobs", 0): 0})
    assert replay_dead_letters(letters, "jobs", offsets=[(0, 1)], to_group="audit").replayed == 1
    assert [r.headers for r in letters.reader("jobs", 0)] == [[(ONLY_GROUP_HEADER, "audit")]]


def test_a_replayed_task_is_queued_again_for_the_group_that_gave_up_on_it(
    data_dir: Path,
) -> None:
    """A dead-lettered task stayed ``dead_lettered`` after its replay, so ``result()``
    raised the old TaskFailed while the task ran again; now it is ``queued`` again when its
    copy reaches the workers' group (not for a replay to another group)."""
    from spoolmq.errors import ResultTimeoutError, TaskFailed
    from spoolmq.tasks import Tasks
    from spoolmq.tasks.results import ResultStore

    task = {"task": "jobs.x", "id": "t1", "args": [], "kwargs": {}, "priority": 0}
    with Store(data_dir) as store:
        store.create_topic("jobs")
        store.append("jobs.dlq", task, headers=[(DeadLetterHeader.GROUP, "spoolmq-tasks")])
        store.append("jobs.dlq", {"not": "a task"}, headers=[(DeadLetterHeader.GROUP, "audit")])
        store.state.commit_offsets("audit", {TopicPartition("jobs", 0): 0})
    results = ResultStore(data_dir)
    row = {"name": "jobs.x", "topic": "jobs", "args": {"args": [], "kwargs": {}}}
    results.add("t1", **row, key=None, priority=0, eta_ms=None, result_ttl_ms=60_000)
    assert results.dead_lettered("t1", "dead-lettered to jobs.dlq after 5 deliveries: x")
    results.close()
    with Tasks(data_dir) as tasks, Store(data_dir) as store:
        with pytest.raises(TaskFailed, match="dead-lettered"):
            tasks.result("t1", timeout=0.1)
        elsewhere = replay_dead_letters(store, "jobs", to_group="audit")
        assert (elsewhere.replayed, elsewhere.tasks_queued) == (2, 0)
        with pytest.raises(TaskFailed):
            tasks.result("t1", timeout=0.1)
        everyone = replay_dead_letters(store, "jobs")
        assert (everyone.replayed, everyone.tasks_queued) == (2, 1)
        row_now = tasks.store.get("t1")
        assert row_now is not None and (row_now.state, row_now.error) == ("queued", None)
        with pytest.raises(ResultTimeoutError):  # it waits for the run to come
            tasks.result("t1", timeout=0.1)
        again = replay_dead_letters(store, "jobs")
        assert (again.already_replayed, again.tasks_queued) == (2, 0)


def test_a_purge_hides_what_it_picked_and_counts_it(letters: Store) -> None:
    assert purge_dead_letters(letters, "jobs", before_ms=1_150) == 2  # stored at 1000, 1100
    assert [d.dlq_offset for d in dead_letters(letters, "jobs")] == [2, 3]
    assert purge_dead_letters(letters, "jobs", offsets=[(0, 3)]) == 1
    assert [d.dlq_offset for d in dead_letters(letters, "jobs")] == [2]
    # A replay never republishes a purged letter; a purged offset cannot be picked again.
    assert [d.dlq_offset for d in replay_dead_letters(letters, "jobs").letters] == [2]
    with pytest.raises(InvalidArgumentError, match="0@3"):
        purge_dead_letters(letters, "jobs", offsets=[(0, 3)])
    assert purge_dead_letters(letters, "jobs") == 1
    assert dead_letters(letters, "jobs") == []
    assert purge_dead_letters(letters, "jobs") == 0
    marks = letters.path / "logs" / "jobs.dlq" / "purged.json"
    assert marks.stat().st_mode & 0o777 == 0o600


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
