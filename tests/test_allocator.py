"""``spoolmq.tune_allocator`` in a process of its own, as an application would call it."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only"
)
def test_tune_allocator_reaches_glibc_in_a_fresh_process() -> None:
    code = (
        "import spoolmq, sys; "
        "ok = spoolmq.tune_allocator(); "
        # A heap that keeps what it frees: 20 MiB of small blocks freed and taken again.
        "blocks = [bytearray(200) for _ in range(100_000)]; del blocks; "
        "sys.stdout.write(str(ok))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout == "True"
