"""What a task's arguments and results may be: JSON, checked where the caller can see it.

``orjson`` would quietly turn a ``datetime``, a ``UUID`` or a dataclass into a string or an
object, and the task would receive something else than was sent; pickle would run code
from the queue. So a task's arguments are checked before anything is stored, and the
first value JSON cannot carry is named with its path (``kwargs['when']: datetime``).
"""

from __future__ import annotations

import math
from typing import Any

from spoolmq.errors import SerializationError

_INT_RANGE = (-(2**63), 2**64 - 1)  # what orjson writes and reads back as an int


def task_id_of(value: Any) -> str | None:
    """The task id a task message's value carries (``{"task": ..., "id": ...}``), None
    for a value that is not a task message."""
    task_id = value.get("id") if isinstance(value, dict) else None
    return task_id if isinstance(task_id, str) and isinstance(value.get("task"), str) else None


def check_json(value: Any, where: str) -> None:
    """SerializationError naming the first part of ``value`` that is not plain JSON
    (dicts with string keys, lists, tuples, str, int, finite float, bool, None)."""
    stack: list[tuple[Any, str]] = [(value, where)]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, str | bool):
            continue
        if isinstance(item, int):
            if not _INT_RANGE[0] <= item <= _INT_RANGE[1]:
                raise SerializationError(f"{path}: the integer {item} is out of JSON's range")
            continue
        if isinstance(item, float):
            if not math.isfinite(item):
                raise SerializationError(f"{path}: {item} is not a JSON number")
            continue
        if isinstance(item, list | tuple):
            stack.extend((element, f"{path}[{i}]") for i, element in enumerate(item))
            continue
        if isinstance(item, dict):
            for key, element in item.items():
                if not isinstance(key, str):
                    raise SerializationError(
                        f"{path}: the key {key!r} is a {type(key).__name__}; JSON keys are text"
                    )
                stack.append((element, f"{path}[{key!r}]"))
            continue
        raise SerializationError(
            f"{path}: a {type(item).__name__} cannot travel as JSON (task arguments and "
            "results are JSON: pass str, int, float, bool, None, lists and dicts)"
        )
