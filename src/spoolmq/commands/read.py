"""``spoolmq read``: print a topic's messages from the store, with no broker and no group.

Like kcat ``-C``: nothing is leased, ACKed or committed, so reading never disturbs a
consumer group, and it works on a stopped broker's data directory. The records come from
:func:`spoolmq.browse.browse`. ``--follow`` keeps tailing: it sleeps in ``select`` on an
inotify descriptor watching the partitions' directories (opened through ctypes; Linux), so
it wakes as soon as the broker writes a segment or starts a new one, not on a timer. Where
inotify is missing it falls back to polling every 5 ms. SIGINT or SIGTERM end a follow
with exit status 0, as ``tail -f`` users expect of a Ctrl-C.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import selectors
import signal
import string
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import orjson

from spoolmq.browse import json_shown, text_shown
from spoolmq.commands.common import CommandFactory, data_dir
from spoolmq.errors import InvalidArgumentError
from spoolmq.inotify import open_inotify

# What a --format template may name: {offset}, {value}, ...
FORMAT_FIELDS = frozenset(
    {"topic", "partition", "offset", "timestamp", "key", "value", "headers", "tags"}
)
# The fallback poll when inotify is not available: a few ms, so a tail still feels live.
_POLL_S = 0.005


def check_template(template: str) -> str:
    """The ``--format`` template, checked: only plain ``{field}`` names from
    :data:`FORMAT_FIELDS` (no attribute or index lookups, which would reach into Python
    objects), with ``\\n`` and ``\\t`` written as escapes on a command line."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise InvalidArgumentError(f"bad --format template: {exc}") from None
    for _, name, _, _ in parsed:
        if name is not None and name not in FORMAT_FIELDS:
            raise InvalidArgumentError(
                f"--format can name {', '.join(sorted(FORMAT_FIELDS))}; not {{{name}}}"
            )
    return template.replace("\\n", "\n").replace("\\t", "\t")


def _text(value: Any) -> str:
    """A field as a template shows it: text as it is, anything else as compact JSON."""
    value = text_shown(value)
    if isinstance(value, str):
        return value
    return orjson.dumps(value).decode()


def _fields(topic: str, partition: int, record: Any, shown: Callable[[Any], Any]) -> dict[str, Any]:
    return {
        "topic": topic,
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": shown(record.key),
        "value": shown(record.value),
        "headers": [[name, shown(value)] for name, value in record.headers],
        "tags": list(record.tags),
    }


def render(topic: str, partition: int, record: Any, *, template: str | None, as_json: bool) -> str:
    """One record's output line: JSON, a template, or (by default) the value alone."""
    if as_json:
        return orjson.dumps(_fields(topic, partition, record, json_shown)).decode()
    fields = _fields(topic, partition, record, text_shown)
    if template is not None:
        return template.format_map({name: _text(value) for name, value in fields.items()})
    return _text(fields["value"])


