"""The ``spoolmq`` command: a thin layer over the library.

Every command takes ``--data DIR`` (else ``$SPOOLMQ_DATA``, else ``./queue_data``). A
user's mistake is one line on stderr and exit status 2; listings take ``--json``.

Each ``cmd_*`` parses its arguments, calls the library (:mod:`spoolmq.operations`, the
store, the clients) and renders the answer; nothing here decides anything a script could
not get from the library. One cohesive thing (the parser and a renderer per command), so it
stays one module past 500 lines.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib
import json
import os
import re
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from spoolmq.browse import json_shown, parse_time, text_shown
from spoolmq.commands import COMMAND_MODULES
from spoolmq.commands.common import Handler, require_extra
from spoolmq.commands.common import data_dir as _data
from spoolmq.commands.common import natural as _natural
from spoolmq.commands.common import positive as _positive
from spoolmq.commands.common import print_json as _print_json
from spoolmq.commands.common import print_table as _table
from spoolmq.commands.common import seconds as _seconds
from spoolmq.commands.common import seconds_positive as _seconds_positive
from spoolmq.config import TopicConfig, parse_duration_ms
from spoolmq.errors import InvalidArgumentError, SpoolError

if TYPE_CHECKING:
    from spoolmq.operations import DeadLetter

# -- publish and consume ------------------------------------------------------------------------


def _parse_headers(items: Sequence[str]) -> list[tuple[str, str]]:
    headers = []
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise InvalidArgumentError(f"a header is NAME=VALUE, not {item!r}")
        headers.append((name, value))
    return headers


# 19 digits in a row: where an integer past 64 bits may be, which orjson reads as a float.
_LONG_DIGITS = re.compile(rb"[0-9]{19}")
_LONG_DIGITS_TEXT = re.compile("[0-9]{19}")


def _check_whole(text: str) -> int:
    number = int(text)
    if not -(2**63) <= number < 2**64:
        raise InvalidArgumentError(
            f"the integer {text[:30]}{'...' if len(text) > 30 else ''} is past 64 bits, which "
            "the store does not hold: send it as a string"
        )
    return number


def _loads_exactly(data: bytes | str) -> Any:
    """``orjson.loads``, and an InvalidArgumentError for an integer past 64 bits, which it
    would read as a float and so store as another number (99999999999999999999 as 1e+20).
    Only text with 19 digits in a row is read a second time, by the json module, to find
    one."""
    value = orjson.loads(data)
    if _LONG_DIGITS.search(data) if isinstance(data, bytes) else _LONG_DIGITS_TEXT.search(data):
        json.loads(data, parse_int=_check_whole)
    return value


def _parse_value(text: str) -> Any:
    """A JSON value if the text is JSON, else the text as a string; but text that opens
    as a JSON object or array and does not parse is a mistake (a trailing comma, a quote
    missing), not a message: it is refused rather than stored as a string."""
    try:
        return _loads_exactly(text)
    except orjson.JSONDecodeError as exc:
        if text.lstrip()[:1] in ("{", "["):
            raise InvalidArgumentError(
                f"VALUE opens as JSON but is not: {exc} (to send that text as it is, "
                f"quote it as a JSON string: '\"...\"')"
            ) from None
        return text


def cmd_publish(args: argparse.Namespace) -> int:
    from spoolmq.client import Publisher

    headers = _parse_headers(args.header or [])
    options = {
        "key": args.key,
        "headers": headers or None,
        "tags": args.tag or None,
        "delay": args.delay,
        "ttl": args.ttl,
        "priority": args.priority,
        "acks": args.acks,
    }
    value = None if args.value is None else _parse_value(args.value)  # before connecting
    existed = _topic_exists(args, args.topic)
    try:
        with Publisher(data=args.data) as publisher:
            if args.value is not None:
                _print_positions([publisher.publish_async(args.topic, value, **options)])
                publisher.flush()
            else:
                for values in _stdin_values():
                    futures = publisher.publish_many_async(args.topic, values, **options)
                    publisher.flush()
                    _print_positions(futures)
    finally:
        # Also when a later stdin line fails: the earlier ones created the topic.
        with contextlib.suppress(SpoolError, OSError):  # never hiding the error itself
            _say_if_created(args, args.topic, existed)
    return 0


def _stdin_values() -> Iterator[list[Any]]:
    """The JSON values of stdin's lines, in lists of what has arrived: each read returns
    what the pipe holds now (``tail -f app.log | spoolmq publish logs`` publishes a line
    when it is written, not at EOF) and a fast pipe still gives large batches."""
    try:
        fd = sys.stdin.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's StringIO)
        fd = -1
    pending = b""
    number = 0
    while True:
        chunk = os.read(fd, 1 << 16) if fd >= 0 else sys.stdin.read().encode()
        lines = (pending + chunk).split(b"\n")
        pending = lines.pop() if chunk else b""
        values = []
        for line in lines:
            number += 1
            if not line.strip():
                continue
            try:
                values.append(_loads_exactly(line))
            except orjson.JSONDecodeError as exc:
                raise InvalidArgumentError(f"stdin line {number} is not JSON: {exc}") from None
            except InvalidArgumentError as exc:
                raise InvalidArgumentError(f"stdin line {number}: {exc}") from None
        if values:
            yield values
        if not chunk:
            return


def _print_positions(futures: Sequence[Any]) -> None:
    for future in futures:
        position = future.result()
        sys.stdout.write(
            orjson.dumps(
                {
                    "topic": position.topic,
                    "partition": position.partition,
                    "offset": position.offset,
                }
            ).decode()
            + "\n"
        )
    sys.stdout.flush()


def _topic_exists(args: argparse.Namespace, topic: str) -> bool | None:
    """Whether ``topic`` exists now (None when there is no data directory to ask)."""
    from spoolmq.store.names import check_topic
    from spoolmq.store.state import StateDB

    check_topic(topic)
    data = _data(args)
    if not (data / "state.db").exists():
        return None
    state = StateDB(data / "state.db")
    try:
        return state.topic(topic) is not None
    finally:
        state.close()


def _say_if_created(args: argparse.Namespace, topic: str, existed: bool | None) -> None:
    """Tell the user, on stderr, that using ``topic`` created it: a typo in a topic name
    otherwise makes a new topic in silence."""
    if existed is False and _topic_exists(args, topic):
        sys.stderr.write(
            f"spoolmq: created topic {topic!r} (the broker creates a topic on first use; "
            "`spoolmq broker --auto-create-topics off` refuses instead)\n"
        )


def _idle_seconds(text: str) -> float:
    """consume's --timeout: more than 0 seconds, or --follow for no end at all."""
    try:
        return _seconds_positive(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc} (or --follow, to wait for ever)") from None


