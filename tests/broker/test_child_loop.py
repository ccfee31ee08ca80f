"""The broker children driven in-process: the test plays the manager (control, status and
notice pipes) and a client (a socket handed over as the manager does), and calls
``loop()`` itself, one step at a time. No process is spawned."""

from __future__ import annotations

import errno
import multiprocessing
import os
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from spoolmq import Store, protocol
from spoolmq.broker import child as child_module
from spoolmq.broker.child import BrokerChild, ChildChannels, send_control
from spoolmq.broker.consumer_broker import ConsumerBroker
from spoolmq.broker.publisher_broker import PublisherBroker
from spoolmq.broker.status import Disconnected, Ready, Stats, StatusMessage, decode_status
from spoolmq.clock import ManualClock
from spoolmq.errors import StorageError


@dataclass
class Manager:
    """The manager's ends of one child's pipes."""

    control: Connection
    watch: Connection
    status: Connection
    notices: Connection

    def statuses(self) -> list[StatusMessage]:
        """What the child has sent so far (all of it once the child has closed)."""
        found = []
        while self.status.poll(0):
            found.append(decode_status(self.status.recv_bytes()))
        return found

    def wait_for(self, wanted: StatusMessage, timeout: float = 30) -> list[StatusMessage]:
        """The statuses up to ``wanted``: a child sends them from a thread of its own, so
        one may arrive a moment after the step that reported it."""
        found: list[StatusMessage] = []
        deadline = time.monotonic() + timeout
        while wanted not in found:
            left = deadline - time.monotonic()
            assert left > 0 and self.status.poll(left), f"no {wanted} within {timeout} s"
            found.append(decode_status(self.status.recv_bytes()))
        return found

    def hand_over(self, client_id: str) -> Connection:
        """Hand the child one end of a new socket pair, as the manager does after a
        handshake; return the client's end."""
        ours, theirs = socket.socketpair()
        with theirs:
            send_control(self.control, {"op": "client", "client_id": client_id}, theirs.fileno())
        return Connection(ours.detach())


@contextmanager
def pipes_for_test() -> Iterator[tuple[Manager, ChildChannels]]:
    """A manager's ends and a child's ends of the pipes between them."""
    control, child_control = multiprocessing.Pipe(duplex=True)
    watch_read, watch_write = multiprocessing.Pipe(duplex=False)
    status_read, status_write = multiprocessing.Pipe(duplex=False)
    notice_read, notice_write = multiprocessing.Pipe(duplex=False)
    manager = Manager(control, watch_write, status_read, notice_write)
    child = ChildChannels(child_control, watch_read, status_write, notice_read)
    try:
        yield manager, child
    finally:
        for conn in (control, watch_write, status_read, notice_write, *child):
            if conn is not None:
                conn.close()


@pytest.fixture
def pipes() -> Iterator[tuple[Manager, ChildChannels]]:
    with pipes_for_test() as both:
        yield both


