"""Linux inotify through libc (no dependency): be told when a directory's files change.

What waits for a partition to grow uses it instead of a sleeping poll: `spoolmq read
--follow` (a blocking wait on the descriptor) and the Kafka front's long-polling Fetch (the
descriptor in the event loop). Every appender writes the segment files, so a watch on the
partition directory sees every write: IN_MODIFY (bytes appended), IN_CREATE (a new
segment), IN_MOVED_TO (a file renamed into place by compaction or an atomic write).

:func:`open_inotify` returns None where inotify does not exist (not Linux, a libc without
it, no descriptors left): the caller falls back to a short poll.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import os
import struct

IN_MODIFY = 0x00000002
IN_OPEN = 0x00000020
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
#: A partition directory's files grew or appeared.
GROWTH = IN_MODIFY | IN_CREATE | IN_MOVED_TO

_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC
_EVENT = struct.Struct("iIII")  # wd, mask, cookie, length of the name that follows


@functools.cache
def _libc() -> ctypes.CDLL | None:
    """The C library, looked up once per process (``find_library`` runs ``ldconfig``:
    milliseconds, too slow for each wait of ``Tasks.result``)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        lib = ctypes.CDLL(name, use_errno=True)
    except OSError:
        return None
    return lib if hasattr(lib, "inotify_init1") else None


class Inotify:
    """One non-blocking inotify descriptor (``fd``: for ``select``, a selector or an event
    loop's ``add_reader``) and its watches."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self.fd = fd

    def watch(self, path: str | os.PathLike[str], mask: int = GROWTH) -> int:
        """Watch ``path`` for ``mask``; its watch descriptor, or -1 if it cannot be watched
        (not there yet, out of watches): the caller's own time bound still ends its wait."""
        return int(self._libc.inotify_add_watch(self.fd, os.fsencode(path), mask))

    def read(self) -> list[int]:
        """The watch descriptors of the events waiting (one per event; none: empty)."""
        try:
            data = os.read(self.fd, 64 * 1024)
        except BlockingIOError:
            return []
        watches: list[int] = []
        position = 0
        while position + _EVENT.size <= len(data):
            wd, _mask, _cookie, length = _EVENT.unpack_from(data, position)
            position += _EVENT.size + length
            watches.append(wd)
        return watches

    def drain(self) -> None:
        """Forget every event waiting: the caller re-reads what it watches anyway."""
        while self.read():
            pass

    def close(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1


def open_inotify() -> Inotify | None:
    """A new :class:`Inotify`, or None where inotify is not available."""
    libc = _libc()
    if libc is None:
        return None
    fd = libc.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
    return Inotify(libc, fd) if fd >= 0 else None
