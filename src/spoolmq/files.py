"""File helpers every layer uses: private modes, durable directory entries, whole writes.

Every file spoolmq creates is private (0600, directories 0700). A file that replaces
another is written with :func:`write_durably` (write, fsync, rename, fsync the directory),
so a crash leaves either the old contents or the new, never a mix or nothing.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

FILE_MODE = 0o600
DIR_MODE = 0o700
_READ_CHUNK = 16 << 20


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
