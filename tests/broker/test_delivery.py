"""The delivery rules of a consumer group, driven with a fake clock and no processes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest

from spoolmq.broker.delivery import (
    Group,
    GroupSettings,
    backoff_ms,
    delivery_tag,
    matches,
)
from spoolmq.broker.events import EventLog
from spoolmq.errors import LeaseExpiredError


class Delivered(NamedTuple):
    """One message of a dispatched batch, as a test looks at it."""

    offset: int
    tag: int
    attempt: int
    consumer: str


def dispatch(group: Group, now: int) -> dict[str, list[Delivered]]:
    """``group.dispatch`` with each batch's runs spelled out message by message."""
    return {
        consumer: [
            Delivered(offset, delivery_tag(state.slot, offset, attempt), attempt, consumer)
            for state, first, count, attempt in batch.runs
            for offset in range(first, first + count)
        ]
        for consumer, batch in group.dispatch(now).items()
    }


def line(offset: int) -> bytes:
    return b'{"offset":%d,"timestamp":%d,"value":null}\n' % (offset, 1_000 + offset)


def record(offset: int, key: str | None = None, **extra: Any) -> dict[str, Any]:
    return {"offset": offset, "timestamp": 1_000 + offset, "key": key, "headers": [], **extra}


def make_group(**settings: Any) -> tuple[Group, Any]:
    group = Group("billing", GroupSettings(**settings))
    state = group.add_partition("orders", 0, 0)
    return group, state


def feed(group: Group, state: Any, records: list[dict[str, Any]], now: int = 0) -> None:
    for fields in records:
        group.add_record(state, fields, line(fields["offset"]), now)


def offsets(delivered: dict[str, list[Any]], consumer: str) -> list[int]:
    return [p.offset for p in delivered.get(consumer, [])]


def test_push_respects_prefetch_and_spreads_over_idle_consumers() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=2, topics=["orders"])
    group.add_consumer("b", prefetch=1, topics=["orders"])
    feed(group, state, [record(i) for i in range(5)])
    sent = dispatch(group, now=0)
    assert offsets(sent, "a") == [0, 1]
    assert offsets(sent, "b") == [2]
    assert dispatch(group, now=0) == {}  # nobody has room until something is acked
    group.ack(sent["b"][0].tag, "b", now=5)
    assert offsets(dispatch(group, now=5), "b") == [3]


def test_same_key_is_never_in_flight_twice_and_keeps_offset_order() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    group.add_consumer("b", prefetch=10, topics=["orders"])
    feed(group, state, [record(0, "k"), record(1, "k"), record(2, "other"), record(3, "k")])
    sent = dispatch(group, now=0)
    in_flight = sorted(p.offset for ps in sent.values() for p in ps)
    assert in_flight == [0, 2]  # offsets 1 and 3 wait behind offset 0 of key "k"
    first = next(p for ps in sent.values() for p in ps if p.offset == 0)
    group.ack(first.tag, first.consumer, now=1)
    after = dispatch(group, now=1)
    assert sorted(p.offset for ps in after.values() for p in ps) == [1]


def test_nack_retries_with_backoff_then_dead_letters_after_max_deliveries() -> None:
    group, state = make_group(max_deliveries=3, retry_backoff_ms=100, retry_backoff_max_ms=1_000)
    group.add_consumer("a", prefetch=1, topics=["orders"])
    feed(group, state, [record(0, "k")])
    now = 0
    attempts = []
    for _ in range(3):
        group.run_timers(now)
        sent = dispatch(group, now)
        assert len(sent["a"]) == 1, f"nothing redelivered at {now} ms"
        pending = sent["a"][0]
        attempts.append(pending.attempt)
        group.nack(pending.tag, "a", now, delay_ms=None, reason="boom")
        assert dispatch(group, now) == {}  # backoff: not at once
        now += backoff_ms(pending.attempt, 100, 1_000)
    assert attempts == [1, 2, 3]
    assert [p.offset for p in group.dead] == [0]
    assert group.dead[0].last_reason == "boom"
    group.dead_lettered(group.dead.pop(), now)
    assert state.committed() == 1


def test_lease_expiry_redelivers_and_the_late_ack_is_refused() -> None:
    group, state = make_group(lease_ms=1_000)
    group.add_consumer("slow", prefetch=1, topics=["orders"])
    group.add_consumer("fast", prefetch=1, topics=["orders"])
    feed(group, state, [record(0)])
    first = dispatch(group, now=0)
    ((consumer, [pending]),) = first.items()
    late_tag = pending.tag
    group.run_timers(now=1_001)
    again = dispatch(group, now=1_001)
    redelivered = [p for ps in again.values() for p in ps]
    assert [(p.offset, p.attempt) for p in redelivered] == [(0, 2)]
    with pytest.raises(LeaseExpiredError):  # the timer fired first: still "expired"
        group.ack(late_tag, consumer, now=1_002)
    other = next(iter(again))
    group.ack(redelivered[0].tag, other, now=1_003)
    assert state.committed() == 1
    assert [e.type for e in group.events].count("acked") == 1


