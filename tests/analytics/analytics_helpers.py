"""Helpers shared by the analytics tests."""

from __future__ import annotations

import os
import shutil
import zlib
from typing import Any

import orjson
import pytest


def record_line(**fields: Any) -> str:
    """A segment line as the store writes it: the CRC-32 of the bytes before ``,"crc":``
    (docs/FORMAT.md), computed here independently of the store's code."""
    head = orjson.dumps(fields)[:-1]
    return (head + b',"crc":%d}' % zlib.crc32(head)).decode()


def need(program: str, package: str) -> str:
    """The program's path; skip when it is missing, but fail in CI (.ci/run installs it)."""
    found = shutil.which(program)
    if found is None:
        message = f"{program} is not installed (apt-get install {package})"
        if os.environ.get("CI"):
            pytest.fail(f"{message}: .ci/run installs it")
        pytest.skip(message)
    return found
