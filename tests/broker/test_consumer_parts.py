"""The pure parts the ConsumerBroker is built from, tested without a process: dead letters,
the group view, frame checks, and the checkpoint API it uses on ``state.db``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from spoolmq.broker.checkpoint import collect_checkpoint, mark_saved
from spoolmq.broker.consumer_frames import (
    parse_nack,
    parse_reset_offsets,
    parse_runs,
    parse_seen,
    parse_subscribe,
)
from spoolmq.broker.dead_letter import (
    DeadLetterHeader,
    dead_letter_message,
    is_dead_letter_header,
)
from spoolmq.broker.delivery import IN_FLIGHT_ROW, Group, GroupSettings, Pending
from spoolmq.broker.group_view import partition_rows
from spoolmq.errors import InvalidArgumentError, InvalidTopicError, ProtocolError
from spoolmq.store import Store
from spoolmq.store.message import Message
from spoolmq.store.record import decode_line, encode_message, frame_record
from spoolmq.store.state import DeliveryKey, DeliveryRow, OpenDelivery, ScheduledRow
from spoolmq.types import TopicPartition

# -- dead letters ------------------------------------------------------------------------


def stored_line(message: Message, offset: int) -> bytes:
    return frame_record(offset, 1_700_000_000_000, encode_message(message).body)


def failed(line: bytes, offset: int) -> Pending:
    return Pending(
        topic="orders",
        partition=2,
        offset=offset,
        key=None,
        line=line,
        published_at=0,
        attempt=5,
        last_reason="card declined",
    )


def test_a_dead_letter_is_the_original_message_with_where_it_came_from() -> None:
    original = Message(
        value=b"\x00\xffraw",
        key=b"\x01key",
        headers=[("trace", "abc"), ("sig", b"\x02\x03")],
        tags=["vip"],
    )
    letter = dead_letter_message("billing", failed(stored_line(original, 41), 41))
    assert (letter.value, letter.key, letter.tags) == (b"\x00\xffraw", b"\x01key", ("vip",))
    assert letter.headers == [
        ("trace", "abc"),
        ("sig", b"\x02\x03"),
        ("x-dlq-reason", "card declined"),
        ("x-dlq-attempts", "5"),
        ("x-dlq-group", "billing"),
        ("x-dlq-topic", "orders"),
        ("x-dlq-partition", "2"),
        ("x-dlq-offset", "41"),
    ]
    # A second write of the same dead letter (after a crash) is a duplicate.
    assert (letter.producer_id, letter.sequence) == ("dlq:billing:orders:2", 41)


def test_a_dead_letter_round_trips_through_the_store_and_its_headers_are_known() -> None:
    letter = dead_letter_message("g", failed(stored_line(Message(value={"n": 1}, key="k"), 3), 3))
    record = decode_line(stored_line(letter, 0))
    assert (record.value, record.key) == ({"n": 1}, "k")
    added = [name for name, _ in record.headers]
    assert added == [str(h) for h in DeadLetterHeader]
    assert all(is_dead_letter_header(name) for name in added)
    assert not is_dead_letter_header("x-dl")


# -- the group view -------------------------------------------------------------------------


def test_group_rows_in_partition_order_with_lag_in_flight_and_owners() -> None:
    a0, a1, b0 = TopicPartition("a", 0), TopicPartition("a", 1), TopicPartition("b", 0)
    rows = partition_rows(
        {b0: 4, a1: 9, a0: 2},
        {a0: 10, a1: 7},  # b/0 unknown: empty; a/1 committed past its end
        {a0: 3},
        {a0: {"c2", "c1"}},
    )
    assert rows == [
        {
            "topic": "a",
            "partition": 0,
            "committed": 2,
            "log_end_offset": 10,
            "lag": 8,
            "in_flight": 3,
            "consumers": ["c1", "c2"],
        },
        {
            "topic": "a",
            "partition": 1,
            "committed": 9,
            "log_end_offset": 7,
            "lag": 0,
            "in_flight": 0,
            "consumers": [],
        },
        {
            "topic": "b",
            "partition": 0,
            "committed": 4,
            "log_end_offset": 0,
            "lag": 0,
            "in_flight": 0,
            "consumers": [],
        },
    ]


# -- frames --------------------------------------------------------------------------------


def test_a_subscribe_frame_with_everything_in_it() -> None:
    subscription = parse_subscribe(
        {
            "group": "billing",
            "topics": ["orders", "refunds"],
            "start": "latest",
            "settings": {"lease_ms": 1000, "max_deliveries": 2},
            "prefetch": 50,
        }
    )
    assert subscription == (
        "billing",
        ["orders", "refunds"],
        "latest",
        GroupSettings(lease_ms=1000, max_deliveries=2),
        50,
    )


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        ({"group": ""}, "'group'"),
        ({"group": "g" * 201}, "'group'"),
        ({"topics": []}, "'topics'"),
        ({"start": "middle"}, "'start'"),
        ({"settings": [1]}, "'settings'"),
        (
            {"settings": {"colour": "red"}},
            r"unknown group setting\(s\) 'colour': known are auto_ack, filter, lease_ms",
        ),
        ({"prefetch": 0}, "'prefetch'"),
        ({"prefetch": 100_001}, "'prefetch'"),
    ],
)
def test_a_bad_subscribe_frame_says_what_is_wrong(change: dict[str, Any], complaint: str) -> None:
    frame = {"group": "g", "topics": ["t"], **change}
    with pytest.raises(InvalidArgumentError, match=complaint):
        parse_subscribe(frame)


def test_settling_frames() -> None:
    assert parse_runs("ack", {"tags": [3, 4]}) == [(3, 1), (4, 1)]
    assert parse_runs("ack", {"runs": [[3, 2], [9, 1]]}) == [(3, 2), (9, 1)]
    with pytest.raises(ProtocolError, match="'nack' needs 'runs' or 'tags'"):
        parse_runs("nack", {"tags": ["3"]})
    for bad in ([[3]], [[3, 0]], [[3, True]], [3, 1], "x", [[1, 2_000_000]]):
        with pytest.raises(ProtocolError, match="'ack'"):
            parse_runs("ack", {"runs": bad})
    assert parse_seen({}) is None  # not said: every delivery may have been processed
    assert parse_seen({"seen": []}) == []
    with pytest.raises(ProtocolError, match="'seen'"):
        parse_seen({"seen": 3})
    assert parse_nack({"delay_ms": 0, "reason": "x" * 2000}) == (0, "x" * 1000)
    assert parse_nack({}) == (None, None)
    with pytest.raises(InvalidArgumentError, match="delay_ms"):
        parse_nack({"delay_ms": -1})


@pytest.mark.parametrize(
    "entry", [[1], ["t", "x", 0], ["t", 0, -1], ["t", True, 0], ["../x", 0, 0]]
)
def test_reset_offsets_are_all_checked_first(entry: list[Any]) -> None:
    with pytest.raises((InvalidArgumentError, InvalidTopicError)):
        parse_reset_offsets([["good", 0, 5], entry])


# -- the checkpoint in state.db ------------------------------------------------------------


def test_a_checkpoint_saves_open_deliveries_and_forgets_finished_ones(data_dir: Path) -> None:
    orders0 = TopicPartition("orders", 0)
    with Store(data_dir) as store:
        state = store.state
        state.checkpoint(
            committed={"g": {orders0: 7}},
            deliveries=[
                DeliveryRow("g", "orders", 0, 7, "", 2, 1000, 0),  # a retry: no lease
                DeliveryRow("g", "orders", 0, 8, "c1", 1, 1000, 31_000),
                DeliveryRow("other", "orders", 0, 7, "c9", 4, 1000, 31_000),
            ],
            scheduled=[ScheduledRow("g", "orders", 0, 7, 61_000, 2, "nacked")],
            finished=[],
        )
        assert state.committed_offsets("g") == {("orders", 0): 7}
        assert state.open_deliveries("g") == {
            ("orders", 0, 7): OpenDelivery(attempt=2, due_at=61_000, out=False),
            ("orders", 0, 8): OpenDelivery(attempt=1, due_at=0, out=True),
        }
        state.checkpoint(
            committed={"g": {orders0: 8}},
            deliveries=[DeliveryRow("g", "orders", 0, 8, "c2", 2, 2000, 32_000)],
            scheduled=[],
            finished=[DeliveryKey("g", "orders", 0, 7)],
        )
        assert state.committed_offsets("g") == {("orders", 0): 8}
        assert state.open_deliveries("g") == {("orders", 0, 8): OpenDelivery(2, 0, True)}
        assert state.query("SELECT COUNT(*) FROM scheduled") == [(0,)]
        # Another group's rows are its own.
        assert state.open_deliveries("other") == {("orders", 0, 7): OpenDelivery(4, 0, True)}


def test_a_checkpoint_writes_only_what_changed_and_what_must_be_remembered() -> None:
    group = Group("g", GroupSettings(max_deliveries=5, retry_backoff_ms=1000))
    state = group.add_partition("orders", 0, 0)
    group.add_consumer("c1", prefetch=10, topics=["orders"])
    for offset in range(5):
        fields = {"offset": offset, "timestamp": 0, "key": None, "headers": []}
        group.add_record(state, fields, b'{"offset":%d,"timestamp":0}\n' % offset, now=0)
    batch = group.dispatch(now=100)["c1"]
    tags = dict(enumerate(batch.tags()))
    state.saved[3] = (1, 0)  # written by an earlier checkpoint
    group.ack(tags[0], "c1", now=200)  # acked before it was ever written
    group.ack(tags[3], "c1", now=200)  # acked after it was written
    group.nack(tags[1], "c1", now=200, delay_ms=None, reason="busy")  # retry at 1200
    # Offset 4 went out again just now: too young to be worth a row yet.
    group.release(tags[4], "c1", now=250)
    fresh = group.dispatch(now=250)["c1"]
    assert [run[1:] for run in fresh.runs] == [[4, 1, 1]]
    checkpoint = collect_checkpoint([group], now=300, min_age_ms=200)
    assert checkpoint == (
        {"g": {TopicPartition("orders", 0): 1}},
        [
            DeliveryRow("g", "orders", 0, 2, "c1", 1, 100, 30_100),
            DeliveryRow("g", "orders", 0, 1, "", 1, 100, 0),  # a retry: nobody's, no lease
        ],
        [ScheduledRow("g", "orders", 0, 1, 1200, 1, "busy")],
        [DeliveryKey("g", "orders", 0, 3)],
        [],  # nothing parked
        [],
    )
    mark_saved(checkpoint, {"g": group})
    assert state.saved == {1: (1, 1200), 2: (1, IN_FLIGHT_ROW)}
    assert collect_checkpoint([group], now=400, min_age_ms=200).is_empty()
    # Old enough now: the redelivered offset 4 gets its row.
    later = collect_checkpoint([group], now=500, min_age_ms=200)
    assert later.deliveries == [DeliveryRow("g", "orders", 0, 4, "c1", 1, 250, 30_250)]


def test_a_delivery_whose_consumer_is_lost_is_saved_as_waiting_not_in_flight() -> None:
    """Its row said in flight with the lost consumer and its lease (the console's pending
    view showed it so for good): the row is written again, nobody's and with no lease, as
    the delivery waits for its next consumer."""
    group = Group("g", GroupSettings(max_deliveries=5))
    state = group.add_partition("orders", 0, 0)
    group.add_consumer("c1", prefetch=10, topics=["orders"])
    fields = {"offset": 0, "timestamp": 0, "key": None, "headers": []}
    group.add_record(state, fields, b'{"offset":0,"timestamp":0}\n', now=0)
    group.dispatch(now=100)
    first = collect_checkpoint([group], now=1000)
    assert first.deliveries == [DeliveryRow("g", "orders", 0, 0, "c1", 1, 100, 30_100)]
    mark_saved(first, {"g": group})
    group.remove_consumer("c1", now=2000)  # its connection lost, with no goodbye
    assert state.in_flight == 0
    second = collect_checkpoint([group], now=3000)
    assert second.deliveries == [DeliveryRow("g", "orders", 0, 0, "", 1, 100, 0)]
    assert second.finished == []  # the attempt still counts: the row stays
    mark_saved(second, {"g": group})
    assert collect_checkpoint([group], now=4000).is_empty()


def test_status_messages_never_block_a_child_whose_manager_is_not_reading() -> None:
    """A child reports to a manager that may be busy: 200 replies of 100 KB each (far
    over a pipe's 64 KiB) are queued at once; nothing is lost but periodic Stats, which
    are dropped while a backlog waits, and the order is kept."""
    import multiprocessing
    import threading

    from spoolmq.broker.status import AdminResult, Stats, StatusSender, decode_status

    reader, writer = multiprocessing.Pipe(duplex=False)
    sender = StatusSender(writer)
    big = {"op": "ok", "blob": "x" * 100_000}

    def report() -> None:
        for n in range(200):
            sender.send(AdminResult(n, big))
            sender.send(Stats({"n": n}))

    reporting = threading.Thread(target=report)
    reporting.start()
    reporting.join(30)
    assert not reporting.is_alive(), "the child blocked on its status pipe"
    received = []
    while len([m for m in received if isinstance(m, AdminResult)]) < 200:
        assert reader.poll(30), "a reply was lost"
        received.append(decode_status(reader.recv_bytes()))
    sender.close()
    replies = [m.request_id for m in received if isinstance(m, AdminResult)]
    assert replies == list(range(200))
    assert len([m for m in received if isinstance(m, Stats)]) < 200


def test_a_row_in_flight_when_the_broker_died_is_saved_as_waiting_after_a_restart() -> None:
    """After a crash, state.db still had the row of a delivery out with its (gone)
    consumer and its lease; restored as (attempts, 0) it matched the waiting form and was
    never written again, so the console showed it in flight until it was redelivered."""
    from spoolmq.broker.group_runtime import restored_by_partition

    restored = restored_by_partition(
        {
            ("orders", 0, 0): OpenDelivery(attempt=1, due_at=0, out=True),
            ("orders", 0, 1): OpenDelivery(attempt=2, due_at=90_000, out=False),
        }
    )
    assert restored == {TopicPartition("orders", 0): {0: (1, IN_FLIGHT_ROW), 1: (2, 90_000)}}
    group = Group("g", GroupSettings(max_deliveries=5))
    state = group.add_partition("orders", 0, 0)
    fields = {"offset": 0, "timestamp": 0, "key": None, "headers": []}
    group.add_record(
        state, fields, b'{"offset":0}\n', now=50_000, attempts_so_far=1, due_at=IN_FLIGHT_ROW
    )
    assert state.retries == {0: (0, None)}  # due now
    checkpoint = collect_checkpoint([group], now=60_000)
    assert checkpoint.deliveries == [DeliveryRow("g", "orders", 0, 0, "", 1, 0, 0)]