def cmd_consume(args: argparse.Namespace) -> int:
    from spoolmq.client import Consumer

    existed = _topic_exists(args, args.topic)
    with Consumer(
        args.topic, args.group, data=args.data, start=args.start, auto_ack=args.no_ack
    ) as consumer:
        _say_if_created(args, args.topic, existed)
        # Ctrl-C is the way to stop --follow: as for read --follow, exit 0.
        with contextlib.suppress(KeyboardInterrupt):
            _consume(args, consumer)
    return 0


def _consume(args: argparse.Namespace, consumer: Any) -> None:
    """Print and ACK messages until ``--max``, the idle ``--timeout`` or Ctrl-C (the one a
    Ctrl-C interrupts is not ACKed: it comes again)."""
    count = 0
    while args.max is None or count < args.max:
        message = consumer.receive(timeout=None if args.follow else args.timeout)
        if message is None:
            break
        key = message.key
        value = message.value
        sys.stdout.write(
            orjson.dumps(
                {
                    "topic": message.topic,
                    "partition": message.partition,
                    "offset": message.offset,
                    "key": json_shown(key),
                    "value": json_shown(value),
                    "headers": [[n, json_shown(v)] for n, v in message.headers],
                    "tags": list(message.tags),
                    "timestamp": message.timestamp,
                    "attempt": message.attempt,
                }
            ).decode()
            + "\n"
        )
        sys.stdout.flush()
        if not args.no_ack:
            message.ack()
        count += 1


