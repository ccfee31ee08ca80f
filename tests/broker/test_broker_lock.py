"""One broker per data directory, and probes of that lock never refuse a starting broker."""

from __future__ import annotations

import threading
from pathlib import Path

from spoolmq.broker.manager import broker_lock, broker_running
from spoolmq.inotify import IN_OPEN, open_inotify
from spoolmq.testing import BrokerProcess, run_spoolmq, wait_until


def test_a_second_broker_on_the_same_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    with BrokerProcess(data) as running:
        assert broker_running(data)
        second = run_spoolmq("broker", "--data", str(data))
        assert second.returncode != 0
        assert f"already running on {data}" in second.stderr
        assert f"process {running.pid}" in second.stderr
        assert "Traceback" not in second.stderr
        running.stats()  # the first one is untouched


def test_a_broker_started_during_a_probe_of_the_lock_starts(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    data.mkdir(mode=0o700)
    # Another process's probe (the console's, every 2 s) holds the lock at the moment the
    # broker tries to take it; it lets go a moment later, as a probe does.
    probe = broker_lock(data)
    probe.acquire()
    opens = open_inotify()
    assert opens is not None and opens.watch(data / "broker.lock", IN_OPEN) >= 0
    started = threading.Event()
    broker = BrokerProcess(data)

    def start() -> None:
        broker.start()
        started.set()

    thread = threading.Thread(target=start)
    thread.start()
    try:
        # Release only once the broker has tried for the lock (opened the lock file): a
        # broker that gives up at once then exits, and fails the test.
        wait_until(opens.read, 60, "the broker to try for the lock")
        assert not started.is_set()
        probe.release()
        thread.join(90)
        assert started.is_set(), "the broker gave up instead of waiting the probe out"
        assert broker_running(data)
    finally:
        if probe.is_locked:
            probe.release()
        thread.join(90)
        broker.stop()
        opens.close()
