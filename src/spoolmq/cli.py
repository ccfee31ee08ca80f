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
import datetime as dt
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import orjson

from spoolmq.commands import COMMAND_MODULES
from spoolmq.commands.common import Handler
from spoolmq.commands.common import data_dir as _data
from spoolmq.commands.common import natural as _natural
from spoolmq.commands.common import print_json as _print_json
from spoolmq.commands.common import print_table as _table
from spoolmq.config import TopicConfig, parse_duration_ms
from spoolmq.errors import GroupActiveError, InvalidArgumentError, SpoolError

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


def _parse_value(text: str) -> Any:
    """A JSON value if the text is JSON, else the text as a string."""
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
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
        "acks": args.acks,
    }
    with Publisher(data=args.data) as publisher:
        if args.value is not None:
            values = [_parse_value(args.value)]
        else:
            values = []
            for number, line in enumerate(sys.stdin, 1):
                if not line.strip():
                    continue
                try:
                    values.append(orjson.loads(line))
                except orjson.JSONDecodeError as exc:
                    raise InvalidArgumentError(f"stdin line {number} is not JSON: {exc}") from None
        futures = [publisher.publish_async(args.topic, value, **options) for value in values]
        publisher.flush()
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
    return 0


def cmd_consume(args: argparse.Namespace) -> int:
    from spoolmq.client import Consumer

    count = 0
    with Consumer(
        args.topic, args.group, data=args.data, start=args.start, auto_ack=args.no_ack
    ) as consumer:
        while args.max is None or count < args.max:
            message = consumer.receive(timeout=args.timeout)
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
                        "key": _hex_bytes(key),
                        "value": _hex_bytes(value),
                        "headers": [[n, _hex_bytes(v)] for n, v in message.headers],
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
    return 0


# -- topics ------------------------------------------------------------------------------------


def cmd_topics(args: argparse.Namespace) -> int:
    from spoolmq.store import Store

    with Store(_data(args, must_exist=args.action != "create")) as store:
        if args.action == "create":
            settings: dict[str, Any] = {"partitions": args.partitions}
            if args.retention is not None:
                settings["retention_ms"] = parse_duration_ms(args.retention)
            if args.compact:
                settings["cleanup_policy"] = "compact"
            config = store.create_topic(args.name, exist_ok=False, **settings)
            if args.json:
                _print_json({"name": args.name, **config.as_dict()})
            else:
                print(f"created topic {args.name} with {config.partitions} partition(s)")
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
        elif args.action == "delete":
            _refuse_if_broker_running(_data(args), "delete a topic")
            store.delete_topic(args.name)
            print(f"deleted topic {args.name}")
    return 0


def _duration(ms: int) -> str:
    if ms < 0:
        return "forever"
    for unit, size in (("d", 86_400_000), ("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


def _refuse_if_broker_running(data: Path, what: str) -> None:
    from spoolmq.broker.manager import broker_running

    if broker_running(data):
        raise GroupActiveError(f"a broker is running on {data}; stop it to {what}")


# -- groups ------------------------------------------------------------------------------------


def cmd_groups(args: argparse.Namespace) -> int:
    data = _data(args, must_exist=True)
    if args.action == "reset":
        return _reset_group(args, data)
    from spoolmq.operations import group_rows

    groups = group_rows(data, args.group if args.action == "describe" else None)
    if args.action == "list":
        summary = [
            {
                "group": name,
                "partitions": len(rows),
                "lag": sum(r["lag"] for r in rows),
                "in_flight": sum(r["in_flight"] for r in rows),
            }
            for name, rows in sorted(groups.items())
        ]
        if args.json:
            _print_json(summary)
        else:
            _table(
                "groups",
                ["group", "partitions", "lag", "in flight"],
                [list(s.values()) for s in summary],
            )
        return 0
    rows = groups[args.group]
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
                    ", ".join(r["consumers"]),
                ]
                for r in rows
            ],
        )
    return 0


