"""Run a real broker as a subprocess, the way a user starts one: for the demo, tests, benchmarks.

`BrokerProcess` starts `python -m spoolmq broker --data DIR`, waits until it answers an admin
`stats` request, knows the pids of the BrokerManager and of its two children, and stops or
kills them by pid. It never signals a process it did not start (or that its broker did not).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spoolmq.errors import SpoolError


class BrokerProcess:
    """One `spoolmq broker` subprocess on a data directory.

    >>> with BrokerProcess(tmp_path / "queue_data") as broker:   # doctest: +SKIP
    ...     broker.child_pids()["publisher"]
    """

    def __init__(
        self,
        data: str | os.PathLike[str],
        *,
        args: Sequence[str] = (),
        env: dict[str, str] | None = None,
        log_level: str = "warning",
        log_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.data = Path(data)
        self.args = list(args)
        self.env = env
        self.log_level = log_level
        self.log_file = Path(log_file) if log_file is not None else None
        self.process: subprocess.Popen[bytes] | None = None
        self._stats: dict[str, Any] = {}

    @property
    def pid(self) -> int:
        if self.process is None:
            raise SpoolError("the broker is not running")
        return self.process.pid

    def start(self, timeout: float = 60.0) -> float:
        """Start the broker; return the seconds until it answered a `stats` request."""
        if self.process is not None and self.process.poll() is None:
            raise SpoolError(f"the broker is already running (pid {self.process.pid})")
        command = [sys.executable, "-m", "spoolmq", "broker", "--data", str(self.data)]
        command += ["--log-level", self.log_level, *self.args]
        environment = {**os.environ, **(self.env or {})}
        started = time.monotonic()
        if self.log_file is not None:
            with open(self.log_file, "ab") as store:
                self.process = subprocess.Popen(
                    command, stdin=subprocess.DEVNULL, stderr=store, env=environment
                )
        else:
            self.process = subprocess.Popen(command, stdin=subprocess.DEVNULL, env=environment)
        try:
            self.wait_ready(timeout)
        except BaseException:  # Ctrl-C while it comes up included: stop what was started
            self.stop()
            raise
        return time.monotonic() - started

    def wait_ready(self, timeout: float = 60.0) -> dict[str, Any]:
        """Wait until the broker answers with both children up and reporting; return its
        `stats`."""
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() is not None:
                raise SpoolError(f"the broker exited with status {self.process.returncode}")
            try:
                stats = self.stats()
                if all(stats["pids"].values()) and stats["publisher"] and stats["consumer"]:
                    return stats
            except SpoolError:
                pass
            if time.monotonic() > deadline:
                raise SpoolError(f"the broker did not answer within {timeout} s")
            # Another process is coming up: there is nothing of ours to wait on.
            time.sleep(0.05)

    def stats(self) -> dict[str, Any]:
        from spoolmq.client import Admin

        with Admin(self.data) as admin:
            self._stats = admin.stats()
        return self._stats

    def tcp_address(self) -> tuple[str, int] | None:
        """The (host, port) of the broker's TCP listener (``--listen``), None without one."""
        listen = self.stats().get("listen")
        return (str(listen[0]), int(listen[1])) if listen else None

    def child_pids(self) -> dict[str, int]:
        """The pids of the PublisherBroker and the ConsumerBroker, as the manager reports them."""
        return {name: int(pid) for name, pid in self.stats()["pids"].items() if pid}

    def kill_child(self, name: str) -> int:
        """SIGKILL the PublisherBroker (``"publisher"``) or the ConsumerBroker
        (``"consumer"``); the manager restarts it. Returns the killed pid."""
        pid = self.child_pids()[name]
        os.kill(pid, signal.SIGKILL)
        return pid

    def wait_child_replaced(self, name: str, old_pid: int, timeout: float = 60.0) -> float:
        """Wait until the manager has restarted child ``name`` (a pid other than
        ``old_pid``) and both children are up; return the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout
        while True:
            stats = self.wait_ready(max(0.1, deadline - time.monotonic()))
            pid = stats["pids"].get(name)
            if pid and int(pid) != old_pid:
                return time.monotonic() - started
            if time.monotonic() > deadline:
                raise SpoolError(f"the {name} broker was not restarted within {timeout} s")
            # The manager restarts it after a backoff; nothing to wait on from outside.
            time.sleep(0.05)

    def pids(self) -> list[int]:
        """The manager and its children (the children as last seen)."""
        children = [int(p) for p in self._stats.get("pids", {}).values() if p]
        return ([self.process.pid] if self.process is not None else []) + children

    def stop(self, signum: int = signal.SIGTERM, timeout: float = 30.0) -> int:
        """Ask the broker to stop; SIGKILL it after `timeout`. Returns its exit status."""
        if self.process is None:
            return 0
        process, self.process = self.process, None
        if process.poll() is None:
            process.send_signal(signum)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        return process.returncode

    def kill(self) -> None:
        """SIGKILL the BrokerManager (its children follow it: they watch their parent)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(10)
            self.process = None

    def __enter__(self) -> BrokerProcess:
        if self.process is None:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