# -- topics ------------------------------------------------------------------------------------


def cmd_topics(args: argparse.Namespace) -> int:
    from spoolmq.store import Store

    if args.action == "delete":
        return _delete_topic(args)
    with Store(_data(args, must_exist=args.action != "create")) as store:
        if args.action in ("create", "alter"):
            settings: dict[str, Any] = {}
            if args.retention is not None:
                settings["retention_ms"] = parse_duration_ms(args.retention)
            if args.compact:
                settings["cleanup_policy"] = "compact"
            if args.action == "create":
                config = store.create_topic(
                    args.name, partitions=args.partitions, exist_ok=False, **settings
                )
                done = f"created topic {args.name} with {config.partitions} partition(s)"
            else:
                if not settings:
                    raise InvalidArgumentError("topics alter needs --retention or --compact")
                config = store.alter_topic(args.name, **settings)
                done = (
                    f"topic {args.name} now keeps messages {_duration(config.retention_ms)}"
                    f" ({config.cleanup_policy}); a running broker applies it within 5 s"
                )
            if args.json:
                _print_json({"name": args.name, **config.as_dict()})
            else:
                print(done)
        elif args.action == "list":
            topics = store.topics()
            if args.json:
                _print_json([{"name": n, **c.as_dict()} for n, c in topics.items()])
            else:
                _table(
                    "topics",
                    ["topic", "partitions", "retention", "cleanup"],
                    [
                        [n, c.partitions, _duration(c.retention_ms), c.cleanup_policy]
                        for n, c in topics.items()
                    ],
                )
        elif args.action == "describe":
            config = store.topic_config(args.name)
            rows = []
            for partition in range(config.partitions):
                rows.append(
                    {
                        "partition": partition,
                        "log_start_offset": store.log_start_offset(args.name, partition),
                        "log_end_offset": store.log_end_offset(args.name, partition),
                        "segments": len(store.partition_log(args.name, partition).segment_bases()),
                    }
                )
            if args.json:
                _print_json({"name": args.name, **config.as_dict(), "partitions": rows})
            else:
                _table(
                    f"topic {args.name} ({config.cleanup_policy}, retention "
                    f"{_duration(config.retention_ms)})",
                    ["partition", "log start", "log end", "segments"],
                    [list(r.values()) for r in rows],
                )
    return 0


def cmd_cancel(args: argparse.Namespace) -> int:
    """Through the broker when one runs (its groups pass over the message at once), else
    in state.db, which the broker reads as it starts."""
    from spoolmq.broker.manager import broker_running
    from spoolmq.client import Admin
    from spoolmq.store import Store

    data = _data(args, must_exist=True)
    where = f"{args.topic}/{args.partition}@{args.offset}"
    if broker_running(data):
        with Admin(data) as admin:
            groups = admin.cancel_message(
                args.topic, args.partition, args.offset, reason=args.reason
            )
    else:
        with Store(data) as store:
            store.cancel_message(args.topic, args.partition, args.offset, args.reason)
        groups = {}
    if args.json:
        _print_json({"cancelled": where, "groups": groups})
        return 0
    print(f"cancelled {where}: no group will deliver it")
    for group, outcome in sorted(groups.items()):
        print(f"  group {group}: {_CANCEL_OUTCOMES[outcome]}")
    return 0


_CANCEL_OUTCOMES = {
    "cancelled": "cancelled",
    "pending": "not read that far yet: it will pass over it",
    "in_flight": "a consumer holds it: its answer counts; it will not come again",
    "finished": "already done with it",
}


def _delete_topic(args: argparse.Namespace) -> int:
    """Through the broker when one runs (it stops serving the topic first), else in the
    store directly."""
    from spoolmq.broker.manager import broker_running
    from spoolmq.client import Admin
    from spoolmq.store import Store

    data = _data(args, must_exist=True)
    if broker_running(data):
        with Admin(data) as admin:
            result = admin.delete_topic(args.name)
    else:
        with Store(data) as store:
            store.finish_deletions()
            partitions = store.topic_config(args.name).partitions
            store.delete_topic(args.name)
        result = {"deleted": args.name, "partitions": partitions, "groups": [], "consumers_told": 0}
    if args.json:
        _print_json(result)
        return 0
    told = result["consumers_told"]
    print(
        f"deleted topic {args.name} ({result['partitions']} partition(s))"
        + (f"; groups that read it: {', '.join(result['groups'])}" if result["groups"] else "")
        + (f"; {told} consumer(s) told" if told else "")
    )
    if not args.name.endswith(".dlq"):
        with Store(data) as store:
            if f"{args.name}.dlq" in store.topics():
                print(f"its dead letters stay in {args.name}.dlq (a topic of its own)")
    return 0


