"""What every command renderer shares: JSON and table output, the data directory."""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from spoolmq.config import resolve_data_dir
from spoolmq.errors import ConfigError

if TYPE_CHECKING:
    from rich.console import Console

Handler = Callable[[argparse.Namespace], int]


class CommandFactory(Protocol):
    """``command(name, handler, help_text)``: a subcommand's parser, with ``--data`` added and
    ``handler`` set as what runs it."""

    def __call__(self, name: str, handler: Handler, help_text: str) -> argparse.ArgumentParser:
        """Add the subcommand ``name`` and return its parser."""
        ...


def print_json(value: Any) -> None:
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def print_table(
    title: str,
    columns: Sequence[str],
    rows: Sequence[Sequence[Any]],
    *,
    whole: Sequence[str] = (),
) -> None:
    """A table on stdout. The columns named in ``whole`` are never cut short, however
    narrow the terminal (ids to copy into another command): the others give way."""
    from rich.table import Table

    cells = [["" if cell is None else str(cell) for cell in row] for row in rows]
    table = Table(title=title)
    for index, column in enumerate(columns):
        if column in whole:
            widest = max((len(row[index]) for row in cells), default=0)
            table.add_column(column, no_wrap=True, min_width=max(widest, len(column)))
        else:
            table.add_column(column)
    for row in cells:
        table.add_row(*row)
    table_console().print(table)


def table_console() -> Console:
    """A console for tables: a terminal's width, and in a pipe or a file (with no
    ``COLUMNS`` set) as wide as each table needs, so that ``| grep`` and ``> file`` get
    every cell whole instead of cut to 80 columns."""
    from rich.console import Console

    if sys.stdout.isatty() or os.environ.get("COLUMNS"):
        return Console()
    return Console(width=_PIPE_WIDTH)


_PIPE_WIDTH = 100_000  # a table is no wider than its cells need


def data_dir(args: argparse.Namespace, *, must_exist: bool = False, store: bool = True) -> Path:
    """The data directory; ``must_exist`` for commands that only look at a store, so that a
    mistyped ``--data`` is an error instead of a new empty store (and, unless ``store`` is
    False for a command that reads other files there, one that is not a store yet)."""
    data = resolve_data_dir(args.data)
    if must_exist and not data.is_dir():
        raise ConfigError(f"no queue data directory at {data} (pass --data or set SPOOLMQ_DATA)")
    if must_exist and store and not (data / "state.db").is_file():
        # An existing directory that is not a store (``--data .``, ``--data ~``): opening
        # it would make one there, and make the directory private.
        raise ConfigError(
            f"{data} is not a queue data directory (it has no state.db); pass the one the "
            "broker uses (--data or SPOOLMQ_DATA)"
        )
    return data


# -- numeric options: argparse ``type=`` functions ----------------------------------------
# Each turns a bad value into argparse's one-line usage error instead of a traceback or
# a value that silently means something else (``--timeout nan``, ``--max -1``).

#: The largest number of seconds an option takes: a year is more than any wait a command
#: makes, and keeps ``inf`` and ``1e12`` from overflowing the clocks they are added to.
MAX_SECONDS = 365 * 24 * 3600.0


def natural(text: str) -> int:
    """A whole number, 0 or more.

    >>> natural("3")
    3
    """
    return _whole(text, minimum=0)


def positive(text: str) -> int:
    """A whole number, 1 or more."""
    return _whole(text, minimum=1)


def _whole(text: str, *, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"{text!r} must be {minimum} or more")
    if value > 2**63 - 1:  # past what JSON frames and SQLite hold
        raise argparse.ArgumentTypeError(f"{text!r} is too large (at most 2**63 - 1)")
    return value


def seconds(text: str) -> float:
    """A finite number of seconds from 0 to :data:`MAX_SECONDS`.

    >>> seconds("2.5")
    2.5
    """
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 <= value <= MAX_SECONDS:  # also false for nan
        raise argparse.ArgumentTypeError(
            f"{text!r} must be a number of seconds from 0 to {MAX_SECONDS:.0f} (a year)"
        )
    return value


def seconds_positive(text: str) -> float:
    """Like :func:`seconds`, but more than 0: a wait of 0 would end before the first
    answer could arrive (``export``'s cluster, ``consume``'s first delivery)."""
    value = seconds(text)
    if value == 0:
        raise argparse.ArgumentTypeError(
            "0 would stop before the first answer could arrive: give a positive number of seconds"
        )
    return value


# -- optional extras -------------------------------------------------------------------------

#: Each extra of the package (pyproject.toml) and the modules its commands import.
EXTRAS: dict[str, tuple[str, ...]] = {
    "analytics": ("pyspark", "matplotlib"),
    "ui": ("starlette", "uvicorn", "multipart"),
    "kafka": ("cramjam", "confluent_kafka"),
}


def require_extra(extra: str, what: str, modules: Sequence[str] | None = None) -> None:
    """Refuse, as one line and a non-zero exit, to run ``what`` (a command) when a module of
    ``extra`` cannot be imported, naming the install command, instead of the
    ``ModuleNotFoundError`` traceback the first import deep inside would give. Call it at
    the command's entry point, before anything starts.

    A module that is there but fails to import for another reason still raises its own
    error: that is not a missing extra. ``modules``: the ones of the extra that ``what``
    needs, when not all."""
    for module in EXTRAS[extra] if modules is None else modules:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name is not None and exc.name.split(".")[0] != module:
                raise
            raise ConfigError(
                f"{what} needs the {extra!r} extra ({module} is not installed): "
                f"pip install 'spoolmq[{extra}]' (or uv add 'spoolmq[{extra}]')"
            ) from None
