"""The library's traps (issue 12, points 17-19): unknown settings, swallowed handler
errors, workers that cannot start, a missing extra."""

from __future__ import annotations

import asyncio
import logging
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from test_demo_and_readme import readme_program  # tests/cli is on sys.path

from spoolmq import Admin, AsyncPublisher, Consumer, Publisher, Store, run_workers
from spoolmq.errors import ConfigError, InvalidArgumentError, SpoolError, WorkersFailedError
from spoolmq.tasks import Tasks
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


def _module_level_handler(message: object) -> None:
    """For run_workers' argument checks (a module-level function it can import)."""


def _store_with_topic(data: Path) -> Store:
    store = Store(data)
    store.create_topic("t")
    return store


def _periodic_both(data: Path) -> None:
    tasks = Tasks(data)
    job = tasks.task(topic="jobs")(_module_level_handler)
    tasks.periodic("0 9 * * *", job, every=timedelta(seconds=3), args=[None])


@pytest.mark.parametrize(
    ("call", "error", "fragment"),
    [
        (lambda d: Publisher(data=5), ConfigError, "data must be a path"),  # type: ignore[arg-type]
        (lambda d: Store(5), ConfigError, "data must be a path"),  # type: ignore[arg-type]
        (lambda d: Consumer("t", "g", data=5), ConfigError, "data must be a path"),  # type: ignore[arg-type]
        (
            lambda d: run_workers("t", "g", _module_level_handler, data=d, processes="2"),
            InvalidArgumentError,
            "processes must be a whole number from 1, not '2'",
        ),
        (
            lambda d: run_workers("t", "g", _module_level_handler, data=d, idle_timeout=-1),
            InvalidArgumentError,
            "idle_timeout must be a finite number",
        ),
        (
            lambda d: run_workers("t", "g", _module_level_handler, data=d, max_messages=0),
            InvalidArgumentError,
            "max_messages must be None or a whole number from 1, not 0",
        ),
        (
            lambda d: _store_with_topic(d).reader("t", 0, timestamp="x"),
            InvalidArgumentError,
            "timestamp must be a whole number of epoch ms, not 'x'",
        ),
        (
            lambda d: Tasks(d).result(5),  # type: ignore[arg-type]
            InvalidArgumentError,
            "a task id is text, not 5",
        ),
        (
            lambda d: _periodic_both(d),
            InvalidArgumentError,
            "a cron expression or every=, not both",
        ),
    ],
)
def test_arguments_of_the_wrong_kind_are_clear_errors_before_anything_starts(
    tmp_path: Path, call: Any, error: type[Exception], fragment: str
) -> None:
    """Each was a raw TypeError from deep inside, accepted and ignored, or a misleading
    message (found by a README walkthrough). No broker runs: none is needed to be told."""
    data = tmp_path / "queue_data"
    with pytest.raises(error, match=re.escape(fragment)):
        call(data)


def test_a_running_clients_wrong_arguments_are_clear_errors(tmp_path: Path) -> None:
    """flush(timeout="1") and ack_many(5) were raw TypeErrors (the asyncio flush ignored a
    bad timeout when nothing waited); an ACK after the consumer's own close() blamed a
    lost connection."""
    data = tmp_path / "queue_data"
    with BrokerProcess(data, log_file=tmp_path / "broker.log"):
        with Publisher(data=data) as publisher:
            publisher.publish("traps", 1)
            with pytest.raises(InvalidArgumentError, match="timeout must be None or a number"):
                publisher.flush(timeout="1")  # type: ignore[arg-type]

        async def flush_async() -> None:
            async with AsyncPublisher(data=data) as publisher:
                await publisher.flush(timeout="x")  # type: ignore[arg-type]

        with pytest.raises(InvalidArgumentError, match="timeout must be None or a number"):
            asyncio.run(flush_async())
        consumer = Consumer("traps", "g", data=data)
        message = consumer.receive(timeout=60)
        assert message is not None
        with pytest.raises(InvalidArgumentError, match="a list of received messages, not int"):
            consumer.ack_many(5)  # type: ignore[arg-type]
        consumer.close()
        with pytest.raises(SpoolError, match="this Consumer is closed"):
            message.ack()
