"""Run a real broker as a subprocess, the way a user starts one: for the demo, tests, benchmarks.

`BrokerProcess` starts `python -m spoolmq broker --data DIR`, waits until it answers an admin
`stats` request with both children ready, knows the pids of the BrokerManager and of its two
children, and stops or kills them by pid. It never signals a process it did not start (or that
its broker did not). `wait_until` is the one bounded poll the tests share.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from spoolmq.errors import SpoolError

T = TypeVar("T")


def run_spoolmq(
    *args: str,
    stdin: str | None = None,
    timeout: float = 120.0,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """``spoolmq ARGS...`` as a user runs it (``python -m spoolmq``, this interpreter):
    the finished process with its exit code and text output. ``timeout`` bounds a command
    that should finish (a broker refused at start, a CLI command); ``env`` is added to
    this process's environment (``{"COLUMNS": "200"}``: a wide terminal's tables)."""
    return subprocess.run(
        [sys.executable, "-m", "spoolmq", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=None if env is None else {**os.environ, **env},
    )


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll ``predicate`` until it returns something true, and return that; raise
    TimeoutError naming ``what`` after ``timeout`` seconds.

    For another process's state (a file, a broker's answer), which offers nothing to wait
    on. Give a generous ``timeout``: it bounds a failure, it does not slow a pass.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is not a zombie (an orphan's end may
    wait for a reaper). Linux (``/proc``)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False


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
        """Wait until the broker answers with both children ready (a restarted child
        included) and reporting; return its `stats`."""

        def ready() -> dict[str, Any] | None:
            if self.process is not None and self.process.poll() is not None:
                raise SpoolError(f"the broker exited with status {self.process.returncode}")
            try:
                stats = self.stats()
            except SpoolError:
                return None  # not answering yet
            children_ready = all(stats["pids"].values()) and all(
                seconds is not None for seconds in stats["ready_s"].values()
            )
            return stats if children_ready and stats["publisher"] and stats["consumer"] else None

        try:
            return wait_until(ready, timeout, "the broker and both its children")
        except TimeoutError as exc:
            raise SpoolError(f"the broker was not ready within {timeout} s") from exc

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
        ``old_pid``) and both children are ready; return the seconds it took."""
        started = time.monotonic()
        deadline = started + timeout

        def replaced() -> bool:
            stats = self.wait_ready(max(0.1, deadline - time.monotonic()))
            return int(stats["pids"][name]) != old_pid

        try:
            wait_until(replaced, timeout, f"a new {name} broker")
        except TimeoutError as exc:
            raise SpoolError(f"the {name} broker was not restarted within {timeout} s") from exc
        return time.monotonic() - started

    def ready_seconds(self, name: str) -> float:
        """How long child ``name`` has been ready, as its manager counts (0 while it starts)."""
        return float(self.stats()["ready_s"][name] or 0.0)

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
