"""The scheduler: sends each periodic job's due tick, once per tick across processes.

Any number of schedulers may run (every ``spoolmq worker`` runs one unless told not to).
For each job it reads the last tick handled from ``tasks.db``; when a later tick is due it
publishes that one tick (so ticks missed while nothing ran collapse into one send on
return, or are skipped with ``catch_up=False`` when late), then records it as handled.
Two schedulers that both see the tick due publish the same message with the job's producer
id and the tick number as sequence: the broker stores it once (and remembers that across a
restart, from its producer ranges), and the tick's task id makes one ``tasks.db`` row.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from spoolmq.client import Publisher
from spoolmq.errors import SpoolError
from spoolmq.tasks.app import Tasks, task_message
from spoolmq.tasks.schedule import Periodic

logger = logging.getLogger("spoolmq.tasks")


class Scheduler:
    """Sends the due ticks of ``tasks.periodics``; ``step`` once, or ``run`` until stopped."""

    def __init__(self, tasks: Tasks) -> None:
        self.tasks = tasks
        self._publishers: dict[str, Publisher] = {}
        # (job, tick, whether the broker already had it) of each send, oldest first.
        self.fired: list[tuple[str, int, bool]] = []

    def _publisher(self, job: Periodic) -> Publisher:
        publisher = self._publishers.get(job.name)
        if publisher is None:
            publisher = Publisher(
                self.tasks.data,
                address=self.tasks.address,
                authkey=self.tasks.authkey,
                producer_id=job.producer_id,
                name="scheduler",
            )
            self._publishers[job.name] = publisher
        return publisher

    def step(self, now: float | None = None) -> float:
        """Send what is due at ``now``; return the epoch time of the next tick."""
        now = time.time() if now is None else now
        soonest = now + 60.0
        for job in self.tasks.periodics.values():
            tick, when = job.latest_tick(now)
            next_time = job.next_time(now)
            soonest = min(soonest, next_time)
            last = self.tasks.store.periodic_last_tick(job.name, job.task, job.schedule)
            if last is not None and tick <= last:
                continue
            # A first run starts from now: no tick from before the job existed is sent.
            late = last is None or now - when > job.grace
            fire = not late or (last is not None and job.catch_up)
            if fire:
                self._fire(job, tick)
            self.tasks.store.periodic_advance(job.name, tick, int(next_time * 1000), fire)
        return soonest

    def _fire(self, job: Periodic, tick: int) -> None:
        task = self.tasks.registry[job.task]
        publisher = self._publisher(job)
        task_id = job.task_id(tick)
        self.tasks.store.add(
            task_id,
            name=task.name,
            topic=task.topic,
            args={"args": job.args, "kwargs": job.kwargs},
            key=None,
            priority=task.priority,
            eta_ms=None,
            result_ttl_ms=None if task.result_ttl is None else int(task.result_ttl * 1000),
        )
        # The tick number is the message's sequence. Only this thread uses this Publisher,
        # so nothing else takes a number from it meanwhile.
        publisher.set_next_sequence(tick)
        value: dict[str, Any] = task_message(task, task_id, job.args, job.kwargs, task.priority)
        position = publisher.publish(task.topic, value)
        self.fired.append((job.name, tick, position.duplicate))
        logger.info(
            "periodic %s: tick %d sent as task %s%s",
            job.name,
            tick,
            task_id,
            " (already stored by another scheduler)" if position.duplicate else "",
        )

    def run(self, stop: threading.Event) -> None:
        """Until ``stop`` is set: send due ticks, sleeping until the next one (at most 1 s,
        so a stop or a tick due sooner than thought is noticed)."""
        while not stop.is_set():
            try:
                soonest = self.step()
            except (SpoolError, OSError) as exc:
                logger.warning("the scheduler could not send a tick (will retry): %s", exc)
                soonest = time.time() + 1.0
            stop.wait(max(0.01, min(1.0, soonest - time.time())))

    def close(self) -> None:
        for publisher in self._publishers.values():
            publisher.close()
        self._publishers.clear()
