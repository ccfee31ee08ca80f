"""``spoolmq stats``: a running broker's figures over the admin connection."""

from __future__ import annotations

import argparse

from spoolmq.commands.common import CommandFactory, print_json, print_table


def cmd_stats(args: argparse.Namespace) -> int:
    from spoolmq.client import Admin

    with Admin(args.data) as admin:
        stats = admin.stats()
    stats.pop("id", None)
    stats.pop("op", None)
    if args.json:
        print_json(stats)
    else:
        rows = [["broker pid", stats["pid"]]]
        rows += [[f"{k} clients", v] for k, v in stats["clients"].items()]
        rows += [[f"published {k}", v] for k, v in stats["publisher"].items() if k != "by_topic"]
        rows += [[f"consumer {k}", v] for k, v in stats["consumer"].items()]
        rows += [[f"{k} restarts", v] for k, v in stats["restarts"].items()]
        print_table("broker", ["figure", "value"], rows)
    return 0


def register(command: CommandFactory) -> None:
    p = command("stats", cmd_stats, "a running broker's figures")
    p.add_argument("--json", action="store_true")
