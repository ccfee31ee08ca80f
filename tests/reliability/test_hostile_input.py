"""Point 10: hostile input on the broker's socket. Every frame gets a structured error or a
closed connection, no broker process dies, a normal client is served afterwards (and while a
client sits on half a frame), and no file appears outside the data directory."""

from __future__ import annotations

import itertools
import json
import logging
import os
import random
import socket
import struct
import time
from collections.abc import Callable
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

import orjson
import pytest

from spoolmq import Consumer, Publisher, protocol
from spoolmq.testing import BrokerProcess

BAD_TOPICS = ["../x", "/abs", "a\x00b", "", "t" * 300, "..", "a/b", " x", "x\n"]

RNG = random.Random(5)

# Frames sent after a successful handshake, as raw bytes (what send_bytes would carry).
FRAMES: dict[str, bytes] = {
    "random bytes": bytes(RNG.randrange(256) for _ in range(4096)),
    "not utf-8": b'{"op":"publish","id":1,"topic":"t","records":[{"key":null,"value":"\xff\xfe"}]}',
    "nested 100000 deep": b"[" * 100_000 + b"]" * 100_000,
    "nested object": b'{"op":"publish","id":1,"topic":"t","records":'
    + b"[" * 100_000
    + b"]" * 100_000
    + b"}",
    "not an object": b"[1,2,3]",
    "no op": b'{"id":1}',
    "op not a string": b'{"op":7}',
    "unknown op": b'{"op":"frobnicate","id":1}',
    "empty": b"",
}

# Records of publish frames wrong in every field the broker reads (the frame's topic "t").
_R = {"key": None, "value": 1, "headers": []}
BAD_RECORDS: list[Any] = [
    {**_R, "key": {"a": 1}},
    {**_R, "key": 7},
    {**_R, "headers": [[1, 2]]},
    {**_R, "headers": [["h", {"x": 1}]]},
    {**_R, "headers": "h"},
    {**_R, "tags": [1, None]},
    {**_R, "partition": 0},
    {**_R, "sequence": "x", "producer_id": "p"},
    {**_R, "sequence": 10**30, "producer_id": "p"},
    {**_R, "sequence": 1, "producer_id": "not the frame's"},
    {**_R, "delay_ms": 1e308},
    {**_R, "deliver_at": "tomorrow"},
    {**_R, "ttl_ms": -5},
    {"key": None, "value_b64": "***", "headers": []},
    {"key": None, "value_b64": 5, "headers": []},
    {"value": 1, "key": None, "headers": []},
    {"value": 1},
    {"key": None, "value": 1, "headers": [], "offset": 5},
    {"key": None, "value": 1, "headers": [], "crc": 5},
    "not an object",
]
# Whole publish frames wrong in a field of the frame itself.
BAD_PUBLISH_FRAMES: list[dict[str, Any]] = [
    *({"op": "publish", "id": 1, "topic": topic, "records": [_R]} for topic in BAD_TOPICS),
    {"op": "publish", "id": 1, "topic": 5, "records": [_R]},
    {"op": "publish", "id": 1, "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "partition": "x", "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "partition": 10**30, "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "partition": -1, "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "partition": 999, "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "acks": "most", "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "producer_id": 5, "records": [_R]},
    {"op": "publish", "id": 1, "topic": "t", "records": []},
    {"op": "publish", "id": 1, "topic": "t", "records": {"key": None}},
    {"op": "publish", "id": 1, "messages": [{"topic": "t", "value": 1}]},  # version 1
]

# Whole frames on a consumer connection.
CONSUMER_FRAMES: list[dict[str, Any]] = [
    *({"op": "subscribe", "id": 1, "group": "g", "topics": [topic]} for topic in BAD_TOPICS),
    {"op": "subscribe", "id": 1, "group": "g", "topics": "t"},
    {"op": "subscribe", "id": 1, "group": {"g": 1}, "topics": ["t"]},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "prefetch": "all"},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "settings": {"lease_ms": "x"}},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "settings": {"auto_ack": None}},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "settings": {"filter": "x"}},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "settings": {"lease_ms": 10**30}},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "settings": {"lease_ms": 1.5}},
    {"op": "subscribe", "id": 1, "group": "g", "topics": ["t"], "settings": {"nope": 1}},
    {"op": "ack", "id": 1, "tags": [1]},
    {"op": "credit", "n": "many"},
    {"op": "publish", "id": 1, "topic": "t", "records": [{"key": None, "value": 1, "headers": []}]},
]

