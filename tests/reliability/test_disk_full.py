"""Point 7: a full disk (a small tmpfs) and write errors (RLIMIT_FSIZE on the PublisherBroker:
EFBIG). Every publish is either ACKed and stored, or answered with an error; the broker keeps
running and stores again once there is room."""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import subprocess
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from fault_checks import pid_alive

from spoolmq import Consumer, Publisher, Store
from spoolmq.store.message import Position
from spoolmq.testing import BrokerProcess

TOPIC = "full"
SEGMENT_BYTES = 256 * 1024  # small enough that the tests roll segments while the disk is full


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 24 MiB tmpfs, unmounted after the test."""
    mount_point = tmp_path / "mnt"
    mount_point.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=24m,mode=0700", "tmpfs", str(mount_point)],
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs in CI: {done.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.strip()}); the EFBIG test runs")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", str(mount_point)], check=False)
        if os.path.ismount(mount_point):
            subprocess.run(["umount", "-l", str(mount_point)], check=True)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem has no byte left."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_CREAT | os.O_WRONLY, 0o600)
    try:
        for chunk in (1 << 20, 1 << 12, 1):
            while True:
                try:
                    os.write(fd, b"\0" * chunk)
                except OSError as exc:
                    assert exc.errno == errno.ENOSPC
                    break
    finally:
        os.close(fd)
    return filler


def publish_round(data_dir: Path, label: str, publishers: int = 4, each: int = 100) -> list[Any]:
    """Several publishers, each a batch of messages; returns (label, n, Position|error)."""
    outcomes: list[Any] = []
    clients = [Publisher(data=data_dir, delivery_timeout=60) for _ in range(publishers)]
    try:
        futures: list[tuple[int, int, Future[Position]]] = []
        for p, pub in enumerate(clients):
            for i in range(each):
                value = {"round": label, "p": p, "i": i, "pad": "x" * 2000}
                futures.append((p, i, pub.publish_async(TOPIC, value)))
        for pub in clients:
            with contextlib.suppress(Exception):
                pub.flush(60)
        for p, i, future in futures:
            try:
                outcomes.append((label, p, i, future.result(timeout=60)))
            except Exception as exc:
                outcomes.append((label, p, i, exc))
    finally:
        for pub in clients:
            with contextlib.suppress(Exception):
                pub.close()
    return outcomes


def check_store(data_dir: Path, outcomes: list[Any]) -> tuple[int, int, int]:
    """Every ACKed message stored once where it was ACKed; returns (acked, failed, failed
    but stored)."""
    with Store(data_dir) as store:
        records = list(store.reader(TOPIC, 0))
        assert store.check() == []
    assert [r.offset for r in records] == list(range(len(records)))
    stored = {(r.value["round"], r.value["p"], r.value["i"]): r.offset for r in records}
    assert len(stored) == len(records)
    acked = failed = failed_stored = 0
    for label, p, i, result in outcomes:
        if isinstance(result, Position):
            acked += 1
            assert stored.get((label, p, i)) == result.offset, (label, p, i)
        else:
            failed += 1
            failed_stored += (label, p, i) in stored
    return acked, failed, failed_stored


def run_fault(
    broker: BrokerProcess,
    data_dir: Path,
    start_fault: Callable[[], None],
    end_fault: Callable[[], None],
) -> tuple[list[Any], dict[str, Any]]:
    outcomes = publish_round(data_dir, "before")
    assert all(isinstance(o[3], Position) for o in outcomes)
    children = broker.child_pids()
    start_fault()
    try:
        during = publish_round(data_dir, "during")
        # the consumer side writes too (events, offsets) while there is no room
        with Consumer(TOPIC, group="g", data=data_dir, prefetch=50) as consumer:
            for _ in range(100):
                message = consumer.receive(timeout=10)
                assert message is not None
                message.ack()
        assert pid_alive(broker.pid)
        broker.stats()
    finally:
        end_fault()
    after = publish_round(data_dir, "after")
    assert all(isinstance(o[3], Position) for o in after), [o[3] for o in after][:3]
    stats = broker.stats()
    info = {"children": children, "now": broker.child_pids(), "restarts": stats["restarts"]}
    broker.stop()
    return outcomes + during + after, info


def describe(kind: str, outcomes: list[Any], data_dir: Path, info: dict[str, Any]) -> str:
    during = [o for o in outcomes if o[0] == "during"]
    errors = sorted({type(o[3]).__name__ for o in during if not isinstance(o[3], Position)})
    acked, failed, failed_stored = check_store(data_dir, outcomes)
    return (
        f"{kind}: {len(during)} publishes while full: "
        f"{sum(isinstance(o[3], Position) for o in during)} ACKed, "
        f"{failed} errors ({', '.join(errors)}); acked lost: 0 of {acked}; "
        f"errors that were stored anyway: {failed_stored}; broker restarts: {info['restarts']}"
    )


def test_disk_full(small_disk: Path, tmp_path: Path, figure: Callable[[str], None]) -> None:
    data_dir = small_disk / "queue_data"
    with Store(data_dir) as store:
        store.create_topic(TOPIC, segment_bytes=SEGMENT_BYTES)
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    broker.start()
    filler: list[Path] = []
    try:
        outcomes, info = run_fault(
            broker,
            data_dir,
            lambda: filler.append(fill(small_disk)),
            lambda: [path.unlink() for path in filler],
        )
    finally:
        broker.stop()
    line = describe("ENOSPC (tmpfs full)", outcomes, data_dir, info)
    figure(line)
    assert any(o[0] == "during" and not isinstance(o[3], Position) for o in outcomes)
    assert info["restarts"] == {"publisher": 0, "consumer": 0}, line


def test_write_errors(data_dir: Path, tmp_path: Path, figure: Callable[[str], None]) -> None:
    with Store(data_dir) as store:
        store.create_topic(TOPIC, segment_bytes=SEGMENT_BYTES)
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log")
    broker.start()
    limit = resource.RLIM_INFINITY

    def limit_file_size() -> None:
        pid = broker.child_pids()["publisher"]
        # Group commits write 100-300 of these 2 KiB messages at once, and a segment past
        # SEGMENT_BYTES rolls before the next batch, so a limit relative to the active
        # segment can be skipped over by a roll; a fixed 64 KiB stops every new batch.
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (64 * 1024, limit))

    def lift_limit() -> None:
        resource.prlimit(broker.child_pids()["publisher"], resource.RLIMIT_FSIZE, (limit, limit))

    try:
        outcomes, info = run_fault(broker, data_dir, limit_file_size, lift_limit)
    finally:
        broker.stop()
    line = describe("EFBIG (RLIMIT_FSIZE on the PublisherBroker)", outcomes, data_dir, info)
    figure(line)
    assert any(o[0] == "during" and not isinstance(o[3], Position) for o in outcomes)
    assert info["restarts"] == {"publisher": 0, "consumer": 0}, line