def _reset_group(args: argparse.Namespace, data: Path) -> int:
    from spoolmq.operations import ResetTo, apply_reset, plan_reset
    from spoolmq.store import Store

    if args.to_earliest:
        to = ResetTo("earliest")
    elif args.to_latest:
        to = ResetTo("latest")
    elif args.to_offset is not None:
        to = ResetTo("offset", args.to_offset)
    else:
        to = ResetTo("time", _parse_datetime(args.to_datetime))
    with Store(data) as store:
        changes = plan_reset(store, args.group, args.topic, to)
    rows = [
        {"topic": c.topic, "partition": c.partition, "from": c.current, "to": c.target}
        for c in changes
    ]
    if args.json:
        _print_json({"group": args.group, "executed": args.execute, "changes": rows})
    else:
        _table(
            f"reset of group {args.group}" + ("" if args.execute else " (dry run: add --execute)"),
            ["topic", "partition", "from", "to"],
            [list(r.values()) for r in rows],
        )
    if args.execute:
        apply_reset(data, args.group, changes)
    return 0


def _parse_datetime(text: str) -> int:
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise InvalidArgumentError(
            f"not an ISO date-time: {text!r} (e.g. 2026-11-22T09:30:00+00:00)"
        ) from None
    if moment.tzinfo is None:
        moment = moment.astimezone()  # local time, as a user typing a time means
    return int(moment.timestamp() * 1000)


# -- dlq, stats, check --------------------------------------------------------------------------


def cmd_dlq(args: argparse.Namespace) -> int:
    from spoolmq.operations import dead_letters, purge_dead_letters, replay_dead_letters
    from spoolmq.store import Store
    from spoolmq.store.names import check_topic

    check_topic(args.topic)  # a bad name is the mistake to report, wherever the data is
    offsets = [(args.partition, offset) for offset in args.offset] if args.offset else None
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
                )
            return 0
        if args.action == "purge":
            before = None if args.before is None else _parse_datetime(args.before)
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
        "key": _hex_bytes(d.record.key),
        "value": _hex_bytes(d.record.value),
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
                _hex_bytes(d.record.key),
            ]
            for d in letters
        ],
    )


def _hex_bytes(value: Any) -> Any:
    """Raw bytes as hex for display; anything else as it is."""
    return value.hex() if isinstance(value, bytes) else value


def cmd_check(args: argparse.Namespace) -> int:
    from spoolmq.store import Store

    with Store(_data(args, must_exist=True)) as store:
        problems = store.check(args.topic)
    if args.json:
        _print_json(
            [
                {
                    "topic": p.topic,
                    "partition": p.partition,
                    "segment": p.segment,
                    "position": p.position,
                    "problem": p.problem,
                }
                for p in problems
            ]
        )
    elif problems:
        for problem in problems:
            print(f"{problem.segment} byte {problem.position}: {problem.problem}")
    else:
        print("no problems found")
    return 1 if problems else 0


def cmd_demo(args: argparse.Namespace) -> int:
    from spoolmq.demo import run_demo

    return run_demo(args)


def cmd_bench(args: argparse.Namespace) -> int:
    from spoolmq.bench import run

    return run(args)


def cmd_analytics(args: argparse.Namespace) -> int:
    from spoolmq.analytics import main

    forwarded = ["--data", str(_data(args))]
    if args.out:
        forwarded += ["--out", args.out]
    if args.master:
        forwarded += ["--master", args.master]
    return main(forwarded)


