"""Shared pieces of the group coordinator and SASL tests."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


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
