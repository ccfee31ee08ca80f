"""Delivery limits of a consumer group, per topic: a rate (``"50/s"``: at most 50
deliveries in any one-second window) and a concurrency cap (at most N deliveries in flight),
both across every consumer of the group. They travel in a ``subscribe`` frame's ``settings``
as ``"limits": {topic: {"rate": "50/s", "concurrency": 4}}`` (docs/PROTOCOL.md); the
ConsumerBroker enforces them as it dispatches (``spoolmq.broker.delivery``); the task layer
declares them per task. One parser here serves all three.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, NamedTuple

from spoolmq.errors import InvalidArgumentError
from spoolmq.store.names import check_topic

_RATE = re.compile(r"^\s*(\d+)\s*/\s*(s|m|h)\s*$")
_WINDOW_MS = {"s": 1_000, "m": 60_000, "h": 3_600_000}
_MAX_COUNT = 1_000_000_000
# The most attempts a message may be given (a subscription's max_deliveries): a delivery
# tag keeps its attempt in 10 bits, so that a tag from an earlier attempt is refused.
MAX_DELIVERIES = 1000


class Limit(NamedTuple):
    """One topic's limits: ``rate`` deliveries per ``window_ms`` (None: no rate limit) and
    at most ``concurrency`` in flight (None: no cap)."""

    rate: int | None
    window_ms: int
    concurrency: int | None


def parse_rate(text: Any) -> tuple[int, int]:
    """A rate limit as (deliveries, window in ms).

    >>> parse_rate("50/s"), parse_rate("10 / m")
    ((50, 1000), (10, 60000))
    >>> parse_rate("0.5/s")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    spoolmq.errors.InvalidArgumentError: a rate limit is a whole number per ..., not '0.5/s'
    """
    match = _RATE.match(text) if isinstance(text, str) else None
    if match is None or not 1 <= int(match.group(1)) <= _MAX_COUNT:
        raise InvalidArgumentError(
            "a rate limit is a whole number per second, minute or hour "
            f"('50/s', '30/m', '100/h'), not {text!r}"
        )
    return int(match.group(1)), _WINDOW_MS[match.group(2)]


def check_concurrency(value: Any) -> int:
    """A concurrency cap: a whole number of deliveries in flight, at least 1."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= _MAX_COUNT:
        raise InvalidArgumentError(f"concurrency must be a whole number from 1, not {value!r}")
    return value


def check_limits(spec: Any) -> dict[str, Limit]:
    """The limits of a ``settings`` object, checked, by topic.

    >>> check_limits({"emails": {"rate": "50/s", "concurrency": 4}})
    {'emails': Limit(rate=50, window_ms=1000, concurrency=4)}
    """
    if spec is None:
        return {}
    if not isinstance(spec, Mapping):
        raise InvalidArgumentError(
            "limits are an object: {topic: {'rate': '50/s', 'concurrency': 4}}"
        )
    checked: dict[str, Limit] = {}
    for topic, limit in spec.items():
        check_topic(topic)
        if not isinstance(limit, Mapping) or not limit or set(limit) - {"rate", "concurrency"}:
            raise InvalidArgumentError(
                f"the limits of topic {topic!r} are an object with 'rate' ('50/s') "
                "and/or 'concurrency' (a whole number)"
            )
        rate, window_ms = (None, 0)
        if limit.get("rate") is not None:
            rate, window_ms = parse_rate(limit["rate"])
        concurrency = limit.get("concurrency")
        if concurrency is not None:
            check_concurrency(concurrency)
        checked[topic] = Limit(rate, window_ms, concurrency)
    return checked
