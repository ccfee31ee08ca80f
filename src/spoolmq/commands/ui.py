"""``spoolmq ui``: the web console (:mod:`spoolmq.ui`), its password and its API tokens.

``spoolmq ui [--listen 127.0.0.1:8080] [--read-only]`` serves the console;
``spoolmq ui --set-password`` sets the login password (from the terminal, or one line of
stdin when stdin is not a terminal) and exits; ``spoolmq ui token create NAME`` prints a
new API token once on its last line, ``token list`` and ``token revoke ID`` manage them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import ipaddress
import socket
import sys
from pathlib import Path

from spoolmq.commands.common import (
    CommandFactory,
    data_dir,
    print_json,
    print_table,
    require_extra,
)
from spoolmq.config import address_family, host_port, listen_error
from spoolmq.errors import ConfigError, InvalidArgumentError
from spoolmq.files import check_data_dir

DEFAULT_LISTEN = "127.0.0.1:8080"


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:8080`` for IPv6) with a port 0-65535 (0: any free port), read
    as ``broker --listen`` reads it."""
    from spoolmq.client.connection import parse_address

    try:
        return parse_address(text)
    except InvalidArgumentError:
        raise InvalidArgumentError(
            f"--listen takes HOST:PORT, e.g. {DEFAULT_LISTEN}, not {text!r}"
        ) from None


def _read_password() -> str:
    if sys.stdin.isatty():
        first = getpass.getpass("New console password: ")
        if getpass.getpass("Again: ") != first:
            raise InvalidArgumentError("the two passwords differ; nothing was changed")
        return first
    return sys.stdin.readline().rstrip("\r\n")


def cmd_ui(args: argparse.Namespace) -> int:
    from spoolmq.ui import auth

    # A token is for a store that exists; a password may be set before the first broker.
    data = data_dir(args, must_exist=not args.set_password, store=False)
    # As every command that opens a store: 0700, or refused when others can write it (they
    # could plant a password or a token, or alter what the console shows and acts on).
    check_data_dir(data)
    if args.ui_command == "token":
        return _token(args, data)
    if args.set_password:
        auth.set_password(data, _read_password())
        print(f"console password set (hashed in {data / auth.PASSWORD_FILE})")
        return 0
    if not auth.password_is_set(data):
        raise ConfigError(
            f"set the console's password first: spoolmq ui --set-password --data {data}"
        )
    host, port = parse_listen(args.listen)
    return _serve(data, host, port, read_only=args.read_only)


def _serve(data: Path, host: str, port: int, *, read_only: bool) -> int:
    require_extra("ui", "spoolmq ui")
    import uvicorn

    from spoolmq.ui import create_app

    try:
        sock = socket.create_server((host, port), family=address_family(host))
    except OSError as exc:
        raise listen_error((host, port), exc) from None
    address, bound = sock.getsockname()[:2]
    if not ipaddress.ip_address(address).is_loopback:
        print(
            f"spoolmq: the console on {address} speaks plain HTTP, so its login crosses the "
            "network as it is; put a TLS proxy or an SSH tunnel in front of it",
            file=sys.stderr,
        )
    app = create_app(data, read_only=read_only)
    # An open live page is a stream that never ends: shutdown waits at most 3 s for them.
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=3)
    print(
        f"spoolmq console at http://{host_port(address, bound)}/"
        + (" (read-only)" if read_only else ""),
        flush=True,
    )
    uvicorn.Server(config).run(sockets=[sock])
    return 0


def _token(args: argparse.Namespace, data: Path) -> int:
    from spoolmq.ui import auth

    if args.token_action == "create":
        if not args.name:
            raise InvalidArgumentError("ui token create needs a NAME (what the token is for)")
        info, token = auth.create_token(data, args.name)
        print(f"API token {info.id} ({info.name}); it is shown only now:")
        print(token)
    elif args.token_action == "list":
        tokens = auth.list_tokens(data)
        rows = [{"id": t.id, "name": t.name, "created": _iso(t.created_ms)} for t in tokens]
        if args.json:
            print_json(rows)
        else:
            print_table("API tokens", ["id", "name", "created"], [list(r.values()) for r in rows])
    else:
        if not args.name:
            raise InvalidArgumentError("ui token revoke needs the token's ID (see ui token list)")
        auth.revoke_token(data, args.name)
        print(f"revoked API token {args.name}")
    return 0


def _iso(ms: int) -> str:
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).isoformat(timespec="seconds")


def register(command: CommandFactory) -> None:
    p = command("ui", cmd_ui, "the web console (and its password and API tokens)")
    p.add_argument(
        "--listen",
        default=DEFAULT_LISTEN,
        metavar="HOST:PORT",
        help=f"address to serve on (default {DEFAULT_LISTEN}; port 0: any free port)",
    )
    p.add_argument(
        "--read-only",
        action="store_true",
        help="show everything, refuse every action (redrive, purge, reset)",
    )
    p.add_argument(
        "--set-password",
        action="store_true",
        help="set the login password (terminal, or stdin when piped) and exit",
    )
    sub = p.add_subparsers(dest="ui_command", metavar="token")
    t = sub.add_parser(
        "token",
        help="API tokens for /api/ (Authorization: Bearer TOKEN)",
        description="create, list or revoke API tokens",
    )
    # --data after ``token`` too; SUPPRESS keeps a --data given before it from being reset.
    t.add_argument("--data", default=argparse.SUPPRESS, help="data directory (as for ui)")
    t.add_argument(
        "token_action",
        choices=["create", "list", "revoke"],
        help="create NAME (prints the token once, on the last line), list, or revoke ID",
    )
    t.add_argument("name", nargs="?", help="create: what the token is for; revoke: its id")
    t.add_argument("--json", action="store_true", help="list as JSON")
