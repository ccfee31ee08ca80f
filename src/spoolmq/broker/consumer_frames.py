"""Checking what a consumer (or an admin) asks of the ConsumerBroker: pure functions from a
decoded frame to the values the broker acts on, raising the error the client is sent.

>>> parse_subscribe({"op": "subscribe", "group": "billing", "topics": ["orders"]}).prefetch
1
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal, NamedTuple, TypeGuard

from spoolmq.broker.delivery import GroupSettings
from spoolmq.errors import InvalidArgumentError, ProtocolError
from spoolmq.store.message import check_extension
from spoolmq.store.names import check_topic
from spoolmq.types import TopicPartition

_MAX_GROUP_NAME = 200
_MAX_PREFETCH = 100_000
_MAX_REASON = 1000
_MAX_SETTLED = 1_000_000  # deliveries one ack/nack/extend frame may name


class Subscription(NamedTuple):
    """A checked ``subscribe`` frame."""

    group: str
    topics: list[str]
    start: Literal["earliest", "latest"]  # where a group new to a partition begins
    settings: GroupSettings
    prefetch: int


def parse_subscribe(frame: dict[str, Any]) -> Subscription:
    group = frame.get("group")
    topics = frame.get("topics")
    if not isinstance(group, str) or not group or len(group) > _MAX_GROUP_NAME:
        raise InvalidArgumentError(
            f"'group' must be a non-empty string of at most {_MAX_GROUP_NAME} chars"
        )
    if not isinstance(topics, list) or not topics:
        raise InvalidArgumentError("'topics' must be a non-empty list of topic names")
    for topic in topics:
        check_topic(topic)
    start = frame.get("start", "earliest")
    if start not in ("earliest", "latest"):
        raise InvalidArgumentError("'start' must be 'earliest' or 'latest'")
    raw_settings = frame.get("settings") or {}
    if not isinstance(raw_settings, dict):
        raise InvalidArgumentError("'settings' must be an object")
    known = {f.name for f in dataclasses.fields(GroupSettings)}
    unknown = sorted(str(name)[:40] for name in raw_settings if name not in known)
    if unknown:
        raise InvalidArgumentError(
            f"unknown group setting(s) {', '.join(map(repr, unknown[:5]))}: "
            f"known are {', '.join(sorted(known))}"
        )
    settings = GroupSettings(**raw_settings)
    prefetch = frame.get("prefetch", 1)
    if not isinstance(prefetch, int) or not 1 <= prefetch <= _MAX_PREFETCH:
        raise InvalidArgumentError(f"'prefetch' must be a whole number from 1 to {_MAX_PREFETCH}")
    return Subscription(group, topics, start, settings, prefetch)


def parse_credit(frame: dict[str, Any]) -> int:
    count = frame.get("n")
    if not isinstance(count, int):
        raise ProtocolError("'credit' needs an integer 'n'")
    return count


def _is_tag_list(value: Any) -> TypeGuard[list[int]]:
    return isinstance(value, list) and all(isinstance(t, int) for t in value)


def parse_runs(op: str, frame: dict[str, Any]) -> list[tuple[int, int]]:
    """The deliveries an ``ack``, ``nack`` or ``extend`` is about, as runs of consecutive
    tags ``(first tag, count)``: from ``runs`` (protocol 2) or a plain list of ``tags``.

    >>> parse_runs("ack", {"runs": [[40, 3]], "tags": [7]})
    [(40, 3), (7, 1)]
    """
    runs: list[tuple[int, int]] = []
    raw = frame.get("runs")
    if raw is not None:
        if not isinstance(raw, list):
            raise ProtocolError(f"{op!r} 'runs' must be a list of [first tag, count]")
        total = 0
        for run in raw:
            if (
                not isinstance(run, list)
                or len(run) != 2
                or not all(type(n) is int for n in run)
                or run[1] < 1
            ):
                raise ProtocolError(f"{op!r} 'runs' must be a list of [first tag, count]")
            total += run[1]
            if total > _MAX_SETTLED:
                raise ProtocolError(f"{op!r} settles at most {_MAX_SETTLED} deliveries a frame")
            runs.append((run[0], run[1]))
    tags = frame.get("tags")
    if tags is not None or raw is None:
        if not _is_tag_list(tags):
            raise ProtocolError(f"{op!r} needs 'runs' or 'tags', a list of delivery tags")
        runs.extend((tag, 1) for tag in tags)
    return runs


def expand_runs(runs: list[tuple[int, int]]) -> list[int]:
    """Every tag of ``runs``, for the per-delivery answers (NACK, extend, release)."""
    return [tag for first, count in runs for tag in range(first, first + count)]


def parse_seen(frame: dict[str, Any]) -> list[int] | None:
    """The deliveries a closing consumer's application got (``bye``); None: not said, so
    every delivery may have been processed."""
    seen = frame.get("seen")
    if seen is not None and not _is_tag_list(seen):
        raise ProtocolError("'seen' must be a list of delivery tags")
    return seen


def parse_nack(frame: dict[str, Any]) -> tuple[int | None, str | None]:
    """(delay_ms, reason) of a ``nack``; None for each one left to the group's rules."""
    delay = frame.get("delay_ms")
    if delay is not None and (not isinstance(delay, int) or delay < 0):
        raise InvalidArgumentError("delay_ms must be a non-negative integer")
    reason = frame.get("reason")
    return delay, str(reason)[:_MAX_REASON] if reason is not None else None


def parse_extend(frame: dict[str, Any]) -> float:
    """The seconds an ``extend`` asks for: more than 0, at most a thousand years."""
    return check_extension(frame.get("seconds"))


def parse_reset_offsets(offsets: list[Any]) -> dict[TopicPartition, int]:
    """``[[topic, partition, offset], ...]`` from an admin frame, checked before any of it
    is applied.

    >>> parse_reset_offsets([["orders", 0, 120]])
    {TopicPartition(topic='orders', partition=0): 120}
    """
    parsed: dict[TopicPartition, int] = {}
    for entry in offsets:
        if (
            not isinstance(entry, list)
            or len(entry) != 3
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in entry[1:])
        ):
            raise InvalidArgumentError(
                "each offset is [topic, partition, offset] with whole numbers >= 0"
            )
        parsed[TopicPartition(check_topic(entry[0]), entry[1])] = entry[2]
    return parsed
