"""The ``spoolmq`` command's subcommands that live in their own modules.

:mod:`spoolmq.cli` builds the parser; each module named in :data:`COMMAND_MODULES` has a
``register(command)`` that adds its subcommands through the ``command(name, handler, help)``
factory :func:`spoolmq.cli.build_parser` passes (which adds ``--data`` and sets the handler).
A feature's commands stay beside each other, and adding one touches one line here.
"""

from __future__ import annotations

COMMAND_MODULES: tuple[str, ...] = (
    "spoolmq.commands.broker",
    "spoolmq.commands.stats",
    "spoolmq.commands.ui",
    "spoolmq.commands.read",
    "spoolmq.commands.top",
    "spoolmq.commands.users",
    "spoolmq.commands.tasks",
    "spoolmq.commands.kafka",
)
