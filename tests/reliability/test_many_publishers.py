"""Point 8: 32 publisher processes at once, each 5,000 messages (about 30 s here, so CI runs
the full count): every message stored exactly once; no client sees "database is locked"."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable
from pathlib import Path

import fault_workers
from fault_checks import SPAWN, start_process, stop_processes

from spoolmq import Store
from spoolmq.testing import BrokerProcess

PUBLISHERS = 32


def test_32_publisher_processes(
    broker: BrokerProcess,
    data_dir: Path,
    tmp_path: Path,
    figure: Callable[[str], None],
) -> None:
    each = 5_000
    with Store(data_dir) as store:
        store.create_topic("crowd", partitions=4)
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
    with Store(data_dir) as store:
        for partition in range(4):
            records = list(store.reader("crowd", partition))
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


def test_32_processes_open_a_new_store_at_once(
    data_dir: Path, tmp_path: Path, long_run: bool, figure: Callable[[str], None]
) -> None:
    """The embedded store, no broker: 32 processes create and write one new store together
    (SQLite answers "database is locked" at once to some of that, without waiting)."""
    rounds = 5 if long_run else 2
    failures: list[str] = []
    for round_number in range(rounds):
        store = data_dir.parent / f"store-{round_number}"
        start = SPAWN.Event()
        outs = [tmp_path / f"open-{round_number}-{w}" for w in range(PUBLISHERS)]
        workers = [
            start_process(fault_workers.open_and_append, str(store), w, 20, start, str(outs[w]))
            for w in range(PUBLISHERS)
        ]
        start.set()
        stop_processes(workers, timeout=300)
        failures += [text for out in outs if (text := out.read_text()) != "ok"]
        with Store(store) as store:
            records = list(store.reader("crowd", 0))
        assert [r.offset for r in records] == list(range(len(records)))
        if not failures:
            assert len(records) == PUBLISHERS * 20
    figure(
        f"{rounds} x {PUBLISHERS} processes opening a new store at once: "
        f"{len(failures)} saw an error ({sorted(set(failures))[:2]})"
    )
    assert failures == []
