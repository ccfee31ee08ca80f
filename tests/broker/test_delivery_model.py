"""The array-based delivery state against a model: per-key order and one-in-flight-per-key
under random reads (some messages with a priority), dispatches, ACKs (as runs), NACKs,
releases and lease expiries; and late ACKs refused after a redelivery. Pure state, a fake
clock, no processes."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from model_consumers import ModelConsumers

from spoolmq.broker.delivery import Group, GroupSettings, delivery_tag
from spoolmq.errors import LeaseExpiredError, UnknownDeliveryError

LEASE_MS = 1_000


def line(offset: int) -> bytes:
    return b'{"offset":%d,"timestamp":%d,"value":null}\n' % (offset, offset)


def fields_and_line(offset: int, key: str | None, priority: int) -> tuple[dict[str, Any], bytes]:
    """A record read from the log, with the priority header when ``priority`` is not 0."""
    headers = [["x-spoolmq-priority", str(priority)]] if priority else []
    fields = {"offset": offset, "timestamp": 0, "key": key, "headers": headers}
    return fields, orjson.dumps({**fields, "value": None}) + b"\n"


def expand(group: Group, now: int) -> dict[str, list[tuple[int, int, int]]]:
    """(offset, attempt, tag) of every message each consumer was sent."""
    return {
        consumer: [
            (offset, attempt, delivery_tag(state.slot, offset, attempt))
            for state, first, count, attempt in batch.runs
            for offset in range(first, first + count)
        ]
        for consumer, batch in group.dispatch(now).items()
    }


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("read"),
            st.lists(
                st.tuples(st.sampled_from([None, "a", "b", "c"]), st.sampled_from([0, 0, 5, 9])),
                max_size=6,
            ),
        ),
        st.tuples(st.just("dispatch"), st.just(0)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("nack"), st.integers(0, 5)),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("time"), st.integers(0, 2 * LEASE_MS)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations)
def test_per_key_order_and_one_in_flight_per_key_hold(ops: list[tuple[str, Any]]) -> None:
    group = Group("g", GroupSettings(lease_ms=LEASE_MS, max_deliveries=1000))
    state = group.add_partition("t", 0, 0)
    for consumer in ("x", "y"):
        group.add_consumer(consumer, prefetch=3, topics=["t"])
    keys: list[str | None] = []
    finished: set[int] = set()
    consumers = ModelConsumers(group, ("x", "y"))
    held = consumers.held  # what each consumer holds: tag -> offset
    now = 0

    def check_dispatch() -> None:
        for consumer, sent in expand(group, now).items():
            for offset, _, tag in sent:
                key = keys[offset]
                if key is not None:
                    earlier = [o for o in range(offset) if keys[o] == key]
                    assert all(o in finished for o in earlier), (offset, key)
                    in_flight = [o for h in held.values() for o in h.values() if keys[o] == key]
                    assert in_flight == [], (offset, key, in_flight)
                held[consumer][tag] = offset

    for kind, argument in ops:
        if kind == "read":
            for key, priority in argument:
                keys.append(key)
                fields, stored = fields_and_line(len(keys) - 1, key, priority)
                group.add_record(state, fields, stored, now)
        elif kind == "dispatch":
            check_dispatch()
        elif kind == "time":
            now += argument
            consumers.run_timers(now)
        elif (answered := consumers.settle(kind, argument, now)) and answered[1]:
            finished.add(answered[0])
        assert state.committed() == min(
            (o for o in range(len(keys)) if o not in finished), default=len(keys)
        )
    # Drain: everything read is delivered and ACKed in the end, in key order.
    for _ in range(len(keys) + 2):
        consumers.run_timers(now)
        check_dispatch()
        finished.update(consumers.ack_all(now))
    assert finished == set(range(len(keys)))
    assert state.committed() == len(keys)


def test_a_late_ack_is_refused_after_redelivery_even_in_a_run() -> None:
    """The tag names (partition, offset, attempt): after the lease expired and the message
    went out again, the first attempt's tag is refused, in a run with good ones too, and
    the good ones of the run are ACKed."""
    group = Group("g", GroupSettings(lease_ms=LEASE_MS))
    state = group.add_partition("t", 0, 0)
    group.add_consumer("slow", prefetch=3, topics=["t"])
    for offset in range(3):
        fields = {"offset": offset, "timestamp": 0, "key": None, "headers": []}
        group.add_record(state, fields, line(offset), 0)
    [(_, first, count, attempt)] = group.dispatch(0)["slow"].runs
    assert (first, count, attempt) == (0, 3, 1)
    old = delivery_tag(state.slot, 0, 1)
    group.extend(old + 1, "slow", 500, 10)  # offset 1 stays leased; 0 and 2 expire
    group.run_timers(LEASE_MS + 1)
    again = expand(group, LEASE_MS + 1)["slow"]
    assert [(o, a) for o, a, _ in again] == [(0, 2), (2, 2)]
    refused = group.ack_runs([(old, 3)], "slow", LEASE_MS + 2)
    assert [(tag, type(exc)) for tag, exc in refused] == [
        (old, LeaseExpiredError),
        (old + 2, LeaseExpiredError),
    ]
    assert state.committed() == 0  # offset 1 was ACKed; 0 is out again at attempt 2
    # Once told, the stale tag is unknown: still refused, never taken for attempt 2.
    with pytest.raises(UnknownDeliveryError):
        group.ack(old, "slow", LEASE_MS + 3)
    group.ack_runs([(tag, 1) for _, _, tag in again], "slow", LEASE_MS + 4)
    assert state.committed() == 3