# -- parser -------------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse with the project's rule for a user's mistake: one line on stderr, starting
    with ``spoolmq:``, and exit status 2 (argparse prints the whole usage block first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"spoolmq: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="spoolmq", description="A durable, file-based message and task queue for one host."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.add_argument("--data", help="data directory (default: $SPOOLMQ_DATA or ./queue_data)")
        p.set_defaults(handler=handler)
        return p

    p = command("publish", cmd_publish, "publish messages (VALUE, or one JSON per stdin line)")
    p.add_argument("topic")
    p.add_argument("value", nargs="?", help="a JSON value, or text; omit to read stdin")
    p.add_argument("--key")
    p.add_argument("--header", action="append", metavar="NAME=VALUE")
    p.add_argument("--tag", action="append")
    p.add_argument("--delay", type=float, help="seconds before it may be delivered")
    p.add_argument("--ttl", type=float, help="seconds after which it is not delivered")
    p.add_argument("--acks", default="all", choices=["0", "1", "all"])

    p = command(
        "consume", cmd_consume, "consume messages as JSON lines, ACKing each after printing"
    )
    p.add_argument("topic")
    p.add_argument("--group", required=True)
    p.add_argument("--max", type=int, help="stop after this many messages")
    p.add_argument("--start", default="earliest", choices=["earliest", "latest"])
    p.add_argument("--timeout", type=float, default=5.0, help="stop after this many idle seconds")
    p.add_argument("--no-ack", action="store_true", help="at-most-once (auto ACK)")

    p = command("topics", cmd_topics, "create, list, describe or delete topics")
    p.add_argument("action", choices=["create", "list", "describe", "delete"])
    p.add_argument("name", nargs="?")
    p.add_argument("--partitions", type=int, default=1)
    p.add_argument("--retention", help="e.g. 14d, 12h, never")
    p.add_argument("--compact", action="store_true", help="keep the newest record per key")
    p.add_argument("--json", action="store_true")

    p = command("groups", cmd_groups, "list, describe or reset consumer groups")
    p.add_argument("action", choices=["list", "describe", "reset"])
    p.add_argument("group", nargs="?")
    p.add_argument("--topic")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--to-earliest", action="store_true")
    target.add_argument("--to-latest", action="store_true")
    target.add_argument("--to-offset", type=int)
    target.add_argument("--to-datetime", metavar="ISO")
    p.add_argument("--execute", action="store_true", help="do the reset (default: show it)")
    p.add_argument("--json", action="store_true")

    p = command("dlq", cmd_dlq, "list, replay or purge a topic's dead letters")
    p.add_argument("action", choices=["list", "replay", "purge"], help="what to do")
    p.add_argument("topic", help="the topic whose dead letters (TOPIC.dlq) to use")
    p.add_argument(
        "--offset",
        type=_natural,
        action="append",
        metavar="N",
        help="only the dead letter at this offset of TOPIC.dlq (repeat for more)",
    )
    p.add_argument(
        "--partition",
        type=_natural,
        default=0,
        help="the TOPIC.dlq partition the --offset values are in (default 0)",
    )
    p.add_argument("--reason", metavar="REGEX", help="replay: only reasons matching REGEX")
    p.add_argument(
        "--to-group", metavar="GROUP", help="replay: deliver them to this consumer group only"
    )
    p.add_argument("--dry-run", action="store_true", help="replay: show what would be replayed")
    p.add_argument("--before", metavar="ISO", help="purge: only those stored before this time")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")

    p = command("check", cmd_check, "verify every record's checksum and offsets")
    p.add_argument("topic", nargs="?")
    p.add_argument("--json", action="store_true")

    p = command(
        "demo", cmd_demo, "run a broker, publishers and consumers on a fresh data directory"
    )
    p.add_argument("--messages", type=int, default=2000)
    p.add_argument("--no-analytics", action="store_true")

    p = command("bench", cmd_bench, "measure throughput, latency and memory (vs Redis Streams)")
    from spoolmq.bench import add_arguments

    add_arguments(p)

    p = command("analytics", cmd_analytics, "run the Spark analytics job over the store")
    p.add_argument(
        "--out", help="output directory (default: analytics_out next to the data directory)"
    )
    p.add_argument("--master", help="Spark master URL (default: local[*])")

    for name in COMMAND_MODULES:
        importlib.import_module(name).register(command)
    return parser


def _validate(args: argparse.Namespace) -> None:
    if args.command == "topics" and args.action != "list" and not args.name:
        raise InvalidArgumentError(f"topics {args.action} needs a topic NAME")
    if args.command == "topics" and args.action == "create":
        TopicConfig(partitions=args.partitions)
    if args.command == "groups":
        if args.action in ("describe", "reset") and not args.group:
            raise InvalidArgumentError(f"groups {args.action} needs a GROUP")
        if args.action == "reset":
            if not args.topic:
                raise InvalidArgumentError("groups reset needs --topic")
            if not (
                args.to_earliest or args.to_latest or args.to_offset is not None or args.to_datetime
            ):
                raise InvalidArgumentError(
                    "groups reset needs one of --to-earliest, --to-latest, --to-offset, "
                    "--to-datetime"
                )


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
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
