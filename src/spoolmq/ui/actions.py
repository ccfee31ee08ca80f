"""What the console changes: dead letters redriven or purged. Group resets go straight to
:mod:`spoolmq.operations` (plan, then apply), as the CLI's do.

Thin on purpose: the work is :mod:`spoolmq.operations`', which the CLI shares, so that the
console and ``spoolmq dlq`` cannot disagree about what a redrive does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from spoolmq import operations
from spoolmq.errors import InvalidArgumentError
from spoolmq.store import Store
from spoolmq.ui.inputs import Search


def redrive(
    data: Path,
    topic: str,
    letters: list[tuple[int, int]] | None,
    query: Search,
    to_group: str | None,
) -> dict[str, Any]:
    """Republish dead letters of ``topic`` to it: ``letters`` (DLQ partition, offset)
    picked, or (None) all that match ``query``."""
    if letters is not None or query.filters or to_group is not None:
        raise InvalidArgumentError(
            "redriving a selection or to one group needs the DLQ operations of issue 12 "
            "point 9; this build redrives all of a topic's dead letters"
        )
    with Store(data) as store:
        store.topic_config(topic)  # UnknownTopicError for a topic that is not there
        result = operations.replay_dead_letters(store, topic)
    return {"replayed": result.replayed, "already_replayed": result.already_replayed}


def purge(data: Path, topic: str) -> dict[str, Any]:
    raise InvalidArgumentError("purging needs the DLQ operations of issue 12 point 9")
