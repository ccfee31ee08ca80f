"""``spoolmq users add/list/remove``: the SCRAM-SHA-256 credentials of the Kafka front.

A Kafka listener on an address other than loopback accepts only clients that
authenticate with SASL/SCRAM-SHA-256 as one of these users. The password is read from
the terminal without echo, or as one line from stdin when stdin is not a terminal (for
scripts); only its salted SCRAM keys are stored, in the data directory's ``users`` file
(mode 0600). A running broker reads the file at each authentication: no restart needed.
Only passwords that SASLprep leaves unchanged are accepted (spoolmq.kafka.saslprep says
why: Kafka clients differ on whether they prepare a password before hashing it).
"""

from __future__ import annotations

import argparse
import getpass
import sys

from spoolmq.commands.common import CommandFactory, data_dir, print_json, print_table
from spoolmq.errors import InvalidArgumentError

# A password longer than this is surely a mistake (a file piped by accident).
MAX_PASSWORD_CHARS = 1024


def read_password() -> str:
    if sys.stdin.isatty():
        password = getpass.getpass("password: ")
        if getpass.getpass("again: ") != password:
            raise InvalidArgumentError("the two passwords differ")
    else:
        password = sys.stdin.readline(MAX_PASSWORD_CHARS + 2).rstrip("\r\n")
    if not password:
        raise InvalidArgumentError("an empty password is not accepted")
    if len(password) > MAX_PASSWORD_CHARS:
        raise InvalidArgumentError(f"a password is at most {MAX_PASSWORD_CHARS} characters")
    from spoolmq.kafka.saslprep import check_stable_password

    return check_stable_password(password)


def cmd_users(args: argparse.Namespace) -> int:
    from spoolmq.files import check_data_dir
    from spoolmq.kafka.scram import (
        MECHANISM,
        Credential,
        check_user_name,
        load_users,
        update_users,
    )

    data = data_dir(args, must_exist=args.action != "add", store=False)
    # As every command that opens a store: 0700 (made so if new), or refused when others
    # can write it (they could plant a user of their own for the Kafka listener).
    check_data_dir(data)
    if args.action == "list":
        users = load_users(data)
        if args.json:
            print_json([{"user": n, "mechanism": MECHANISM} for n in sorted(users)])
        else:
            rows = [[n, MECHANISM, c.iterations] for n, c in sorted(users.items())]
            print_table("users", ["user", "mechanism", "iterations"], rows)
        return 0
    if args.name is None:
        raise InvalidArgumentError(
            f"users {args.action} needs a NAME: `spoolmq users {args.action} NAME` "
            f"(see `spoolmq users --help`)"
        )
    name = check_user_name(args.name)
    if args.action == "add":
        # Read the password before taking the lock: a person typing must not hold it.
        credential = Credential.derive(read_password())

        def add(users: dict[str, Credential]) -> None:
            if name in users and not args.replace:
                raise InvalidArgumentError(f"user {name!r} exists (pass --replace to change it)")
            users[name] = credential

        update_users(data, add)
        print(f"user {name} {'replaced' if args.replace else 'added'}")
        return 0

    def remove(users: dict[str, Credential]) -> None:
        if users.pop(name, None) is None:
            raise InvalidArgumentError(f"no user {name!r}")

    update_users(data, remove)
    print(f"user {name} removed")
    return 0


def register(command: CommandFactory) -> None:
    p = command("users", cmd_users, "add, list or remove the Kafka listener's SCRAM users")
    p.add_argument("action", choices=["add", "list", "remove"], help="what to do")
    p.add_argument("name", nargs="?", help="the user (for add and remove)")
    p.add_argument("--replace", action="store_true", help="add: change an existing password")
    p.add_argument("--json", action="store_true", help="list: as JSON")
