"""``spoolmq groups reset``: every target form, the dry run, ``--execute``, the refusal while
the group has live consumers, and a reset done with the broker stopped."""

from __future__ import annotations

import datetime as dt
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from spoolmq import Consumer, Publisher, Store
from spoolmq.cli import main
from spoolmq.testing import BrokerProcess, wait_until


def reset(capsys: pytest.CaptureFixture[str], data_dir: Path, *target: str) -> dict[str, Any]:
    capsys.readouterr()
    status = main(
        [
            "groups",
            "reset",
            "billing",
            "--topic",
            "orders",
            *target,
            "--json",
            "--data",
            str(data_dir),
        ]
    )
    captured = capsys.readouterr()
    assert status == 0, captured.err
    result: dict[str, Any] = orjson.loads(captured.out)
    return result


def committed(data_dir: Path) -> int | None:
    with Store(data_dir) as store:
        return store.state.committed_offsets("billing").get(("orders", 0))


def receive_all(data_dir: Path, count: int) -> list[int]:
    """The offsets group billing is given: ``count`` of them, each waited for with a
    generous bound, then any that come within a second more (none, if all is well)."""
    offsets = []
    with Consumer("orders", group="billing", data=data_dir, prefetch=10) as consumer:
        while (
            message := consumer.receive(timeout=60 if len(offsets) < count else 1.0)
        ) is not None:
            offsets.append(message.offset)
            message.ack()
    return offsets


def wait_committed(data_dir: Path, offset: int) -> None:
    """The broker saves committed offsets within 0.2 s; wait (bounded) until it did."""
    wait_until(lambda: committed(data_dir) == offset, 60, f"committed offset {offset}")


@pytest.fixture
def consumed(broker: BrokerProcess, data_dir: Path) -> dt.datetime:
    """Six messages, all consumed by group billing; returns a moment between the third and
    the fourth."""
    with Publisher(data=data_dir) as publisher:
        for n in range(3):
            publisher.publish("orders", n)
        time.sleep(0.05)  # distinct timestamps on either side of the moment
        moment = dt.datetime.now(dt.UTC)
        time.sleep(0.05)
        for n in range(3, 6):
            publisher.publish("orders", n)
    assert receive_all(data_dir, 6) == [0, 1, 2, 3, 4, 5]
    wait_committed(data_dir, 6)
    return moment


def test_reset_to_a_datetime_shows_then_executes(
    consumed: dt.datetime, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    moment = consumed.isoformat()
    dry = reset(capsys, data_dir, "--to-datetime", moment)
    assert dry == {
        "group": "billing",
        "executed": False,
        "changes": [{"topic": "orders", "partition": 0, "from": 6, "to": 3}],
    }
    assert committed(data_dir) == 6
    assert receive_all(data_dir, 0) == []  # the dry run changed nothing
    done = reset(capsys, data_dir, "--to-datetime", moment, "--execute")
    assert done["executed"] is True and done["changes"] == dry["changes"]
    assert committed(data_dir) == 3
    assert receive_all(data_dir, 3) == [3, 4, 5]
    # The same moment in another time zone is the same moment.
    plus_two = consumed.astimezone(dt.timezone(dt.timedelta(hours=2))).isoformat()
    assert reset(capsys, data_dir, "--to-datetime", plus_two, "--execute")["changes"][0]["to"] == 3


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        (["--to-earliest"], [0, 1, 2, 3, 4, 5]),
        (["--to-offset", "4"], [4, 5]),
        (["--to-offset", "99"], []),  # clamped to the log end
        (["--to-latest"], []),
    ],
)
def test_reset_to_earliest_latest_and_an_offset(
    consumed: dt.datetime,
    data_dir: Path,
    capsys: pytest.CaptureFixture[str],
    target: list[str],
    expected: list[int],
) -> None:
    result = reset(capsys, data_dir, *target, "--execute")
    assert result["changes"] == [
        {"topic": "orders", "partition": 0, "from": 6, "to": expected[0] if expected else 6}
    ]
    assert receive_all(data_dir, len(expected)) == expected


def test_reset_is_refused_while_the_group_has_live_consumers(
    consumed: dt.datetime, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    reset_command = ["groups", "reset", "billing", "--topic", "orders", "--to-earliest"]
    with Consumer("orders", group="billing", data=data_dir):
        refused = subprocess.run(
            [sys.executable, "-m", "spoolmq", *reset_command, "--execute", "--data", str(data_dir)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 2
        (line,) = refused.stderr.splitlines()
        assert line.startswith("spoolmq: ") and "live consumer" in line
        # The dry run still shows what would change.
        assert reset(capsys, data_dir, "--to-earliest")["changes"][0]["to"] == 0
    assert committed(data_dir) == 6
    assert receive_all(data_dir, 0) == []


def test_reset_with_the_broker_stopped(
    consumed: dt.datetime, broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert broker.stop() == 0
    reset(capsys, data_dir, "--to-offset", "2", "--execute")
    assert committed(data_dir) == 2
    broker.start()
    assert receive_all(data_dir, 4) == [2, 3, 4, 5]


def test_a_reset_with_the_broker_stopped_forgets_old_attempts(
    broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with Publisher(data=data_dir) as publisher:
        publisher.publish("orders", "flaky")
    with Consumer("orders", group="billing", data=data_dir, max_deliveries=3) as consumer:
        for attempt in (1, 2):
            message = consumer.receive(timeout=30)
            assert message is not None and message.attempt == attempt
            message.nack(delay=0 if attempt == 1 else 60)
    assert broker.stop() == 0
    reset(capsys, data_dir, "--to-earliest", "--execute")
    broker.start()
    # A reset starts the group's work over: the attempt count too, as it does when the
    # broker runs the reset.
    with Consumer("orders", group="billing", data=data_dir, max_deliveries=3) as consumer:
        message = consumer.receive(timeout=30)
        assert message is not None and (message.value, message.attempt) == ("flaky", 1)
        message.ack()


def test_resets_do_not_leak_the_brokers_files(
    consumed: dt.datetime, broker: BrokerProcess, data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    consumer_broker = Path("/proc", str(broker.child_pids()["consumer"]), "fd")

    def open_files() -> int:
        return len(list(consumer_broker.iterdir()))

    def reset_and_replay() -> None:
        reset(capsys, data_dir, "--to-earliest", "--execute")
        assert receive_all(data_dir, 6) == [0, 1, 2, 3, 4, 5]

    def open_files_when_idle() -> int:
        # The ConsumerBroker reports a departed consumer once it closed its connection.
        wait_until(lambda: not broker.stats()["clients"]["consumer"], 60, "the consumers to leave")
        return open_files()

    reset_and_replay()
    before = open_files_when_idle()
    for _ in range(3):
        reset_and_replay()
    assert open_files_when_idle() == before
