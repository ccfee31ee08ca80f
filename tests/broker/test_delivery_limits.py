"""Rate and concurrency limits per topic of a consumer group: never exceeded across all of
its consumers, retries included, with a timer that wakes the broker when a rate frees up.
Pure state, a fake clock, no processes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spoolmq.broker.delivery import Group, GroupSettings, PartitionState, delivery_tag
from spoolmq.errors import InvalidArgumentError, InvalidTopicError, LeaseExpiredError


def read(group: Group, state: PartitionState, count: int, priority: int = 0) -> None:
    for _ in range(count):
        headers = [["x-spoolmq-priority", str(priority)]] if priority else []
        fields = {"offset": state.next_fetch, "timestamp": 0, "key": None, "headers": headers}
        line = orjson.dumps({**fields, "value": None}) + b"\n"
        group.add_record(state, fields, line, now=0)


def sent(group: Group, now: int) -> dict[str, list[tuple[str, int, int]]]:
    """(topic, offset, tag) of each message dispatched at ``now``, per consumer."""
    return {
        consumer: [
            (state.topic, offset, delivery_tag(state.slot, offset, attempt))
            for state, first, count, attempt in batch.runs
            for offset in range(first, first + count)
        ]
        for consumer, batch in group.dispatch(now).items()
    }


def total(out: dict[str, list[Any]], topic: str | None = None) -> int:
    return sum(1 for entries in out.values() for entry in entries if topic in (None, entry[0]))


def test_concurrency_caps_what_is_in_flight_across_consumers() -> None:
    group = Group("g", GroupSettings(limits={"jobs": {"concurrency": 3}}))
    state = group.add_partition("jobs", 0, 0)
    for name in ("a", "b"):
        group.add_consumer(name, prefetch=10, topics=["jobs"])
    read(group, state, 20)
    first = sent(group, 0)
    assert total(first) == 3
    assert sent(group, 0) == {}
    consumer, entries = next(iter(first.items()))
    group.ack(entries[0][2], consumer, now=5)
    assert total(sent(group, 5)) == 1


def test_a_rate_is_never_exceeded_in_any_window_and_wakes_the_broker_when_it_frees() -> None:
    group = Group("g", GroupSettings(limits={"jobs": {"rate": "3/s"}}))
    state = group.add_partition("jobs", 0, 0)
    group.add_consumer("a", prefetch=100, topics=["jobs"])
    read(group, state, 10)
    assert total(sent(group, 0)) == 3
    assert sent(group, 400) == {}
    assert group.next_timer() == 1000  # when the first three leave the window
    group.run_timers(999)
    assert sent(group, 999) == {}
    group.run_timers(1000)
    assert total(sent(group, 1000)) == 3


def test_retries_count_against_the_rate() -> None:
    group = Group("g", GroupSettings(limits={"jobs": {"rate": "2/s"}}))
    state = group.add_partition("jobs", 0, 0)
    group.add_consumer("a", prefetch=100, topics=["jobs"])
    read(group, state, 5)
    first = sent(group, 0)["a"]
    group.nack(first[0][2], "a", now=10, delay_ms=0, reason="again")
    assert sent(group, 10) == {}  # due again at once, but two went out in this second
    group.run_timers(1000)
    again = sent(group, 1000)["a"]
    assert [offset for _, offset, _ in again] == [0, 2]


def test_limits_hold_only_for_their_topic_and_priorities_keep_to_them() -> None:
    group = Group("g", GroupSettings(limits={"slow": {"rate": "1/s", "concurrency": 1}}))
    slow = group.add_partition("slow", 0, 0)
    fast = group.add_partition("fast", 0, 0)
    group.add_consumer("a", prefetch=100, topics=["slow", "fast"])
    read(group, slow, 3, priority=9)
    read(group, fast, 50)
    out = sent(group, 0)
    assert (total(out, "slow"), total(out, "fast")) == (1, 50)


@pytest.mark.parametrize(
    "limits",
    [
        {"jobs": {"rate": "0.5/s"}},
        {"jobs": {"rate": "fast"}},
        {"jobs": {"concurrency": 0}},
        {"jobs": {"concurrency": True}},
        {"jobs": {"burst": 3}},
        {"jobs": {}},
        {"": {"rate": "1/s"}},
        ["jobs"],
    ],
)
def test_bad_limits_are_refused(limits: Any) -> None:
    with pytest.raises((InvalidArgumentError, InvalidTopicError)):
        GroupSettings(limits=limits)


LEASE_MS = 700
operations = st.lists(
    st.one_of(
        st.tuples(st.just("read"), st.integers(1, 8)),
        st.tuples(st.just("dispatch"), st.just(0)),
        st.tuples(st.just("ack"), st.integers(0, 9)),
        st.tuples(st.just("nack"), st.integers(0, 9)),
        st.tuples(st.just("time"), st.integers(0, 900)),
    ),
    max_size=80,
)


@settings(max_examples=150, deadline=None)
@given(operations, st.integers(1, 4), st.integers(1, 5))
def test_limits_hold_under_any_sequence(ops: list[Any], rate: int, concurrency: int) -> None:
    limits = {"t": {"rate": f"{rate}/s", "concurrency": concurrency}}
    group = Group("g", GroupSettings(lease_ms=LEASE_MS, max_deliveries=50, limits=limits))
    state = group.add_partition("t", 0, 0)
    for name in ("x", "y"):
        group.add_consumer(name, prefetch=3, topics=["t"])
    held: list[tuple[str, int]] = []
    times: list[int] = []  # when each delivery went out
    now = 0

    def dispatch() -> None:
        for consumer, entries in sent(group, now).items():
            for _, _, tag in entries:
                held.append((consumer, tag))
                times.append(now)
        assert state.in_flight <= concurrency
        assert all(
            sum(1 for t in times if start <= t < start + 1000) <= rate for start in set(times)
        )

    for kind, argument in ops:
        if kind == "read":
            read(group, state, argument)
        elif kind == "dispatch":
            dispatch()
        elif kind == "time":
            now += argument
            group.run_timers(now)
            held[:] = [(c, t) for c, t in held if group._find(t) is not None]
        elif held:
            consumer, tag = held.pop(argument % len(held))
            try:
                if kind == "ack":
                    group.ack(tag, consumer, now)
                else:
                    group.nack(tag, consumer, now, delay_ms=0, reason="model")
            except LeaseExpiredError:
                pass
    # Everything still goes out in the end, as fast as the limits let it.
    for _ in range(400):
        timer = group.next_timer()
        now = max(now + 1, timer or 0)
        group.run_timers(now)
        held[:] = [(c, t) for c, t in held if group._find(t) is not None]
        dispatch()
        for consumer, tag in held:
            group.ack(tag, consumer, now)
        held.clear()
        if state.committed() == state.next_fetch:
            break
    assert state.committed() == state.next_fetch
