"""The publisher client against a broker that answers wrongly (a stand-in speaking the wire
protocol on a Unix socket): it is never told "stored" for a message the answer left out."""

from __future__ import annotations

import threading
from multiprocessing.connection import Listener
from pathlib import Path

import pytest
from fake_publish_broker import serve_one_publisher

from spoolmq import Publisher
from spoolmq.errors import ProtocolError


def short_answering_broker(listener: Listener) -> None:
    """Welcome one publisher, then answer each publish frame for its first message only."""
    # One range of one message: partition 0, offset 0, timestamp 1, count 1.
    serve_one_publisher(
        listener, lambda frame: {"op": "published", "id": frame["id"], "r": [[0, 0, 1, 1]]}
    )


def test_messages_a_reply_leaves_out_fail_instead_of_waiting(tmp_path: Path) -> None:
    address, key = str(tmp_path / "fake.sock"), b"k" * 32
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        server = threading.Thread(target=short_answering_broker, args=(listener,), daemon=True)
        server.start()
        with Publisher(address=address, authkey=key, linger_ms=50) as publisher:
            futures = [publisher.publish_async("t", n) for n in range(3)]
            assert futures[0].result(timeout=10).offset == 0
            for future in futures[1:]:
                with pytest.raises(ProtocolError, match="answered 1 of the 3 messages"):
                    future.result(timeout=10)
        server.join(10)
