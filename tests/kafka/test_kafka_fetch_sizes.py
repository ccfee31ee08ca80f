"""Fetch's answers fit the client's byte limits, and what did not fit is sent next time
without being read from the file again (the reader keeps it; no seek)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from spoolmq import Message, Store
from spoolmq.kafka.fetch import _encode_entries, _Part
from spoolmq.kafka.records import decode_batches

MAX = 1 << 26


def _values(count: int) -> list[dict[str, Any]]:
    # Sizes that vary, so batch edges fall anywhere.
    return [{"n": n, "pad": "x" * (n * 37 % 300)} for n in range(count)]


def _offsets_and_values(data: bytes) -> list[tuple[int, Any]]:
    out = []
    for batch in decode_batches(data, MAX):
        for record in batch.records:
            assert record.value is not None
            out.append((batch.base_offset + record.offset_delta, orjson.loads(record.value)))
    return out


@pytest.mark.parametrize("budget", [1_000, 4_096, 65_536])
def test_each_answer_fits_and_the_next_goes_on_where_it_stopped(
    tmp_path: Any, verified_lines: list[bytes], budget: int
) -> None:
    values = _values(2_000)
    with Store(tmp_path / "data") as store:
        for start in range(0, len(values), 700):  # batches of the store: 700, 700, 600
            store.append_batch("t", [Message(value=v) for v in values[start : start + 700]])
        reader = store.reader("t", 0)
        got: list[tuple[int, Any]] = []
        answers = 0
        while len(got) < len(values):
            part = _Part(0, len(got), budget)
            assert reader.position == part.offset  # as Fetch finds it: no seek
            data = _encode_entries(reader, budget, part, force=True)
            assert 0 < len(data) <= budget
            records = _offsets_and_values(data)
            assert records[0][0] == len(got)
            got += records
            answers += 1
            assert answers < 2_000
        reader.close()
    assert got == list(enumerate(values))
    # Every line was read and verified once, whatever did not fit the answer before (a
    # batch's first line again when the reader's chunk ended inside that batch).
    assert len(values) <= len(verified_lines) <= len(values) + 3


def test_a_record_larger_than_the_budget_goes_out_alone_only_when_forced(
    tmp_path: Any,
) -> None:
    with Store(tmp_path / "data") as store:
        store.append_batch("t", [Message(value="y" * 5_000), Message(value="z")])
        reader = store.reader("t", 0)
        assert _encode_entries(reader, 1_000, _Part(0, 0, 1_000), force=False) == b""
        assert reader.position == 0
        data = _encode_entries(reader, 1_000, _Part(0, 0, 1_000), force=True)
        assert [offset for offset, _ in _offsets_and_values(data)] == [0]
        assert reader.position == 1
        rest = _encode_entries(reader, 1_000, _Part(0, 1, 1_000), force=False)
        assert _offsets_and_values(rest) == [(1, "z")]
        reader.close()
