"""glibc's heap, tuned for a process that moves many small messages.

With glibc's default trim threshold, memory freed after each batch is handed back to the
kernel and faulted in again for the next one: the broker spent most of its CPU in those
page faults before its children called :func:`tune_allocator` (DESIGN.md, "What
measurements say"). Client processes gain too: in ``spoolmq bench`` (100,000 messages, 2
publishers and 2 consumers, three alternating pairs of runs) the publishers' CPU per
message went from 10.2-11.4 to 9.3-10.1 µs and the consumers' from 7.2-9.2 to 6.6-8.3 µs.

The broker's children and ``spoolmq worker`` call it; an application that publishes or
consumes at high rates may call ``spoolmq.tune_allocator()`` at its start. It changes the
whole process's allocator, which is why the client library does not call it on its own.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def libc() -> ctypes.CDLL | None:
    """The C library, or None where it cannot be loaded."""
    name = ctypes.util.find_library("c")
    if name is None:  # pragma: no cover - every Linux has a libc
        return None
    try:
        return ctypes.CDLL(name, use_errno=True)
    except OSError:  # pragma: no cover
        return None


def tune_allocator() -> bool:
    """Keep up to 64 MiB of freed heap instead of trimming it after every batch, and serve
    allocations up to 4 MiB from the heap (frames and batches are below that). Returns
    whether glibc's ``mallopt`` was there to call (not on musl or macOS)."""
    c = libc()
    if c is None or not hasattr(c, "mallopt"):
        return False
    c.mallopt(_M_TRIM_THRESHOLD, 64 * 1024 * 1024)
    c.mallopt(_M_MMAP_THRESHOLD, 4 * 1024 * 1024)
    return True
