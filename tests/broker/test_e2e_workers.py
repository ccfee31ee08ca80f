"""Handlers instead of iteration: ``Consumer(handler=...).run()`` and ``run_workers``, which
runs a handler in N processes; a handler that returns ACKs, one that raises NACKs."""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from e2e_workers import flaky_handler, publish_all, read_lines

from spoolmq import Admin, Consumer, ReceivedMessage, run_workers
from spoolmq.errors import InvalidArgumentError
from spoolmq.testing import BrokerProcess, process_alive, wait_until


def test_run_workers_runs_a_handler_in_several_processes(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "calls"
    out.mkdir()
    monkeypatch.setenv("E2E_OUT", str(out))
    monkeypatch.setenv("E2E_WORKERS", "3")
    publish_all(data_dir, "tasks", range(30))
    codes = run_workers(
        "tasks",
        "workers",
        flaky_handler,
        processes=3,
        idle_timeout=10.0,  # generous: an idle worker is done
        data=data_dir,
        prefetch=2,
        retry_backoff=0.1,
    )
    assert codes == [0, 0, 0]
    calls = [line for path in out.iterdir() for line in read_lines(path)]
    attempts = collections.Counter(line["value"] for line in calls)
    # Every value handled; the ones that failed once were handled again, and only once more.
    assert attempts == {v: 2 if v % 5 == 0 else 1 for v in range(30)}
    assert {line["attempt"] for line in calls if line["value"] % 5 == 0} == {1, 2}
    assert len({line["pid"] for line in calls}) == 3
    # Nothing is left: the group has ACKed everything.
    with Consumer("tasks", group="workers", data=data_dir) as consumer:
        assert consumer.receive(timeout=1.0) is None


def test_run_workers_processes_leave_when_their_parent_is_killed(
    broker: BrokerProcess, data_dir: Path, tmp_path: Path
) -> None:
    """A script running run_workers killed with SIGKILL could not stop its workers: they
    stayed in the group, taking messages, until killed by pid. Each now closes its
    consumer and exits once its parent is gone."""
    out = tmp_path / "calls"
    out.mkdir()
    script = (
        "from e2e_workers import flaky_handler\n"
        "from spoolmq import run_workers\n"
        f"run_workers('orphans', 'w', flaky_handler, processes=1, data={str(data_dir)!r})\n"
    )
    env = {**os.environ, "E2E_OUT": str(out), "E2E_WORKERS": "1"}
    stderr = tmp_path / "stderr"
    with open(stderr, "wb") as output:  # the workers inherit it
        parent = subprocess.Popen(
            [sys.executable, "-c", script], cwd=Path(__file__).parent, env=env, stderr=output
        )
    children: list[int] = []
    try:
        wait_until(lambda: _members(data_dir, "w") == 1 or None, 60, "the worker joined")
        children = _children(parent.pid)
        parent.kill()
        parent.wait(30)
        wait_until(lambda: _members(data_dir, "w") == 0 or None, 60, "the worker to leave")
        wait_until(lambda: not any(map(process_alive, children)) or None, 60, "the workers to exit")
        # A clean stop, not a worker's traceback (closing its consumer under run() raised).
        assert "Traceback" not in stderr.read_text(errors="replace")
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(30)
        for pid in children:
            if process_alive(pid):
                os.kill(pid, signal.SIGKILL)


def _members(data_dir: Path, group: str) -> int:
    with Admin(data=data_dir) as admin:
        return len(admin.describe_groups().get(group, {}).get("members", []))


def _children(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in found]


def test_a_consumer_with_a_handler(broker: BrokerProcess, data_dir: Path) -> None:
    publish_all(data_dir, "handled", ["a", "b", "c"])
    seen: list[Any] = []

    def handle(message: ReceivedMessage) -> None:
        seen.append((message.value, message.attempt))
        if message.value == "b" and message.attempt == 1:
            raise ValueError("b fails once")

    with Consumer("handled", group="g", data=data_dir, handler=handle, retry_backoff=0.1) as c:
        # Four calls (b twice); a generous bound for each, then a second with nothing more.
        assert c.run(max_messages=4, idle_timeout=60) == 4
        assert c.run(idle_timeout=1.0) == 0
    assert sorted(seen) == [("a", 1), ("b", 1), ("b", 2), ("c", 1)]


def test_iterating_over_a_consumer(broker: BrokerProcess, data_dir: Path) -> None:
    publish_all(data_dir, "iterated", [1, 2, 3])
    values = []
    with Consumer("iterated", group="g", data=data_dir, prefetch=10) as consumer:
        for message in consumer:  # pushed by the broker, forever: the loop decides when to stop
            values.append(message.value)
            message.ack()
            if len(values) == 3:
                break
        assert consumer.receive(timeout=1.0) is None
    assert values == [1, 2, 3]


def test_auto_ack_is_at_most_once(broker: BrokerProcess, data_dir: Path) -> None:
    publish_all(data_dir, "fire-and-forget", [1, 2])
    with Consumer("fire-and-forget", group="g", data=data_dir, auto_ack=True) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None and message.value == 1
        with pytest.raises(InvalidArgumentError):
            message.ack()  # nothing to acknowledge: it was final when sent
        # A window for a wrong push of message 2 to arrive (and be lost with this consumer):
        # a check that something does not happen, so a lower bound by design.
        time.sleep(1.0)
    # The consumer left without handling anything more: message 1 is not delivered again.
    with Consumer("fire-and-forget", group="g", data=data_dir, auto_ack=True) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None and message.value == 2
