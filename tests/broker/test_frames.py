"""FrameReader and FrameWriter: the broker's non-blocking halves of the
``multiprocessing.connection`` framing, checked against the blocking originals."""

from __future__ import annotations

import random
import select
import threading
from multiprocessing import Pipe

import pytest

from spoolmq import protocol


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
