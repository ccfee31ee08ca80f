"""Typed, frozen configuration with documented defaults; unknown keys are refused.

Durations are milliseconds in code and accept ``"500ms"``, ``"30s"``, ``"15m"``,
``"2h"``, ``"14d"`` from users; sizes are bytes and accept ``"64MiB"``-style units.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import math
import os
import re
import socket
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, ParamSpec, TypeVar

from spoolmq.errors import ConfigError

DAY_MS = 24 * 3600 * 1000
MIB = 1024 * 1024
# The largest max_message_bytes: a stored record and the head of the frame that carries it
# fit the protocol's 64 MiB frame (protocol.MAX_FRAME_BYTES) with 1 MiB to spare.
MAX_MESSAGE_BYTES = 63 * MIB

CleanupPolicy = Literal["delete", "compact"]

_DURATION_UNITS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": DAY_MS, "w": 7 * DAY_MS}
_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "kib": 1024,
    "m": 1000**2,
    "mb": 1000**2,
    "mib": 1024**2,
    "g": 1000**3,
    "gb": 1000**3,
    "gib": 1024**3,
}


def host_port(host: str, port: int) -> str:
    """An address as a user writes it: an IPv6 host in brackets.

    >>> host_port("127.0.0.1", 9092), host_port("::1", 9092)
    ('127.0.0.1:9092', '[::1]:9092')
    """
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def address_family(host: str) -> socket.AddressFamily:
    """The family of the first address ``host`` names (AF_INET6 for ``::1``, a name by
    what it resolves to first); a name that does not resolve raises ``socket.gaierror``."""
    return socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]


def listen_error(address: tuple[str, int], exc: OSError, option: str = "") -> ConfigError:
    """The one-line error for failing to listen on ``address`` (a port taken, an
    address not of this host, a name that does not resolve), naming ``option``."""
    if isinstance(exc, socket.gaierror) or not exc.errno or exc.errno < 0:
        reason = exc.strerror or str(exc)  # a name that does not resolve, for one
    else:
        reason = os.strerror(exc.errno)  # without create_server's "(while attempting...)"
    where = host_port(*address) + (f" ({option})" if option else "")
    return ConfigError(f"cannot listen on {where}: {reason}")


def parse_duration_ms(text: str | int | float) -> int:
    """``"14d"`` -> 1209600000; text needs a unit (ms, s, m, h, d, w). A Python number is
    seconds. ``-1``/``"never"`` means unlimited.

    >>> parse_duration_ms("14d"), parse_duration_ms(1.5), parse_duration_ms("never")
    (1209600000, 1500, -1)
    """
    if isinstance(text, bool):
        raise ConfigError(f"a duration must be a number or a string like '30s', not {text!r}")
    if isinstance(text, int | float):
        if text < 0:
            return -1
        if text > MAX_DURATION_MS:  # (an int past 1e308 would overflow float())
            raise ConfigError(f"duration {text!r} is too long (at most {MAX_DURATION_MS} ms)")
        return _whole_ms(float(text) * 1000, text)
    value = text.strip().lower()
    if value in ("never", "-1", "unlimited"):
        return -1
    # Text needs its unit: "5" read as 5 seconds surprised a user who meant 5 days, and
    # a unit costs nothing to type. A Python number is seconds, as documented.
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)", value)
    if not match:
        raise ConfigError(
            f"bad duration {text!r}: use a number with a unit ms, s, m, h, d or w "
            "(e.g. '14d'), or 'never'"
        )
    return _whole_ms(float(match.group(1)) * _DURATION_UNITS[match.group(2)], text)


#: The largest number a setting takes, a duration in ms or a size in bytes: what SQLite's
#: and JSON's 64-bit integers hold with room to add a clock in epoch milliseconds to it
#: (as a duration, about 146 million years).
MAX_SETTING = 2**62
MAX_DURATION_MS = MAX_SETTING


def _whole_ms(ms: float, given: object) -> int:
    """A duration in whole milliseconds: ConfigError for one that is not finite, longer
    than MAX_DURATION_MS, or more than 0 and under 1 ms (which would be 0: "keep nothing")."""
    if not math.isfinite(ms):
        raise ConfigError(f"duration {given!r} is not a finite number")
    if ms > MAX_DURATION_MS:
        raise ConfigError(f"duration {given!r} is too long (at most {MAX_DURATION_MS} ms)")
    if 0 < ms < 1:
        raise ConfigError(f"duration {given!r} is under 1 ms: give 0 or at least 1ms")
    return int(ms)


def parse_size_bytes(text: str | int) -> int:
    """``"64MiB"`` -> 67108864. ``-1``/``"unlimited"`` means unlimited."""
    if isinstance(text, bool):
        raise ConfigError(f"a size must be a number or a string like '64MiB', not {text!r}")
    if isinstance(text, int):
        return -1 if text < 0 else text
    value = text.strip().lower()
    if value in ("unlimited", "-1"):
        return -1
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([kmg]i?b?|b)?", value)
    if not match:
        raise ConfigError(f"bad size {text!r}: use a number with a unit B, KiB, MiB or GiB")
    return int(float(match.group(1)) * _SIZE_UNITS[match.group(2) or ""])


T = TypeVar("T")


def setting_names(function: Callable[..., Any]) -> list[str]:
    """The keyword arguments ``function`` takes (``self`` and ``*args``/``**kwargs`` not)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return [
        name
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.kind in kinds and name != "self"
    ]


