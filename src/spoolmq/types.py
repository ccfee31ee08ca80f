"""Small value types shared by every layer (the store, the brokers, the clients, analytics)."""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


class TopicPartition(NamedTuple):
    """One partition of one topic."""

    topic: str
    partition: int


class EventType(StrEnum):
    """The ``type`` of a line in ``events/`` (docs/FORMAT.md). A ``StrEnum``: each member is
    the string written to the file, so ``EventType.ACKED == "acked"``."""

    DELIVERED = "delivered"  # handed to a consumer (attempt n)
    ACKED = "acked"  # settled by the consumer (or at once with auto_ack)
    NACKED = "nacked"  # the consumer gave it back; retried after a backoff
    LEASE_EXPIRED = "lease_expired"  # the consumer kept it past its lease; retried
    RELEASED = "released"  # its consumer left: returned unread, or counted as an attempt
    EXPIRED = "expired"  # its TTL passed before it was delivered
    CANCELLED = "cancelled"  # cancelled before it was delivered (Admin.cancel_message)
    DEAD_LETTERED = "dead_lettered"  # out of attempts: moved to <topic>.dlq
    SKIPPED = "skipped"  # deleted by retention before the group read it (a range)
    LAG = "lag"  # a group's committed offset and log end in a partition (periodic)


DEAD_LETTER_HEADER_PREFIX = "x-dlq-"


class DeadLetterHeader(StrEnum):
    """The headers a dead letter carries besides the original message's own."""

    REASON = "x-dlq-reason"  # why the last attempt failed
    ATTEMPTS = "x-dlq-attempts"  # deliveries made
    GROUP = "x-dlq-group"  # the consumer group that gave up
    TOPIC = "x-dlq-topic"  # where the original is: topic, partition, offset
    PARTITION = "x-dlq-partition"
    OFFSET = "x-dlq-offset"


def is_dead_letter_header(name: str) -> bool:
    """Was this header added by dead-lettering (and so is dropped when the message is
    replayed)?

    >>> is_dead_letter_header(DeadLetterHeader.REASON), is_dead_letter_header("trace")
    (True, False)
    """
    return name.startswith(DEAD_LETTER_HEADER_PREFIX)
