"""Checking what a browser or an API client sends, as the CLI checks its arguments.

Nothing from a request is trusted: a topic name goes through :func:`check_topic` before a
path is built from it, an offset is a whole number ≥ 0, a time is ISO 8601 or epoch ms, a
search's bound is capped. A bad value is an :class:`InvalidArgumentError` (or
:class:`InvalidTopicError`), which the application answers with 400 and the message.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spoolmq.errors import InvalidArgumentError
from spoolmq.store import Record
from spoolmq.store.names import check_topic

MAX_PAGE = 500
MAX_SCAN = 1_000_000
DEFAULT_SCAN = 10_000
MAX_RESULTS = 1000
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
_FIELD = re.compile(r"[A-Za-z0-9_$-]+(\.[A-Za-z0-9_$-]+)*")

__all__ = ["check_topic"]


def whole(value: Any, what: str, *, low: int = 0, high: int | None = None) -> int:
    """A whole number in ``low`` .. ``high``, from a query string (text) or JSON (int)."""
    if isinstance(value, bool):
        raise InvalidArgumentError(f"{what} must be a whole number, not {value!r}")
    if isinstance(value, str) and re.fullmatch(r"-?[0-9]{1,19}", value.strip()):
        value = int(value)
    if not isinstance(value, int):
        raise InvalidArgumentError(f"{what} must be a whole number, not {value!r}")
    if value < low or (high is not None and value > high):
        bound = f"{low} to {high}" if high is not None else f"at least {low}"
        raise InvalidArgumentError(f"{what} must be {bound}, not {value}")
    return value


def optional_whole(value: Any, what: str, *, high: int | None = None) -> int | None:
    return None if value in (None, "") else whole(value, what, high=high)


def moment(value: Any, what: str = "time") -> int | None:
    """Epoch milliseconds from ISO 8601 (a zone-less time is UTC: the page sends UTC) or a
    number of ms; None for nothing."""
    if value in (None, ""):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return whole(value, what)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be an ISO date-time or epoch ms")
    try:
        parsed = dt.datetime.fromisoformat(value.strip())
    except ValueError:
        raise InvalidArgumentError(
            f"{what} is not an ISO date-time: {value!r} (e.g. 2026-11-22T09:30:00Z)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=dt.UTC)
    return int(parsed.timestamp() * 1000)


def group_name(value: Any) -> str:
    if not isinstance(value, str) or not _GROUP.fullmatch(value):
        raise InvalidArgumentError(f"invalid consumer group name {str(value)[:60]!r}")
    return value


def text(value: Any, what: str, *, limit: int = 1000) -> str | None:
    if value in (None, ""):
        return None
    if not isinstance(value, str) or len(value) > limit:
        raise InvalidArgumentError(f"{what} must be text of at most {limit} characters")
    return value


def _pair(value: Any, what: str) -> tuple[str, str] | None:
    item = text(value, what)
    if item is None:
        return None
    name, sep, wanted = item.partition("=")
    if not sep or not name:
        raise InvalidArgumentError(f"a {what} filter is NAME=VALUE, not {item!r}")
    return name, wanted


def _as_text(value: Any) -> str:
    """How a stored value compares with what the user typed: text as is, bytes as hex,
    anything else as its JSON-ish string (``1`` matches the number 1, ``true`` True)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    return str(value)


@dataclass(frozen=True, slots=True)
class Search:
    """What the message browser and the DLQ page search for: every filter given must hold.

    ``field`` is a dotted path into a JSON object value (``customer.id=7``)."""

    partition: int | None = None
    offset: int | None = None
    timestamp: int | None = None
    key: str | None = None
    header: tuple[str, str] | None = None
    tag: str | None = None
    field: tuple[str, str] | None = None
    max_scan: int = DEFAULT_SCAN
    max_results: int = MAX_RESULTS
    _path: tuple[str, ...] = dataclasses.field(default=(), repr=False)

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> Search:
        json_field = _pair(params.get("field"), "field")
        if json_field is not None and not _FIELD.fullmatch(json_field[0]):
            raise InvalidArgumentError(
                f"a field path is names joined by dots, not {json_field[0]!r}"
            )
        return cls(
            partition=optional_whole(params.get("partition"), "partition", high=100_000),
            offset=optional_whole(params.get("offset"), "offset"),
            timestamp=moment(params.get("time")),
            key=text(params.get("key"), "key"),
            header=_pair(params.get("header"), "header"),
            tag=text(params.get("tag"), "tag", limit=256),
            field=json_field,
            max_scan=whole(
                params.get("max_scan") or DEFAULT_SCAN, "max_scan", low=1, high=MAX_SCAN
            ),
            max_results=whole(
                params.get("max_results") or MAX_RESULTS, "max_results", low=1, high=MAX_RESULTS
            ),
            _path=tuple(json_field[0].split(".")) if json_field else (),
        )

    @property
    def filters(self) -> bool:
        return any(f is not None for f in (self.key, self.header, self.tag, self.field))

    def matches(self, record: Record) -> bool:
        if self.key is not None and (record.key is None or _as_text(record.key) != self.key):
            return False
        if self.header is not None:
            name, wanted = self.header
            if not any(h == name and _as_text(v) == wanted for h, v in record.headers):
                return False
        if self.tag is not None and self.tag not in record.tags:
            return False
        if self.field is not None:
            value: Any = record.value
            for step in self._path:
                if not isinstance(value, dict) or step not in value:
                    return False
                value = value[step]
            if _as_text(value) != self.field[1]:
                return False
        return True
