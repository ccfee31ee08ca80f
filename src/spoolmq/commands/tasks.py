"""``spoolmq worker`` (run tasks) and ``spoolmq tasks list|inspect|cancel|result|periodic``.

The ``tasks`` commands read ``<data>/tasks.db`` (spoolmq.tasks.results) and need no
running broker: results and periodic jobs are readable while it is down.
"""

from __future__ import annotations

import argparse
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from spoolmq.commands.common import (
    CommandFactory,
    data_dir,
    positive,
    print_json,
    print_table,
)
from spoolmq.errors import ConfigError
from spoolmq.tasks.schedule import tick_ms


def cmd_worker(args: argparse.Namespace) -> int:
    import os

    from spoolmq.tasks.worker import run_worker

    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s worker[%(process)d] %(levelname)s %(name)s: %(message)s",
    )
    if args.data:
        # The worker processes build their Tasks from the module; --data reaches them (and
        # a Tasks() without data=) through the environment every spoolmq process reads.
        os.environ["SPOOLMQ_DATA"] = str(args.data)
    topics = [t for t in args.topics.split(",") if t] if args.topics else None
    return run_worker(
        args.spec,
        processes=args.processes,
        concurrency=args.concurrency,
        topics=topics,
        scheduler=not args.no_scheduler,
        shutdown_timeout=args.shutdown_timeout,
    )


def _store(args: argparse.Namespace) -> Any:
    from spoolmq.tasks.results import FILE_NAME, ResultStore

    data = data_dir(args, must_exist=True, store=False)  # tasks.db is looked for instead
    if not (data / FILE_NAME).exists():
        raise ConfigError(f"no tasks have been sent with {data} ({FILE_NAME} does not exist)")
    return ResultStore(data)


def _when(ms: int | None) -> str:
    if ms is None:
        return ""
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def cmd_list(args: argparse.Namespace) -> int:
    rows = _store(args).recent(state=args.state, name=args.name, limit=args.limit)
    if args.json:
        print_json([row.as_dict() for row in rows])
        return 0
    print_table(
        "tasks (newest first)",
        ["id", "task", "state", "attempts", "created (UTC)", "finished (UTC)", "error"],
        [
            [r.id, r.name, r.state, r.attempts, _when(r.created_ms), _when(r.finished_ms), r.error]
            for r in rows
        ],
        whole=["id"],  # to copy into `tasks inspect ID`
    )
    return 0


def _row_or_fail(args: argparse.Namespace) -> Any:
    row = _store(args).get(args.task_id)
    if row is None:
        print(f"spoolmq: no task {args.task_id} (unknown, or its result expired)", file=sys.stderr)
    return row


def cmd_inspect(args: argparse.Namespace) -> int:
    row = _row_or_fail(args)
    if row is None:
        return 1
    fields = row.as_dict()
    if args.json:
        print_json(fields)
    else:
        for ms in ("created_ms", "eta_ms", "started_ms", "finished_ms", "expires_ms"):
            fields[ms] = _when(fields[ms])
        traceback = fields.pop("traceback")
        print_table(f"task {row.id}", ["field", "value"], [[k, v] for k, v in fields.items()])
        if traceback:
            print(traceback)
    return 0


def cmd_result(args: argparse.Namespace) -> int:
    from spoolmq.tasks.results import SUCCEEDED

    row = _row_or_fail(args)
    if row is None:
        return 1
    if args.json:
        print_json({"id": row.id, "state": row.state, "result": row.result, "error": row.error})
    elif row.state == SUCCEEDED:
        print_json(row.result)
    else:
        print(f"{row.state}" + (f": {row.error}" if row.error else ""))
    return 0 if row.state == SUCCEEDED else 2


def cmd_cancel(args: argparse.Namespace) -> int:
    from spoolmq.tasks.app import cancel_task

    store = _store(args)
    cancelled = cancel_task(store, args.task_id, store.data)
    if args.json:
        print_json({"id": args.task_id, "cancelled": cancelled})
    else:
        print(
            f"{args.task_id}: cancelled, it will not run"
            if cancelled
            else f"{args.task_id}: not cancelled (unknown, running or finished)"
        )
    return 0 if cancelled else 1


def cmd_periodic_list(args: argparse.Namespace) -> int:
    jobs = _store(args).periodic_jobs()
    if args.json:
        print_json(jobs)
        return 0
    print_table(
        "periodic jobs",
        ["name", "task", "schedule", "last tick (UTC)", "last sent (UTC)", "next (UTC)"],
        [
            [
                j["name"],
                j["task"],
                j["schedule"],
                _when(tick_ms(j["schedule"], j["last_tick"])),
                _when(j["last_fired_ms"]),
                _when(j["next_ms"]),
            ]
            for j in jobs
        ],
    )
    return 0


def register(command: CommandFactory) -> None:
    from spoolmq.tasks.results import STATES

    p = command("worker", cmd_worker, "run the tasks of MODULE:TASKS")
    p.add_argument("spec", metavar="MODULE:TASKS", help="e.g. myapp.jobs:tasks")
    p.add_argument("--processes", type=int, default=1, help="worker processes (default 1)")
    p.add_argument("--concurrency", type=int, default=1, help="tasks at a time in each")
    p.add_argument("--topics", help="only the tasks of these topics (comma-separated)")
    p.add_argument("--no-scheduler", action="store_true", help="do not send periodic jobs")
    p.add_argument(
        "--shutdown-timeout", type=float, default=30.0, help="seconds to finish on SIGTERM"
    )
    p.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="what the workers log to stderr (default: info)",
    )

    tasks = command("tasks", lambda args: _no_action(tasks), "sent tasks and their results")
    sub = tasks.add_subparsers(dest="tasks_command", metavar="ACTION")

    def action(name: str, handler: Any, help_text: str) -> argparse.ArgumentParser:
        parser = sub.add_parser(name, help=help_text, description=help_text)
        parser.add_argument("--json", action="store_true", help="print JSON")
        _data_option(parser)
        parser.set_defaults(handler=handler)
        return parser

    listing = action("list", cmd_list, "the newest tasks")
    listing.add_argument("--state", choices=STATES, help="only tasks in this state")
    listing.add_argument("--name", help="only this task")
    listing.add_argument(
        "--limit", type=positive, default=50, help="at most this many (default 50)"
    )
    for name, handler, help_text in (
        ("inspect", cmd_inspect, "everything about one task"),
        ("result", cmd_result, "one task's result (exit 2 if it did not succeed)"),
        ("cancel", cmd_cancel, "cancel a task that has not started"),
    ):
        action(name, handler, help_text).add_argument("task_id", help="the task's id")
    periodic = sub.add_parser("periodic", help="periodic jobs")
    periodic_sub = periodic.add_subparsers(dest="periodic_command", metavar="ACTION")
    p_list = periodic_sub.add_parser("list", help="the periodic jobs and their last ticks")
    p_list.add_argument("--json", action="store_true", help="print JSON")
    _data_option(p_list)
    p_list.set_defaults(handler=cmd_periodic_list)
    periodic.set_defaults(handler=lambda args: _no_action(periodic))


def _data_option(parser: argparse.ArgumentParser) -> None:
    # Also after the action (``spoolmq tasks list --data DIR``); SUPPRESS keeps an absent
    # one from overwriting a ``--data`` given before it.
    parser.add_argument("--data", default=argparse.SUPPRESS, help=argparse.SUPPRESS)


def _no_action(parser: argparse.ArgumentParser) -> int:
    parser.print_help()
    return 2
