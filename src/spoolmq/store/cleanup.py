"""The file work of a topic's ``cleanup_policy``: deleting closed segments (retention,
``delete``) and rewriting one with the records compaction keeps (``compact``).

Which segments and records go is decided by the pure functions in
:mod:`spoolmq.store.retention` and :mod:`spoolmq.store.compaction`; :class:`PartitionLog`
calls these under the partition's writer lock. The active segment is never touched.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from spoolmq.errors import CorruptRecordError
from spoolmq.files import fsync_dir, pread_all, write_durably
from spoolmq.store.compaction import KeyedEntry
from spoolmq.store.record import as_single_record, check_line, key_identity
from spoolmq.store.segment import SegmentFiles, SparseIndex, scan_batches


def delete_segments(files: SegmentFiles, bases: Sequence[int]) -> None:
    """Delete closed segments and their indexes (ValueError, and nothing deleted, if one
    of ``bases`` is the active segment)."""
    active = files.bases()[-1]
    if any(base >= active for base in bases):
        raise ValueError("the active segment is never deleted")
    for base in bases:
        files.segment_path(base).unlink(missing_ok=True)
        files.index_path(base).unlink(missing_ok=True)
    fsync_dir(files.directory)


def rewrite_segment(
    files: SegmentFiles, base: int, lines: Sequence[bytes], *, index_interval_bytes: int
) -> SparseIndex:
    """Atomically replace a closed segment's records with ``lines`` (each one record, in
    offset order) and its index with a new one, which is returned."""
    if base >= files.bases()[-1]:
        raise ValueError("the active segment is never rewritten")
    # A batch's first line says how many lines follow; compaction may have removed them.
    lines = [as_single_record(line) for line in lines]
    index = SparseIndex()
    position = 0
    for line in lines:
        if index.wants_entry(position, index_interval_bytes):
            fields = check_line(line)
            index.add(fields["offset"], position, fields["timestamp"])
        position += len(line)
    write_durably(
        [
            (files.segment_path(base), b"".join(lines)),
            (files.index_path(base), index.encode_from(0)),
        ]
    )
    return index


def keyed_entries(
    files: SegmentFiles, base: int, *, closed: bool
) -> list[tuple[KeyedEntry, bytes]]:
    """Every whole record of a segment with its stored line, for compaction. A closed
    segment must be whole: compacting past damage would delete the records after it in
    silence."""
    path = str(files.segment_path(base))
    fd = os.open(path, os.O_RDONLY)
    try:
        data = pread_all(fd, os.fstat(fd).st_size, 0)
        scan = scan_batches(fd, path, 0, None, keep_records=True)
    finally:
        os.close(fd)
    if closed and scan.bad_position >= 0:
        raise CorruptRecordError(
            f"{path} is damaged at byte {scan.bad_position} ({scan.problem}); not compacted. "
            "Run `spoolmq check`.",
            path=path,
            position=scan.bad_position,
        )
    lines = [line + b"\n" for line in data[: scan.end].split(b"\n")[:-1]]
    entries = []
    for fields, line in zip(scan.records, lines, strict=True):
        key = key_identity(fields)
        tombstone = "value_b64" not in fields and fields.get("value") is None
        entries.append((KeyedEntry(fields["offset"], fields["timestamp"], key, tombstone), line))
    return entries
