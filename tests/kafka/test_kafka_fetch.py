"""Fetch's batches: the same bytes as the general encoder gives, answers that fit the
client's byte limits, and what did not fit sent next time without being read from the
file again (the reader keeps it; no seek)."""

from __future__ import annotations

from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from json_strategies import JSON_VALUES
from spoolmq import Message, Store
from spoolmq.kafka.core import fields_to_kafka
from spoolmq.kafka.fetch import _encode_entries, _Part, stored_batch
from spoolmq.kafka.records import OutRecord, decode_batches, encode_batch
from spoolmq.store.record import encode_message, frame_record, verified_fields

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


STORED = st.builds(
    Message,
    value=JSON_VALUES | st.binary(max_size=200),
    key=st.none() | st.text(max_size=20) | st.binary(max_size=20),
    headers=st.none()
    | st.lists(
        st.tuples(st.text(min_size=1, max_size=10), st.text(max_size=10) | st.binary(max_size=10)),
        max_size=3,
    ),
    tags=st.none() | st.lists(st.text(min_size=1, max_size=8), max_size=2),
    deliver_at=st.none() | st.integers(0, 2**45),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(-5_000, 5_000), STORED), min_size=1))
def test_stored_batches_are_what_the_general_encoder_gives(
    records: list[tuple[int, int, Message]],
) -> None:
    """``stored_batch`` puts the usual record together by hand: for any stored record (text,
    bytes or no key; JSON, bytes or null value; headers, tags, schedules; offset gaps from
    compaction; timestamps that go down) it gives the bytes ``encode_batch`` gives."""
    entries = []
    offset, timestamp = 40, 1_763_830_000_000
    for gap, step, message in records:
        offset += gap + 1
        timestamp += step
        line = frame_record(offset, timestamp, encode_message(message).body)
        fields = verified_fields(line)
        assert fields is not None
        entries.append((fields, line))
    general = [
        OutRecord(fields["offset"], fields["timestamp"], *fields_to_kafka(fields))
        for fields, _ in entries
    ]
    assert stored_batch(entries) == encode_batch(general)


@pytest.mark.parametrize(
    "body",
    [
        b'"key":"k","value":{"a":1}',  # no headers: a line no writer makes, but it verifies
        b'"key":null,"key_b64":"AAE=","value":[1],"headers":[]',
        b'"value_b64":"AP8=","headers":[["h","v"]]',
    ],
)
def test_unusual_stored_lines_go_the_general_way(body: bytes) -> None:
    line = frame_record(7, 1_763_830_000_000, body)
    fields = verified_fields(line)
    assert fields is not None
    expected = OutRecord(7, fields["timestamp"], *fields_to_kafka(fields))
    assert stored_batch([(fields, line)]) == encode_batch([expected])


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


class _GappedLog:
    """A reader over given offsets (a compacted log whose gaps no test can write 2**31
    records for), with the store reader's ``read_entries``/``unread`` rules."""

    def __init__(self, offsets: list[int]) -> None:
        self.entries = []
        for offset in offsets:
            line = frame_record(offset, 1_763_830_000_000 + offset % 1000, b'"value":%d' % offset)
            fields = verified_fields(line)
            assert fields is not None
            self.entries.append((fields, line))
        self.next = 0

    @property
    def position(self) -> int:
        if self.next < len(self.entries):
            return int(self.entries[self.next][0]["offset"])
        return int(self.entries[-1][0]["offset"]) + 1

    def read_entries(self, max_records: int) -> list[tuple[dict[str, Any], bytes]]:
        taken = self.entries[self.next : self.next + max_records]
        self.next += len(taken)
        return taken

    def unread(self, entries: list[tuple[dict[str, Any], bytes]]) -> None:
        assert entries == self.entries[self.next - len(entries) : self.next]
        self.next -= len(entries)


def test_a_gap_wider_than_a_batch_can_say_starts_a_new_batch() -> None:
    """A RecordBatch's last offset delta is an int32: records further apart than that go
    in separate batches, each decoding to the right offsets."""
    far = 5 + 2**31 + 10
    offsets = [5, 6, 5 + 2**31 - 1, far, far + 1, far + 2**33]
    log = _GappedLog(offsets)
    data = _encode_entries(log, 1 << 20, _Part(0, 5, 1 << 20), force=True)  # type: ignore[arg-type]
    batches = decode_batches(data, MAX)
    assert [[b.base_offset + r.offset_delta for r in b.records] for b in batches] == [
        [5, 6, 5 + 2**31 - 1],  # a delta of exactly 2**31 - 1 still fits
        [far, far + 1],
        [far + 2**33],
    ]
    assert [orjson.loads(r.value or b"") for b in batches for r in b.records] == offsets
    assert log.position == far + 2**33 + 1