def check_settings(owner: str, given: Iterable[str], known: Iterable[str]) -> None:
    """Refuse settings ``owner`` does not know with a :class:`ConfigError` that names the
    closest known one and lists them all (a typo is otherwise a bare ``TypeError``).

    >>> try:
    ...     check_settings("Consumer", ["prefech"], ["prefetch", "lease"])
    ... except ConfigError as exc:
    ...     print(exc)
    Consumer has no setting 'prefech' (did you mean 'prefetch'?); known settings: lease, prefetch
    """
    names = sorted(set(known))
    unknown = [name for name in given if name not in names]
    if not unknown:
        return
    hints = []
    for name in unknown:
        close = difflib.get_close_matches(name, names, n=1)
        hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
    raise ConfigError(
        f"{owner} has no setting {', '.join(hints)}; known settings: {', '.join(names)}"
    )


P = ParamSpec("P")
R = TypeVar("R")


def known_settings(function: Callable[P, R]) -> Callable[P, R]:
    """Make a constructor refuse unknown keyword arguments with :func:`check_settings`'s
    ConfigError (the README promises it) instead of Python's TypeError."""
    names = setting_names(function)
    owner = function.__qualname__.removesuffix(".__init__")

    @functools.wraps(function)
    def checked(*args: P.args, **kwargs: P.kwargs) -> R:
        check_settings(owner, kwargs, names)
        return function(*args, **kwargs)

    return checked


def _build(cls: type[T], values: Mapping[str, Any], what: str) -> T:
    """Build a dataclass from a mapping, refusing keys the class does not have."""
    known = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"unknown {what} setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    return cls(**values)


@dataclass(frozen=True, slots=True)
class TopicConfig:
    """Settings of one topic, kept in ``state.db``.

    Attributes:
        partitions: number of partitions (1-1024); fixed once the topic exists.
        retention_ms: delete closed segments whose newest record is older than this
            (default 14 days; -1 keeps forever).
        retention_bytes: per partition, delete the oldest closed segments while the
            partition is larger than this (default -1, unlimited).
        cleanup_policy: ``"delete"`` (retention only) or ``"compact"`` (keep the newest
            record per key, then retention).
        segment_bytes: roll to a new segment file past this size (default 64 MiB).
        segment_ms: roll a segment whose first record is older than this (default 7 days).
        tombstone_retention_ms: on compacted topics, how long a ``None`` value (tombstone)
            is kept so readers see the delete (default 1 day).
    """

    partitions: int = 1
    retention_ms: int = 14 * DAY_MS
    retention_bytes: int = -1
    cleanup_policy: CleanupPolicy = "delete"
    segment_bytes: int = 64 * MIB
    segment_ms: int = 7 * DAY_MS
    tombstone_retention_ms: int = DAY_MS

    def __post_init__(self) -> None:
        if not isinstance(self.partitions, int) or not 1 <= self.partitions <= 1024:
            raise ConfigError(
                f"partitions must be a whole number from 1 to 1024, not {self.partitions!r}"
            )
        if self.cleanup_policy not in ("delete", "compact"):
            raise ConfigError(
                f"cleanup_policy must be 'delete' or 'compact', not {self.cleanup_policy!r}"
            )
        if not isinstance(self.segment_bytes, int) or self.segment_bytes < 1024:
            raise ConfigError(f"segment_bytes must be at least 1024, not {self.segment_bytes!r}")
        if not isinstance(self.segment_ms, int) or self.segment_ms < 1:
            raise ConfigError(f"segment_ms must be positive, not {self.segment_ms!r}")
        for name in ("retention_ms", "retention_bytes", "tombstone_retention_ms"):
            value = getattr(self, name)
            if not isinstance(value, int) or (value < 0 and value != -1) or value > MAX_SETTING:
                raise ConfigError(
                    f"{name} must be -1 (unlimited) or a number from 0 to 2**62, not {value!r}"
                )
        for name in ("segment_bytes", "segment_ms"):
            if getattr(self, name) > MAX_SETTING:
                raise ConfigError(f"{name} must be at most 2**62, not {getattr(self, name)!r}")

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> TopicConfig:
        """Build from user settings; durations and sizes may be strings ('14d', '64MiB')."""
        converted = dict(values)
        for name in ("retention_ms", "segment_ms", "tombstone_retention_ms"):
            if name in converted and isinstance(converted[name], str):
                converted[name] = parse_duration_ms(converted[name])
        for name in ("retention_bytes", "segment_bytes"):
            if name in converted and isinstance(converted[name], str):
                converted[name] = parse_size_bytes(converted[name])
        return _build(cls, converted, "topic")

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def differences(self, other: TopicConfig) -> str:
        """Each setting where ``other`` differs, as ``name: self's (wanted other's)``.

        >>> TopicConfig(partitions=1).differences(TopicConfig(partitions=3))
        'partitions: 1 (wanted 3)'
        """
        mine, theirs = self.as_dict(), other.as_dict()
        return ", ".join(
            f"{name}: {mine[name]} (wanted {theirs[name]})"
            for name in mine
            if mine[name] != theirs[name]
        )


