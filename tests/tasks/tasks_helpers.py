"""Helpers the task tests import (a module of its own: ``conftest`` is a name every test
directory has, so ``from conftest import`` found another directory's when run together)."""

from __future__ import annotations

from pathlib import Path


def count_marks(marks: Path, name: str) -> list[str]:
    """The marks ``task_app``'s tasks left in ``marks/name``, one per run, in order."""
    path = marks / name
    return path.read_text().split() if path.exists() else []
