"""The web console (``spoolmq ui``): a Starlette application over the data directory.

It reads the files through the store and :mod:`spoolmq.operations` (so it works with no
broker running), and asks the running broker over the admin connection when there is one.
See the README's "Web console" section for the pages and the JSON API.

Starlette comes with the ``ui`` extra, so it is imported only when an application is
built: ``spoolmq ui --set-password`` and ``ui token`` (:mod:`spoolmq.ui.auth`) work
without it, and ``spoolmq ui`` can say which extra to install.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from starlette.applications import Starlette


def create_app(data: Path, *, read_only: bool = False) -> Starlette:
    """The console for the data directory ``data`` (see :func:`spoolmq.ui.app.create_app`)."""
    from spoolmq.ui.app import create_app as build

    return build(data, read_only=read_only)


__all__ = ["create_app"]
