"""The layering rule of docs/ARCHITECTURE.md, checked on every import in ``src/spoolmq``.

Each module belongs to one layer, and a layer imports only the layers below it:

    foundation (errors, config, clock, files, types, allocator, inotify)
      <- store
      <- protocol                (with the clients: only the store's message and record forms)
      <- broker, client          (neither imports the other; the Kafka front is broker)
      <- tasks                   (the task layer: the public client API only)
      <- analytics               (the files only: foundation, never the store code or Spark
                                  outside it)
      <- the application layer (cli, demo, bench, testing, ...), which may import anything

A new module must be put in a layer here (and in docs/ARCHITECTURE.md) before it is used.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import spoolmq

SOURCE = Path(spoolmq.__file__).parent

FOUNDATION = {"errors", "config", "clock", "files", "types", "allocator", "inotify"}
LAYER_OF_PACKAGE = {
    "store": "store",
    "broker": "broker",
    "client": "client",
    "analytics": "analytics",
    # The Kafka front is a broker process of its own (a child of the BrokerManager).
    "kafka": "broker",
    # The task layer is built on the public client API only.
    "tasks": "tasks",
    "ui": "application",
    "commands": "application",
}
LAYER_OF_MODULE = {
    **dict.fromkeys(FOUNDATION, "foundation"),
    "protocol": "protocol",
    **dict.fromkeys(
        [
            "__init__",
            "__main__",
            "cli",
            "demo",
            "bench",
            "testing",
            "stats",
            "operations",
            "browse",
        ],
        "application",
    ),
}
# What each layer may import (besides itself).
ALLOWED = {
    "foundation": {"foundation"},
    "store": {"foundation"},
    "protocol": {"foundation", "store"},
    "broker": {"foundation", "store", "protocol"},
    "client": {"foundation", "store", "protocol"},
    "analytics": {"foundation"},
    "tasks": {"foundation", "store", "protocol", "client"},
    "application": {
        "tasks",
        "foundation",
        "store",
        "protocol",
        "broker",
        "client",
        "analytics",
        "application",
    },
}
ONLY_IN_ANALYTICS = ("pyspark", "matplotlib")
# The clients and the wire codec share the store's message and record forms, never the code
# that writes and reads the files.
STORE_FORMS = {
    "spoolmq.store.message",
    "spoolmq.store.record",
    "spoolmq.store.names",
    "spoolmq.store.partitioner",
}


def layer_of(module: str) -> str:
    """``spoolmq.store.segment`` -> ``store``; raises for a module no layer claims."""
    parts = module.split(".")
    assert parts[0] == "spoolmq", module
    if len(parts) == 1:
        return "application"  # the package's __init__
    head = parts[1]
    if head in LAYER_OF_PACKAGE:
        return LAYER_OF_PACKAGE[head]
    if head in LAYER_OF_MODULE:
        return LAYER_OF_MODULE[head]
    raise AssertionError(
        f"{module} belongs to no layer: add it to tests/test_layering.py and docs/ARCHITECTURE.md"
    )


def module_name(path: Path) -> str:
    relative = path.relative_to(SOURCE.parent).with_suffix("")
    parts = list(relative.parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path) -> list[tuple[int, str]]:
    """Every module ``path`` imports, at any depth (function-local imports count)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            if name == "spoolmq":  # `from spoolmq import protocol` imports a submodule
                for alias in node.names:
                    is_module = (SOURCE / f"{alias.name}.py").exists() or (
                        SOURCE / alias.name
                    ).is_dir()
                    found.append((node.lineno, f"spoolmq.{alias.name}" if is_module else name))
            else:
                found.append((node.lineno, name))
    return found


SOURCES = sorted(SOURCE.rglob("*.py"))


def test_the_rule_itself_catches_an_upward_import(tmp_path: Path) -> None:
    """The checker is not vacuous: a store module importing the broker is a violation."""
    assert "broker" not in ALLOWED[layer_of("spoolmq.store.segment")]
    assert layer_of("spoolmq.broker.manager") == "broker"
    with pytest.raises(AssertionError, match="belongs to no layer"):
        layer_of("spoolmq.somewhere_new")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(SOURCE)))
def test_each_module_imports_only_the_layers_below_it(path: Path) -> None:
    own = layer_of(module_name(path))
    wrong = []
    for line, name in imports_of(path):
        if name.split(".")[0] in ONLY_IN_ANALYTICS and own not in ("analytics", "application"):
            wrong.append(f"line {line}: {name} (heavy analytics dependency)")
        if name != "spoolmq" and not name.startswith("spoolmq."):
            continue
        target = layer_of(name)
        if target != own and target not in ALLOWED[own]:
            wrong.append(f"line {line}: {name} ({own} must not import {target})")
        elif own in ("client", "protocol") and target == "store" and name not in STORE_FORMS:
            wrong.append(f"line {line}: {name} ({own} uses only the store's forms)")
    assert not wrong, f"{path.relative_to(SOURCE)}:\n" + "\n".join(wrong)