# Whole frames on an admin connection.
ADMIN_FRAMES: list[dict[str, Any]] = [
    {"op": "admin", "id": 1, "action": "reset_group", "group": "g", "offsets": [[1]]},
    {"op": "admin", "id": 1, "action": "reset_group", "group": "g", "offsets": [["t", "x", 0]]},
    {"op": "admin", "id": 1, "action": "reset_group", "group": "g", "offsets": [["../x", 0, 0]]},
    {"op": "admin", "id": 1, "action": "reset_group", "group": "g", "offsets": "all"},
    {"op": "admin", "id": 1, "action": "reset_group", "group": 5, "offsets": []},
    {"op": "admin", "id": 1, "action": "format_disk"},
    {"op": "admin", "id": 1},
    {"op": "publish", "id": 1, "topic": "t", "records": [{"key": None, "value": 1, "headers": []}]},
]


def connect_raw(data_dir: Path) -> Connection:
    key = (data_dir / protocol.AUTHKEY_FILE).read_bytes()
    return Client(str(data_dir / protocol.SOCKET_FILE), family="AF_UNIX", authkey=key)


def welcomed(data_dir: Path, role: str) -> Connection:
    conn = connect_raw(data_dir)
    hello = {"op": "hello", "version": protocol.PROTOCOL_VERSION, "role": role, "pid": os.getpid()}
    protocol.send(conn, hello)
    assert protocol.receive(conn)["op"] == "welcome"
    return conn


def outcome(conn: Connection, timeout: float = 20.0) -> str:
    """What the broker did: ``error`` (a structured error, whole frame or per message),
    ``closed``, or ``ok``/``silent`` (accepted, or no answer within ``timeout``)."""
    try:
        if not conn.poll(timeout):
            return "silent"
        frame = orjson.loads(conn.recv_bytes())
    except (EOFError, OSError):
        return "closed"
    if frame.get("op") == "error":
        assert isinstance(frame.get("code"), str) and frame.get("message")
        return "error"
    errors = frame.get("errors") or {}
    if errors:
        assert all(isinstance(e.get("code"), str) and e.get("message") for e in errors.values())
        return "error"
    if frame.get("refused"):
        return "error"
    return "ok"


def files_outside(root: Path, data_dir: Path) -> set[str]:
    """Every path under ``root`` that is not in the data directory."""
    found = set()
    for directory, dirs, files in os.walk(root):
        if Path(directory) == data_dir:
            dirs.clear()
            continue
        found.update(os.path.join(directory, name) for name in dirs + files)
    return found


def served(data_dir: Path) -> None:
    """A normal publisher and consumer still work."""
    with Publisher(data=data_dir, delivery_timeout=60) as pub:
        position = pub.publish("healthy", {"ok": True})
    with Consumer("healthy", group=f"check-{position.offset}", data=data_dir) as consumer:
        message = consumer.receive(timeout=60)
        assert message is not None and message.offset == 0
        message.ack()


@pytest.fixture
def watched(broker: BrokerProcess, data_dir: Path, tmp_path: Path) -> Any:
    """The broker, and after the test: no process died, nothing written outside data_dir."""
    children = broker.child_pids()
    outside = files_outside(tmp_path, data_dir)
    absolute = {p: Path(p).exists() for p in ("/abs", "/x", str(data_dir.parent / "x"))}
    yield broker
    assert broker.child_pids() == children, "a broker process died and was restarted"
    assert broker.stats()["pid"] == broker.pid
    assert files_outside(tmp_path, data_dir) - outside <= {str(tmp_path / "broker.log")}
    assert {p: Path(p).exists() for p in absolute} == absolute


@pytest.mark.parametrize("role", ["hello", "publisher", "consumer", "admin"])
def test_malformed_frames(watched: BrokerProcess, data_dir: Path, role: str, figure: Any) -> None:
    seen: dict[str, str] = {}
    for name, payload in FRAMES.items():
        conn = connect_raw(data_dir) if role == "hello" else welcomed(data_dir, role)
        conn.send_bytes(payload)
        seen[name] = outcome(conn)
        if name in ("not an object", "no op", "op not a string", "unknown op"):
            # docs/PROTOCOL.md: such a frame closes the connection (after an error frame);
            # an admin connection answered and stayed open.
            assert outcome(conn) == "closed", f"{role}: {name}"
        conn.close()
    served(data_dir)
    figure(f"{role}: " + ", ".join(f"{n} -> {o}" for n, o in seen.items()))
    assert set(seen.values()) <= {"error", "closed"}, seen