class _Follow:
    """The ``follow`` callback of :func:`spoolmq.browse.browse`: wait until a partition
    directory changes or a stop signal arrives (True: read again; False: stop)."""

    def __init__(self, directories: Sequence[Path]) -> None:
        self._wake_read, self._wake_write = os.pipe()
        os.set_blocking(self._wake_write, False)
        self.stopping = False
        self._inotify = open_inotify()  # None: not Linux
        if self._inotify is not None and any(
            self._inotify.watch(directory) < 0 for directory in directories
        ):
            self._inotify.close()  # out of watches: poll instead
            self._inotify = None
        self._old: dict[int, Any] = {}
        for signum in (signal.SIGINT, signal.SIGTERM):
            self._old[signum] = signal.signal(signum, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.stopping = True
        with contextlib.suppress(OSError):
            os.write(self._wake_write, b"x")

    def __call__(self) -> bool:
        sys.stdout.flush()
        if self.stopping:
            return False
        waited = [self._wake_read]
        if self._inotify is not None:
            waited.append(self._inotify.fd)
        # A bounded wait, so a signal that lands between the check above and the select
        # is still noticed (the pipe catches it too; this is belt and braces).
        timeout = 1.0 if self._inotify is not None else _POLL_S
        with selectors.DefaultSelector() as selector:
            for fd in waited:
                selector.register(fd, selectors.EVENT_READ)
            selector.select(timeout)  # retried by Python after a signal handler ran
        if self._inotify is not None:
            self._inotify.drain()
        return not self.stopping

    def close(self) -> None:
        for signum, handler in self._old.items():
            signal.signal(signum, handler)
        if self._inotify is not None:
            self._inotify.close()
        os.close(self._wake_read)
        os.close(self._wake_write)


def _start(args: argparse.Namespace) -> Any:
    from spoolmq.browse import Start, parse_time

    if args.offset is not None:
        return Start("offset", args.offset)
    if args.from_time is not None:
        return Start("time", parse_time(args.from_time))
    if args.from_end is not None:
        return Start("from_end", abs(args.from_end))
    return Start("earliest")


def _count(text: str) -> int:
    """A whole number for --offset, --from-end and --max (argparse calls this)."""
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None


def cmd_read(args: argparse.Namespace) -> int:
    from spoolmq.browse import Filters, browse
    from spoolmq.store import Store
    from spoolmq.store.names import partition_dir
    from spoolmq.types import TopicPartition

    template = check_template(args.format) if args.format is not None else None
    if args.max is not None and args.max < 1:  # as consume's: 0 would print nothing
        raise InvalidArgumentError(f"--max must be at least 1, not {args.max}")
    if args.offset is not None and args.offset < 0:
        raise InvalidArgumentError(f"--offset must be at least 0, not {args.offset}")
    filters = Filters.parse(key=args.key, headers=args.header, tags=args.tag, fields=args.field)
    start = _start(args)
    data = data_dir(args, must_exist=True)
    with Store(data) as store:
        config = store.topic_config(args.topic)
        partitions = args.partition or list(range(config.partitions))
        follow: _Follow | None = None
        if args.follow:
            for p in partitions:
                store.partition_log(args.topic, p)  # checks it, and makes its directory
            follow = _Follow(
                [partition_dir(data, TopicPartition(args.topic, p)) for p in partitions]
            )
        try:
            found: Iterator[Any] = browse(
                store,
                args.topic,
                partitions=partitions,
                start=start,
                filters=filters,
                limit=args.max,
                follow=follow,
            )
            write: Callable[[str], object] = sys.stdout.write
            for item in found:
                write(
                    render(
                        item.topic,
                        item.partition,
                        item.record,
                        template=template,
                        as_json=args.json,
                    )
                    + "\n"
                )
        finally:
            if follow is not None:
                follow.close()
    sys.stdout.flush()
    return 0


def register(command: CommandFactory) -> None:
    p = command("read", cmd_read, "print a topic's messages from the store (no group, no broker)")
    p.add_argument("topic", help="the topic to read")
    p.add_argument(
        "--partition",
        type=_count,
        action="append",
        metavar="P",
        help="read this partition (repeat for several; default: all)",
    )
    start = p.add_mutually_exclusive_group()
    start.add_argument("--offset", type=_count, metavar="N", help="start at offset N")
    start.add_argument(
        "--from-time",
        metavar="ISO",
        help="start at the first message at or after this time (ISO 8601; no zone: local time)",
    )
    start.add_argument(
        "--from-end",
        type=_count,
        metavar="-N",
        help="start N messages before the end of each partition",
    )
    p.add_argument(
        "--follow", action="store_true", help="keep printing new messages until interrupted"
    )
    p.add_argument("--key", metavar="K", help="only messages with this key")
    p.add_argument(
        "--header", action="append", default=[], metavar="NAME=VALUE", help="only with header"
    )
    p.add_argument("--tag", action="append", default=[], help="only messages with this tag")
    p.add_argument(
        "--field",
        action="append",
        default=[],
        metavar="PATH=VALUE",
        help="only messages whose JSON value has this field (customer.id=42)",
    )
    p.add_argument("--max", type=_count, metavar="N", help="stop after N messages")
    output = p.add_mutually_exclusive_group()
    output.add_argument(
        "--format",
        metavar="TEMPLATE",
        help="print each message with this template: {topic} {partition} {offset} "
        "{timestamp} {key} {value} {headers} {tags}",
    )
    output.add_argument("--json", action="store_true", help="one JSON object per message")