@dataclass(frozen=True, slots=True)
class StoreConfig:
    """Settings of a data directory's store.

    Attributes:
        max_message_bytes: largest encoded record line accepted (default 1 MiB, at most
            63 MiB: a record must fit one 64 MiB frame with its head).
        index_interval_bytes: a sparse-index entry every this many bytes of log (default 4 KiB);
            smaller means faster seeks and a larger index.
        auto_create_topics: appending to a missing topic creates it with ``default_topic``.
        default_topic: settings for topics created without explicit ones.
        lock_timeout_s: how long to wait for a partition's file lock before failing.
        busy_timeout_ms: SQLite's busy timeout; writers wait this long for each other.
    """

    max_message_bytes: int = MIB
    index_interval_bytes: int = 4096
    auto_create_topics: bool = True
    default_topic: TopicConfig = field(default_factory=TopicConfig)
    lock_timeout_s: float = 30.0
    busy_timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_message_bytes, int)
            or not 64 <= self.max_message_bytes <= MAX_MESSAGE_BYTES
        ):
            raise ConfigError(
                f"max_message_bytes must be from 64 to {MAX_MESSAGE_BYTES} (63 MiB: a record "
                f"and its frame's head fit the protocol's 64 MiB frame), "
                f"not {self.max_message_bytes!r}"
            )
        if not isinstance(self.index_interval_bytes, int) or self.index_interval_bytes < 64:
            raise ConfigError(
                f"index_interval_bytes must be at least 64, not {self.index_interval_bytes!r}"
            )
        for name in ("lock_timeout_s", "busy_timeout_ms"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise ConfigError(f"{name} must be a positive number, not {value!r}")
        if not isinstance(self.auto_create_topics, bool):
            raise ConfigError(
                f"auto_create_topics must be True or False, not {self.auto_create_topics!r}"
            )
        if not isinstance(self.default_topic, TopicConfig):
            raise ConfigError(
                f"default_topic must be a TopicConfig, not {type(self.default_topic).__name__} "
                f"(StoreConfig.from_mapping takes a mapping of its settings)"
            )

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> StoreConfig:
        converted = dict(values)
        if "max_message_bytes" in converted and isinstance(converted["max_message_bytes"], str):
            converted["max_message_bytes"] = parse_size_bytes(converted["max_message_bytes"])
        if isinstance(converted.get("default_topic"), Mapping):
            converted["default_topic"] = TopicConfig.from_mapping(converted["default_topic"])
        return _build(cls, converted, "store")


DATA_ENV = "SPOOLMQ_DATA"
DEFAULT_DATA_DIR = "queue_data"


def resolve_data_dir(data: str | os.PathLike[str] | None = None) -> Path:
    """The data directory rule every command and client shares:
    the explicit argument, else ``$SPOOLMQ_DATA``, else ``./queue_data``; a ConfigError
    for an argument that is not a path (``data=5`` was a TypeError from deep inside)."""
    if data is not None and not isinstance(data, str | os.PathLike):
        raise ConfigError(f"data must be a path (str or os.PathLike), not {data!r:.60}")
    if data is not None and str(data) != "":
        return Path(data)
    env = os.environ.get(DATA_ENV)
    return Path(env) if env else Path(DEFAULT_DATA_DIR)
