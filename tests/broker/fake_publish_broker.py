"""A stand-in broker for Publisher tests: it speaks the wire protocol on a Unix socket, so a
test can answer publish frames the way it needs (ranges, errors, wrong answers, late ones)."""

from __future__ import annotations

from collections.abc import Callable
from multiprocessing.connection import Listener
from typing import Any

from spoolmq import protocol


def serve_one_publisher(
    listener: Listener, answer: Callable[[dict[str, Any]], dict[str, Any] | None]
) -> None:
    """Welcome one publisher and send ``answer(frame)`` for each publish frame (nothing
    when it returns None), until the publisher goes, whether it goes between frames or
    before an answer is sent."""
    with listener.accept() as conn:
        assert protocol.receive(conn)["op"] == "hello"
        protocol.send(conn, {"op": "welcome", "client_id": "fake"})
        while True:
            try:
                frame = protocol.receive(conn)
            except (EOFError, OSError):
                return
            if frame.get("op") != "publish":
                continue
            reply = answer(frame)
            if reply is None:
                continue
            try:
                protocol.send(conn, reply)
            except OSError:  # BrokenPipeError: the publisher left before the answer
                return