def test_ack_after_the_lease_but_before_the_timer_is_refused_as_expired() -> None:
    group, state = make_group(lease_ms=1_000)
    group.add_consumer("a", prefetch=1, topics=["orders"])
    feed(group, state, [record(0)])
    (pending,) = dispatch(group, now=0)["a"]
    with pytest.raises(LeaseExpiredError):
        group.ack(pending.tag, "a", now=1_500)
    assert [p.attempt for p in dispatch(group, now=1_500)["a"]] == [2]


def test_extend_lease_keeps_the_delivery() -> None:
    group, state = make_group(lease_ms=1_000)
    group.add_consumer("a", prefetch=1, topics=["orders"])
    feed(group, state, [record(0)])
    (pending,) = dispatch(group, now=0)["a"]
    group.extend(pending.tag, "a", now=900, seconds=5)
    group.run_timers(now=2_000)
    assert dispatch(group, now=2_000) == {}
    group.ack(pending.tag, "a", now=5_000)
    assert state.committed() == 1


def test_a_lost_consumer_releases_its_messages_at_once() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=5, topics=["orders"])
    feed(group, state, [record(i) for i in range(3)])
    dispatch(group, now=0)
    group.add_consumer("b", prefetch=5, topics=["orders"])
    group.remove_consumer("a", now=10)
    again = dispatch(group, now=10)
    assert [(p.offset, p.attempt) for p in again["b"]] == [(0, 2), (1, 2), (2, 2)]


def test_a_delivery_returned_unread_is_not_an_attempt_and_goes_first() -> None:
    group, state = make_group(max_deliveries=2)
    group.add_consumer("a", prefetch=3, topics=["orders"])
    feed(group, state, [record(0, "k"), record(1), record(2, "k"), record(3)])
    sent = dispatch(group, now=0)
    assert offsets(sent, "a") == [0, 1, 3]  # 2 waits behind offset 0 of key "k"
    first, *unread = sent["a"]
    group.ack(first.tag, "a", now=1)
    for pending in reversed(unread):  # newest first, as the broker does
        group.release(pending.tag, "a", now=2)
    assert [e.reason for e in group.events if e.type == "released"] == ["returned unread"] * 2
    group.remove_consumer("a", now=3)
    group.add_consumer("b", prefetch=3, topics=["orders"])
    again = dispatch(group, now=3)
    # Still first, and their first real attempt; key "k" moved on to offset 2.
    assert [(p.offset, p.attempt) for p in again["b"]] == [(1, 1), (3, 1), (2, 1)]
    assert state.committed() == 1


def test_delayed_message_waits_and_blocks_its_key_only() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    feed(group, state, [record(0, "k", deliver_at=5_000), record(1, "k"), record(2, "j")])
    assert offsets(dispatch(group, now=0), "a") == [2]
    group.run_timers(now=4_999)
    assert dispatch(group, now=4_999) == {}
    group.run_timers(now=5_000)
    assert offsets(dispatch(group, now=5_000), "a") == [0]


def test_expired_message_is_not_delivered_and_is_committed() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    feed(group, state, [record(0, expires_at=100), record(1)])
    assert offsets(dispatch(group, now=200), "a") == [1]
    assert [(e.type, e.offset) for e in group.events if e.type != "delivered"] == [("expired", 0)]
    assert state.committed() == 1  # offset 1 still in flight


def test_committed_offset_is_the_smallest_unfinished() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    feed(group, state, [record(i) for i in range(4)])
    sent = {p.offset: p for p in dispatch(group, now=0)["a"]}
    for offset in (1, 3):
        group.ack(sent[offset].tag, "a", now=1)
    assert state.committed() == 0
    group.ack(sent[0].tag, "a", now=2)
    assert state.committed() == 2
    group.ack(sent[2].tag, "a", now=3)
    assert state.committed() == 4


def test_auto_ack_is_final_on_send_and_limited_by_credit() -> None:
    group, state = make_group(auto_ack=True)
    group.add_consumer("a", prefetch=2, topics=["orders"])
    group.add_credit("a", 2)
    feed(group, state, [record(i) for i in range(3)])
    assert offsets(dispatch(group, now=0), "a") == [0, 1]
    assert state.committed() == 2
    assert dispatch(group, now=0) == {}
    group.add_credit("a", 1)
    assert offsets(dispatch(group, now=0), "a") == [2]


