"""Checking what a browser or an API client sends, as the CLI checks its arguments.

Nothing from a request is trusted: a topic name goes through :func:`check_topic` before a
path is built from it, an offset is a whole number ≥ 0, a time is ISO 8601 or epoch ms, a
search's bound is capped. A bad value is an :class:`InvalidArgumentError` (or
:class:`InvalidTopicError`), which the application answers with 400 and the message.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from spoolmq.browse import Filters, Start, parse_time
from spoolmq.errors import InvalidArgumentError
from spoolmq.store.names import check_topic

MAX_PAGE = 500
MAX_SCAN = 1_000_000
DEFAULT_SCAN = 10_000
MAX_RESULTS = 1000
_GROUP = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:@-]{0,127}")
#: What narrows the records kept, in a topic's search and a DLQ's filter alike.
FILTER_KEYS = ("key", "header", "tag", "field")
#: What a topic's search takes: the filters, where it starts and its bounds.
SEARCH_KEYS = (*FILTER_KEYS, "partition", "offset", "time", "max_scan", "max_results")

__all__ = ["check_topic"]


def direction(value: str | None) -> bool:
    """A page's ``direction``: True for ``back``; ``forward`` (or none) is False."""
    if value in (None, "", "forward"):
        return False
    if value == "back":
        return True
    raise InvalidArgumentError(f"direction is 'back' or 'forward', not {value[:40]!r}")


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
    """Epoch milliseconds from ISO 8601 (a zone-less time is UTC, as the log's timestamps
    and the page are) or a number of ms; None for nothing."""
    if value in (None, ""):
        return None
    if isinstance(value, int) or (isinstance(value, str) and value.strip().isdigit()):
        return whole(value, what)
    if not isinstance(value, str):
        raise InvalidArgumentError(f"{what} must be an ISO date-time or epoch ms")
    return parse_time(value, zoneless="utc")


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


@dataclass(frozen=True, slots=True)
class Search:
    """What the message browser and the DLQ page search for: a start, the partition (None:
    all), the :class:`Filters` of :mod:`spoolmq.browse` (shared with ``spoolmq read``, so
    both refuse the same input with the same message) and the bounds."""

    partition: int | None
    start: Start
    filters: Filters
    max_scan: int
    max_results: int

    @classmethod
    def parse(cls, params: Mapping[str, Any]) -> Search:
        """A topic's search; a name it does not know is refused rather than ignored (a
        mistyped filter would otherwise keep every record)."""
        _only(params, SEARCH_KEYS, "a search")
        offset = optional_whole(params.get("offset"), "offset")
        when = moment(params.get("time"))
        if offset is not None and when is not None:
            raise InvalidArgumentError("a search starts from an offset or a time, not both")
        start = Start("time", when) if when is not None else Start()
        if offset is not None:
            start = Start("offset", offset)
        header, tag, field = (text(params.get(n), n) for n in ("header", "tag", "field"))
        return cls(
            partition=optional_whole(params.get("partition"), "partition", high=100_000),
            start=start,
            filters=Filters.parse(
                key=text(params.get("key"), "key"),
                headers=[header] if header else [],
                tags=[tag] if tag else [],
                fields=[field] if field else [],
            ),
            max_scan=whole(
                params.get("max_scan") or DEFAULT_SCAN, "max_scan", low=1, high=MAX_SCAN
            ),
            max_results=whole(
                params.get("max_results") or MAX_RESULTS, "max_results", low=1, high=MAX_RESULTS
            ),
        )

    @classmethod
    def dead_letters(cls, params: Any) -> Search:
        """A DLQ's filter: the filters alone. A redrive or a purge acts on every letter the
        filter keeps, so a name it does not know (a typo, or ``partition``, ``offset`` and
        ``time``, which pick records of a topic, not letters) is refused, never dropped."""
        if not isinstance(params, Mapping):
            raise InvalidArgumentError(
                f"a dead-letter filter is a JSON object with {_listed(FILTER_KEYS)}"
            )
        _only(params, FILTER_KEYS, "a dead-letter filter")
        for name, value in params.items():
            # Given but empty would narrow nothing, and "all matching" would be every letter.
            if value is None or value == "":
                raise InvalidArgumentError(
                    f"the dead-letter filter's {name} is empty: give a value or leave it out"
                )
        return cls.parse({name: params.get(name) for name in FILTER_KEYS})

    @property
    def narrows(self) -> bool:
        """Whether any filter was given (else a search keeps every record)."""
        return not self.filters.empty


def _listed(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + " or " + names[-1]


def _only(params: Mapping[str, Any], allowed: tuple[str, ...], what: str) -> None:
    unknown = [str(name) for name in params if name not in allowed]
    if unknown:
        raise InvalidArgumentError(f"{what} takes {_listed(allowed)}, not {unknown[0][:40]!r}")
