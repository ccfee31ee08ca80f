"""Helpers shared by the store tests."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from spoolmq.store.names import partition_dir
from spoolmq.types import TopicPartition

START_MS = 1_700_000_000_000  # where the store tests' ManualClock starts (Nov 2023)


def tree_snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file and directory under ``root`` with its mode and content hash.

    SQLite's shared-memory file changes on reads, so it is left out; the database and
    its WAL are compared byte for byte.
    """
    snapshot: dict[str, tuple[int, str]] = {}
    if not root.exists():
        return snapshot
    for directory, dirs, files in os.walk(root):
        for name in dirs:
            path = Path(directory, name)
            snapshot[str(path.relative_to(root))] = (path.stat().st_mode, "dir")
        for name in files:
            if name.endswith("-shm"):
                continue
            path = Path(directory, name)
            digest = hashlib.sha256(path.read_bytes()).hexdigest()
            snapshot[str(path.relative_to(root))] = (path.stat().st_mode, digest)
    return snapshot


def segment_files(data_dir: Path, topic: str, partition: int = 0) -> list[Path]:
    return sorted(partition_dir(data_dir, TopicPartition(topic, partition)).glob("*.jsonl"))
