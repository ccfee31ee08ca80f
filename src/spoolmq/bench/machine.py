"""What the bench measures of the machine and of processes: the facts recorded with every
result, the memory and CPU of a server's processes, and the disk's fdatasync time."""

from __future__ import annotations

import contextlib
import os
import platform
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def machine_facts() -> dict[str, Any]:
    """CPUs, Python, platform, spoolmq version, load average, CPU model and memory."""
    from spoolmq import __version__

    facts: dict[str, Any] = {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "spoolmq": __version__,
        "load_average_start": list(os.getloadavg()),
    }
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                facts["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal"):
                facts["memory_kib"] = int(line.split()[1])
    return facts


def disk_facts(path: Path) -> dict[str, Any]:
    """The filesystem and block device holding ``path`` (from /proc/mounts), if known."""
    facts: dict[str, Any] = {}
    best = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            device, mount, fstype = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best = mount
                facts = {"disk_device": device, "disk_mount": mount, "disk_filesystem": fstype}
    name = Path(facts.get("disk_device", "")).name
    with contextlib.suppress(OSError):
        rotational = Path(f"/sys/block/{name}/queue/rotational").read_text().strip()
        facts["disk_rotational"] = rotational == "1"
    return facts


def fdatasync_ms(directory: Path, count: int = 200, size: int = 350) -> list[float]:
    """Times (ms) of ``count`` appends of ``size`` bytes each followed by fdatasync, in a
    file in ``directory``: the disk's floor under a publish with ACK ``all``."""
    times: list[float] = []
    fd, name = tempfile.mkstemp(dir=directory)
    try:
        for _ in range(count):
            os.write(fd, b"x" * size)
            started = time.perf_counter()
            os.fdatasync(fd)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        os.close(fd)
        os.unlink(name)
    return times


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds used so far by the processes ``pids`` (gone ones count 0)."""
    import psutil

    total = 0.0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


class RssSampler:
    """Peak RSS (MiB) of a server's processes, sampled every 50 ms in a thread."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self._pids = pids
        self.peak_mib = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def current_mib(self) -> float:
        import psutil

        total = 0
        for pid in self._pids():
            with contextlib.suppress(psutil.Error):
                total += psutil.Process(pid).memory_info().rss
        return total / (1024 * 1024)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            self.peak_mib = max(self.peak_mib, self.current_mib())

    def start(self) -> None:
        self.peak_mib = self.current_mib()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def __enter__(self) -> RssSampler:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
