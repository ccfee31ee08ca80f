"""Wake long-polling Fetch requests when a partition's files grow (inotify, no polling).

A Fetch with ``max_wait_ms`` and ``min_bytes`` waits until enough is there. What
wakes it is the kernel telling us a segment file in the partition's directory
was written (IN_MODIFY) or a new segment created (IN_CREATE): every appender
(the PublisherBroker for native and Kafka producers alike, an embedded
``Store``) writes those files, so one mechanism covers them all, and nothing
sleeps and re-reads. Where inotify does not exist (not Linux), :class:`GrowthWatcher`
falls back to waking waiters every ``fallback_s``.

Use: ``fut = watcher.arm(dirs)``, read the store, and only if there was not
enough ``await watcher.wait(fut, timeout)``: arming first means an append that
lands between the read and the wait still wakes us.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path

from spoolmq.inotify import Inotify, open_inotify

log = logging.getLogger(__name__)


class GrowthWatcher:
    """inotify watches on partition directories, shared by every Fetch of the child."""

    def __init__(self, fallback_s: float = 0.2) -> None:
        self._inotify: Inotify | None = None
        self._wd_by_dir: dict[str, int] = {}
        self._dir_by_wd: dict[int, str] = {}
        self._waiters: dict[str, set[asyncio.Future[None]]] = {}
        self._fallback_s = fallback_s
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._inotify = open_inotify()
        if self._inotify is not None:
            self._loop.add_reader(self._inotify.fd, self._on_events)
            return
        log.warning("kafka: inotify unavailable; long polls wake every %.1fs", self._fallback_s)

    @property
    def uses_inotify(self) -> bool:
        return self._inotify is not None

    def _watch(self, directory: str) -> None:
        if self._inotify is None or directory in self._wd_by_dir:
            return
        wd = self._inotify.watch(directory)
        if wd < 0:
            return  # not there yet: the caller's wait bound still ends the poll
        self._wd_by_dir[directory] = wd
        self._dir_by_wd[wd] = directory

    def arm(self, directories: list[Path]) -> asyncio.Future[None]:
        """A future set as soon as any of ``directories`` sees a write."""
        loop = self._loop or asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        for d in directories:
            key = str(d)
            self._watch(key)
            self._waiters.setdefault(key, set()).add(future)
        return future

    async def wait(self, future: asyncio.Future[None], timeout: float) -> bool:
        """Wait for an armed future up to ``timeout`` seconds; True if woken by a write."""
        if self._inotify is None:
            timeout = min(timeout, self._fallback_s)
        try:
            await asyncio.wait_for(asyncio.shield(future), max(timeout, 0.0))
            return True
        except TimeoutError:
            return False
        finally:
            self.disarm(future)

    def disarm(self, future: asyncio.Future[None]) -> None:
        for key in [k for k, s in self._waiters.items() if future in s]:
            waiters = self._waiters[key]
            waiters.discard(future)
            if not waiters:
                del self._waiters[key]
        if not future.done():
            future.cancel()

    def _on_events(self) -> None:
        if self._inotify is None:
            return
        woken: set[str] = set()
        for wd in self._inotify.read():
            directory = self._dir_by_wd.get(wd)
            if directory is not None:
                woken.add(directory)
        for directory in woken:
            for future in self._waiters.pop(directory, set()):
                if not future.done():
                    future.set_result(None)

    def close(self) -> None:
        if self._inotify is not None:
            if self._loop is not None:
                with contextlib.suppress(Exception):
                    self._loop.remove_reader(self._inotify.fd)
            self._inotify.close()
            self._inotify = None
