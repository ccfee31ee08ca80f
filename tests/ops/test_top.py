"""``spoolmq top`` and ``spoolmq stats --watch`` on a real terminal: run under tmux (a
detached session of a fixed size, on a tmux server of the test's own) and read the
screen."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from spoolmq import Consumer, Publisher
from spoolmq.commands.stats import Sample, duration, rates, stats_rows
from spoolmq.testing import BrokerProcess, run_spoolmq, wait_until

SPOOLMQ = [sys.executable, "-m", "spoolmq"]
pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


class Tmux:
    """One detached session on a private tmux server (its own socket name)."""

    def __init__(self, name: str) -> None:
        self.socket = name

    def run(self, *args: str) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, timeout=30
        ).stdout

    def start(self, command: list[str]) -> None:
        # The shell line prints the exit status and stays, so the test can read it.
        line = f"{shlex.join(command)}; echo EXITED $?; sleep 120"
        self.run("new-session", "-d", "-s", "t", "-x", "140", "-y", "50", line)

    def screen(self) -> str:
        return self.run("capture-pane", "-p", "-t", "t")

    def wait_for(self, *texts: str) -> str:
        def shown() -> str | None:
            screen = self.screen()
            return screen if all(text in screen for text in texts) else None

        return wait_until(shown, 60, f"{texts} on the screen")

    def stop(self) -> None:
        self.run("kill-server")


@pytest.fixture
def tmux(tmp_path: Path) -> Iterator[Tmux]:
    session = Tmux(f"spoolmq-test-{tmp_path.name}")
    try:
        yield session
    finally:
        session.stop()


def _traffic(data_dir: Path) -> None:
    with Publisher(data=data_dir) as publisher:
        for n in range(12):
            publisher.publish("jobs", {"n": n})
    with Consumer("jobs", "workers", data=data_dir, max_deliveries=1) as consumer:
        for index in range(3):
            message = consumer.receive(timeout=30)
            assert message is not None
            if index == 0:
                message.nack(reason="broken")  # one delivery allowed: a dead letter
            else:
                message.ack()


def test_top_shows_groups_and_dead_letters_and_q_quits(
    broker: BrokerProcess, data_dir: Path, tmux: Tmux
) -> None:
    _traffic(data_dir)
    tmux.start([sys.executable, "-m", "spoolmq", "top", "--data", str(data_dir)])
    screen = tmux.wait_for("spoolmq top", "consumer groups", "workers", "q quits")
    assert f"broker pid {broker.pid}" in screen
    group_line = next(line for line in screen.splitlines() if "workers" in line)
    # 12 published, 2 ACKed and 1 dead-lettered: the group has 9 left.
    cells = [cell.strip() for cell in group_line.split("│") if cell.strip()]
    assert cells[:3] == ["workers", "jobs", "9"], screen
    dlq_line = tmux.wait_for("dead letters")
    dead = [line for line in dlq_line.splitlines() if line.startswith("│ jobs")]
    assert dead and dead[-1].split("│")[2].strip() == "1", dlq_line
    tmux.run("send-keys", "-t", "t", "q")
    after = tmux.wait_for("EXITED")
    assert "EXITED 0" in after


def test_stats_watch_refreshes_with_rates(
    broker: BrokerProcess, data_dir: Path, tmux: Tmux
) -> None:
    tmux.start(
        [sys.executable, "-m", "spoolmq", "stats", "--watch", "0.5", "--data", str(data_dir)]
    )
    tmux.wait_for("messages published", "every 0.5 s")
    with Publisher(data=data_dir) as publisher:
        for n in range(40):
            publisher.publish("jobs", n)

    def published_row() -> str | None:
        line = next((row for row in tmux.screen().splitlines() if "messages published" in row), "")
        cells = line.split("│")  # empty while the screen is being redrawn
        return line if len(cells) > 3 and cells[2].strip() == "40" else None

    row = wait_until(published_row, 60, "40 published on the refreshed table")
    assert "/s" in row  # a rate, from two samples
    tmux.run("send-keys", "-t", "t", "C-c")
    assert "EXITED 0" in tmux.wait_for("EXITED")


def test_rates_and_rows() -> None:
    before = Sample(10.0, {"publisher": {"messages": 100}, "consumer": {"acked": 50}})
    after = Sample(12.0, {"publisher": {"messages": 300}, "consumer": {"acked": 40}})
    got = rates(before, after)
    assert got["published"] == 100.0
    assert got["acked"] is None  # the consumer broker restarted: counts began again
    assert rates(None, after)["published"] is None
    labels = [row[0] for row in stats_rows(after, before)]
    assert "messages published" in labels and all("_" not in label for label in labels)
    assert [duration(s) for s in (5, 65, 3700, 90000)] == ["5s", "1m 05s", "1h 01m", "1d 1h"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["stats", "--watch", "0"], "--watch takes seconds between 0.1 and 86400"),
        (["stats", "--watch", "nan"], "--watch takes seconds between 0.1 and 86400"),
        (["top", "--interval", "inf"], "--interval takes seconds between 0.1 and 86400"),
    ],
)
def test_bad_intervals_are_one_line(
    argv: list[str], message: str, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from spoolmq.cli import main

    data_dir.mkdir()
    assert main([*argv, "--data", str(data_dir)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("spoolmq: ") and message in err and err.count("\n") == 1, err


def stats_watch_json(data_dir: Path) -> subprocess.Popen[str]:
    """``spoolmq stats --watch 0.2 --json`` started as a user starts it, its output piped."""
    return subprocess.Popen(
        [*SPOOLMQ, "stats", "--watch", "0.2", "--json", "--data", str(data_dir)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_stats_watch_json_lines_until_sigint(broker: BrokerProcess, data_dir: Path) -> None:
    import json
    import signal

    process = stats_watch_json(data_dir)
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        second = json.loads(process.stdout.readline())
        assert first["pid"] == second["pid"] == broker.pid
        assert first["rates"]["published"] is None  # no earlier sample yet
        assert second["rates"]["published"] == 0.0
        assert second["uptime_s"] >= first["uptime_s"]
        process.send_signal(signal.SIGINT)
        assert process.wait(60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_stats_watch_says_when_the_broker_stops(data_dir: Path, tmp_path: Path) -> None:
    """It ended with exit 0 and nothing said, as if asked to stop."""
    import json

    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    broker.start()
    process = stats_watch_json(data_dir)
    try:
        assert process.stdout is not None and process.stderr is not None
        assert json.loads(process.stdout.readline())["pid"] == broker.pid
        broker.stop()
        assert process.wait(60) == 2
        error = process.stderr.read()
        assert error.startswith("spoolmq: lost the broker") and error.count("\n") == 1, error
    finally:
        broker.stop()
        if process.poll() is None:
            process.kill()
            process.wait()


def test_top_without_a_terminal_is_one_line(data_dir: Path) -> None:
    """Into a pipe it drew nothing and never ended."""
    data_dir.mkdir()
    result = run_spoolmq("top", "--data", str(data_dir), timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith("spoolmq: spoolmq top needs a terminal")
    assert "stats --watch" in result.stderr and result.stderr.count("\n") == 1