def _duration(ms: int) -> str:
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


# -- groups ------------------------------------------------------------------------------------


def cmd_groups(args: argparse.Namespace) -> int:
    data = _data(args, must_exist=True)
    if args.action == "reset":
        return _reset_group(args, data)
    from spoolmq.operations import delete_group, group_rows

    if args.action == "delete":
        delete_group(data, args.group)
        print(f"deleted consumer group {args.group}")
        return 0
    groups = group_rows(data, args.group if args.action == "describe" else None)
    if args.action == "list":
        summary = [
            {
                "group": name,
                "partitions": len(rows),
                "lag": sum(r["lag"] for r in rows),
                "in_flight": sum(r["in_flight"] for r in rows),
                "parked": sum(r["parked"] for r in rows),
            }
            for name, rows in sorted(groups.items())
        ]
        if args.json:
            _print_json(summary)
        else:
            _table(
                "groups",
                ["group", "partitions", "lag", "in flight", "parked"],
                [list(s.values()) for s in summary],
            )
        return 0
    rows = groups[args.group]
    if args.members:
        return _print_members(data, args)
    if args.json:
        _print_json(rows)
    else:
        _table(
            f"group {args.group}",
            [
                "topic",
                "partition",
                "committed offset",
                "log end offset",
                "lag",
                "in-flight",
                "parked",
                "consumer",
            ],
            [
                [
                    r["topic"],
                    r["partition"],
                    r["committed"],
                    r["log_end_offset"],
                    r["lag"],
                    r["in_flight"],
                    r["parked"],
                    ", ".join(r["consumers"]),
                ]
                for r in rows
            ],
        )
    return 0


def _print_members(data: Path, args: argparse.Namespace) -> int:
    from spoolmq.operations import group_members

    members = group_members(data, args.group)
    if args.json:
        _print_json(members)
        return 0
    _table(
        f"members of group {args.group}" + ("" if members else " (none connected)"),
        ["consumer", "kind", "pid", "name", "connected", "last seen", "in-flight"],
        [
            [
                m["consumer"],
                m["kind"],
                m["pid"],
                m["name"],
                _moment(m["since"]) if m["since"] else None,
                _moment(m["last_seen"]) if m["last_seen"] else "not yet",
                m["in_flight"],
            ]
            if m["kind"] == "spoolmq"
            else [m["consumer"], "kafka", None, f"{m['name']} at {m['host']}", None, None, None]
            for m in members
        ],
        whole=["consumer"],
    )
    return 0


def _moment(ms: float) -> str:
    return dt.datetime.fromtimestamp(ms / 1000).isoformat(sep=" ", timespec="seconds")


def _reset_group(args: argparse.Namespace, data: Path) -> int:
    from spoolmq.operations import ResetTo, apply_reset, plan_reset
    from spoolmq.store import Store

    if args.to_earliest:
        to = ResetTo("earliest")
    elif args.to_latest:
        to = ResetTo("latest")
    elif args.to_offset is not None:
        to = ResetTo("offset", args.to_offset)
    elif args.shift_by is not None:
        to = ResetTo("shift", args.shift_by)
    else:
        to = ResetTo("time", parse_time(args.to_datetime))
    with Store(data) as store:
        changes = plan_reset(store, args.group, None if args.all_topics else args.topic, to)
    if args.execute:
        # Applied before anything is printed: a refusal (a consumer is connected) is then
        # the only thing the user sees, never a table that looks like it happened.
        apply_reset(data, args.group, changes)
    rows = [
        {"topic": c.topic, "partition": c.partition, "from": c.current, "to": c.target}
        for c in changes
    ]
    if args.json:
        _print_json({"group": args.group, "executed": args.execute, "changes": rows})
    elif args.execute:
        _table(
            f"reset group {args.group}: done",
            ["topic", "partition", "from", "to"],
            [list(r.values()) for r in rows],
        )
    else:
        _table(
            f"PREVIEW of a reset of group {args.group}: nothing changed; add --execute to do it",
            ["topic", "partition", "from", "to"],
            [list(r.values()) for r in rows],
        )
    return 0


