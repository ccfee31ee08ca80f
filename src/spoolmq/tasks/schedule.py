"""Periodic jobs: when each one is due, and its ticks numbered so that each is sent once.

A job's ticks are numbered by their time: a tick's number is its epoch millisecond, whatever
the schedule, so the numbers of a job only grow when its schedule changes (numbered by the
schedule, ``every=2s`` made to ``every=60s`` would number its ticks 30 times lower than the
last one fired: never "due" again, and each one a duplicate to the broker). The scheduler
(spoolmq.tasks.scheduler) publishes a tick with the job's own producer id and the tick
number as the message's sequence, so the broker's idempotent publishing stores it once
even when two schedulers race or one retries after a broker restart; the tick's task id is
derived from the same number, so ``tasks.db`` holds one row for it too.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from spoolmq.errors import InvalidArgumentError

_EPOCH_MS_TICKS = 10**11  # a tick number at least this is an epoch millisecond

# A tick noticed later than this (seconds) after its time was missed: with
# ``catch_up=False`` it is skipped. Short jobs get half their interval.
MISFIRE_GRACE = 30.0


@dataclass(frozen=True)
class Periodic:
    """One periodic job: send task ``task`` with ``args``/``kwargs`` on a schedule."""

    name: str
    task: str
    cron: str | None
    every: float | None
    tz: str | None
    catch_up: bool
    args: list[Any] = field(default_factory=list)
    kwargs: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(
        cls,
        task: str,
        *,
        cron: str | None,
        every: float | None,
        tz: str | None,
        catch_up: bool,
        args: list[Any],
        kwargs: dict[str, Any],
        name: str | None,
    ) -> Periodic:
        from croniter import croniter

        if cron is not None and every is not None:
            raise InvalidArgumentError("a periodic job takes a cron expression or every=, not both")
        if cron is None and every is None:
            raise InvalidArgumentError("a periodic job needs either a cron expression or every=")
        if cron is not None and not croniter.is_valid(cron):
            raise InvalidArgumentError(f"not a cron expression: {cron!r}")
        if every is not None and every < 0.001:
            raise InvalidArgumentError("every= must be at least a millisecond")
        if tz is not None:
            if every is not None:
                raise InvalidArgumentError("tz= goes with a cron expression, not every=")
            try:
                ZoneInfo(tz)
            except (ZoneInfoNotFoundError, ValueError):
                raise InvalidArgumentError(f"unknown time zone: {tz!r}") from None
        job = cls("", task, cron, every, tz, catch_up, args, kwargs)
        return cls(name or f"{task}@{job.schedule}", task, cron, every, tz, catch_up, args, kwargs)

    @property
    def schedule(self) -> str:
        if self.cron is not None:
            return f"cron {self.cron}" + (f" {self.tz}" if self.tz else "")
        return f"every {self.every:g}s"

    @property
    def producer_id(self) -> str:
        """The job's producer id: the same in every process, unique per job name."""
        return "periodic-" + hashlib.sha256(self.name.encode()).hexdigest()[:24]

    def task_id(self, tick: int) -> str:
        return f"{self.producer_id}-{tick}"

    @property
    def grace(self) -> float:
        return MISFIRE_GRACE if self.every is None else min(MISFIRE_GRACE, self.every / 2)

    def latest_tick(self, now: float) -> tuple[int, float]:
        """The last tick at or before epoch time ``now``: (its number, its epoch time);
        the number is the time in epoch milliseconds."""
        if self.every is not None:
            every_ms = int(self.every * 1000)
            tick = int(now * 1000) // every_ms * every_ms
            return tick, tick / 1000
        from croniter import croniter

        zone = ZoneInfo(self.tz) if self.tz else UTC
        # From a second later: croniter's previous tick of an exact tick time is the one
        # before it.
        start = datetime.fromtimestamp(now, zone) + timedelta(seconds=1)
        when = croniter(self.cron, start).get_prev(datetime)
        seconds = int(when.timestamp())
        if seconds > now:  # the tick in that extra second is not due yet
            when = croniter(self.cron, when).get_prev(datetime)
            seconds = int(when.timestamp())
        return seconds * 1000, float(seconds)

    def next_time(self, now: float) -> float:
        """The epoch time of the first tick after ``now``."""
        if self.every is not None:
            return (self.latest_tick(now)[0] + int(self.every * 1000)) / 1000
        from croniter import croniter

        zone = ZoneInfo(self.tz) if self.tz else UTC
        return float(croniter(self.cron, datetime.fromtimestamp(now, zone)).get_next(float))


def tick_ms(schedule: str, tick: int | None) -> int | None:
    """When a job's tick was due (epoch ms), from its number and the job's ``schedule``
    (``Periodic.schedule``). A tick is numbered by its epoch millisecond; a tasks.db
    written before numbered a cron job's ticks by their epoch second and an ``every`` job's
    by time // interval: numbers below 10^11 (a millisecond of 1973) are read that way.

    >>> tick_ms("every 60s", 1_740_000_000_000), tick_ms("0 * * * *", 1_795_766_400_000)
    (1740000000000, 1795766400000)
    >>> tick_ms("every 60s", 29_000_000), tick_ms("0 * * * *", 1_795_766_400)
    (1740000000000, 1795766400000)
    """
    if tick is None or tick >= _EPOCH_MS_TICKS:
        return tick
    if schedule.startswith("every ") and schedule.endswith("s"):
        try:
            return tick * int(float(schedule[6:-1]) * 1000)
        except ValueError:
            return None
    return tick * 1000
