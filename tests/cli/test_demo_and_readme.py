"""What a new user runs first: the demo, and the README's publisher and consumer programs
(taken from README.md itself, so the README cannot drift from what works)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from spoolmq import Store
from spoolmq.testing import BrokerProcess

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_demo_runs_to_the_end_and_dead_letters_the_poison_orders(tmp_path: Path) -> None:
    data = tmp_path / "demo"
    demo = ["demo", "--no-analytics", "--messages", "300", "--data", str(data)]
    result = subprocess.run(
        [sys.executable, "-m", "spoolmq", *demo],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "COLUMNS": "120"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    summary = {}
    for line in result.stdout.splitlines():
        cells = [c.strip() for c in re.split(r"[│┃|]", line) if c.strip()]
        if len(cells) == 2:
            summary[cells[0]] = cells[1]
    # Orders 97, 194 and 291 always fail: they are the demo's dead letters.
    assert summary["published"] == "300"
    assert summary["dead-lettered (expected 3)"] == "3"
    assert summary["acked"] == "297"
    assert int(summary["NACKs (failed attempts)"]) > 0
    with Store(data) as store:
        dead = [
            record.value["order_id"]
            for partition in range(store.topic_config("orders.dlq").partitions)
            for record in store.reader("orders.dlq", partition)
        ]
    assert sorted(dead) == [97, 194, 291]


def readme_program(name: str) -> str:
    """The code block that follows the mention of ``name`` in "A publisher and a consumer"."""
    text = README.read_text()
    section = text.split("## A publisher and a consumer", 1)[1].split("\n## ", 1)[0]
    match = re.search(rf"`{re.escape(name)}`[^`]*?:\s*```python\n(.*?)```", section, re.S)
    assert match, f"README.md has no {name} block in 'A publisher and a consumer'"
    return match.group(1)


def run_program(directory: Path, name: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, name], cwd=directory, capture_output=True, text=True, timeout=120
    )


def test_the_readme_publisher_and_consumer_run_as_written(tmp_path: Path) -> None:
    for name in ("publisher.py", "consumer.py", "batches.py"):
        (tmp_path / name).write_text(readme_program(name))
    # As the README says: a broker on ./queue_data, then each program from that directory.
    with BrokerProcess(tmp_path / "queue_data"):
        published = run_program(tmp_path, "publisher.py")
        assert published.returncode == 0, published.stderr
        assert published.stdout.splitlines() == ["stored at 0 0", "last offset 98"]
        consumed = run_program(tmp_path, "consumer.py")
        assert consumed.returncode == 0, consumed.stderr
        batched = run_program(tmp_path, "batches.py")
        assert batched.returncode == 0, batched.stderr
    saved = [int(line.split()[1]) for line in batched.stdout.splitlines()]
    assert sum(saved) == 101 and max(saved) <= 100, batched.stdout  # 101 orders, 100 a call
    orders = [int(line.split()[-1]) for line in consumed.stdout.splitlines()]
    # The consumer starts on the whole backlog: the priority-9 order, published last, goes
    # first, then the rest in the order they were published.
    assert consumed.stdout.startswith("billing order 101\nbilling order 1\n"), consumed.stdout
    assert sorted(orders) == list(range(1, 102))
