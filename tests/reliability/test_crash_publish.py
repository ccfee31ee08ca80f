"""Point 1: SIGKILL each broker process at random moments during a stream of ACK "all"
publishes; every ACKed message is stored exactly once, at the offset it was ACKed with."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from fault_checks import audit, read_acks, start_publishers, stop_processes

from spoolmq import Store
from spoolmq.testing import BrokerProcess, wait_until

WORKERS = 2
TOPIC = "stream"


@pytest.mark.parametrize("target", ["publisher", "consumer", "manager"])
def test_acked_publishes_survive_sigkill(
    target: str,
    data_dir: Path,
    tmp_path: Path,
    long_run: bool,
    figure: Callable[[str], None],
) -> None:
    trials = 20 if long_run else 3
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    with Store(data_dir) as store:
        store.create_topic(TOPIC, partitions=2)
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    broker.start()
    publishers, acks, stop_file = start_publishers(data_dir, TOPIC, WORKERS, tmp_path, 0.01)
    recovery: list[float] = []

    def acked() -> int:
        return sum(len(read_acks(path)[0]) for path in acks.values())

    try:
        wait_until(
            lambda: all(path.exists() and path.stat().st_size for path in acks.values()),
            60,
            "the publishers' first ACKs",
        )
        for _ in range(trials):
            time.sleep(rng.uniform(0.2, 1.5))  # pacing: a random moment in the stream
            if target == "manager":
                broker.kill()  # the children die with it (PR_SET_PDEATHSIG)
                recovery.append(broker.start())
            else:
                old = broker.kill_child(target)
                recovery.append(broker.wait_child_replaced(target, old))
            # The stream flows again before the next kill (or the end), however slowly the
            # publishers reconnect.
            wanted = acked() + 20
            wait_until(lambda n=wanted: acked() >= n, 120, "ACKs after the restart")
        stop_file.touch()
        stop_processes(publishers, timeout=300)
        assert all(p.exitcode == 0 for p in publishers), [p.exitcode for p in publishers]
    finally:
        stop_file.touch()
        stop_processes(publishers, timeout=30)
        broker.stop()
    result = audit(data_dir, TOPIC, acks)
    figure(
        f"{trials} SIGKILLs of the {target}: {result.line()}; "
        f"recovery max {max(recovery):.2f} s (seed {seed})"
    )
    assert result.acked > trials * 10
    assert result.lost == []
    assert result.moved == []
    assert result.duplicates == []
    assert result.gaps == []
    assert result.failed == 0
