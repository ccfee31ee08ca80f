"""A message a caller asks to append, before it is a record: its fields
(:class:`Message`), the keyword options every way of publishing takes
(:class:`PublishOptions`, declared once for ``Store.append``, ``Publisher.publish`` and
``publish_async``), the one check of its timing options (delay, deliver_at, ttl), the ACK
level asked for (:data:`Acks`) and where it was stored (:class:`Position`). Clients and the
wire codec import this and :mod:`~spoolmq.store.record`, never the writing store.

:mod:`spoolmq.store.record` turns a Message into the stored line; the wire codec
(:mod:`spoolmq.protocol.publish`) builds Messages with these same checks.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, TypedDict

from spoolmq.errors import InvalidArgumentError

HeaderValue = str | bytes
Headers = list[tuple[str, HeaderValue]]
HeadersInput = Mapping[str, HeaderValue] | Sequence[tuple[str, HeaderValue]] | None


@dataclass(slots=True)
class Message:
    """A message to append: what the caller chooses; offset and timestamp come from the log."""

    value: Any
    key: str | bytes | None = None
    headers: HeadersInput = None
    tags: Sequence[str] | None = None
    deliver_at: int | None = None
    expires_at: int | None = None
    producer_id: str | None = None
    sequence: int | None = None
    partition: int | None = None


class PublishOptions(TypedDict, total=False):
    """The keyword options of a message, declared once for every way to publish one
    (``Store.append``, ``Publisher.publish``, ``Publisher.publish_async``).

    ``key`` orders and partitions (text or raw bytes); ``headers`` are ``{name: str or
    bytes}`` or ``(name, value)`` pairs; ``tags`` are strings consumers filter on;
    ``partition`` overrides the key's partition; ``delay`` (seconds) or ``deliver_at``
    (epoch ms) hold the message back; ``ttl`` (seconds) drops it if not delivered by then;
    ``priority`` (0-9, default 0) delivers it before the lower ones it waits with
    (stored as the reserved header :data:`PRIORITY_HEADER`).
    """

    key: str | bytes | None
    headers: HeadersInput
    tags: Sequence[str] | None
    partition: int | None
    delay: float | None
    deliver_at: int | None
    ttl: float | None
    priority: int | None


#: The reserved header that carries a message's priority, one digit "1" to "9" (a message
#: without it has priority 0). The ``priority`` option sets it; a Kafka producer can set
#: it too. docs/FORMAT.md lists the reserved headers.
PRIORITY_HEADER = "x-spoolmq-priority"
PRIORITY_VALUES = frozenset("0123456789")


def check_priority(priority: Any) -> int:
    """A message priority: a whole number 0 (the default) to 9 (first).

    >>> check_priority(9)
    9
    >>> check_priority(10)
    Traceback (most recent call last):
    ...
    spoolmq.errors.InvalidArgumentError: priority must be a whole number 0-9, not 10
    """
    if isinstance(priority, bool) or not isinstance(priority, int) or not 0 <= priority <= 9:
        raise InvalidArgumentError(f"priority must be a whole number 0-9, not {priority!r}")
    return priority


def with_priority(headers: HeadersInput, priority: Any) -> HeadersInput:
    """``headers`` with the priority header added for a ``priority`` above 0 (0 and None
    store nothing: priority 0 is the default). Both a priority and the header: an error,
    rather than one of them winning in silence.

    >>> with_priority({"trace": "abc"}, 7)
    [('trace', 'abc'), ('x-spoolmq-priority', '7')]
    >>> with_priority(None, 0) is None
    True
    """
    if priority is None:
        return headers
    if not check_priority(priority):
        return headers
    pairs: list[Any] = list(
        headers.items() if isinstance(headers, Mapping) else headers if headers else ()
    )
    if any(
        isinstance(pair, tuple | list) and pair and pair[0] == PRIORITY_HEADER for pair in pairs
    ):
        raise InvalidArgumentError(f"give priority= or the {PRIORITY_HEADER} header, not both")
    pairs.append((PRIORITY_HEADER, str(priority)))
    return pairs


def priority_of(headers: Headers) -> int:
    """A message's priority read from its headers: 0 without the priority header.

    >>> priority_of([("x-spoolmq-priority", "9")]), priority_of([])
    (9, 0)
    """
    for name, value in headers:
        if name == PRIORITY_HEADER:
            return int(value) if isinstance(value, str) and value in PRIORITY_VALUES else 0
    return 0


def check_options(options: Mapping[str, Any]) -> None:
    """TypeError for a keyword that is not a publish option, as for a misspelt argument."""
    unknown = options.keys() - PublishOptions.__optional_keys__
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")


def _is_number(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return isinstance(value, int) or math.isfinite(value)  # (an int past 1e308 overflows it)


#: The longest ``delay`` or ``ttl`` (and NACK delay) a message takes, in seconds: a
#: thousand years, which epoch milliseconds in 64 bits hold with room to spare.
# The highest idempotence sequence: state.db keeps sequences as SQLite integers (signed
# 64-bit), and readers of the stored records (the Spark job among others) read them so.
MAX_SEQUENCE = 2**63 - 1
MAX_DELAY_S = 1000 * 365 * 24 * 3600
#: The latest ``deliver_at`` (epoch ms) a message takes.
MAX_EPOCH_MS = 2**62


def check_extension(seconds: Any) -> float:
    """The seconds of a lease extension (``extend_lease``): a finite number, more than 0
    and at most MAX_DELAY_S; an InvalidArgumentError otherwise (1e20 s would overflow
    the lease's end in ms, and NaN would compare as neither)."""
    if (
        not isinstance(seconds, int | float)
        or isinstance(seconds, bool)
        or not 0 < seconds <= MAX_DELAY_S  # False for NaN
    ):
        raise InvalidArgumentError(
            f"a lease extension must be a number of seconds more than 0 and at most "
            f"{MAX_DELAY_S} (a thousand years), not {seconds!r}"
        )
    return seconds


def check_at_most_max_delay(seconds: float, name: str) -> None:
    """InvalidArgumentError for a checked ``delay``/``ttl`` (or a NACK's delay) longer
    than MAX_DELAY_S."""
    if seconds > MAX_DELAY_S:
        raise InvalidArgumentError(
            f"{name} must be at most {MAX_DELAY_S} seconds (a thousand years), not {seconds!r}"
        )


def check_timing(delay: Any, deliver_at: Any, ttl: Any) -> None:
    """The one check of a message's timing options: ``delay`` (seconds, at least 0) or
    ``deliver_at`` (epoch ms, not both), and ``ttl`` (seconds, more than 0).

    >>> check_timing(1.5, None, 60)
    >>> check_timing(-1, None, None)
    Traceback (most recent call last):
    ...
    spoolmq.errors.InvalidArgumentError: delay must be at least 0 seconds, not -1
    """
    if delay is not None:
        if deliver_at is not None:
            raise InvalidArgumentError("give either delay (seconds) or deliver_at (ms), not both")
        if not _is_number(delay) or delay < 0:
            raise InvalidArgumentError(f"delay must be at least 0 seconds, not {delay!r}")
        check_at_most_max_delay(delay, "delay")
    if deliver_at is not None and (
        not isinstance(deliver_at, int)
        or isinstance(deliver_at, bool)
        or not 0 <= deliver_at <= MAX_EPOCH_MS
    ):
        raise InvalidArgumentError(
            f"deliver_at must be an integer from 0 to 2**62 (epoch ms), not {deliver_at!r}"
        )
    if ttl is not None and (not _is_number(ttl) or ttl <= 0):
        raise InvalidArgumentError(f"ttl must be more than 0 seconds, not {ttl!r}")
    if ttl is not None:
        check_at_most_max_delay(ttl, "ttl")


def seconds_to_ms(seconds: float) -> int:
    """A checked ``delay`` or ``ttl`` in whole milliseconds."""
    return round(seconds * 1000)


def schedule(delay: Any, deliver_at: Any, ttl: Any, now: int) -> tuple[int | None, int | None]:
    """Absolute ``deliver_at`` and ``expires_at`` (epoch ms) of a message published at
    ``now`` with the timing options ``check_timing`` checks.

    >>> schedule(2, None, 60, now=1_000)
    (3000, 63000)
    >>> schedule(None, None, 0.5, now=1_000)
    (None, 1500)
    """
    check_timing(delay, deliver_at, ttl)
    if delay is not None:
        deliver_at = now + seconds_to_ms(delay)
    expires_at = None if ttl is None else (deliver_at or now) + seconds_to_ms(ttl)
    return deliver_at, expires_at


def check_sequence(sequence: Any) -> None:
    """An idempotence sequence: None, or a whole number from 0 to ``MAX_SEQUENCE``."""
    if sequence is not None and (type(sequence) is not int or not 0 <= sequence <= MAX_SEQUENCE):
        raise InvalidArgumentError(
            f"sequence must be a whole number from 0 to 2**63 - 1, not {sequence!r:.60}"
        )


def message_from_options(
    value: Any,
    options: PublishOptions,
    *,
    now: int,
    producer_id: str | None = None,
    sequence: int | None = None,
) -> Message:
    """The Message that ``value`` published with ``options`` at ``now`` stores."""
    check_options(options)
    check_sequence(sequence)
    deliver_at, expires_at = schedule(
        options.get("delay"), options.get("deliver_at"), options.get("ttl"), now
    )
    return Message(
        value=value,
        key=options.get("key"),
        headers=with_priority(options.get("headers"), options.get("priority")),
        tags=options.get("tags"),
        deliver_at=deliver_at,
        expires_at=expires_at,
        producer_id=producer_id,
        sequence=sequence,
        partition=options.get("partition"),
    )


# The ACK level a publisher asks for: not waited for, written, or written and fsynced.
Acks = Literal["0", "1", "all"]


def normalize_acks(acks: str | int) -> Acks:
    """``"0"``, ``"1"`` or ``"all"`` (also ``0``, ``1``, ``-1``)."""
    text = str(acks).strip().lower()
    if text == "-1":
        text = "all"
    if text not in ("0", "1", "all"):
        raise InvalidArgumentError(f"acks must be '0', '1' or 'all', not {acks!r}")
    return text  # type: ignore[return-value]


class Position(NamedTuple):
    """Where a message was stored."""

    topic: str
    partition: int
    offset: int
    timestamp: int
    duplicate: bool = False
