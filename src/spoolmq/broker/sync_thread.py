"""The PublisherBroker's disk syncs, off its loop: while one group commit waits for
``fdatasync``, the loop reads, checks and writes the next. (When there is no next to read
and nothing else syncs, the loop syncs the one file itself, :meth:`SyncThread.sync_here`.)

The loop writes a commit's batches (``write`` only) and hands the sync thread one job: a
duplicate file descriptor per segment file it wrote to. The thread takes every job queued
when it is free and syncs each file they name once (the files of several partitions in
parallel, so one fsync per partition does not make many partitions slow), then reports each
job done, with the error of the first of its files that failed, through a queue and one byte
on a pipe the loop waits on. The loop handles the results in commit order
(:meth:`SyncThread.results`).

A duplicate descriptor shares the writer's open file description, so a sync here covers
every byte written before it, and the writer may close or roll its own descriptor
meanwhile. It also shares the file's error state: an fsync error is reported to one caller
only, which is why the PublisherBroker fails every unsynced commit on a file once any
fsync of it (here or a roll's) has failed.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from queue import Empty, SimpleQueue
from typing import Any

from spoolmq.broker.metrics import SECONDS_BOUNDS, Buckets

# How many files are synced at once at most.
_PARALLEL = 8

SyncKey = tuple[str, int, int]  # (topic, partition, segment base): one segment file


class SyncThread:
    """Syncs the files of submitted jobs in a thread; see the module docstring."""

    def __init__(self, sync: Callable[[int], None] = os.fdatasync) -> None:
        self._sync = sync  # os.fdatasync; tests pass a failing one
        self._jobs: deque[tuple[int, dict[SyncKey, int]]] = deque()
        self._cond = threading.Condition()
        self._stopping = False
        self._done: SimpleQueue[tuple[int, OSError | None]] = SimpleQueue()
        self._outstanding = 0  # jobs submitted and not yet returned by results()
        self._ready, self._signal = os.pipe()
        os.set_blocking(self._ready, False)
        self._pool: ThreadPoolExecutor | None = None
        # Seconds per round of syncs, for the metrics (written by the thread only).
        self.fsync_seconds = Buckets(SECONDS_BOUNDS)
        self._thread = threading.Thread(target=self._run, name="spoolmq-sync", daemon=True)
        self._thread.start()

    def fileno(self) -> int:
        """Readable when results are waiting (for the loop's wait)."""
        return self._ready

    def submit(self, job: int, files: Mapping[SyncKey, int]) -> None:
        """Sync ``files`` (descriptors the thread closes once synced) as job ``job``."""
        with self._cond:
            self._jobs.append((job, dict(files)))
            self._cond.notify()
        self._outstanding += 1

    def sync_here(self, fd: int) -> OSError | None:
        """Sync one file in the caller's thread (the loop's, while this thread has no job:
        nothing else writes the metrics then); the error, or None. Closes ``fd``."""
        started = time.monotonic()
        try:
            return self._sync_one(fd)
        finally:
            self.fsync_seconds.observe(time.monotonic() - started)
            with contextlib.suppress(OSError):
                os.close(fd)

    def results(self) -> list[tuple[int, OSError | None]]:
        """The jobs finished since the last call, with their error (None: synced).

        With no job outstanding there is nothing to look for (the loop asks after every
        commit, and most at a low rate were synced in the loop): no system call then."""
        if not self._outstanding:
            return []
        with contextlib.suppress(BlockingIOError):
            os.read(self._ready, 4096)
        done = []
        while True:
            try:
                done.append(self._done.get_nowait())
            except Empty:
                self._outstanding -= len(done)
                return done

    def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a result; True if one is waiting."""
        readable, _, _ = select.select([self._ready], [], [], timeout)
        return bool(readable)

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(30)
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        for fd in (self._ready, self._signal):
            with contextlib.suppress(OSError):
                os.close(fd)

    # -- the thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._jobs and not self._stopping:
                    self._cond.wait()
                if not self._jobs:
                    return
                jobs = list(self._jobs)
                self._jobs.clear()
            files: dict[SyncKey, int] = {}
            for _, job_files in jobs:
                files.update(job_files)  # one descriptor per file is enough
            started = time.monotonic()
            errors = self._sync_all(files)
            self.fsync_seconds.observe(time.monotonic() - started)
            for _, job_files in jobs:
                for fd in job_files.values():
                    with contextlib.suppress(OSError):
                        os.close(fd)
            for job, job_files in jobs:
                error = next((errors[k] for k in job_files if errors.get(k) is not None), None)
                self._done.put((job, error))
            with contextlib.suppress(OSError):
                os.write(self._signal, b"s")

    def _sync_all(self, files: dict[SyncKey, int]) -> dict[SyncKey, OSError | None]:
        if len(files) == 1:
            [(key, fd)] = files.items()
            return {key: self._sync_one(fd)}
        if self._pool is None:
            self._pool = ThreadPoolExecutor(_PARALLEL, thread_name_prefix="spoolmq-fsync")
        futures = {key: self._pool.submit(self._sync_one, fd) for key, fd in files.items()}
        return {key: future.result() for key, future in futures.items()}

    def _sync_one(self, fd: int) -> OSError | None:
        try:
            self._sync(fd)
        except OSError as exc:
            return exc
        return None


def describe(error: Any) -> str:
    """An OSError's text for an answer."""
    return str(getattr(error, "strerror", None) or error)
