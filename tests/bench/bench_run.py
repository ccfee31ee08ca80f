"""Running `spoolmq bench` as a user does, and finding the processes it started, for the bench
tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from pathlib import Path

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


def interrupt_bench(args: list[str], tmp_path: Path, signum: int, wait_for: list[str]) -> None:
    """Start `spoolmq bench ARGS` with its temporary directory in ``tmp_path``, send it
    ``signum`` once a process with each of ``wait_for`` in its command line runs below it, and
    check that every process it had started has ended and ``tmp_path`` is empty."""
    bench = subprocess.Popen(
        [sys.executable, "-m", "spoolmq", "bench", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "TMPDIR": str(tmp_path)},
        start_new_session=True,  # the signal reaches the bench alone, not a process group
    )
    seen: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 180
        while not all(any(started(p, what) for p in seen) for what in wait_for):
            assert time.monotonic() < deadline, f"{wait_for} never started"
            assert bench.poll() is None, f"the bench ended before it started {wait_for}"
            time.sleep(0.1)
            seen = descendants(bench.pid)
        bench.send_signal(signum)
        bench.wait(120)
        _, alive = psutil.wait_procs(seen, timeout=30)
        assert not alive, [p.cmdline() for p in alive]
        assert list(tmp_path.iterdir()) == []  # the bench's temporary directory is removed
    finally:
        # Whatever the bench left behind, orphans included (they are no longer its children).
        for process in [*seen, *descendants(bench.pid)]:
            with contextlib.suppress(psutil.Error):
                process.kill()
        bench.kill()
        bench.wait(10)