@pytest.mark.parametrize("role", ["hello", "publisher", "consumer", "admin"])
def test_frames_over_the_size_limit_and_truncated(
    watched: BrokerProcess, data_dir: Path, role: str, figure: Any
) -> None:
    seen: dict[str, str] = {}
    for name, header, body in [
        ("over the limit", struct.pack("!i", protocol.MAX_FRAME_BYTES + 1), b"{}"),
        ("over the limit (64-bit size)", struct.pack("!iQ", -1, 1 << 40), b"{}"),
        ("negative size", struct.pack("!i", -7), b"{}"),
        ("truncated, then closed", struct.pack("!i", 1000), b'{"op":"publish"'),
    ]:
        conn = connect_raw(data_dir) if role == "hello" else welcomed(data_dir, role)
        os.write(conn.fileno(), header + body)
        if name.startswith("truncated"):
            socket.socket(fileno=os.dup(conn.fileno())).shutdown(socket.SHUT_WR)
        seen[name] = outcome(conn)
        conn.close()
    # Half a frame on an open connection: the broker must go on serving everyone else.
    stalled = connect_raw(data_dir) if role == "hello" else welcomed(data_dir, role)
    os.write(stalled.fileno(), struct.pack("!i", 1000) + b'{"op":"publish"')
    started = time.monotonic()
    served(data_dir)
    seen["half a frame, left open: others served in"] = f"{time.monotonic() - started:.2f} s"
    stalled.close()
    served(data_dir)
    figure(f"{role}: " + ", ".join(f"{n} -> {o}" for n, o in seen.items()))
    assert {o for n, o in seen.items() if not n.startswith("half")} <= {"error", "closed"}, seen


def test_bad_fields_in_publish_frames(watched: BrokerProcess, data_dir: Path, figure: Any) -> None:
    outcomes = []
    frames = [
        {"op": "publish", "id": n, "topic": "t", "producer_id": "p", "records": [record]}
        for n, record in enumerate(BAD_RECORDS)
    ] + BAD_PUBLISH_FRAMES
    for frame in frames:
        conn = welcomed(data_dir, "publisher")
        # Python's json: orjson refuses integers past 64 bits, a hostile client need not.
        conn.send_bytes(json.dumps(frame).encode())
        outcomes.append(outcome(conn))
        conn.close()
    served(data_dir)
    figure(
        f"{len(outcomes)} bad publish frames: {outcomes.count('error')} structured errors, "
        f"{outcomes.count('closed')} closed"
    )
    assert set(outcomes) <= {"error", "closed"}, [
        (frame, result) for frame, result in zip(frames, outcomes, strict=True) if result != "error"
    ]


@pytest.mark.parametrize("role", ["consumer", "admin"])
def test_bad_consumer_and_admin_frames(
    watched: BrokerProcess, data_dir: Path, role: str, figure: Any
) -> None:
    frames = CONSUMER_FRAMES if role == "consumer" else ADMIN_FRAMES
    outcomes = []
    for frame in frames:
        conn = welcomed(data_dir, role)
        conn.send_bytes(json.dumps(frame).encode())
        outcomes.append(outcome(conn))
        conn.close()
    served(data_dir)
    figure(
        f"{len(outcomes)} bad {role} frames: {outcomes.count('error')} structured errors, "
        f"{outcomes.count('closed')} closed"
    )
    assert set(outcomes) <= {"error", "closed"}, [
        (frame, result) for frame, result in zip(frames, outcomes, strict=True) if result != "error"
    ]


@pytest.mark.parametrize(
    ("role", "frame", "expected"),
    [
        ("consumer", {"op": "publish", "id": 5}, "a consumer connection cannot send 'publish'"),
        ("consumer", {"op": "subscribe", "id": 6, "group": 7}, None),
        ("consumer", {"op": "ack", "id": 7, "runs": [[1, 1]]}, "'ack' before 'subscribe'"),
        ("publisher", {"op": "subscribe", "id": 8}, "a publisher connection cannot send"),
    ],
)
def test_an_error_that_closes_a_connection_answers_the_frame_by_its_id(
    broker: BrokerProcess, data_dir: Path, role: str, frame: dict[str, Any], expected: str | None
) -> None:
    """PROTOCOL.md: an error's ``id`` is the frame it answers. The frame closing the
    connection was answered with no id, and a consumer's op that is never allowed
    before subscribing was said to come "before 'subscribe'"."""
    conn = welcomed(data_dir, role)
    conn.send_bytes(json.dumps(frame).encode())
    assert conn.poll(30)
    answer = orjson.loads(conn.recv_bytes())
    assert (answer["op"], answer.get("id")) == ("error", frame["id"]), answer
    if expected is not None:
        assert expected in answer["message"], answer
    conn.close()


