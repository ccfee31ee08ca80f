"""File helpers every layer uses: private modes, durable directory entries, whole writes.

Every file spoolmq creates is private (0600, directories 0700). A file that replaces
another is written with :func:`write_durably` (write, fsync, rename, fsync the directory),
so a crash leaves either the old contents or the new, never a mix or nothing.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import stat
import time
from collections.abc import Iterable
from pathlib import Path

from spoolmq.errors import ConfigError, StorageError, UnsafePermissionsError

FILE_MODE = 0o600
DIR_MODE = 0o700
_READ_CHUNK = 16 << 20

logger = logging.getLogger("spoolmq.files")


def fsync_dir(path: Path) -> None:
    """Make a created, renamed or deleted entry in ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def make_private_dirs(path: Path) -> None:
    """Create ``path`` and missing parents with mode 0700.

    Each new directory's entry is fsynced in its parent: a segment fsynced with ACK
    ``all`` is only durable if the directories leading to it are.
    """
    if path.is_dir():
        return
    make_private_dirs(path.parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        return
    os.chmod(path, DIR_MODE)  # the umask may have narrowed it further; never widened
    fsync_dir(path.parent)


def check_data_dir(path: Path) -> None:
    """Create the data directory 0700 (or make ours 0700), or refuse one that other users
    can write to (or that cannot be one: a file, a path through a file, no permission)."""
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(f"the data directory {path} is a file, not a directory")
        make_private_dirs(path)
    except OSError as exc:
        raise ConfigError(
            f"cannot create the data directory {path}: {exc.strerror or exc}"
        ) from None
    status = path.stat()
    mode = status.st_mode
    if mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafePermissionsError(
            f"{path} can be written by other users (mode {stat.filemode(mode)}); "
            f"run `chmod 700 {path}` so that nobody else can alter the queue"
        )
    if mode & 0o077 and status.st_uid == os.geteuid():
        # Readable by others, as a directory made with the usual umask (022) is (the
        # repository's queue_data/ among them): the files in it are 0600 already, and
        # the directory becomes 0700 as documented.
        os.chmod(path, 0o700)
        logger.info("made %s private (mode %s -> drwx------)", path, stat.filemode(mode))


def start_next_dir(root: Path) -> Path:
    """A new, empty ``<root>.next`` (0700) in which to build what will replace the directory
    ``root`` whole (:func:`swap_in`), once what a stopped swap left (``.next``, ``.old``)
    is removed."""
    following = root.with_name(root.name + ".next")
    for leftover in (following, root.with_name(root.name + ".old")):
        shutil.rmtree(leftover, ignore_errors=True)
    make_private_dirs(following)
    return following


def swap_in(following: Path, root: Path) -> None:
    """Put ``following`` (from :func:`start_next_dir`) in place of ``root``: a reader finds
    the old directory or the new one, whole, or (after a crash between the two renames)
    none, which is right for what is kept this way: caches, computed again when absent."""
    old = root.with_name(root.name + ".old")
    if root.exists():
        os.replace(root, old)
    os.replace(following, root)
    shutil.rmtree(old, ignore_errors=True)


def pread_all(fd: int, length: int, position: int) -> bytes:
    """Up to ``length`` bytes at ``position`` (fewer only at the end of the file)."""
    chunks = []
    while length > 0:
        chunk = os.pread(fd, min(length, _READ_CHUNK), position)
        if not chunk:
            break
        chunks.append(chunk)
        length -= len(chunk)
        position += len(chunk)
    return b"".join(chunks)


def write_all(fd: int, data: bytes) -> None:
    """``os.write`` until all of ``data`` is written (a write may take only part)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def write_new_file(path: Path, data: bytes, *, exclusive: bool = False) -> None:
    """Write ``path`` (mode 0600) and fsync it; the caller fsyncs the directory."""
    flags = os.O_CREAT | os.O_WRONLY | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = os.open(path, flags, FILE_MODE)
    try:
        write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def write_durably(files: Iterable[tuple[Path, bytes]]) -> None:
    """Replace each ``(path, data)`` atomically: write a temporary file beside it, fsync it,
    rename it over ``path``, then fsync each directory once. Several files are renamed in
    the order given, after all of them are written."""
    staged = []
    for path, data in files:
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # unique per writer
        write_new_file(tmp, data)
        staged.append((tmp, path))
    for tmp, path in staged:
        os.replace(tmp, path)
    for directory in {path.parent for _, path in staged}:
        fsync_dir(directory)


def open_sqlite(path: Path, busy_timeout_ms: int) -> sqlite3.Connection:
    """A connection to the SQLite database ``path`` as spoolmq keeps them (``state.db``,
    ``tasks.db``): the file created 0600 first (SQLite would use the umask; its ``-wal`` and
    ``-shm`` files take the database's mode), autocommit (callers write in their own
    ``BEGIN IMMEDIATE``), usable by every thread of the opening process, with a busy timeout,
    WAL and ``synchronous = NORMAL`` (a commit survives a process crash).

    Switching a new database to WAL needs an exclusive lock, and SQLite answers "database is
    locked" at once, without its busy wait, while another process holds the file (two
    processes opening a new database together): that is retried until the busy timeout, so
    it never reaches a user. Any other failure is a StorageError.
    """
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_RDWR, FILE_MODE))
    connection = sqlite3.connect(
        path, timeout=busy_timeout_ms / 1000, isolation_level=None, check_same_thread=False
    )
    try:
        connection.execute(f"PRAGMA busy_timeout = {int(busy_timeout_ms)}")
        deadline = time.monotonic() + busy_timeout_ms / 1000
        while True:
            try:
                connection.execute("PRAGMA journal_mode = WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() >= deadline:
                    raise StorageError(f"cannot open {path} in WAL mode: {exc}") from None
            time.sleep(0.005)  # the lock holder sends no wake-up; SQLite's own wait polls too
        connection.execute("PRAGMA synchronous = NORMAL")
    except BaseException:
        connection.close()
        raise
    return connection


def chmod_sqlite_side_files(path: Path) -> None:
    """Make the ``-wal``/``-shm`` files of database ``path`` private, where they exist."""
    for suffix in ("-wal", "-shm"):
        side = Path(str(path) + suffix)
        if side.exists():
            os.chmod(side, FILE_MODE)
