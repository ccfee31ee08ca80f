"""Shared pieces of the group coordinator and SASL tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class _Timer:
    due: float
    callback: Callable[[], object]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class ManualTimers:
    """``call_later`` on a clock that moves only when the test says so: timeouts of the
    coordinator are tested without waiting for them."""

    now: float = 0.0
    timers: list[_Timer] = field(default_factory=list)

    def call_later(self, delay: float, callback: Callable[[], object]) -> _Timer:
        timer = _Timer(self.now + delay, callback)
        self.timers.append(timer)
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock, firing every timer that falls due, in due order."""
        target = self.now + seconds
        while True:
            due = [t for t in self.timers if not t.cancelled and t.due <= target]
            if not due:
                break
            timer = min(due, key=lambda t: t.due)
            self.timers.remove(timer)
            self.now = timer.due
            timer.callback()
        self.now = target

    def pending(self) -> int:
        return sum(1 for t in self.timers if not t.cancelled)


def outward_address() -> str | None:
    """An IPv4 address of this machine that is not loopback (where a listener must demand
    SASL), or None. A UDP "connect" sends nothing; it only makes the OS pick the address."""
    import ipaddress
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        try:
            sock.connect(("192.0.2.1", 9))
            host = str(sock.getsockname()[0])
        except OSError:
            return None
    return None if ipaddress.ip_address(host).is_loopback else host


def self_signed_certificate(directory: Path, host: str) -> tuple[Path, Path]:
    """A throwaway certificate for ``host`` (an IP address) and its key, made by the
    ``openssl`` command (the ``cryptography`` package is not installed here)."""
    import subprocess

    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=spoolmq-test",
            "-addext",
            f"subjectAltName=IP:{host}",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    return cert, key
