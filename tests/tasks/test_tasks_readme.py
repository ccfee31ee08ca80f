"""The README's "Tasks" example, run as written: ``jobs.py`` in a real ``spoolmq worker``,
``send.py`` as a program of its own."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from readme_examples import code_blocks
from spoolmq.testing import BrokerProcess


def test_the_readme_tasks_example(tmp_path: Path) -> None:
    jobs, send = code_blocks("Tasks")
    (tmp_path / "jobs.py").write_text(jobs)
    (tmp_path / "send.py").write_text(send)
    environment = {k: v for k, v in os.environ.items() if k != "SPOOLMQ_DATA"}
    with BrokerProcess(tmp_path / "queue_data"):
        with open(tmp_path / "worker.log", "wb") as log:
            worker = subprocess.Popen(
                [sys.executable, "-m", "spoolmq", "worker", "jobs:tasks", "--concurrency", "4"],
                cwd=tmp_path,
                stdin=subprocess.DEVNULL,
                stderr=log,
                env=environment,
            )
        try:
            run = subprocess.run(
                [sys.executable, "send.py"],
                cwd=tmp_path,
                capture_output=True,
                text=True,
                timeout=180,
                env=environment,
            )
        finally:
            worker.send_signal(signal.SIGTERM)
            assert worker.wait(60) == 0
    assert run.returncode == 0, run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert lines[:3] == ["sent 'hi' to a@example.com", "True", "ValueError: bad address 'nobody'"]
    assert lines[3].startswith("ValueError: bad address")  # the traceback's last line
    assert lines[4:] == ["True", "True", "sent 'once' to c@example.com"]
    log = (tmp_path / "worker.log").read_text()
    assert "failed on attempt 5 of 5" in log and "Traceback" in log
