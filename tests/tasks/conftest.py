"""Fixtures of the task-layer suite: a real broker, real ``spoolmq worker`` processes."""

from __future__ import annotations

import importlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from spoolmq.testing import BrokerProcess

HERE = Path(__file__).parent


class WorkerProcess:
    """``spoolmq worker task_app:tasks`` as a subprocess, stopped by its pid."""

    def __init__(self, data: Path, marks: Path, log: Path, *args: str, **env: str) -> None:
        self.log = log
        command = [sys.executable, "-m", "spoolmq", "worker", "task_app:tasks"]
        command += ["--data", str(data), "--shutdown-timeout", "20", *args]
        environment = {**os.environ, "TASKS_MARKS": str(marks), **env}
        with open(log, "ab") as output:
            self.process = subprocess.Popen(
                command, cwd=HERE, stdin=subprocess.DEVNULL, stderr=output, env=environment
            )

    def stop(self, timeout: float = 60.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture
def marks(tmp_path: Path) -> Path:
    path = tmp_path / "marks"
    path.mkdir()
    return path


@pytest.fixture
def broker(data_dir: Path) -> Iterator[BrokerProcess]:
    with BrokerProcess(data_dir) as running:
        yield running


@pytest.fixture
def app(data_dir: Path, marks: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    """The task module, imported here with this test's data directory."""
    monkeypatch.setenv("SPOOLMQ_DATA", str(data_dir))
    monkeypatch.setenv("TASKS_MARKS", str(marks))
    monkeypatch.syspath_prepend(str(HERE))
    import task_app

    module = importlib.reload(task_app)
    yield module
    module.tasks.close()


@pytest.fixture
def start_worker(data_dir: Path, marks: Path, tmp_path: Path) -> Iterator[object]:
    started: list[WorkerProcess] = []

    def start(*args: str, **env: str) -> WorkerProcess:
        log = tmp_path / f"worker{len(started)}.log"
        worker = WorkerProcess(data_dir, marks, log, *args, **env)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        try:
            worker.stop()
        except subprocess.TimeoutExpired:
            worker.process.kill()
            worker.process.wait(10)
