"""What every broker child process does first, and the control channel from the manager."""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import selectors
import signal
import socket
import time
from collections.abc import Iterable, Mapping
from multiprocessing.connection import Connection
from multiprocessing.reduction import recvfds, sendfds
from typing import Any

from spoolmq import protocol

# What ``multiprocessing.connection.wait`` uses: cheap to build for one call.
_Selector = getattr(selectors, "PollSelector", selectors.SelectSelector)

_PR_SET_PDEATHSIG = 1
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - every Linux has a libc
        return None
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:  # pragma: no cover
        return None


def tune_allocator() -> None:
    """Keep glibc from handing freed heap back to the OS after every batch.

    With the default trim threshold, the broker spent most of its CPU in the kernel
    faulting pages back in (DESIGN.md, "What measurements say"); 64 MiB keeps them.
    """
    libc = _libc()
    if libc is not None and hasattr(libc, "mallopt"):
        libc.mallopt(_M_TRIM_THRESHOLD, 64 * 1024 * 1024)
        libc.mallopt(_M_MMAP_THRESHOLD, 4 * 1024 * 1024)


def die_with_parent() -> None:
    """Ask the kernel to SIGKILL this process if the manager dies (Linux only)."""
    libc = _libc()
    if libc is not None and hasattr(libc, "prctl"):
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def child_setup(name: str, log_level: str) -> None:
    """Signals: Ctrl-C in a terminal reaches the whole process group; only the manager
    acts on it and tells the children to stop."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    die_with_parent()
    tune_allocator()
    logging.basicConfig(
        level=log_level.upper(),
        format=f"%(asctime)s {name}[%(process)d] %(levelname)s %(name)s: %(message)s",
    )


def send_control(conn: Connection, frame: dict[str, Any], fd: int | None = None) -> None:
    """A control frame, optionally followed by a file descriptor (SCM_RIGHTS)."""
    protocol.send(conn, frame)
    if fd is not None:
        with socket.socket(fileno=os.dup(conn.fileno())) as sock:
            sendfds(sock, [fd])


def receive_fd(conn: Connection) -> int:
    with socket.socket(fileno=os.dup(conn.fileno())) as sock:
        return recvfds(sock, 1)[0]


def wait_io(
    readers: Iterable[Any], writers: Iterable[Any], timeout: float | None
) -> tuple[list[Any], list[Any]]:
    """``multiprocessing.connection.wait`` that also waits for sockets to become writable:
    the objects of ``readers`` that can be read and of ``writers`` that can be written."""
    wanted: dict[Any, int] = {obj: selectors.EVENT_READ for obj in readers}
    for obj in writers:
        wanted[obj] = wanted.get(obj, 0) | selectors.EVENT_WRITE
    with _Selector() as selector:
        for obj, events in wanted.items():
            selector.register(obj, events)
        ready = selector.select(timeout)
    readable = [key.fileobj for key, events in ready if events & selectors.EVENT_READ]
    writable = [key.fileobj for key, events in ready if events & selectors.EVENT_WRITE]
    return readable, writable


def flush_before_close(writers: dict[Any, protocol.FrameWriter], timeout: float) -> None:
    """On stop: give frames still queued for slow readers (replies, ``closing``) up to
    ``timeout`` seconds to go out. ``writers`` maps each connection to its writer."""
    deadline = time.monotonic() + timeout
    waiting = {conn: writer for conn, writer in writers.items() if writer.waiting}
    while waiting and (left := deadline - time.monotonic()) > 0:
        _, writable = wait_io((), waiting, left)
        for conn in writable:
            try:
                waiting[conn].flush()
            except OSError:
                waiting[conn].close()  # gone: nothing more to give it
            if not waiting[conn].waiting:
                del waiting[conn]


def wait_for_clients(
    others: list[Any], writers: Mapping[Any, protocol.FrameWriter], timeout: float | None
) -> tuple[list[Any], list[Any]]:
    """One wait of a broker loop: until one of ``others`` or a client connection (the keys
    of ``writers``) can be read, or a client with frames queued can take more, which are
    written. Returns what can be read, and the clients found gone while writing to them."""
    blocked = [conn for conn, writer in writers.items() if writer.waiting]
    ready, writable = wait_io([*others, *writers], blocked, timeout)
    gone = []
    for conn in writable:
        try:
            writers[conn].flush()
        except OSError:
            gone.append(conn)
    return ready, gone
