"""The supervisor's watch of the tasks' dead-letter topics.

A task message the broker gives up on goes to ``<topic>.dlq`` without any worker running it
to the end: no worker knew the task (each NACKed it), or its workers died ``max_deliveries``
times. Its row in ``tasks.db`` would stay ``queued`` or ``running`` and ``result()`` would
wait forever. The supervisor of ``spoolmq worker`` consumes those topics (the ones that
exist) as the group ``spoolmq-tasks-dlq`` and marks each task that the workers' group gave
up on ``dead_lettered``, with the broker's reason, so ``result()`` raises TaskFailed saying
why. The dead letter stays where it is: ``spoolmq
dlq list`` shows it and ``spoolmq dlq replay`` runs the task again.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import threading
import time
from collections.abc import Sequence

from spoolmq.client import Consumer, ReceivedMessage
from spoolmq.errors import SpoolError
from spoolmq.store.names import dlq_topic, topic_dir
from spoolmq.tasks.app import Tasks
from spoolmq.tasks.codec import task_id_of
from spoolmq.types import DeadLetterHeader

logger = logging.getLogger("spoolmq.tasks")

GROUP = "spoolmq-tasks-dlq"
RETRY_S = 5.0  # after tasks.db or the broker failed
LOOK_S = 10.0  # between looks for a .dlq topic that did not exist


class DeadLetterWatch:
    """Marks the tasks dead-lettered on ``topics`` (``run`` until stopped). It reads the
    ``.dlq`` topics that exist (a subscription would create the others, or be refused
    where topics are not created on use), and looks for new ones every LOOK_S."""

    def __init__(self, tasks: Tasks, topics: Sequence[str]) -> None:
        self.tasks = tasks
        self.topics: list[str] = []
        for topic in topics:
            with contextlib.suppress(SpoolError):  # a name too long for a .dlq: none made
                self.topics.append(dlq_topic(topic))
        self.recorded = 0

    def existing(self) -> list[str]:
        return [t for t in self.topics if topic_dir(self.tasks.data, t).is_dir()]

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            topics = self.existing()
            if not topics:
                stop.wait(LOOK_S)
                continue
            try:
                self._watch(topics, stop)
            except Exception as exc:  # the broker, tasks.db: whatever it was, again later
                logger.warning("the dead-letter watch stopped (starting again): %s", exc)
                stop.wait(RETRY_S)

    def _watch(self, topics: list[str], stop: threading.Event) -> None:
        """Until ``stop``, or until another of the ``.dlq`` topics exists."""
        with Consumer(
            topics,
            GROUP,
            data=self.tasks.data,
            address=self.tasks.address,
            authkey=self.tasks.authkey,
            prefetch=100,
            # A letter it cannot record now is NACKed and comes back; never to a
            # ``.dlq.dlq`` of its own.
            max_deliveries=1000,
            name="tasks dead-letter watch",
        ) as consumer:
            look_at = time.monotonic() + LOOK_S
            while not stop.is_set():
                message = consumer.receive(1.0)
                if message is not None:
                    self.record(message)
                if time.monotonic() >= look_at:
                    if self.existing() != topics:
                        return  # subscribe again, with the new one
                    look_at = time.monotonic() + LOOK_S

    def record(self, message: ReceivedMessage) -> None:
        value = message.value
        task_id = task_id_of(value)
        name = value.get("task") if task_id is not None else None
        if task_id is None:
            message.ack(wait=False)  # not a task message: nothing to record
            return
        headers = {
            name: value.decode(errors="replace") if isinstance(value, bytes) else str(value)
            for name, value in message.headers
        }
        if headers.get(DeadLetterHeader.GROUP) != self.tasks.group:
            message.ack(wait=False)  # another group gave up on it; the workers have not
            return
        reason = (
            f"dead-lettered to {message.topic} after {headers.get(DeadLetterHeader.ATTEMPTS)} "
            f"deliveries: {headers.get(DeadLetterHeader.REASON) or 'no reason given'}"
        )
        try:
            changed = self.tasks.store.dead_lettered(task_id, reason)
        except (SpoolError, sqlite3.Error) as exc:
            logger.warning("could not record dead-lettered task %s: %s", task_id, exc)
            message.nack(delay=RETRY_S, reason=str(exc)[:500], wait=False)
            return
        if changed:
            self.recorded += 1
            logger.error("task %s (%s) %s", task_id, name, reason)
        message.ack(wait=False)
