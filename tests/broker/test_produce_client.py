"""The Publisher against a stand-in broker speaking protocol version 2: frames of one topic
and one partition (keyed messages grouped by the key's partition once an answer gave the
count), records in the store's form, and answers as ranges resolved without a Position
built per message until one is asked for."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from multiprocessing.connection import Listener
from pathlib import Path
from typing import Any

import pytest
from fake_publish_broker import serve_one_publisher

from spoolmq import Publisher
from spoolmq.errors import (
    InvalidArgumentError,
    InvalidTopicError,
    MessageTooLargeError,
    PublishTimeoutError,
    SerializationError,
)
from spoolmq.store.message import Position
from spoolmq.store.partitioner import partition_for_key


def fake_broker(
    listener: Listener, frames: list[dict[str, Any]], gate: threading.Event | None = None
) -> None:
    """Welcome one publisher; store every record at the next offset of its frame's
    partition (partition 0 when the frame leaves it to the broker), except records whose
    value is "bad"; answer ranges, with the topic's 4 partitions (once ``gate`` is set,
    when there is one)."""
    ends = [0] * 4

    def answer(frame: dict[str, Any]) -> dict[str, Any]:
        frames.append(frame)
        partition = frame["partition"] or 0
        ranges: list[list[int]] = []
        errors = {}
        for index, record in enumerate(frame["records"]):
            if record.get("value") == "bad":
                errors[str(index)] = {"code": "message_too_large", "message": "too big"}
                continue
            if ranges and ranges[-1][1] + ranges[-1][3] == ends[partition]:
                ranges[-1][3] += 1
            else:
                ranges.append([partition, ends[partition], 1000, 1])
            ends[partition] += 1
        reply: dict[str, Any] = {"op": "published", "id": frame["id"], "r": ranges, "n": 4}
        if errors:
            reply["errors"] = errors
        if gate is not None:
            gate.wait(60)
        return reply

    serve_one_publisher(listener, answer)


@contextlib.contextmanager
def serving(
    tmp_path: Path, gate: threading.Event | None = None, **settings: Any
) -> Iterator[tuple[Publisher, list[dict[str, Any]]]]:
    """A Publisher with ``settings`` connected to the stand-in broker, and the frames the
    broker received."""
    address, key = str(tmp_path / "fake.sock"), b"k" * 32
    frames: list[dict[str, Any]] = []
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        server = threading.Thread(target=fake_broker, args=(listener, frames, gate), daemon=True)
        server.start()
        with Publisher(address=address, authkey=key, **settings) as pub:
            yield pub, frames
        server.join(10)


@pytest.fixture
def publisher(tmp_path: Path) -> Iterator[tuple[Publisher, list[dict[str, Any]]]]:
    with serving(tmp_path, linger_ms=20, producer_id="p") as served:
        yield served


def test_answers_as_ranges_resolve_each_future(publisher: Any) -> None:
    pub, frames = publisher
    futures = [pub.publish_async("t", value) for value in ["a", "bad", "c", "d"]]
    pub.flush()
    assert futures[0].result(timeout=0) == Position("t", 0, 0, 1000)
    with pytest.raises(MessageTooLargeError, match="too big"):
        futures[1].result(timeout=0)
    assert [f.result(timeout=0).offset for f in futures[2:]] == [1, 2]
    [frame] = frames
    assert (frame["topic"], frame["partition"], frame["producer_id"]) == ("t", None, "p")
    assert frame["records"] == [
        {"key": None, "value": v, "headers": [], "sequence": n, "producer_id": "p"}
        for n, v in enumerate(["a", "bad", "c", "d"])
    ]


def test_a_blocking_publish_and_callbacks_see_their_position(publisher: Any) -> None:
    pub, _ = publisher
    assert pub.publish("t", 1) == Position("t", 0, 0, 1000)
    seen: list[Position] = []
    future = pub.publish_async("t", 2)
    future.add_done_callback(lambda f: seen.append(f.result()))
    pub.flush()
    assert seen == [Position("t", 0, 1, 1000)]


def test_keyed_messages_go_in_frames_of_their_keys_partition(publisher: Any) -> None:
    pub, frames = publisher
    pub.publish("t", "first")  # the answer tells the client the topic has 4 partitions
    keys = [f"k{n}" for n in range(20)]
    futures = [pub.publish_async("t", n, key=key) for n, key in enumerate(keys)]
    pub.flush()
    for frame in frames[1:]:
        partitions = {partition_for_key(r["key"], 4) for r in frame["records"]}
        assert partitions == {frame["partition"]}
    by_partition: dict[int, list[int]] = {}
    for key, future in zip(keys, futures, strict=True):
        position = future.result(timeout=0)
        assert position.partition == partition_for_key(key, 4)
        by_partition.setdefault(position.partition, []).append(position.offset)
    # Per partition, the messages are stored in the order they were published.
    assert all(offsets == sorted(offsets) for offsets in by_partition.values())


def test_publish_async_waits_for_room_when_the_buffer_is_full(tmp_path: Path) -> None:
    gate = threading.Event()
    with serving(tmp_path, gate, max_buffered=5, linger_ms=1) as (pub, _):
        futures = [pub.publish_async("t", n) for n in range(5)]
        sixth: list[Any] = []
        caller = threading.Thread(target=lambda: sixth.append(pub.publish_async("t", 5)))
        caller.start()
        caller.join(1.0)
        # No answer yet, so no room: the sixth call is still waiting.
        assert caller.is_alive() and not sixth
        gate.set()
        caller.join(30)
        assert not caller.is_alive()
        pub.flush(30)
        assert [f.result(timeout=0).offset for f in [*futures, *sixth]] == list(range(6))


def test_a_full_buffer_fails_the_caller_after_the_delivery_timeout(tmp_path: Path) -> None:
    """With the buffer full and no answer coming, a third ``publish_async`` waits for room
    and fails after the delivery timeout. The two queued messages reach their own delivery
    timeout at about the same moment, and their failure makes room: on a busy machine that
    can come first, and then the third call returns, but only once both have failed. Either
    way nothing is taken beyond ``max_buffered`` and every caller learns of the failure."""
    address, key = str(tmp_path / "fake.sock"), b"k" * 32
    gate = threading.Event()  # never set while the publisher waits: no answer comes
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        server = threading.Thread(target=fake_broker, args=(listener, [], gate), daemon=True)
        server.start()
        pub = Publisher(address=address, authkey=key, max_buffered=2, delivery_timeout=1.0)
        try:
            first = [pub.publish_async("t", 0), pub.publish_async("t", 1)]
            try:
                third = pub.publish_async("t", 2)
            except PublishTimeoutError as exc:
                assert "max_buffered" in str(exc)
            else:
                assert all(f.done() for f in first), "room taken while the buffer was full"
                for future in [*first, third]:
                    with pytest.raises(PublishTimeoutError):
                        future.result(timeout=60)
        finally:
            gate.set()
            pub.close()
        server.join(10)


def test_set_next_sequence_numbers_the_next_message(publisher: Any) -> None:
    """A caller that numbers its own messages (a periodic job's tick) gets that sequence on
    the wire, and the messages after it continue from there; a bad number is refused."""
    pub, frames = publisher
    pub.set_next_sequence(41)
    pub.publish("t", "a")
    pub.publish("t", "b")
    sent = [record["sequence"] for frame in frames for record in frame["records"]]
    assert sent[-2:] == [41, 42]
    for bad in (-1, 1.5, True, "3", 2**63):  # past 2**63 - 1 readers could not hold it
        with pytest.raises(InvalidArgumentError):
            pub.set_next_sequence(bad)
    pub.set_next_sequence(2**63 - 1)
    pub.publish("t", "last")
    assert frames[-1]["records"][-1]["sequence"] == 2**63 - 1


@pytest.mark.parametrize("bad", ["", 7, b"p-1", "p-\ud800"])
def test_a_producer_id_that_cannot_go_in_a_record_is_refused_at_once(
    tmp_path: Path, bad: Any
) -> None:
    """Every numbered record carries the producer id as JSON text: one that is not a
    non-empty str UTF-8 can hold is refused when the Publisher is made, not per message."""
    with pytest.raises(InvalidArgumentError, match="producer_id"):
        Publisher(address=str(tmp_path / "none.sock"), authkey=b"k" * 32, producer_id=bad)


def _senders(pub: Any) -> list[str]:
    """The names of the threads that send ``pub``'s publish frames, in order, from now on."""
    names: list[str] = []
    conn = pub._conn
    send = conn.send_bytes

    def recorded(data: bytes, *args: Any) -> None:
        if data.startswith(b'{"op":"publish"'):
            names.append(threading.current_thread().name)
        send(data, *args)

    conn.send_bytes = recorded
    return names


@pytest.mark.parametrize("linger_ms", [0, 20])
def test_with_no_linger_an_idle_publisher_sends_from_the_caller(
    tmp_path: Path, linger_ms: int
) -> None:
    """With nothing queued or in flight, a ``publish_async`` that may not linger goes out
    from the caller's thread: no wake-up of the I/O thread on a message's way (latency).
    With a linger, the I/O thread sends it once the linger is over.

    The caller's send is best effort: when the I/O thread happens to hold the send lock
    right then (it goes round its loop after each answer), the I/O thread sends it. On a
    busy machine that can happen to a message now and then, so
    the test asks only that some of the caller's messages go from its own thread."""
    with serving(tmp_path, linger_ms=linger_ms) as (pub, frames):
        senders = _senders(pub)
        for n in range(6):
            assert pub.publish_async("t", n).result(timeout=30).offset == n
    caller = threading.current_thread().name
    assert len(senders) == 6
    if linger_ms == 0:
        assert caller in senders, senders
    else:
        assert senders == ["spoolmq-publisher"] * 6
    assert [len(frame["records"]) for frame in frames] == [1] * 6


def test_with_no_linger_a_fast_caller_still_fills_frames(tmp_path: Path) -> None:
    """The caller sends only into an idle pipeline: while a frame is in flight, what it
    queues is left to the I/O thread, which sends it in frames of many messages."""
    gate = threading.Event()
    with serving(tmp_path, gate, linger_ms=0, batch_size=100, max_in_flight=8) as (pub, frames):
        senders = _senders(pub)
        futures = [pub.publish_async("t", n) for n in range(1000)]
        gate.set()  # the broker answers only now: every later message found one in flight
        pub.flush(30)
    assert [f.result(timeout=0).offset for f in futures] == list(range(1000))
    # The first message went out from the caller, alone; then at most 7 frames of what
    # was queued so far before the window of 8 was full, then full frames of 100.
    assert senders.count(threading.current_thread().name) == 1, senders
    assert len(frames[0]["records"]) == 1
    assert len(frames) <= 1 + 7 + 10, [len(frame["records"]) for frame in frames]


def test_publish_many_sends_frames_of_up_to_a_batch_and_answers_each_in_order(
    tmp_path: Path,
) -> None:
    with serving(tmp_path, batch_size=3, linger_ms=20, producer_id="p") as (pub, frames):
        values = ["a", "b", "c", "d", "e", "f", "g"]
        positions = pub.publish_many("t", values)
    assert positions == [Position("t", 0, n, 1000) for n in range(7)]
    assert all(len(frame["records"]) <= 3 for frame in frames)
    sent = [record for frame in frames for record in frame["records"]]
    assert [(r["value"], r["sequence"]) for r in sent] == list(zip(values, range(7), strict=True))


def test_publish_many_with_a_value_that_cannot_be_sent_publishes_none(publisher: Any) -> None:
    pub, frames = publisher
    with pytest.raises(SerializationError, match=r"values\[1\]"):
        pub.publish_many("t", ["a", {1, 2}, "c"])
    with pytest.raises(SerializationError, match=r"values\[2\]"):
        pub.publish_many_async("t", ["a", "b", float("nan")])
    pub.publish("t", "after")
    assert [r["value"] for frame in frames for r in frame["records"]] == ["after"]


def test_publish_many_a_refused_message_fails_only_its_own_future(publisher: Any) -> None:
    pub, _ = publisher
    futures = pub.publish_many_async("t", ["a", "bad", "c"])
    pub.flush()
    assert futures[0].result(timeout=0).offset == 0
    with pytest.raises(MessageTooLargeError, match="too big"):
        futures[1].result(timeout=0)
    assert futures[2].result(timeout=0).offset == 1
    # Blocking, the refused message's error is raised once all are answered.
    with pytest.raises(MessageTooLargeError):
        pub.publish_many("t", ["d", "bad", "e"])
    assert pub.publish("t", "f").offset == 4  # "d" and "e" were stored


def test_publish_many_with_a_key_goes_to_the_keys_partition(publisher: Any) -> None:
    pub, frames = publisher
    pub.publish("t", "first")  # the answer tells the client the topic has 4 partitions
    positions = pub.publish_many("t", list(range(10)), key="k7", headers={"h": "v"})
    partition = partition_for_key("k7", 4)
    assert {p.partition for p in positions} == {partition}
    first = 1 if partition == 0 else 0  # "first" went to partition 0 (the stand-in's choice)
    assert [p.offset for p in positions] == list(range(first, first + 10))
    records = [r for frame in frames[1:] for r in frame["records"]]
    assert {(r["key"], frame["partition"]) for frame in frames[1:] for r in frame["records"]} == {
        ("k7", partition_for_key("k7", 4))
    }
    assert all(r["headers"] == [["h", "v"]] for r in records)


def test_publish_many_waits_for_room_a_frame_at_a_time(tmp_path: Path) -> None:
    """More values than ``max_buffered``: what fits is queued, the rest waits for answers
    to make room (never more than ``max_buffered`` outstanding)."""
    gate = threading.Event()
    with serving(tmp_path, gate, max_buffered=5, linger_ms=1) as (pub, _):
        got: list[Any] = []
        caller = threading.Thread(target=lambda: got.extend(pub.publish_many_async("t", range(8))))
        caller.start()
        caller.join(1.0)
        assert caller.is_alive() and not got  # 5 queued, no answer yet: no room for 3 more
        assert pub._outstanding == 5
        gate.set()
        caller.join(30)
        assert not caller.is_alive()
        pub.flush(30)
    assert [f.result(timeout=0).offset for f in got] == list(range(8))


def test_a_blocking_publish_many_raises_only_once_every_message_is_answered(
    tmp_path: Path,
) -> None:
    with serving(tmp_path, batch_size=2, linger_ms=1) as (pub, _):
        queued: list[Any] = []
        enqueue = pub._enqueue_many

        def seen(*args: Any, **kwargs: Any) -> Any:
            queued.extend(enqueue(*args, **kwargs))
            return queued

        pub._enqueue_many = seen
        with pytest.raises(MessageTooLargeError):
            pub.publish_many("t", ["a", "bad", "c", "d", "e", "f"])  # 3 frames
        # Raised once every message had its answer, the later frames' too.
        assert len(queued) == 6 and all(future.done() for future in queued)


@pytest.mark.parametrize("values", ["abc", b"ab", {"a": 1}, 5])
def test_publish_many_wants_an_iterable_of_values(publisher: Any, values: Any) -> None:
    pub, frames = publisher
    with pytest.raises(InvalidArgumentError, match="values must be a list"):
        pub.publish_many("t", values)
    assert frames == []


def test_publish_many_checks_the_topic_and_options_even_with_no_values(publisher: Any) -> None:
    pub, frames = publisher
    with pytest.raises(InvalidTopicError):
        pub.publish_many("no spaces", [])
    with pytest.raises(InvalidArgumentError):
        pub.publish_many_async("t", [], priority=12)
    assert pub.publish_many("t", []) == [] and pub.publish_many_async("t", iter(())) == []
    assert frames == []


def test_a_done_callback_may_wait_for_another_publishers_answers(tmp_path: Path) -> None:
    """Another Publisher's I/O thread answers its messages: waiting for them in a done
    callback of the first holds the first one's thread a while, and is allowed."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    seen: list[Any] = []

    def callback(_: Any) -> None:
        try:
            seen.append(other.publish("t", "from a's callback"))
            seen.append(other.publish_many("t", ["and", "more"]))
            seen.append(other.publish_async("t", "last").result(timeout=30))
        except Exception as exc:  # what the test reports
            seen.append(exc)

    with (
        serving(tmp_path / "a", linger_ms=60_000, producer_id="a") as (pub, _),
        serving(tmp_path / "b", linger_ms=5, producer_id="b") as (other, frames),
    ):
        pub.publish_async("t", "first").add_done_callback(callback)
        pub.flush(timeout=30)
    assert seen == [
        Position("t", 0, 0, 1000),
        [Position("t", 0, 1, 1000), Position("t", 0, 2, 1000)],
        Position("t", 0, 3, 1000),
    ]
    assert [r["value"] for f in frames for r in f["records"]] == [
        "from a's callback", "and", "more", "last",
    ]  # fmt: skip


def test_a_done_callback_that_would_wait_for_answers_is_refused(tmp_path: Path) -> None:
    """A done callback runs in the I/O thread, which reads the answers: a blocking call
    there would hold it (for good, or until a timeout), and so would waiting for a future
    not answered yet. They raise instead; the callback's own future (done) gives its
    result, and queueing from there still works: the message goes out at once, not after
    its linger, since flush() is waiting for it."""
    outcomes: dict[str, Any] = {}

    def callback(done: Any) -> None:
        outcomes["thread"] = threading.current_thread().name
        outcomes["own"] = done.result(timeout=0)
        for name, call in [
            ("publish", lambda: pub.publish("t", "blocked")),
            ("publish_many", lambda: pub.publish_many("t", ["blocked"])),
            ("flush", pub.flush),
            ("close", pub.close),
        ]:
            try:
                outcomes[name] = call()
            except InvalidArgumentError as exc:
                outcomes[name] = exc
        outcomes["queued"] = queued = pub.publish_async("t", "from the callback")
        # Before, each waited out its timeout (the answer could not be read meanwhile).
        for name, wait in [("result", queued.result), ("exception", queued.exception)]:
            try:
                outcomes[name] = wait(timeout=20)
            except (InvalidArgumentError, TimeoutError) as exc:
                outcomes[name] = exc
        try:  # a look that does not wait is no mistake: not answered yet, as Future says
            outcomes["look"] = queued.result(timeout=0)
        except TimeoutError as exc:
            outcomes["look"] = exc

    # A long linger keeps the first message queued until flush(), so the callback is
    # added before its answer and runs in the I/O thread when the answer comes.
    with serving(tmp_path, linger_ms=60_000, producer_id="p") as (pub, frames):
        first = pub.publish_async("t", "first")
        first.add_done_callback(callback)
        pub.flush(timeout=30)  # well before the 60 s linger: flush() sends it at once
        assert outcomes["thread"] == "spoolmq-publisher"
        assert outcomes["own"] == Position("t", 0, 0, 1000)
        assert isinstance(outcomes["look"], TimeoutError)
        for name in ("publish", "publish_many", "flush", "close", "result", "exception"):
            assert isinstance(outcomes[name], InvalidArgumentError), name
            assert f"{name}()" in str(outcomes[name]) and "callback" in str(outcomes[name])
        assert outcomes["queued"].result(timeout=0) == Position("t", 0, 1, 1000)
        assert pub.publish("t", "after") == Position("t", 0, 2, 1000)  # still usable
    values = [record["value"] for frame in frames for record in frame["records"]]
    assert values == ["first", "from the callback", "after"]
