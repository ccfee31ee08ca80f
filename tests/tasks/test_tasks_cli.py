"""``spoolmq tasks list|inspect|result|cancel|periodic list`` (point 11), on a real store."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from spoolmq.errors import TaskFailed
from spoolmq.testing import BrokerProcess


def _cli(data_dir: Path, *args: str, columns: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "spoolmq", "tasks", *args, "--data", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "COLUMNS": str(columns)},  # rich fits a table to the width
    )


def test_the_tasks_commands(
    broker: BrokerProcess, app: ModuleType, start_worker: Any, data_dir: Path
) -> None:
    start_worker()
    done = app.add.send(40, 2)
    failed = app.boom.send("nope")
    assert done.result(timeout=60) == 42
    waiting = app.add.send_with(args=[1, 1], delay=3600)

    listed = json.loads(_cli(data_dir, "list", "--json").stdout)
    assert {row["id"] for row in listed} == {done.id, failed.id, waiting.id}
    assert json.loads(_cli(data_dir, "list", "--json", "--state", "queued").stdout)[0]["id"] == (
        waiting.id
    )
    table = _cli(data_dir, "list")
    assert table.returncode == 0 and "task_app.add" in table.stdout
    # However narrow, the ids stay whole: they are copied into `tasks inspect ID`.
    narrow = _cli(data_dir, "list", columns=80).stdout
    assert all(task.id in narrow for task in (done, failed, waiting)), narrow

    result = _cli(data_dir, "result", done.id)
    assert result.returncode == 0 and result.stdout.strip() == "42"
    inspected = json.loads(_cli(data_dir, "inspect", done.id, "--json").stdout)
    assert inspected["state"] == "succeeded" and inspected["args"]["args"] == [40, 2]

    cancel = _cli(data_dir, "cancel", waiting.id, "--json")
    assert cancel.returncode == 0 and json.loads(cancel.stdout)["cancelled"] is True
    assert _cli(data_dir, "cancel", done.id).returncode == 1

    with pytest.raises(TaskFailed):  # the failed one ends after its two attempts
        failed.result(timeout=60)
    bad = _cli(data_dir, "result", failed.id)
    assert bad.returncode == 2 and "ValueError: nope" in bad.stdout
    shown = _cli(data_dir, "inspect", failed.id)
    assert "raise ValueError(text)" in shown.stdout

    missing = _cli(data_dir, "result", "no-such-task")
    assert missing.returncode == 1 and "no task no-such-task" in missing.stderr
    assert json.loads(_cli(data_dir, "periodic", "list", "--json").stdout) == []


def test_the_commands_refuse_a_directory_without_tasks(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    answer = _cli(empty, "list")
    assert answer.returncode != 0 and "tasks.db" in answer.stderr
    assert len(answer.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no_such_module:tasks"], "cannot import 'no_such_module'"),
        (["task_app"], "expected MODULE:TASKS"),
        (["task_app:mark"], "is not a spoolmq Tasks object"),
        (["task_app:tasks", "--topics", "nope"], "no task uses topic(s): nope"),
        (["task_app:tasks", "--processes", "0"], "at least 1"),
    ],
)
def test_worker_mistakes_are_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    answer = subprocess.run(
        [sys.executable, "-m", "spoolmq", "worker", *args, "--data", str(tmp_path / "d")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parent,
        env={**os.environ, "TASKS_MARKS": str(tmp_path)},
    )
    assert answer.returncode != 0
    assert message in answer.stderr and len(answer.stderr.strip().splitlines()) == 1


def test_periodic_list_shows_each_jobs_last_tick_as_a_time(data_dir: Path) -> None:
    """A tick is numbered by its time: shown bare, a cron job's 1795766400 read like
    nothing a user could place."""
    from spoolmq.tasks.results import ResultStore

    store = ResultStore(data_dir)
    store.periodic_last_tick("hourly", "jobs.report", "0 * * * *")
    store.periodic_advance("hourly", 1_795_766_400, None, fired=False)  # 2026-11-27 08:00 UTC
    store.periodic_last_tick("minutely", "jobs.ping", "every 60s")
    store.periodic_advance("minutely", 29_929_440, None, fired=False)  # the same minute
    store.close()
    table = _cli(data_dir, "periodic", "list").stdout
    lines = {line.split("│")[1].strip(): line for line in table.splitlines() if "│" in line}
    assert "2026-11-27 08:00:00" in lines["hourly"], table
    assert "2026-11-27 08:00:00" in lines["minutely"], table
    assert "1795766400" not in table
