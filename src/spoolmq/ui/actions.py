"""What the console changes in dead-letter queues: redrive and purge. Group resets go
straight to :mod:`spoolmq.operations` (plan, then apply), as the CLI's do.

Thin on purpose: the work is :mod:`spoolmq.operations`', which ``spoolmq dlq`` shares, so
the console and the CLI cannot disagree about what a redrive or a purge does (nor about
which topics have dead letters: a deleted topic's DLQ is still reached). What the
console adds is its own search (key, header, tag, JSON field): the letters it matches are
handed to the operations as (DLQ partition, DLQ offset) pairs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spoolmq import operations
from spoolmq.store import Store
from spoolmq.ui.inputs import Search

Letters = list[tuple[int, int]]


def _picked(store: Store, topic: str, letters: Letters | None, query: Search) -> Letters | None:
    """The pairs to act on: those the search matches, of the ``letters`` given (None: of
    all); None again when nothing narrows the choice, so the operation takes every letter.
    A filter given with letters is never passed over: a letter it does not match is left
    alone."""
    if not query.narrows:
        return letters
    given = None if letters is None else set(letters)
    return [
        (d.dlq_partition, d.dlq_offset)
        for d in operations.dead_letters(store, topic)
        if (given is None or (d.dlq_partition, d.dlq_offset) in given)
        and query.filters.matches(d.record)
    ]


def redrive(
    data: Path, topic: str, letters: Letters | None, query: Search, to_group: str | None
) -> dict[str, Any]:
    """Republish dead letters of ``topic`` to it (to every group, or ``to_group`` only):
    the ``letters`` picked, or all that match ``query``."""
    with Store(data) as store:
        offsets = _picked(store, topic, letters, query)
        if offsets == []:
            return {"replayed": 0, "already_replayed": 0, "tasks_queued": 0}
        result = operations.replay_dead_letters(store, topic, offsets=offsets, to_group=to_group)
    return {
        "replayed": result.replayed,
        "already_replayed": result.already_replayed,
        "tasks_queued": result.tasks_queued,
    }


def purge(data: Path, topic: str, letters: Letters | None, query: Search) -> dict[str, Any]:
    """Purge dead letters of ``topic``: the ``letters`` picked, or all that match."""
    with Store(data) as store:
        offsets = _picked(store, topic, letters, query)
        if offsets == []:
            return {"purged": 0}
        return {"purged": operations.purge_dead_letters(store, topic, offsets=offsets)}