def test_garbage_instead_of_the_handshake(
    watched: BrokerProcess, data_dir: Path, figure: Callable[[str], None]
) -> None:
    closed_after = []
    for garbage in [
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        bytes(RNG.randrange(256) for _ in range(2048)),
        struct.pack("!i", 1 << 30),
        b"",
    ]:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(str(data_dir / protocol.SOCKET_FILE))
        sock.settimeout(30)
        started = time.monotonic()
        if garbage:
            sock.sendall(garbage)
        try:
            while sock.recv(65536):
                pass
        except ConnectionResetError:
            pass
        closed_after.append(time.monotonic() - started)
        sock.close()
    served(data_dir)
    figure(
        "garbage before authentication: connection closed after "
        + ", ".join(f"{t:.2f} s" for t in closed_after)
    )
    assert max(closed_after) < 30


def _silent_flood(
    address: tuple[str, int], count: int, meanwhile: Callable[[], None] = lambda: None
) -> int:
    """Open ``count`` TCP connections that never say a word and wait (up to 120 s, calling
    ``meanwhile`` every 50 ms) until the broker has cut each off after its challenge;
    return how many it had not."""
    import selectors

    flood = [socket.create_connection(address, timeout=60) for _ in range(count)]
    try:
        with selectors.DefaultSelector() as selector:
            for sock in flood:
                selector.register(sock, selectors.EVENT_READ)
            deadline = time.monotonic() + 120
            while selector.get_map() and time.monotonic() < deadline:
                meanwhile()
                for key, _ in selector.select(timeout=0.05):
                    try:  # the manager's challenge, then the end of the connection
                        ended = key.fileobj.recv(4096) == b""  # type: ignore[union-attr]
                    except ConnectionResetError:
                        ended = True
                    if ended:
                        selector.unregister(key.fileobj)
            return len(selector.get_map())
    finally:
        for sock in flood:
            sock.close()


def _threads(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("Threads:"))


def test_a_flood_of_silent_connections_is_greeted_a_bounded_number_at_a_time(
    tmp_path: Path, figure: Callable[[str], None]
) -> None:
    """900 TCP connections that never say a word: the manager greets at most _GREETING of
    them at a time (two threads each, until its handshake timeout cuts them off), the
    rest wait (in the kernel's backlog, or retrying their SYN once it is full) and are
    greeted and cut off in their turn, and a
    real client is served once they are gone. Without the bound the manager grew by two
    threads a connection, and a larger flood left it unable to start any."""

    from spoolmq.broker.manager import _GREETING

    flooding = _GREETING + 388
    data = tmp_path / "queue_data"
    broker = BrokerProcess(data, args=["--listen", "127.0.0.1:0"])
    broker.start(timeout=90)
    try:
        address = broker.tcp_address()
        assert address is not None
        manager = broker.pid
        idle_threads = _threads(manager)
        # Every silent connection is cut off in the end (handshake_timeout_s for each
        # _GREETING of them); the manager's threads are counted meanwhile.
        counts = [idle_threads]
        left = _silent_flood(address, flooding, lambda: counts.append(_threads(manager)))
        most = max(counts)
        assert left == 0, f"{left} silent connections still open after 120 s"
        figure(
            f"{flooding} silent TCP connections: manager threads {idle_threads} idle, "
            f"{most} at most (bound: {idle_threads} + 2 x {_GREETING})"
        )
        assert most <= idle_threads + 2 * _GREETING + 16  # (a thread takes time to exit)
        assert most >= idle_threads + _GREETING, "the flood never reached the bound"
        with Publisher(
            address=address,
            authkey=(data / ".authkey").read_bytes(),
            delivery_timeout=60,
        ) as publisher:
            assert publisher.publish("after-the-flood", {"ok": True}).offset == 0
    finally:
        broker.stop()


