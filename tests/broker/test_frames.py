"""Frames: FrameReader and FrameWriter (the broker's non-blocking halves of the
``multiprocessing.connection`` framing, checked against the blocking originals), and how a
client tells a delivery from any other frame."""

from __future__ import annotations

import contextlib
import os
import random
import select
import threading
from multiprocessing import Pipe
from multiprocessing.connection import Listener
from pathlib import Path

import orjson
import pytest

from spoolmq import Consumer, protocol
from spoolmq.errors import ProtocolError
from spoolmq.store.record import frame_record


def test_frames_written_without_blocking_arrive_whole_and_in_order() -> None:
    broker_end, client_end = Pipe()
    writer = protocol.FrameWriter(broker_end)
    rng = random.Random(7)
    frames = [
        rng.randbytes(rng.choice([0, 1, 3, 4, 5, 1000, 70_000, 3_000_000])) for _ in range(40)
    ]
    received: list[bytes] = []
    reader = threading.Thread(
        target=lambda: received.extend(client_end.recv_bytes() for _ in frames)
    )
    for frame in frames:  # far more than a socket buffer holds, and nobody reads yet
        writer.send(frame)
    assert writer.waiting > 1_000_000  # queued, not blocked on
    reader.start()
    while writer.waiting:
        select.select([], [broker_end], [], 10)
        writer.flush()
    reader.join(30)
    assert received == frames
    writer.close()


def test_what_the_client_sends_is_read_back_frame_by_frame() -> None:
    broker_end, client_end = Pipe()
    reader = protocol.FrameReader(broker_end)
    assert reader.next_frame() is None  # nothing yet: no waiting
    frames = [b"", b"a", b"{}" * 40_000, b"x" * 5]
    for frame in frames:
        client_end.send_bytes(frame)
    got = []
    while len(got) < len(frames):
        frame = reader.next_frame()
        if frame is not None:
            got.append(frame)
    assert got == frames
    client_end.close()
    with pytest.raises(EOFError):
        reader.next_frame()
    reader.close()


def _all_frames(reader: protocol.PipeFrames, count: int) -> list[bytes]:
    got: list[bytes] = []
    for _ in range(10_000):  # bounded: each round waits up to 10 s for the pipe
        if len(got) >= count:
            break
        select.select([reader], [], [], 10)
        got.extend(reader.read())
    return got


def test_notices_on_a_pipe_are_read_whole_however_the_bytes_arrive() -> None:
    """PipeFrames splits what ``send_bytes`` wrote, whether a read holds many frames, part
    of one (a body larger than its chunk, or a header cut in two) or a long-size header."""
    read_end, write_end = Pipe(duplex=False)
    reader = protocol.PipeFrames(read_end)
    assert reader.read() == []  # nothing yet: no waiting
    rng = random.Random(3)
    frames = [rng.randbytes(rng.choice([0, 1, 4, 100, 3000])) for _ in range(500)]
    big = rng.randbytes(300_000)  # larger than a chunk: arrives over several reads
    frames.insert(250, big)
    # More than a pipe holds: the writer blocks until the reader has taken some.
    sender = threading.Thread(target=lambda: [write_end.send_bytes(f) for f in frames])
    sender.start()
    assert _all_frames(reader, len(frames)) == frames
    sender.join(30)

    # A header cut in two, then the long form (-1 and an 8-byte size) by hand.
    fd = write_end.fileno()
    os.write(fd, (5).to_bytes(4, "big")[:2])
    assert reader.read() == []
    os.write(fd, (5).to_bytes(4, "big")[2:] + b"hello")
    os.write(fd, b"\xff\xff\xff\xff" + (3).to_bytes(8, "big") + b"abc")
    assert _all_frames(reader, 2) == [b"hello", b"abc"]
    assert not reader.ended
    write_end.close()
    select.select([reader], [], [], 10)
    assert reader.read() == []
    assert reader.ended
    assert reader.error is None  # closed, not broken
    reader.close()


def test_a_bad_size_on_the_notice_pipe_ends_it_and_says_why() -> None:
    read_end, write_end = Pipe(duplex=False)
    reader = protocol.PipeFrames(read_end, max_bytes=1000)
    write_end.send_bytes(b"ok")
    os.write(write_end.fileno(), (5000).to_bytes(4, "big") + b"x" * 10)
    select.select([reader], [], [], 10)
    assert reader.read() == [b"ok"]  # what came before it
    assert reader.ended
    assert "bad message length: 5000" in str(reader.error)
    write_end.send_bytes(b"later")  # no frame boundary can be trusted any more
    assert reader.read() == []
    reader.close()
    write_end.close()


def test_a_client_that_leaves_too_much_unread_is_reported() -> None:
    broker_end, _client_end = Pipe()
    writer = protocol.FrameWriter(broker_end, limit=1_000_000)
    writer.send(b"x" * 500_000)  # under the limit: queued
    with pytest.raises(OSError, match="unread"):
        writer.send(b"y" * 2_000_000)
    writer.close()


def test_a_client_that_has_gone_is_reported() -> None:
    broker_end, client_end = Pipe()
    writer = protocol.FrameWriter(broker_end)
    client_end.close()
    with pytest.raises(BrokenPipeError):
        writer.send(b"hello")
    writer.close()


def test_a_frame_is_told_by_its_op_whatever_the_key_order() -> None:
    line = frame_record(5, 1_000, b'"key":"k","value":1,"headers":[]')
    delivery = orjson.dumps({"r": [["t", 0, 5, 1, 1, 9]], "op": "deliver"}) + b"\n" + line
    assert protocol.split_frame(delivery) == (
        {"r": [["t", 0, 5, 1, 1, 9]], "op": "deliver"},
        [line],
    )
    answer = orjson.dumps({"id": 3, "op": "ack_result", "refused": []})
    assert protocol.split_frame(answer) == ({"id": 3, "op": "ack_result", "refused": []}, [])
    with pytest.raises(ProtocolError, match="lines after its header"):
        protocol.split_frame(answer + b"\n" + line)


def broker_with_its_keys_in_another_order(listener: Listener, line: bytes) -> None:
    """Welcome one consumer, subscribe it, push one delivery whose header starts with "r"."""
    with listener.accept() as conn:
        assert protocol.receive(conn)["op"] == "hello"
        protocol.send(conn, {"client_id": "fake", "op": "welcome"})
        subscribe = protocol.receive(conn)
        protocol.send(conn, {"id": subscribe["id"], "consumer_id": "c#1", "op": "subscribed"})
        conn.send_bytes(
            protocol.encode_delivery({"r": [["t", 0, 5, 1, 1, 9]], "op": "deliver"}, [line])
        )
        with contextlib.suppress(EOFError, OSError):
            while True:
                conn.recv_bytes()


def test_the_consumer_takes_a_delivery_whatever_the_key_order(tmp_path: Path) -> None:
    line = frame_record(5, 1_000, b'"key":"k","value":{"n":1},"headers":[]')
    address, key = str(tmp_path / "fake.sock"), b"k" * 32
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        server = threading.Thread(
            target=broker_with_its_keys_in_another_order, args=(listener, line), daemon=True
        )
        server.start()
        with Consumer("t", "g", address=address, authkey=key, auto_ack=True) as consumer:
            message = consumer.receive(timeout=30)
        server.join(30)
    assert message is not None
    assert (message.topic, message.partition, message.tag, message.attempt) == ("t", 0, 9, 1)
    assert (message.offset, message.key, message.value) == (5, "k", {"n": 1})