def test_filter_skips_non_matching_messages_and_commits_past_them() -> None:
    group, state = make_group(filter={"tags": ["vip"]})
    group.add_consumer("a", prefetch=10, topics=["orders"])
    feed(group, state, [record(0, tags=["vip"]), record(1), record(2, tags=["eu", "vip"])])
    assert offsets(dispatch(group, now=0), "a") == [0, 2]
    assert group.filtered == 1


@pytest.mark.parametrize(
    ("spec", "tags", "headers", "expected"),
    [
        (None, [], [], True),
        ({"tags": ["a"]}, ["b"], [], False),
        ({"tags": ["a", "b"]}, ["b"], [], True),
        ({"headers": {"kind": "refund"}}, [], [["kind", "refund"]], True),
        ({"headers": {"kind": "refund"}}, [], [["kind", "order"]], False),
        ({"headers": {"kind": "refund"}, "tags": ["x"]}, ["x"], [], False),
    ],
)
def test_matches(spec: Any, tags: list[str], headers: list[Any], expected: bool) -> None:
    assert matches(spec, tags, headers) is expected


def test_backoff_doubles_and_is_capped() -> None:
    assert [backoff_ms(a, 250, 1_500) for a in range(1, 6)] == [250, 500, 1000, 1500, 1500]


def test_a_text_key_that_looks_like_base64_and_a_bytes_key_are_different_keys() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    text = record(0, "b64:QUJD")  # the text key "b64:QUJD"
    raw = {"offset": 1, "timestamp": 1_001, "key_b64": "QUJD", "headers": []}  # b"ABC"
    feed(group, state, [text, raw, record(2, "b64:QUJD")])
    sent = dispatch(group, now=0)
    assert offsets(sent, "a") == [0, 1]  # both keys in flight; offset 2 waits behind 0
    group.ack(sent["a"][1].tag, "a", now=1)
    assert dispatch(group, now=1) == {}  # b"ABC" done: "b64:QUJD" still has 0 in flight
    group.ack(sent["a"][0].tag, "a", now=2)
    assert offsets(dispatch(group, now=2), "a") == [2]


def test_event_lines_tell_a_text_key_from_a_bytes_key(tmp_path: Path) -> None:
    """A text key is ``key``, a raw-bytes key ``key_b64`` (as in a record line) in the
    per-message events: the text key "QUJD" and the bytes key b"ABC" (base64 "QUJD") never
    read alike."""
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    raw = {"offset": 1, "timestamp": 1_001, "key_b64": "QUJD", "headers": []}  # b"ABC"
    feed(group, state, [record(0, "QUJD"), raw, record(2)])
    for delivered in dispatch(group, now=0)["a"]:
        group.nack(delivered.tag, "a", now=1, delay_ms=0, reason="later")
    events = EventLog(tmp_path)
    for event in group.events:
        events.add(event, group.name)
    events.flush()
    events.close()
    [path] = (tmp_path / "events").glob("date=*/*.jsonl")
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    nacked = [
        (line["offset"], line.get("key"), line.get("key_b64"), line["published_at"])
        for line in lines
        if line["type"] == "nacked"
    ]
    assert nacked == [(0, "QUJD", None, 1_000), (1, None, "QUJD", 1_001), (2, None, None, 1_002)]


def test_a_restored_retry_waits_until_it_is_due_and_keeps_counting_attempts() -> None:
    group, state = make_group(max_deliveries=5)
    group.add_consumer("a", prefetch=10, topics=["orders"])
    # Offset 0 was NACKed twice under an earlier broker, its retry due at 5000; offset 1
    # was in flight (no retry scheduled); offset 2 is new.
    group.add_record(state, record(0), line(0), 1000, attempts_so_far=2, due_at=5000)
    group.add_record(state, record(1), line(1), 1000, attempts_so_far=1)
    group.add_record(state, record(2), line(2), 1000)
    first = dispatch(group, now=1000)["a"]
    assert [(p.offset, p.attempt) for p in first] == [(1, 2), (2, 1)]
    group.run_timers(4999)
    assert dispatch(group, now=4999) == {}
    assert group.next_timer() == 5000
    group.run_timers(5000)
    assert [(p.offset, p.attempt) for p in dispatch(group, now=5000)["a"]] == [(0, 3)]


def test_a_restored_retry_behind_its_key_waits_for_both() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    group.add_record(state, record(0, "k"), line(0), 0)
    group.add_record(state, record(1, "k"), line(1), 0, attempts_so_far=1, due_at=3000)
    head = dispatch(group, now=0)["a"]
    assert [p.offset for p in head] == [0]
    group.ack(head[0].tag, "a", now=10)  # the key's head is done; offset 1 is not due yet
    assert dispatch(group, now=10) == {}
    group.run_timers(3000)
    assert [(p.offset, p.attempt) for p in dispatch(group, now=3000)["a"]] == [(1, 2)]