def step_until(
    child: BrokerChild[Any], done: Callable[[], bool], what: str, timeout: float = 30.0
) -> None:
    """Call ``child.loop()`` until ``done()``; each step waits at most 50 ms."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        child.loop(0.05)


def next_frame(child: BrokerChild[Any], client: Connection) -> bytes:
    """The next frame the child sends the client, stepping the child until it comes."""
    step_until(child, lambda: client.poll(0), "frame for the client")
    return client.recv_bytes()


def answer(child: BrokerChild[Any], client: Connection) -> dict[str, Any]:
    return protocol.decode(next_frame(child, client))


def test_a_publisher_broker_step_by_step(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    manager, channels = pipes
    publisher = PublisherBroker(data_dir, channels)
    client = manager.hand_over("p1-7")
    publisher.loop(0.5)  # the control frame: the client is registered
    assert [c.client_id for c in publisher.clients.values()] == ["p1-7"]
    records = [
        {"key": None, "value": "a", "headers": []},
        {"key": None, "value": None, "headers": []},
    ]
    protocol.send(client, {"op": "publish", "id": 3, "topic": "t", "records": records})
    # The publish step's answer waits for the sync thread's fdatasync: later steps send it.
    reply = answer(publisher, client)
    assert reply["op"] == "published" and reply["id"] == 3
    # One range: partition 0, offsets 0 and 1 (partition, first offset, timestamp, count).
    [(partition, first, _timestamp, count)] = reply["r"]
    assert (partition, first, count) == (0, 0, 2)
    protocol.send(client, {"op": "bye"})
    step_until(publisher, lambda: not publisher.clients, "drop after bye")
    assert Disconnected("p1-7") in manager.wait_for(Disconnected("p1-7"))
    publisher.close()
    with Store(data_dir) as store:
        assert [r.value for r in store.reader("t", 0)] == ["a", None]


def test_a_consumer_broker_step_by_step_with_a_manual_clock(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    """Delivery, lease expiry on the test's clock, redelivery and ACK, one step at a time."""
    with Store(data_dir) as store:
        store.append("jobs", "only")
    manager, channels = pipes
    clock = ManualClock(time.time_ns() // 1_000_000)
    consumer_broker = ConsumerBroker(data_dir, channels, clock=clock)
    client = manager.hand_over("c1-9")
    consumer_broker.loop(0.5)
    protocol.send(
        client,
        {
            "op": "subscribe",
            "id": 1,
            "group": "g",
            "topics": ["jobs"],
            "settings": {"lease_ms": 5000},
        },
    )
    assert answer(consumer_broker, client)["op"] == "subscribed"
    header, lines = protocol.split_frame(next_frame(consumer_broker, client))
    assert header["op"] == "deliver" and header["r"][0][4] == 1  # attempt 1
    assert b'"value":"only"' in lines[0]
    # Nothing happens while the lease runs, however many steps pass...
    for _ in range(5):
        consumer_broker.loop(0.01)
    assert not client.poll(0)
    # ... and the message comes again once the test's clock passes it.
    clock.advance(5001)
    header, _ = protocol.split_frame(next_frame(consumer_broker, client))
    assert header["r"][0][4] == 2
    tag = header["r"][0][5]
    protocol.send(client, {"op": "ack", "id": 2, "tags": [tag]})
    assert answer(consumer_broker, client) == {
        "op": "ack_result",
        "id": 2,
        "refused": [],
    }
    consumer_broker.close()
    with Store(data_dir) as store:
        assert store.state.committed_offsets("g") == {("jobs", 0): 1}


def subscribe(
    consumer_broker: ConsumerBroker, client: Connection, prefetch: int = 1, **settings: Any
) -> None:
    """Subscribe the client to "jobs" in group "g" with these group settings."""
    protocol.send(
        client,
        {
            "op": "subscribe",
            "id": 1,
            "group": "g",
            "topics": ["jobs"],
            "prefetch": prefetch,
            "settings": settings,
        },
    )
    assert answer(consumer_broker, client)["op"] == "subscribed"


def test_a_retry_restored_after_a_restart_waits_until_it_is_due(data_dir: Path) -> None:
    """A NACK with a delay, then the ConsumerBroker stops: the next one neither forgets the
    attempt nor delivers the message before its retry time."""
    with Store(data_dir) as store:
        store.append("jobs", "retry me")
    clock = ManualClock(time.time_ns() // 1_000_000)
    for incarnation in ("first", "second"):
        with pipes_for_test() as (manager, channels):
            consumer_broker = ConsumerBroker(data_dir, channels, clock=clock)
            client = manager.hand_over(f"c-{incarnation}")
            subscribe(consumer_broker, client)
            if incarnation == "first":
                header, _ = protocol.split_frame(next_frame(consumer_broker, client))
                assert header["r"][0][4] == 1
                tag = header["r"][0][5]
                protocol.send(client, {"op": "nack", "id": 2, "tags": [tag], "delay_ms": 60_000})
                assert answer(consumer_broker, client)["refused"] == []
            else:
                clock.advance(59_000)
                for _ in range(5):
                    consumer_broker.loop(0.01)
                assert not client.poll(0), "delivered before its retry was due"
                clock.advance(1_000)
                header, _ = protocol.split_frame(next_frame(consumer_broker, client))
                assert header["r"][0][4] == 2  # the attempt before the restart counted
            consumer_broker.close()
            client.close()


def test_run_reports_ready_and_stops_on_the_managers_stop_frame(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    manager, channels = pipes
    protocol.send(manager.control, {"op": "stop"})
    PublisherBroker(data_dir, channels).run()  # returns: the stop frame ended the loop
    statuses = manager.statuses()
    assert statuses[0] == Ready(os.getpid())
    assert {type(s) for s in statuses[1:]} == {Stats}
    # The last word is its final figures, after it stopped.
    last = statuses[-1]
    assert isinstance(last, Stats)
    counts = {
        "frames": 0,
        "messages": 0,
        "batches": 0,
        "errors": 0,
        "by_topic": {},
        "publishers": 0,
    }
    assert {k: last.figures[k] for k in counts} == counts
    assert last.figures["commit_size"]["count"] == 0  # the metrics' histograms, empty


def test_a_dead_letter_the_disk_refuses_is_written_later_not_lost(
    pipes: tuple[Manager, ChildChannels], data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The DLQ append fails twice (a full disk, say): the dead letter stays first in line
    and is written on a later step; only then does the group's offset move past it."""
    with Store(data_dir) as store:
        store.append("jobs", "poison")
    manager, channels = pipes
    clock = ManualClock(time.time_ns() // 1_000_000)
    consumer_broker = ConsumerBroker(data_dir, channels, clock=clock)
    real_append = consumer_broker.store.append_batch
    refusals = [StorageError("no space left on device"), StorageError("no space left")]

    def failing_append(topic: str, messages: Any, **kwargs: Any) -> Any:
        if topic == "jobs.dlq" and refusals:
            raise refusals.pop(0)
        return real_append(topic, messages, **kwargs)

    monkeypatch.setattr(consumer_broker.store, "append_batch", failing_append)
    client = manager.hand_over("c1-1")
    subscribe(consumer_broker, client, max_deliveries=1)
    header, _ = protocol.split_frame(next_frame(consumer_broker, client))
    protocol.send(client, {"op": "nack", "id": 2, "tags": [header["r"][0][5]], "reason": "bad"})
    assert answer(consumer_broker, client)["refused"] == []
    step_until(consumer_broker, lambda: not refusals[1:], "the first refusal")
    runtime = consumer_broker.groups["g"]
    assert [p.offset for p in runtime.group.dead] == [0]  # kept, not dropped
    for _ in range(3):
        clock.advance(60_000)  # past any backoff
        consumer_broker.loop(0.01)
    assert refusals == [] and runtime.group.dead == []
    consumer_broker.close()
    with Store(data_dir) as store:
        [letter] = list(store.reader("jobs.dlq", 0))
        assert letter.value == "poison"
        assert store.state.committed_offsets("g") == {("jobs", 0): 1}


def test_a_waitable_is_watched_only_in_the_steps_that_pass_it(
    pipes: tuple[Manager, ChildChannels], data_dir: Path
) -> None:
    """The loop's selector lives as long as the child; what a step passes besides the
    clients (the sync thread's pipe) must not keep waking later steps that do not read it."""
    _, channels = pipes
    publisher = PublisherBroker(data_dir, channels)
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, b"x")  # readable, and nobody reads it
        waitable = Connection(read_end, writable=False)
        assert waitable in publisher._wait_step(5.0, [waitable])
        assert waitable not in publisher._wait_step(0.05)
        assert waitable in publisher._wait_step(5.0, [waitable])
    finally:
        os.close(write_end)
        publisher.close()


def _dropped_on_arrival(manager: Manager, monkeypatch: pytest.MonkeyPatch) -> None:
    """A child out of descriptors gets the hand-over's byte without the descriptor (the
    kernel drops it)."""
    protocol.send(manager.control, {"op": "client", "client_id": "p1-lost"})
    with protocol.borrowed_socket(manager.control) as sock:
        sock.sendmsg([b"\x01"])  # what sendfds sends, without its SCM_RIGHTS


def _refused_by_sendmsg(manager: Manager, monkeypatch: pytest.MonkeyPatch) -> None:
    """``sendmsg`` refuses the descriptor (ETOOMANYREFS) after the hand-over's frame went:
    the manager is told, and the child must not take the next frame's first byte for the
    descriptor's."""

    def refused(sock: socket.socket, fds: list[int]) -> None:
        raise OSError(errno.ETOOMANYREFS, os.strerror(errno.ETOOMANYREFS))

    ours, theirs = socket.socketpair()
    with monkeypatch.context() as patch, ours, theirs:
        patch.setattr(child_module, "sendfds", refused)
        with pytest.raises(OSError, match="many references"):
            frame = {"op": "client", "client_id": "p1-lost"}
            send_control(manager.control, frame, theirs.fileno())


def _notice_pipe_dropped(manager: Manager, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConsumerBroker's notice pipe, handed to the PublisherBroker the same way, lost
    the same way: the child logs it and goes on (the ConsumerBroker's rescan finds new
    messages without notices)."""
    protocol.send(manager.control, {"op": "notices"})
    with protocol.borrowed_socket(manager.control) as sock:
        sock.sendmsg([b"\x01"])


@pytest.mark.timeout(60)  # a frame read out of step would wait for ever
@pytest.mark.parametrize("lose", [_dropped_on_arrival, _refused_by_sendmsg, _notice_pipe_dropped])
def test_a_client_whose_descriptor_was_lost_is_dropped_not_the_child(
    pipes: tuple[Manager, ChildChannels],
    data_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    lose: Callable[[Manager, pytest.MonkeyPatch], None],
) -> None:
    """That client is lost, logged, and the child goes on taking others."""
    manager, channels = pipes
    publisher = PublisherBroker(data_dir, channels)
    try:
        lose(manager, monkeypatch)
        publisher.loop(0.5)
        assert not publisher.clients
        client = manager.hand_over("p2-7")
        step_until(publisher, lambda: bool(publisher.clients), "the next client")
        assert [c.client_id for c in publisher.clients.values()] == ["p2-7"]
        client.close()
    finally:
        publisher.close()