def test_the_accept_loop_outlives_running_out_of_descriptors(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """accept() failing with EMFILE (or ENOMEM...) pauses the loop instead of ending it,
    and a connection gone before its accept (ECONNABORTED) is skipped; the loop ends only
    when its listener is closed. Failures in a row are logged once (per 10 s), not once
    per pause."""
    import errno
    import threading

    from spoolmq.broker.manager import BrokerManager, BrokerSettings

    manager = BrokerManager(BrokerSettings(data_dir=tmp_path / "queue_data"))
    refused = threading.Event()

    class Refused:
        def send_bytes(self, data: bytes) -> None:
            raise OSError("gone")

        def close(self) -> None:
            refused.set()

    class Listener:
        def __init__(self) -> None:
            self.outcomes: list[Any] = [
                OSError(errno.EMFILE, "Too many open files"),
                OSError(errno.EMFILE, "Too many open files"),
                OSError(errno.ENFILE, "Too many open files in system"),
                OSError(errno.ECONNABORTED, "Software caused connection abort"),
                Refused(),
            ]
            self.calls = 0
            self.times: list[float] = []

        def accept(self) -> Any:
            self.calls += 1
            self.times.append(time.monotonic())
            if not self.outcomes:
                refused.wait(30)  # the greeting of the last connection has ended
                raise OSError(errno.EBADF, "Bad file descriptor")  # the listener closed
            outcome = self.outcomes.pop(0)
            if isinstance(outcome, OSError):
                raise outcome
            return outcome

    listener = Listener()
    loop = threading.Thread(target=manager._accept_loop, args=(listener,))
    with caplog.at_level(logging.WARNING, logger="spoolmq.broker"):
        loop.start()
        loop.join(60)
    assert not loop.is_alive()
    assert listener.calls == 6 and refused.is_set()
    # After EMFILE the loop paused (as long as _ACCEPT_PAUSE_S) before accepting again.
    from spoolmq.broker.manager import _ACCEPT_PAUSE_S

    assert all(
        later - earlier >= _ACCEPT_PAUSE_S * 0.9
        for earlier, later in itertools.pairwise(listener.times[:4])
    )
    failures = [r.getMessage() for r in caplog.records if "accepting" in r.getMessage()]
    assert failures == [  # the second EMFILE is folded into the next line; ENFILE is new
        "accepting a connection failed (Too many open files); trying again every 0.5 s",
        "accepting a connection failed (Too many open files in system) (1 more since the "
        "last line); trying again every 0.5 s",
        "accepting connections again, after 3 failed accepts",
    ]


def test_failed_accepts_are_logged_once_per_window_with_their_count() -> None:
    from spoolmq.broker.manager import AcceptFailures

    failures = AcceptFailures(every=10.0)
    emfile = "Too many open files"
    assert failures.failed(emfile, now=100.0) == (
        "accepting a connection failed (Too many open files); trying again every 0.5 s"
    )
    assert [failures.failed(emfile, now=100.0 + t) for t in (0.5, 1.0, 9.9)] == [None] * 3
    assert failures.failed(emfile, now=110.0) == (
        "accepting a connection failed (Too many open files) (3 more since the last line); "
        "trying again every 0.5 s"
    )
    assert failures.failed(emfile, now=110.5) is None
    assert failures.accepted() == "accepting connections again, after 6 failed accepts"
    # A new episode starts afresh: its first failure is logged at once.
    assert failures.total == 0
    assert failures.failed(emfile, now=111.0) is not None


def test_out_of_descriptors_the_manager_still_cuts_silent_connections_off(
    tmp_path: Path, figure: Callable[[str], None]
) -> None:
    """The manager limited to 200 open files, 230 silent TCP connections: accept() fails
    with EMFILE, the loop pauses and goes on, and every silent connection is still cut
    off at its handshake timeout (cutting one off must not need a descriptor of its own),
    after which a client is served again."""
    import resource

    data = tmp_path / "queue_data"
    log = tmp_path / "broker.log"
    broker = BrokerProcess(data, args=["--listen", "127.0.0.1:0"], log_file=log)
    broker.start(timeout=90)
    try:
        address = broker.tcp_address()
        assert address is not None
        resource.prlimit(broker.pid, resource.RLIMIT_NOFILE, (200, 200))
        started = time.monotonic()
        left = _silent_flood(address, 230)
        assert left == 0, f"{left} of 230 silent connections still open after 120 s"
        figure(
            f"230 silent TCP connections to a manager of 200 files: all cut off in "
            f"{time.monotonic() - started:.1f} s"
        )
        served(data)
        assert "accepting a connection failed (Too many open files)" in log.read_text()
    finally:
        broker.stop()
