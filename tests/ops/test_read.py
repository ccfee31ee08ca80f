"""``spoolmq read``: a topic from the store, with no group, as a user runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from spoolmq import Consumer, Publisher, Store
from spoolmq.cli import main
from spoolmq.clock import ManualClock
from spoolmq.testing import BrokerProcess, wait_until

SPOOLMQ = [sys.executable, "-m", "spoolmq"]


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    status = main(list(args))
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_read_starts_filters_and_formats(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = ManualClock(1_000_000)  # one ms apart: the merge's time order is known
    with Store(data_dir, clock=clock) as store:
        store.create_topic("orders", partitions=2)
        for i in range(6):
            clock.advance(1)
            store.append(
                "orders",
                {"n": i, "customer": {"id": i % 3}},
                key=f"k{i}",
                headers={"src": "web" if i < 3 else "app"},
                partition=i % 2,
            )
        clock.advance(1)
        store.append("orders", b"\x00\xff", partition=0)
    d = ["--data", str(data_dir)]
    status, out, err = run(capsys, "read", "orders", *d, "--json")
    assert (status, err) == (0, "")
    rows = [orjson.loads(line) for line in out.splitlines()]
    assert [(r["partition"], r["offset"]) for r in rows] == [
        (0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 3)
    ]  # fmt: skip
    # Raw bytes as {"hex": ...}: a bare "00ff" would read as the text "00ff".
    assert rows[-1]["value"] == {"hex": "00ff"}
    assert rows[0]["headers"] == [["src", "web"]]

    def lines(*args: str) -> list[str]:
        status, out, err = run(capsys, "read", "orders", *d, *args)
        assert (status, err) == (0, "")
        return out.splitlines()

    assert lines("--partition", "1", "--format", "{offset}:{key}") == ["0:k1", "1:k3", "2:k5"]
    assert lines("--partition", "0", "--offset", "2", "--format", "{offset}") == ["2", "3"]
    assert lines("--partition", "0", "--from-end", "-1", "--format", "{offset}") == ["3"]
    assert lines("--key", "k4") == ['{"n":4,"customer":{"id":1}}']
    assert lines("--header", "src=app", "--format", "{key}") == ["k3", "k4", "k5"]
    assert lines("--field", "customer.id=2", "--format", "{key}") == ["k2", "k5"]
    assert lines("--max", "2", "--format", "{key}") == ["k0", "k1"]
    assert lines("--from-time", "2999-01-01T00:00:00Z") == []
    assert lines("--partition", "0", "--offset", "3") == ["00ff"]  # for a person: bare hex
    assert lines("--partition", "0", "--offset", "3", "--format", "{value}") == ["00ff"]

    for bad, message in [
        (["--format", "{value.__class__}"], "--format can name"),
        (["--header", "novalue"], "NAME=VALUE"),
        (["--from-time", "soon"], "ISO 8601"),
        (["--partition", "5"], "no partition 5"),
        (["--max", "-1"], "--max must be at least 1"),
        (["--max", "0"], "--max must be at least 1, not 0"),
    ]:
        status, out, err = run(capsys, "read", "orders", *d, *bad)
        assert status == 2 and out == ""
        assert err.startswith("spoolmq: ") and message in err and err.count("\n") == 1, err
    status, _, err = run(capsys, "read", "missing", *d)
    assert status == 2 and "does not exist" in err


def _reader(data_dir: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*SPOOLMQ, "read", "live", "--data", str(data_dir), "--follow", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class _Lines:
    """The reader's stdout lines, collected by a thread so the test can wait for them."""

    def __init__(self, process: subprocess.Popen[str]) -> None:
        self.lines: list[Any] = []
        assert process.stdout is not None
        stdout = process.stdout
        self._thread = threading.Thread(target=self._run, args=(stdout,), daemon=True)
        self._thread.start()

    def _run(self, stdout: Any) -> None:
        for line in stdout:
            self.lines.append(orjson.loads(line))


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_follow_tails_a_live_broker_without_a_group(
    broker: BrokerProcess, data_dir: Path, signum: int
) -> None:
    with Store(data_dir) as store:
        store.create_topic("live", partitions=2)
    with Publisher(data=data_dir) as publisher:
        publisher.publish("live", {"n": -1}, partition=0)
        process = _reader(data_dir, "--json")
        try:
            seen = _Lines(process)
            wait_until(lambda: len(seen.lines) == 1 or None, 60, "the stored message")
            for n in range(50):
                publisher.publish("live", {"n": n}, partition=n % 2)
            wait_until(lambda: len(seen.lines) == 51 or None, 60, "the 50 new messages")
            got = [line["value"]["n"] for line in seen.lines]
            assert got[0] == -1 and sorted(got[1:]) == list(range(50))
            by_partition = [[n for n in got[1:] if n % 2 == p] for p in (0, 1)]
            assert by_partition == [sorted(part) for part in by_partition]  # order per partition
            publisher.publish("live", {"n": 50}, partition=1)
            wait_until(lambda: len(seen.lines) == 52 or None, 60, "one more message")
            os.kill(process.pid, signum)
            assert process.wait(60) == 0
            assert process.stderr is not None and process.stderr.read() == ""
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    # Reading took nothing from any group: a consumer group still gets every message.
    with Store(data_dir) as store:
        assert store.state.groups() == []
    with Consumer("live", "after", data=data_dir) as consumer:
        values = []
        while (message := consumer.receive(timeout=5)) is not None:
            values.append(message.value["n"])
            message.ack()
    assert sorted(values) == list(range(-1, 51))


def test_follow_merges_partitions_in_time_order_too(data_dir: Path) -> None:
    """With follow, the records there already came partition by partition (`read
    --follow --max 3` gave three of partition 0); now merged by time as without it, and
    what comes later in time order within each poll."""
    from spoolmq.browse import browse

    clock = ManualClock(1_000_000)
    with Store(data_dir, clock=clock) as store:
        store.create_topic("orders", partitions=2)
        for i in range(6):
            clock.advance(1)
            store.append("orders", {"n": i}, partition=i % 2)
        rounds: list[int] = []

        def follow() -> bool:  # new records once, then stop
            rounds.append(1)
            if len(rounds) > 1:
                return False
            for i in range(6, 10):
                clock.advance(1)
                store.append("orders", {"n": i}, partition=(i // 2) % 2)
            return True

        seen = [f.record.value["n"] for f in browse(store, "orders", follow=follow)]
        assert seen == list(range(10))
        assert [f.partition for f in browse(store, "orders", follow=lambda: False, limit=3)] == [
            0,
            1,
            0,
        ]
