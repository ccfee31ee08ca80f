"""Point 8: 32 publisher processes at once, each 5,000 messages (about 30 s here, so CI runs
the full count): every message stored exactly once; no client sees "database is locked"."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path

import fault_workers
from fault_checks import SPAWN, start_process, stop_processes

from spoolmq import Log
from spoolmq.testing import BrokerProcess

PUBLISHERS = 32


def test_32_publisher_processes(
    broker: BrokerProcess,
    data_dir: Path,
    tmp_path: Path,
    long_run: bool,
    figure: Callable[[str], None],
) -> None:
    each = 5_000 if long_run else 1_000
    with Log(data_dir) as log:
        log.create_topic("crowd", partitions=4)
    start = SPAWN.Event()
    workers = [
        start_process(fault_workers.publish_count, str(data_dir), "crowd", w, each, start)
        for w in range(PUBLISHERS)
    ]
    try:
        began = time.monotonic()
        start.set()
        stop_processes(workers, timeout=600)
        took = time.monotonic() - began
        assert [w.exitcode for w in workers] == [0] * PUBLISHERS
    finally:
        stop_processes(workers, timeout=5)
    reports = [(tmp_path / f"pub-{w}").read_text().split("\n", 1) for w in range(PUBLISHERS)]
    acked = sum(int(count) for count, _ in reports)
    errors = [error for _, error in reports if error]
    broker.stop()
    seen: collections.Counter[tuple[int, int]] = collections.Counter()
    with Log(data_dir) as log:
        for partition in range(4):
            records = list(log.reader("crowd", partition))
            assert [r.offset for r in records] == list(range(len(records)))
            seen.update((r.value["w"], r.value["i"]) for r in records)
    broker_log = (tmp_path / "broker.log").read_text()
    figure(
        f"{PUBLISHERS} processes x {each:,} = {PUBLISHERS * each:,}: acked {acked:,}, stored "
        f"{sum(seen.values()):,}, duplicates {sum(c - 1 for c in seen.values())}, errors "
        f"{len(errors)}, 'database is locked' in broker log: "
        f"{broker_log.count('database is locked')}; took {took:.1f} s"
    )
    assert errors == []
    assert acked == PUBLISHERS * each
    assert set(seen) == {(w, i) for w in range(PUBLISHERS) for i in range(each)}
    assert all(count == 1 for count in seen.values())
    assert "database is locked" not in broker_log