# -- dlq, stats, check --------------------------------------------------------------------------


def cmd_dlq(args: argparse.Namespace) -> int:
    from spoolmq.operations import dead_letters, purge_dead_letters, replay_dead_letters
    from spoolmq.store import Store
    from spoolmq.store.names import check_topic

    check_topic(args.topic)  # a bad name is the mistake to report, wherever the data is
    picked = getattr(args, "offset", None)  # replay and purge have --offset; list not
    offsets = [(args.partition, offset) for offset in picked] if picked else None
    with Store(_data(args, must_exist=True)) as store:
        if args.action == "replay":
            result = replay_dead_letters(
                store,
                args.topic,
                offsets=offsets,
                reason=args.reason,
                to_group=args.to_group,
                dry_run=args.dry_run,
            )
            where = args.topic + (f" for group {args.to_group} only" if args.to_group else "")
            if args.json:
                _print_json(
                    {
                        "dry_run": result.dry_run,
                        "to_group": result.to_group,
                        "selected": len(result.letters),
                        "replayed": result.replayed,
                        "already_replayed": result.already_replayed,
                        "tasks_queued": result.tasks_queued,
                        "letters": [_letter_row(d) for d in result.letters],
                    }
                )
            elif result.dry_run:
                _letters_table(
                    f"dry run: would replay {len(result.letters)} dead letter(s) to {where}",
                    result.letters,
                )
            else:
                print(
                    f"replayed {result.replayed} dead letter(s) to {where}; "
                    f"{result.already_replayed} had been replayed before"
                    + (
                        f"; {result.tasks_queued} dead-lettered task(s) queued again"
                        if result.tasks_queued
                        else ""
                    )
                )
            return 0
        if args.action == "purge":
            before = None if args.before is None else parse_time(args.before)
            count = purge_dead_letters(store, args.topic, before_ms=before, offsets=offsets)
            if args.json:
                _print_json({"purged": count})
            else:
                print(f"purged {count} dead letter(s) of {args.topic}")
            return 0
        letters = dead_letters(store, args.topic)
    if args.json:
        _print_json([_letter_row(d) for d in letters])
    else:
        _letters_table(f"dead letters of {args.topic}", letters)
    return 0


def _letter_row(d: DeadLetter) -> dict[str, Any]:
    return {
        "dlq_partition": d.dlq_partition,
        "dlq_offset": d.dlq_offset,
        "topic": d.topic,
        "partition": d.partition,
        "offset": d.offset,
        "group": d.group,
        "attempts": d.attempts,
        "reason": d.reason,
        "timestamp": d.record.timestamp,
        "key": json_shown(d.record.key),
        "value": json_shown(d.record.value),
        "tags": list(d.record.tags),
    }


def _letters_table(title: str, letters: Sequence[DeadLetter]) -> None:
    _table(
        title,
        ["partition", "offset", "from", "group", "attempts", "reason", "key"],
        [
            [
                d.dlq_partition,
                d.dlq_offset,
                f"{d.topic}/{d.partition}@{d.offset}",
                d.group,
                d.attempts,
                d.reason,
                text_shown(d.record.key),
            ]
            for d in letters
        ],
    )


