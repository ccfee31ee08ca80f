"""Running `spoolmq bench` as a user does, and finding the processes it started, for the bench
tests."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import psutil


def run_bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """`python -m spoolmq bench ARGS` as a user runs it; fails the test unless it exits 0."""
    completed = subprocess.run(
        [sys.executable, "-m", "spoolmq", "bench", *args],
        capture_output=True,
        timeout=240,
        check=False,
        env=env,
    )
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    return completed


def descendants(pid: int) -> list[psutil.Process]:
    """Every process below ``pid`` now (none if it is gone)."""
    with contextlib.suppress(psutil.Error):
        return list(psutil.Process(pid).children(recursive=True))
    return []


def started(process: psutil.Process, what: str) -> bool:
    """Whether ``process`` runs and ``what`` is in its command line."""
    with contextlib.suppress(psutil.Error):
        return process.is_running() and what in " ".join(process.cmdline())
    return False
