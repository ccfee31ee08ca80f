"""The README's asyncio example, taken from README.md and run as written against a real
broker on ./queue_data."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from readme_examples import code_blocks
from spoolmq.testing import BrokerProcess


def test_the_readme_asyncio_example_runs_as_written(tmp_path: Path) -> None:
    (example,) = code_blocks("asyncio")
    (tmp_path / "example.py").write_text(example)
    with BrokerProcess(tmp_path / "queue_data", log_file=tmp_path / "broker.log"):
        completed = subprocess.run(
            [sys.executable, "example.py"],
            cwd=tmp_path,
            capture_output=True,
            timeout=120,
            check=False,
        )
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    lines = completed.stdout.decode().splitlines()
    assert lines[0].startswith("stored at ")
    # One partition (the default): orders 1..99 at offsets 0..98, consumed in that order.
    assert lines[1] == "last offset 98"
    billed = [int(line.split()[-1]) for line in lines if line.startswith("billing order")]
    assert billed == list(range(1, 100))
