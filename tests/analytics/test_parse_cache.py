"""The parse cache's bookkeeping (analytics/cache.py) without Spark: what a run plans to
parse, what it counts as reused, and what a later run does with a file that grew, was
replaced or lost its rows. Spark's part of a run (writing the staged rows as Parquet) is
played by writing a part file into the file's directory, as ``partitionBy`` would."""

from __future__ import annotations

import os
from pathlib import Path

from spoolmq.analytics.cache import ParseCache, Staged, bytes_to_parse

LINE = b'{"ts":1,"type":"acked","group":"g"}\n'


def _events(data: Path, name: str = "1-1.jsonl") -> Path:
    path = data / "events" / "2026-11-26" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _run(root: Path, data: Path, files: list[Path]) -> tuple[list[bytes], Staged]:
    """One run's bookkeeping: plan, Spark's part files for what was staged, record, commit,
    close. Returns the staged bytes (the stage is gone after the run) and the figures."""
    cache = ParseCache(root, data)
    staged = cache.plan("events", files)
    contents = [path.read_bytes() for path in staged.keep]
    for path in staged.keep:
        part = (
            cache.table("events")
            / f"file_id={path.stem}"
            / f"part-{len(os.listdir(path.parent))}.parquet"
        )
        part.parent.mkdir(parents=True, exist_ok=True)
        part.write_bytes(b"PAR1")
    cache.record("events")
    cache.commit()
    cache.close()
    assert not cache.stage.exists()
    return contents, staged


def test_a_new_file_with_only_a_half_written_line_is_neither_parsed_nor_reused(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    events = _events(data)
    events.write_bytes(LINE[:10])
    _, staged = _run(tmp_path / "cache", data, [events])
    assert (staged.files_parsed, staged.files_reused, staged.parsed_bytes) == (0, 0, 0)
    assert staged.reused_bytes == 0
    assert len(staged.fragments) == 1 and staged.keep == []


def test_a_file_is_reused_then_read_from_its_extent_then_again_whole_when_replaced(
    tmp_path: Path,
) -> None:
    data, root = tmp_path / "data", tmp_path / "cache"
    events = _events(data)
    events.write_bytes(LINE * 3 + LINE[:5])
    _, first = _run(root, data, [events])
    assert (first.files_parsed, first.files_reused, first.parsed_bytes) == (1, 0, 3 * len(LINE))
    assert len(first.fragments) == 1

    _, same = _run(root, data, [events])
    assert (same.files_parsed, same.files_reused) == (0, 1)
    assert (same.parsed_bytes, same.reused_bytes) == (0, 3 * len(LINE))

    with events.open("ab") as file:
        file.write(LINE[5:] + LINE)
    contents, grown = _run(root, data, [events])
    assert (grown.files_parsed, grown.files_reused) == (1, 0)
    assert (grown.parsed_bytes, grown.reused_bytes) == (2 * len(LINE), 3 * len(LINE))
    assert grown.fragments == []
    assert contents == [LINE * 2]  # only the new bytes were staged

    replacement = events.with_name("new.jsonl")
    replacement.write_bytes(LINE)
    os.replace(replacement, events)  # compaction's way: a new inode under the old name
    _, again = _run(root, data, [events])
    assert (again.files_parsed, again.reused_bytes, again.parsed_bytes) == (1, 0, len(LINE))
    directories = list((root / "events").iterdir())
    assert len(directories) == 1 and len(list(directories[0].iterdir())) == 1


def test_the_bytes_a_run_would_parse_are_judged_from_the_manifest_alone(tmp_path: Path) -> None:
    data, root = tmp_path / "data", tmp_path / "cache"
    old, new = _events(data), _events(data, "2-2.jsonl")
    old.write_bytes(LINE * 4)
    assert bytes_to_parse(root, data, {"events": [old]}, fingerprint="") is None  # no cache
    _run(root, data, [old])
    assert bytes_to_parse(root, data, {"events": [old]}, fingerprint="") == 0
    assert bytes_to_parse(root, data, {"events": [old]}, fingerprint="other") is None
    with old.open("ab") as file:
        file.write(LINE)
    new.write_bytes(LINE * 2)
    files = {"events": [old, new]}
    assert bytes_to_parse(root, data, files, fingerprint="") == 3 * len(LINE)
    manifest = root / "manifest.json"
    before = manifest.read_bytes()
    # A run that would drop cached rows (what is kept from them is computed again, every
    # row: not a short re-run): a file cut back, replaced, or deleted.
    kept = old.read_bytes()
    old.write_bytes(LINE * 3)
    assert bytes_to_parse(root, data, files, fingerprint="") is None
    old.write_bytes(kept)
    assert bytes_to_parse(root, data, files, fingerprint="") == 3 * len(LINE)
    replaced = old.with_name("replaced")
    replaced.write_bytes(LINE * 5)
    os.replace(replaced, old)  # another file under the old name
    assert bytes_to_parse(root, data, files, fingerprint="") is None
    old.unlink()
    assert bytes_to_parse(root, data, {"events": [new]}, fingerprint="") is None
    assert manifest.read_bytes() == before  # nothing changed
