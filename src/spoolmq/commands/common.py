"""What every command renderer shares: JSON and table output, the data directory."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson

from spoolmq.config import resolve_data_dir
from spoolmq.errors import ConfigError

Handler = Callable[[argparse.Namespace], int]


class CommandFactory(Protocol):
    """``command(name, handler, help_text)``: a subcommand's parser, with ``--data`` added and
    ``handler`` set as what runs it."""

    def __call__(self, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        """Add the subcommand ``name`` and return its parser."""
        ...


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def print_table(title: str, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    Console().print(table)


def data_dir(args: argparse.Namespace, *, must_exist: bool = False) -> Path:
    """The data directory; ``must_exist`` for commands that only look at a store, so that a
    mistyped ``--data`` is an error instead of a new empty store."""
    data = resolve_data_dir(args.data)
    if must_exist and not data.is_dir():
        raise ConfigError(f"no queue data directory at {data} (pass --data or set SPOOLMQ_DATA)")
    return data
