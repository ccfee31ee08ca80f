"""The library's traps (issue 12, points 17-19): unknown settings, swallowed handler
errors, workers that cannot start, a missing extra."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_demo_and_readme import readme_program  # tests/cli is on sys.path

from spoolmq import Admin, Consumer, Publisher, run_workers
from spoolmq.errors import ConfigError, InvalidArgumentError, WorkersFailedError
from spoolmq.testing import BrokerProcess


@pytest.mark.parametrize(
    ("make", "hint"),
    [
        (lambda d: Publisher(data=d, linger=5), "'linger' (did you mean 'linger_ms'?)"),
        (lambda d: Consumer("t", "g", data=d, prefech=5), "'prefech' (did you mean 'prefetch'?)"),
        (lambda d: Admin(d, adress="x"), "'adress' (did you mean 'address'?)"),
        (
            lambda d: run_workers("t", "g", print, data=d, prefech=5),
            "run_workers has no setting 'prefech' (did you mean 'prefetch'?)",
        ),
    ],
)
def test_an_unknown_setting_is_a_config_error_listing_the_known_ones(
    tmp_path: Path, make: object, hint: str
) -> None:
    with pytest.raises(ConfigError) as raised:
        make(tmp_path)  # type: ignore[operator]
    assert hint in str(raised.value)
    assert "known settings:" in str(raised.value)


def test_run_workers_refuses_a_handler_its_workers_cannot_import(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgumentError, match="module-level function"):
        run_workers("t", "g", lambda message: None, data=tmp_path)


def test_run_workers_fails_loudly_when_its_workers_cannot_start(tmp_path: Path) -> None:
    # No broker has ever run here: each worker's Consumer fails at once.
    with pytest.raises(WorkersFailedError, match="2 of 2 worker process"):
        run_workers("t", "g", print, processes=2, data=tmp_path / "nothing", idle_timeout=1)


def _fail_on_odd(message: object) -> None:
    if message.value % 2:  # type: ignore[attr-defined]
        raise ValueError(f"odd {message.value}")  # type: ignore[attr-defined]


def test_consumer_run_logs_each_handler_failure_with_its_traceback(
    broker: BrokerProcess, data_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with Publisher(data=data_dir) as publisher:
        for n in range(4):
            publisher.publish("work", n)
    caplog.set_level(logging.ERROR, logger="spoolmq")
    with Consumer("work", "g", data=data_dir, max_deliveries=1) as consumer:
        assert consumer.run(_fail_on_odd, max_messages=4, idle_timeout=30) == 4
    failures = [r for r in caplog.records if r.getMessage().startswith("handler failed")]
    assert [r.getMessage() for r in failures] == [
        "handler failed on work/0@1 (attempt 1)",
        "handler failed on work/0@3 (attempt 1)",
    ]
    assert all(r.exc_info and r.exc_info[0] is ValueError for r in failures)


def test_the_readme_workers_program_runs_as_written(tmp_path: Path) -> None:
    program = readme_program("workers.py")
    assert 'if __name__ == "__main__":' in program
    (tmp_path / "workers.py").write_text(program)
    with BrokerProcess(tmp_path / "queue_data", log_file=tmp_path / "broker.log"):
        with Publisher(data=tmp_path / "queue_data") as publisher:
            for n in range(20):
                publisher.publish("orders", {"order_id": n})
        # Buffered output (as a user's terminal or pipe has it, not PYTHONUNBUFFERED), so
        # that each print is one write and four workers' lines do not interleave.
        result = subprocess.run(
            [sys.executable, "workers.py"],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            env={k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
        )
    assert result.returncode == 0, result.stderr
    handled = [int(line.split()[-1]) for line in result.stdout.splitlines()]
    assert sorted(handled) == list(range(20)), (result.stdout, result.stderr)


SITECUSTOMIZE = '''
import sys

class _NoSpark:
    """As if the analytics extra were not installed."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("pyspark", "matplotlib"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NoSpark())
'''


@pytest.mark.parametrize(
    "args",
    [["analytics"], ["demo", "--messages", "10"]],
)
def test_a_command_that_needs_a_missing_extra_says_which(tmp_path: Path, args: list[str]) -> None:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    result = subprocess.run(
        [sys.executable, "-m", "spoolmq", *args, "--data", str(tmp_path / "q")],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
    )
    assert result.returncode == 2
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"spoolmq: spoolmq {args[0]}")
    assert "needs the 'analytics' extra (pyspark is not installed)" in lines[0]
    assert "pip install 'spoolmq[analytics]'" in lines[0]
