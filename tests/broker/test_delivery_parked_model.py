"""Parked messages against a model, under random reads (keyless and keyed, delayed past
the horizon or not), dispatches, ACKs, NACKs with short and long delays, releases, time,
checkpoints and look-ups of due rows done as the broker may do them (any due row, any
number of times): no message is delivered before its time or twice at once, everything
below the committed offset is finished or parked, and in the end every message is ACKed
once. Pure state, a fake clock, no processes."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from model_consumers import ModelConsumers

from spoolmq.broker.checkpoint import collect_checkpoint, mark_saved
from spoolmq.broker.delivery import PARK_AFTER_MS, Group, GroupSettings, Revived, record_extra
from spoolmq.broker.group_runtime import REVIVE_AHEAD_MS

LEASE_MS = 2_000
LONG = 2 * PARK_AFTER_MS


def record(offset: int, key: str | None, deliver_at: int | None) -> tuple[dict[str, Any], bytes]:
    fields: dict[str, Any] = {"offset": offset, "timestamp": 0, "key": key, "headers": []}
    if deliver_at is not None:
        fields["deliver_at"] = deliver_at
    return fields, orjson.dumps({**fields, "value": None}) + b"\n"


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("read"),
            st.lists(
                st.tuples(
                    st.sampled_from([None, None, "a", "b"]),
                    st.sampled_from([None, 1_000, LONG, 3 * LONG]),  # delay after now
                ),
                max_size=5,
            ),
        ),
        st.tuples(st.just("dispatch"), st.just(0)),
        st.tuples(st.just("ack"), st.integers(0, 5)),
        st.tuples(st.just("nack"), st.sampled_from([0, 1_000, LONG])),
        st.tuples(st.just("release"), st.integers(0, 5)),
        st.tuples(st.just("time"), st.integers(0, LONG)),
        st.tuples(st.just("save"), st.just(0)),
        st.tuples(st.just("revive"), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=200, deadline=None)
@given(operations)
def test_parked_messages_keep_every_delivery_rule(ops: list[tuple[str, Any]]) -> None:
    group = Group("g", GroupSettings(lease_ms=LEASE_MS, max_deliveries=1000))
    state = group.add_partition("t", 0, 0)
    for consumer in ("x", "y"):
        group.add_consumer(consumer, prefetch=3, topics=["t"])
    lines: list[tuple[dict[str, Any], bytes]] = []
    not_before: dict[int, int] = {}  # offset -> the earliest time it may go out
    finished: set[int] = set()
    consumers = ModelConsumers(group, ("x", "y"))
    table: dict[int, tuple[int, int, str | None]] = {}  # state.db's parked rows, by offset
    now = 0

    def dispatch() -> None:
        for consumer, batch in group.dispatch(now).items():
            offsets = [orjson.loads(line)["offset"] for line in batch.lines]
            for offset, tag in zip(offsets, batch.tags(), strict=True):
                assert now >= not_before.get(offset, 0), (offset, now, not_before)
                assert not consumers.holding(offset), offset
                assert offset not in finished
                consumers.held[consumer][tag] = offset

    def save() -> None:
        checkpoint = collect_checkpoint([group], now)
        for row in checkpoint.parked:
            if row.offset not in table or row.attempt > 0:  # the upsert's rule
                table[row.offset] = (row.due_at, row.attempt, row.reason)
        for gone in checkpoint.unparked:
            table.pop(gone.offset, None)
        mark_saved(checkpoint, {"g": group})

    def revive() -> None:
        """Every row due soon, whether handed back before or not (the broker hands back a
        subset of these)."""
        due: list[Revived] = []
        for offset, (due_at, attempt, reason) in sorted(table.items(), key=lambda r: r[1][0]):
            if due_at <= now + REVIVE_AHEAD_MS:
                fields, line = lines[offset]
                due.append((offset, due_at, attempt, reason, line, record_extra(fields)))
        group.revive(state, due, now)

    for kind, argument in ops:
        if kind == "read":
            for key, delay in argument:
                offset = len(lines)
                deliver_at = None if delay is None else now + delay
                lines.append(record(offset, key, deliver_at))
                not_before[offset] = deliver_at or 0
                group.add_record(state, *lines[offset], now)
        elif kind == "dispatch":
            dispatch()
        elif kind == "time":
            now += argument
            consumers.run_timers(now)
        elif kind == "save":
            save()
        elif kind == "revive":
            revive()
        elif kind == "nack":
            if (answered := consumers.settle(kind, 0, now, delay_ms=argument)) is not None:
                not_before[answered[0]] = now + argument
        elif (answered := consumers.settle(kind, argument, now)) and answered[1]:
            finished.add(answered[0])
        parked = set(table) | {o for (_, _, o), row in group.parking.items() if row}
        lane = set(state.lane.positions) if state.lane is not None else set()
        below = range(state.committed())
        assert all(o in finished or o in parked or o in lane for o in below)
    # Drain: time passes, checkpoints and look-ups run, and every delivery is ACKed.
    for _ in range(len(lines) * 3 + 10):
        now += PARK_AFTER_MS
        consumers.run_timers(now)
        save()
        revive()
        dispatch()
        finished.update(consumers.ack_all(now))
    save()
    assert finished == set(range(len(lines)))
    assert table == {} and group.parking == {}
    assert state.committed() == len(lines)
