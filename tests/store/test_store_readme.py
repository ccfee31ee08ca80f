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


def test_the_fields_are_written_in_the_order_the_readme_lists_them(tmp_path: Path) -> None:
    """A record with every field, written by the store, against the README's table (the
    broker's records must come in the same order: check_line refuses any other). The
    table had producer_id before sequence."""
    import re

    from readme_examples import README
    from spoolmq import Store
    from spoolmq.store.message import Message

    section = README.read_text().split("## On-disk format", 1)[1].split("\n## ", 1)[0]
    table = re.findall(r"^\| `(\w+)` \|", section, re.M)
    assert table[:3] == ["offset", "timestamp", "key"] and table[-1] == "crc"
    with Store(tmp_path / "d") as store:
        message = Message(
            value={"n": 1},
            key="k",
            headers=[("h", "v")],
            tags=["t"],
            deliver_at=10**13,
            expires_at=10**13 + 1,
            producer_id="p-1",
            sequence=4,
        )
        store.append_batch("t", [message, Message(value=2)])
        [segment] = (tmp_path / "d" / "logs" / "t" / "0").glob("*.jsonl")
        line = segment.read_bytes().splitlines()[0]
    fields = list(check_line(line + b"\n"))
    assert fields == [name for name in table if name in fields], "order as the README lists"
    assert {"producer_id", "sequence", "batch_records", "tags", "deliver_at"} <= set(fields)


def test_the_format_documents_example_line_is_a_valid_record() -> None:
    from readme_examples import README

    text = (README.parent / "docs" / "FORMAT.md").read_text()
    example = text.split("Example (one line in the file, wrapped here):", 1)[1]
    block = example.split("```json\n", 1)[1].split("```", 1)[0]
    line = "".join(part.strip() for part in block.splitlines()).encode() + b"\n"
    record = record_from_fields(check_line(line))  # its CRC checks out
    assert (record.offset, record.key, record.tags) == (7, "customer-7", ("vip",))


def test_the_record_modules_example_line_is_a_valid_record() -> None:
    from spoolmq.store import record as record_module

    doc = record_module.__doc__ or ""
    block = doc.split("fields in this order::", 1)[1].split("\n\n", 2)[1]
    line = "".join(part.strip() for part in block.splitlines()).encode() + b"\n"
    fields = check_line(line)
    assert list(fields)[-3:] == ["producer_id", "batch_records", "crc"]
