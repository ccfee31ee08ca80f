"""Time for everything below the CLI: one seam, passed in, so tests can move it.

The store, the brokers and the delivery rules ask a :class:`Clock` for the wall time in
milliseconds instead of calling ``time`` themselves; a test gives them a
:class:`ManualClock` and moves it, instead of monkeypatching a module.

>>> clock = ManualClock(1_000)
>>> clock.now_ms()
1000
>>> clock.advance(250)
>>> clock.now_ms()
1250
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Milliseconds since the Unix epoch."""
        ...


class SystemClock:
    """The wall clock."""

    __slots__ = ()

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock that only moves when told to (tests, simulations)."""

    __slots__ = ("_now",)

    def __init__(self, start_ms: int = 0) -> None:
        self._now = start_ms

    def now_ms(self) -> int:
        return self._now

    def set(self, now_ms: int) -> None:
        self._now = now_ms

    def advance(self, ms: int) -> None:
        self._now += ms


SYSTEM_CLOCK = SystemClock()
