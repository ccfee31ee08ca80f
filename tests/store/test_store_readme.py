"""The README's embedded-store example and on-disk format example, checked against the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from readme_examples import code_blocks
from spoolmq.store.record import check_line, record_from_fields


def test_the_embedded_store_example_runs_as_written(tmp_path: Path) -> None:
    (example,) = code_blocks("The embedded store (no broker)")
    completed = subprocess.run(
        [sys.executable, "-c", example], cwd=tmp_path, capture_output=True, timeout=120
    )
    assert completed.returncode == 0, completed.stderr.decode()
    lines = completed.stdout.decode().splitlines()
    assert lines[:4] == ["0", "1", "0", "1"]
    keyed_partition = int(lines[4])
    # Partition 0 holds {"n": 0}, {"n": 2}, and {"n": 9} when the key hashes there.
    values = [line.split(" ", 3)[3] for line in lines[5:]]
    expected = ["{'n': 0} []", "{'n': 2} []"] + (["{'n': 9} []"] if keyed_partition == 0 else [])
    assert values == expected
    assert (tmp_path / "queue_data" / "logs" / "events" / "0").is_dir()


def test_the_format_example_lines_are_valid_records() -> None:
    (example,) = code_blocks("On-disk format", "json")
    lines = [line.encode() + b"\n" for line in example.splitlines()]
    first, second = (record_from_fields(check_line(line)) for line in lines)
    assert (first.offset, first.key) == (0, "customer-7")
    assert first.value == {"order_id": 1, "amount": 12.5}
    assert first.headers == [("trace", "abc")]
    assert (second.key, second.value) == (b"\x01k", b"\x00\xffraw")
