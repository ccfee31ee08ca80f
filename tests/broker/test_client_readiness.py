"""Readiness: the clients' wait for their connection or their wake-up descriptor, one
``poll`` object kept for the client's life instead of a selector built per wait."""

from __future__ import annotations

import os
import time
from multiprocessing import Pipe

from spoolmq.client.connection import Readiness


def test_it_tells_the_connection_from_the_wake_up_and_times_out() -> None:
    wake_read, wake_write = os.pipe()
    ours, theirs = Pipe()
    readiness = Readiness(wake_read)
    try:
        started = time.monotonic()
        assert readiness.wait(ours, 0.05) == (False, False)
        assert time.monotonic() - started >= 0.045  # waited, did not come back early
        assert readiness.wait(ours, 0) == (False, False)

        theirs.send_bytes(b"frame")
        assert readiness.wait(ours, 10) == (True, False)
        assert ours.recv_bytes() == b"frame"
        assert readiness.wait(ours, 0) == (False, False)

        os.write(wake_write, b"x")
        assert readiness.wait(ours, 10) == (False, True)
        os.read(wake_read, 16)

        theirs.close()  # a hang-up reads as ready: the read then raises EOFError
        assert readiness.wait(ours, 10) == (True, False)
    finally:
        ours.close()
        os.close(wake_read)
        os.close(wake_write)


def test_a_new_connection_is_watched_instead_of_the_old_one() -> None:
    wake_read, wake_write = os.pipe()
    readiness = Readiness(wake_read)
    old, old_peer = Pipe()
    new, new_peer = Pipe()
    try:
        assert readiness.wait(old, 0) == (False, False)
        old_peer.send_bytes(b"stale")  # the old connection is no longer the one asked about
        new_peer.send_bytes(b"fresh")
        assert readiness.wait(new, 10) == (True, False)
        assert new.recv_bytes() == b"fresh"
        assert readiness.wait(new, 0) == (False, False)  # the old one's data is not reported
    finally:
        for end in (old, old_peer, new, new_peer):
            end.close()
        os.close(wake_read)
        os.close(wake_write)
