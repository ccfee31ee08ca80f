"""Dead letters: the message a group gave up on, as written to ``<topic>.dlq``.

A dead letter is the original record (value, key, headers, tags) plus ``x-dlq-*`` headers
that say where it came from and why it failed. The header names are defined once, in
``spoolmq.types`` (the task layer reads them too); the CLI's ``spoolmq dlq`` reads and strips
them with these names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import orjson

from spoolmq.broker.delivery import Pending
from spoolmq.errors import CorruptRecordError
from spoolmq.store.message import Headers, Message
from spoolmq.store.names import topic_dir
from spoolmq.store.record import record_from_fields
from spoolmq.types import DEAD_LETTER_HEADER_PREFIX, DeadLetterHeader, is_dead_letter_header

__all__ = [
    "DEAD_LETTER_HEADER_PREFIX",
    "DeadLetterHeader",
    "dead_letter_message",
    "dlq_depth",
    "is_dead_letter_header",
    "purged_offsets",
]

if TYPE_CHECKING:
    from spoolmq.store import Store


def dead_letter_message(group: str, pending: Pending) -> Message:
    """The message to append to ``<topic>.dlq`` for ``pending``, which ``group`` gave up
    on. Its producer id and sequence (the original offset) make a repeated write after a
    crash a duplicate, not a second dead letter."""
    record = record_from_fields(orjson.loads(pending.line))
    origin: Headers = [
        (DeadLetterHeader.REASON, pending.last_reason or "unknown"),
        (DeadLetterHeader.ATTEMPTS, str(pending.attempt)),
        (DeadLetterHeader.GROUP, group),
        (DeadLetterHeader.TOPIC, pending.topic),
        (DeadLetterHeader.PARTITION, str(pending.partition)),
        (DeadLetterHeader.OFFSET, str(pending.offset)),
    ]
    return Message(
        value=record.value,
        key=record.key,
        headers=[*record.headers, *origin],
        tags=record.tags,
        producer_id=f"dlq:{group}:{pending.topic}:{pending.partition}",
        sequence=pending.offset,
    )


PURGED_FILE = "purged.json"  # in logs/<topic>.dlq/: the DLQ offsets purged, by partition


def purged_offsets(store: Store, name: str) -> dict[int, set[int]]:
    """The purged offsets of DLQ topic ``name``, by partition (none if never purged)."""
    try:
        text = (topic_dir(store.path, name) / PURGED_FILE).read_bytes()
    except FileNotFoundError:
        return {}
    try:
        stored = orjson.loads(text)
        return {int(p): {int(o) for o in marks} for p, marks in stored.items()}
    except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError):
        raise CorruptRecordError(
            f"{topic_dir(store.path, name) / PURGED_FILE} is damaged; delete it to show "
            "every dead letter again (purged ones included)"
        ) from None


def dlq_depth(
    store: Store, dlq: str, partitions: int, *, purged: dict[int, set[int]] | None = None
) -> int:
    """The dead letters DLQ topic ``dlq`` holds: its records, less those purged (read
    from its ``purged.json`` unless given)."""
    if purged is None:
        purged = purged_offsets(store, dlq)
    depth = 0
    for partition in range(partitions):
        start = store.log_start_offset(dlq, partition)
        depth += store.log_end_offset(dlq, partition) - start
        depth -= sum(1 for offset in purged.get(partition, ()) if offset >= start)
    return depth