def cmd_check(args: argparse.Namespace) -> int:
    from spoolmq.store import Store

    with Store(_data(args, must_exist=True)) as store:
        problems = store.check(args.topic)
        names = [args.topic] if args.topic else sorted(store.topics())
        partitions = segments = offsets = 0
        for name in names:
            for number in range(store.topic_config(name).partitions):
                partitions += 1
                segments += len(store.partition_log(name, number).segment_bases())
                offsets += store.log_end_offset(name, number) - store.log_start_offset(name, number)
    checked = {"topics": len(names), "partitions": partitions, "segments": segments}
    if args.json:
        _print_json(
            {
                "checked": {**checked, "offsets": offsets},
                "problems": [
                    {
                        "topic": p.topic,
                        "partition": p.partition,
                        "offset": p.offset,
                        "segment": p.segment,
                        "position": p.position,
                        "problem": p.problem,
                        "batch_offset": p.batch_offset,
                        "batch_position": p.batch_position,
                    }
                    for p in problems
                ],
            }
        )
    elif problems:
        for problem in problems:
            batch = (
                f"; its batch starts at offset {problem.batch_offset} (byte "
                f"{problem.batch_position}), where readers stop"
                if problem.batch_offset != problem.offset
                else ""
            )
            print(
                f"{problem.topic}/{problem.partition} offset {problem.offset} "
                f"({problem.segment} byte {problem.position}): {problem.problem}{batch}"
            )
        print(
            f"{len(problems)} problem(s). What to do: a torn tail (a crash mid-write) is "
            "moved to quarantine/ and cut off when a writer next opens the partition (start "
            "the broker, or publish); damage inside a segment is never skipped: consumers of "
            "that partition stop at the first offset of the damaged record's batch. Stop the "
            "broker, keep a copy of the segment, and repair or remove the line at that byte "
            "(one JSON record per line, docs/FORMAT.md), then run `spoolmq check` again."
        )
    else:
        print(
            f"no problems found: {len(names)} topic(s), {partitions} partition(s), "
            f"{segments} segment(s), {offsets} offset(s) checked"
        )
    return 1 if problems else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from spoolmq.demo import run_demo

    if not args.no_analytics:
        require_extra("analytics", "spoolmq demo's report (or pass --no-analytics)")

    return run_demo(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from spoolmq.bench import run

    return run(args)


def cmd_analytics(args: argparse.Namespace) -> int:
    require_extra("analytics", "spoolmq analytics")
    from spoolmq.analytics import main

    forwarded = ["--data", str(_data(args))]
    if args.out:
        forwarded += ["--out", args.out]
    if args.master:
        forwarded += ["--master", args.master]
    if args.full:
        forwarded.append("--full")
    return main(forwarded)


# -- parser -------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with the project's rule for a user's mistake: one line on stderr, starting
    with ``spoolmq:``, naming the ``--help`` of the (sub)command it is about, and exit status
    2 (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"spoolmq: {message} (see `{self.prog} --help`)\n")


_DATA_HELP = "data directory (default: $SPOOLMQ_DATA or ./queue_data)"
_JSON_HELP = "print JSON instead of a table"


def build_parser() -> argparse.ArgumentParser:
    from spoolmq import __version__

    parser = _Parser(
        prog="spoolmq", description="A durable, file-based message and task queue for one host."
    )
    parser.add_argument("--version", action="version", version=f"spoolmq {__version__}")
    # Accepted before the command too (``spoolmq --data DIR topics list``); its own dest,
    # since a subcommand's default would overwrite a shared one. ``main`` merges them.
    parser.add_argument("--data", dest="data_before", metavar="DATA", help=_DATA_HELP)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def leaf(parent: Any, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p: argparse.ArgumentParser = parent.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--data", help=_DATA_HELP)
        p.set_defaults(handler=handler, prog=p.prog)
        return p

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        return leaf(sub, name, handler, help_text)

    def family(name: str, help_text: str) -> Any:
        """A command with actions of its own (``topics create``): each action is a parser,
        so ``spoolmq topics create --help`` shows create's options and nothing else."""
        p = sub.add_parser(name, help=help_text, description=help_text)
        return p.add_subparsers(dest="action", required=True, metavar="ACTION")

    p = command("publish", cmd_publish, "publish messages (VALUE, or one JSON per stdin line)")
    p.add_argument("topic", help="the topic to publish to")
    p.add_argument(
        "value",
        nargs="?",
        help="a JSON value, or text; omit to publish each stdin line as it arrives",
    )
    p.add_argument("--key", help="the message key (same key: same partition, in order)")
    p.add_argument(
        "--header", action="append", metavar="NAME=VALUE", help="a header (repeat for more)"
    )
    p.add_argument("--tag", action="append", help="a tag consumers can filter on (repeatable)")
    p.add_argument("--delay", type=_seconds, help="seconds before it may be delivered")
    p.add_argument("--ttl", type=_seconds, help="seconds after which it is not delivered")
    p.add_argument(
        "--priority",
        type=int,
        choices=range(10),
        metavar="0-9",
        help="delivered before waiting messages of lower priorities (default 0)",
    )
    p.add_argument(
        "--acks",
        default="all",
        choices=["0", "1", "all"],
        help="all: answer after fsync (default); 1: after the write; 0: do not wait",
    )

    p = command("cancel", cmd_cancel, "cancel a stored message: no group will deliver it")
    p.add_argument("topic", help="the message's topic")
    p.add_argument("offset", type=_natural, help="the message's offset")
    p.add_argument("--partition", type=_natural, default=0, help="its partition (default 0)")
    p.add_argument("--reason", help="why (in the groups' cancelled events)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)

    p = command(
        "consume", cmd_consume, "consume messages as JSON lines, ACKing each after printing"
    )
    p.add_argument("topic", help="the topic to consume")
    p.add_argument("--group", required=True, help="the consumer group (its offsets are kept)")
    p.add_argument("--max", type=_positive, help="stop after this many messages")
    p.add_argument(
        "--start",
        default="earliest",
        choices=["earliest", "latest"],
        help="where a new group starts (default earliest)",
    )
    wait = p.add_mutually_exclusive_group()
    wait.add_argument(
        "--timeout",
        type=_idle_seconds,
        default=5.0,
        help="stop after this many seconds with no message (default 5)",
    )
    wait.add_argument(
        "--follow", action="store_true", help="never stop for want of messages (Ctrl-C ends)"
    )
    p.add_argument("--no-ack", action="store_true", help="at-most-once (auto ACK)")

    topics = family("topics", "create, list, describe, alter or delete topics")
    p = leaf(topics, "create", cmd_topics, "create a topic")
    p.add_argument("name", help="the topic's name")
    p.add_argument("--partitions", type=_positive, default=1, help="partition count (default 1)")
    _topic_settings(p)
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(topics, "list", cmd_topics, "list the topics and their settings")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(topics, "describe", cmd_topics, "a topic's partitions: log start, end, segments")
    p.add_argument("name", help="the topic's name")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(topics, "alter", cmd_topics, "change a topic's retention or cleanup policy")
    p.add_argument("name", help="the topic's name")
    _topic_settings(p)
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(
        topics,
        "delete",
        cmd_topics,
        "delete a topic and its files (a running broker stops serving it first)",
    )
    p.add_argument("name", help="the topic's name")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)

    groups = family("groups", "list, describe, reset or delete consumer groups")
    p = leaf(groups, "list", cmd_groups, "every group with its lag and in-flight count")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(groups, "describe", cmd_groups, "a group's offsets, lag and consumers")
    p.add_argument("group", help="the consumer group")
    p.add_argument(
        "--members",
        action="store_true",
        help="its connected consumers instead: pid, name, last seen, in-flight",
    )
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(groups, "reset", cmd_groups, "move a group's committed offsets (preview first)")
    p.add_argument("group", help="the consumer group")
    on = p.add_mutually_exclusive_group(required=True)
    on.add_argument("--topic", help="reset the group on this topic")
    on.add_argument(
        "--all-topics", action="store_true", help="reset it on every topic it has offsets in"
    )
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--to-earliest", action="store_true", help="to the log start")
    target.add_argument("--to-latest", action="store_true", help="to the log end (skip all)")
    target.add_argument("--to-offset", type=_natural, help="to this offset (kept in the log)")
    target.add_argument(
        "--to-datetime",
        metavar="ISO",
        help="to the first message at or after this time (ISO 8601; no zone: local time)",
    )
    target.add_argument(
        "--shift-by",
        type=int,
        metavar="N",
        help="by N from the committed offset (negative: back), kept in the log",
    )
    p.add_argument("--execute", action="store_true", help="do the reset (default: preview)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)
    p = leaf(groups, "delete", cmd_groups, "forget a group (refused while consumers are connected)")
    p.add_argument("group", help="the consumer group")

    dlq = family("dlq", "list, replay or purge a topic's dead letters")
    for action, help_text in (
        ("list", "a topic's dead letters: where from, why, how many attempts"),
        ("replay", "publish dead letters to their topic again (all, or those picked)"),
        ("purge", "drop dead letters (all, or those picked)"),
    ):
        p = leaf(dlq, action, cmd_dlq, help_text)
        p.add_argument("topic", help="the topic whose dead letters (TOPIC.dlq) to use")
        if action != "list":
            p.add_argument(
                "--offset",
                type=_natural,
                action="append",
                metavar="N",
                help="only the dead letter at offset N of TOPIC.dlq (repeat for more)",
            )
            p.add_argument(
                "--partition",
                type=_natural,
                default=0,
                help="the TOPIC.dlq partition the --offset values are in (default 0)",
            )
        if action == "replay":
            p.add_argument("--reason", metavar="REGEX", help="only those whose reason matches")
            p.add_argument(
                "--to-group", metavar="GROUP", help="deliver them to this consumer group only"
            )
            p.add_argument(
                "--dry-run", action="store_true", help="show what would be replayed, do nothing"
            )
        if action == "purge":
            p.add_argument(
                "--before",
                metavar="ISO",
                help="only those stored before this time (ISO 8601; no zone: local time)",
            )
        p.add_argument("--json", action="store_true", help=_JSON_HELP)

    p = command("check", cmd_check, "verify every record's checksum and offsets")
    p.add_argument("topic", nargs="?", help="check only this topic (default: all)")
    p.add_argument("--json", action="store_true", help=_JSON_HELP)

    p = command(
        "demo", cmd_demo, "run a broker, publishers and consumers on a fresh data directory"
    )
    p.add_argument("--messages", type=_positive, default=2000, help="messages to publish")
    p.add_argument("--no-analytics", action="store_true", help="skip the Spark report")

    p = command(
        "bench",
        cmd_bench,
        "measure throughput, latency and memory (vs Redis Streams, NATS JetStream, RabbitMQ)",
    )
    from spoolmq.bench import add_arguments

    add_arguments(p)

    p = command("analytics", cmd_analytics, "run the Spark analytics job over the store")
    p.add_argument(
        "--out", help="output directory (default: analytics_out next to the data directory)"
    )
    p.add_argument("--master", help="Spark master URL (default: local[*])")
    p.add_argument(
        "--full",
        action="store_true",
        help="parse the whole store again (default: only what is new since the last run)",
    )

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(command)
    return parser


def _topic_settings(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--retention", help="how long messages are kept: a number and a unit (14d, 12h), or never"
    )
    p.add_argument("--compact", action="store_true", help="keep the newest record per key")


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``. argparse hands out positionals in one go, so in ``publish jobs
    --delay 3 VALUE`` the optional VALUE is already taken (empty) when VALUE comes: it is
    left over. Give it to ``publish`` instead of refusing a command a user would write."""
    args, extra = parser.parse_known_args(argv)
    if (
        extra
        and args.command == "publish"
        and args.value is None
        and len(extra) == 1
        and not extra[0].startswith("--")
    ):
        args.value, extra = extra[0], []
    if extra:
        sub = _Parser(prog=getattr(args, "prog", "spoolmq"))
        sub.error(f"unrecognized arguments: {' '.join(extra)}")
    if args.data is None:
        args.data = args.data_before
    elif args.data_before is not None and args.data_before != args.data:
        sub = _Parser(prog=args.prog)
        sub.error(f"--data is given twice: {args.data_before} and {args.data}")
    return args


def _validate(args: argparse.Namespace) -> None:
    if args.command == "topics" and args.action == "create":
        TopicConfig(partitions=args.partitions)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = _parse(parser, argv)
    try:
        _validate(args)
        handler: Handler = args.handler
        return handler(args)
    except SpoolError as exc:
        sys.stderr.write(f"spoolmq: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