def test_messages_arriving_one_at_a_time_go_round_robin() -> None:
    """Each dispatch starts with the consumer after the one served last, so a trickle of
    single messages is shared, not all taken by whichever consumer joined first."""
    group, state = make_group()
    group.add_consumer("a", prefetch=5, topics=["orders"])
    group.add_consumer("b", prefetch=5, topics=["orders"])
    takers = []
    for offset in range(6):
        feed(group, state, [record(offset)])
        ((consumer, [delivered]),) = dispatch(group, now=offset).items()
        takers.append(consumer)
        group.ack(delivered.tag, consumer, now=offset)
    assert takers == ["a", "b"] * 3


def test_offsets_a_compacted_log_no_longer_has_are_final() -> None:
    group, state = make_group()
    group.add_consumer("a", prefetch=10, topics=["orders"])
    feed(group, state, [record(0, "k"), record(2), record(5, "k")])
    sent = dispatch(group, now=0)["a"]
    assert [d.offset for d in sent] == [0, 2]  # 5 waits behind 0 of key "k"
    for delivered in sent:
        group.ack(delivered.tag, "a", now=1)
    assert state.committed() == 5
    [last] = dispatch(group, now=1)["a"]
    group.ack(last.tag, "a", now=2)
    assert (last.offset, state.committed()) == (5, 6)


def test_one_lease_timer_per_batch_expires_only_the_unanswered() -> None:
    group, state = make_group(lease_ms=1_000)
    group.add_consumer("a", prefetch=3, topics=["orders"])
    feed(group, state, [record(i) for i in range(3)])
    acked, extended, forgotten = dispatch(group, now=0)["a"]
    assert group.next_timer() == 1_000  # one batch: one lease timer for all of it
    group.ack(acked.tag, "a", now=10)
    group.extend(extended.tag, "a", now=10, seconds=5)
    group.events.clear()
    group.run_timers(now=1_000)
    assert [(e.type, e.offset) for e in group.events] == [("lease_expired", forgotten.offset)]
    assert [d.offset for d in dispatch(group, now=1_000)["a"]] == [forgotten.offset]
    assert group.next_timer() == 2_000  # the redelivery's lease, before the extended one
    group.ack(extended.tag, "a", now=4_000)
    assert state.committed() == forgotten.offset


def test_an_acked_message_is_not_held_until_its_lease_ends() -> None:
    """The lease timer holds runs of offsets, not the stored lines: once ACKed, a line is
    dropped at once, not 30 s later."""
    group, state = make_group(lease_ms=30_000)
    group.add_consumer("a", prefetch=50, topics=["orders"])
    feed(group, state, [record(i) for i in range(50)])
    for delivered in dispatch(group, now=0)["a"]:
        group.ack(delivered.tag, "a", now=5)
    assert state.lines == [None] * 50
    assert group.next_timer() == 30_000  # the timer is still there, holding no line


def test_a_long_run_filtered_out_is_dropped_from_memory_and_the_next_match_delivered() -> None:
    group, state = make_group(filter={"tags": ["vip"]})
    group.add_consumer("a", prefetch=10, topics=["orders"])
    feed(group, state, [record(i) for i in range(10_000)])
    assert state.committed() == 10_000 and len(state.status) < 10_000  # the window was cut
    feed(group, state, [record(10_000, tags=["vip"]), record(10_001)])
    assert offsets(dispatch(group, now=0), "a") == [10_000]


def test_max_deliveries_stays_below_where_a_tags_attempt_would_wrap(tmp_path: Path) -> None:
    """A tag keeps its attempt in 10 bits: with max_deliveries 100,000 (accepted before),
    attempt 1,025's tag was attempt 1's, so a late ACK of attempt 1 settled attempt 1,025."""
    from spoolmq.errors import InvalidArgumentError
    from spoolmq.protocol.limits import MAX_DELIVERIES
    from spoolmq.tasks import Tasks

    assert len({delivery_tag(3, 7, a) for a in range(1, MAX_DELIVERIES + 1)}) == MAX_DELIVERIES
    assert GroupSettings(max_deliveries=MAX_DELIVERIES).max_deliveries == 1000
    for bad in (0, MAX_DELIVERIES + 1, 100_000):
        with pytest.raises(
            InvalidArgumentError, match="max_deliveries must be a whole number from 1 to 1000"
        ):
            GroupSettings(max_deliveries=bad)
    # A string: the range named is max_deliveries's, not the ten years in ms of the times.
    with pytest.raises(
        InvalidArgumentError, match="max_deliveries must be a whole number from 1 to 1000, not '5'"
    ):
        GroupSettings(max_deliveries="5")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="lease_ms must be a whole number from 1 to"):
        GroupSettings(lease_ms=0)
    with pytest.raises(InvalidArgumentError, match="must be a whole number from 1 to 1000"):
        Tasks(data=tmp_path / "d").task(topic="t", max_deliveries=5000)(print)