def test_a_long_poll_reads_each_record_once_however_often_it_wakes(
    tmp_path: Any, verified_lines: list[bytes]
) -> None:
    """A Fetch whose ``min_bytes`` are not there yet waits, woken each time the partition
    grows; each wake reads on from where the answer so far ends (the records read before
    are kept, not read and verified again), and the answer holds every record once."""
    import asyncio
    import time

    from spoolmq.kafka.fetch import handle_fetch
    from spoolmq.kafka.wire import Reader, Writer

    def request(min_bytes: int) -> Reader:
        w = Writer().int32(-1).int32(20_000).int32(min_bytes).int32(1 << 20).int8(0)
        w.int32(1).string("t").int32(1).int32(0).int64(0).int32(1 << 20)  # t/0 from 0
        return Reader(w.getvalue())

    async def main(store: Store) -> bytes:
        ctx, watcher = _fetch_context(store)

        def armed() -> set[Any]:
            return {future for futures in watcher._waiters.values() for future in futures}

        async def until(condition: Any) -> None:
            deadline = time.monotonic() + 30
            while not condition():
                assert time.monotonic() < deadline
                await asyncio.sleep(0.01)

        fetch = asyncio.create_task(handle_fetch(ctx, 4, request(min_bytes=5_000)))
        await until(armed)  # the Fetch waits for the partition to grow
        for step in range(1, 6):  # four wakes short of min_bytes, then the fifth is enough
            waiting = armed()
            store.append_batch("t", [Message(value={"n": n, "pad": "x" * 100}) for n in _ns(step)])
            # Woken: it reads, then waits again (a new wait) or answers.
            await until(lambda: fetch.done() or (armed() and not armed() & waiting))  # noqa: B023
            assert fetch.done() == (step == 5), step
        return await asyncio.wait_for(fetch, 30)

    with Store(tmp_path / "data") as store:
        store.append_batch("t", [Message(value={"n": n, "pad": "x" * 100}) for n in _ns(0)])
        answer = asyncio.run(main(store))
    records = _offsets_and_values(_record_bytes(answer))
    assert [offset for offset, _ in records] == list(range(len(records)))
    assert [value["n"] for _, value in records] == [n for step in range(6) for n in _ns(step)]
    # Every stored line verified once (each wake read on, with no seek back).
    assert len(verified_lines) == len(records)


def _fetch_context(store: Store) -> tuple[Any, Any]:
    """A Kafka request context whose core serves Fetch from ``store`` in this process (no
    link to a PublisherBroker), and the core's started growth watcher; in a loop."""
    from spoolmq.kafka.api import RequestContext
    from spoolmq.kafka.core import KafkaCore
    from spoolmq.kafka.watch import GrowthWatcher

    watcher = GrowthWatcher()
    watcher.start()
    ctx = RequestContext(data_dir=store.path, host="127.0.0.1", port=0)
    ctx.shared["core"] = KafkaCore(store=store, link=None, watcher=watcher)  # type: ignore[arg-type]
    return ctx, watcher


def _record_bytes(answer: bytes) -> bytes:
    """The records of a Fetch v4 answer for t/0 alone, which it answers without error."""
    from spoolmq.kafka.wire import Reader

    r = Reader(answer)
    r.int32()  # throttle
    assert r.int32() == 1 and r.string() == "t" and r.int32() == 1
    assert (r.int32(), r.int16()) == (0, 0)  # partition 0, no error
    r.int64(), r.int64(), r.int32()  # high watermark, last stable offset, no aborted
    data = r.bytes_()
    assert data is not None
    return data


def _ns(step: int) -> list[int]:
    """The message numbers written at ``step``: 4 messages (~550 bytes in Kafka's form,
    so steps 0-4 stay well below the long poll's 5,000), then 40 at step 5."""
    return list(range(step * 4, step * 4 + (40 if step == 5 else 4)))


def test_an_answer_holds_no_more_than_the_cap_whatever_the_request_asks(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Fetch asking for 2 GiB (``max_bytes`` and the partition's limit both at int32's
    top) gets what fits the child's cap (Kafka's fetch.max.bytes; lowered here so that a
    small topic passes it), from the offset asked, in order."""
    import asyncio

    from spoolmq.kafka import fetch as fetch_module
    from spoolmq.kafka.fetch import handle_fetch
    from spoolmq.kafka.wire import Reader, Writer

    cap = 20_000
    monkeypatch.setattr(fetch_module, "MAX_FETCH_BYTES", cap)
    top = 2**31 - 1
    w = Writer().int32(-1).int32(0).int32(1).int32(top).int8(0)
    w.int32(1).string("t").int32(1).int32(0).int64(10).int32(top)  # t/0 from offset 10

    async def main(store: Store) -> bytes:
        ctx, watcher = _fetch_context(store)
        try:
            return await handle_fetch(ctx, 4, Reader(w.getvalue()))
        finally:
            watcher.close()

    with Store(tmp_path / "data") as store:
        store.append_batch("t", [Message(value={"n": n, "pad": "x" * 300}) for n in range(400)])
        answer = asyncio.run(main(store))
    data = _record_bytes(answer)
    records = _offsets_and_values(data)
    # About 350 bytes a record: the 400 stored (~140 kB) do not fit; those that do come.
    assert cap // 2 < len(data) <= cap
    assert [offset for offset, _ in records] == list(range(10, 10 + len(records)))
    assert [value["n"] for _, value in records] == list(range(10, 10 + len(records)))
