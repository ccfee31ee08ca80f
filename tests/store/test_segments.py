"""Rolling, retention, compaction, seeking and readers."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from store_helpers import START_MS, segment_files

from spoolmq import Message, Store
from spoolmq.clock import ManualClock
from spoolmq.config import DAY_MS
from spoolmq.errors import CorruptRecordError, OffsetOutOfRangeError, StorageError
from spoolmq.store.segment import SegmentFiles

TOPIC = "t"


def test_segments_roll_by_size(store: Store, data_dir: Path) -> None:
    store.create_topic(TOPIC, segment_bytes=1024)
    for i in range(50):
        store.append(TOPIC, {"i": i, "pad": "x" * 60})
    segments = segment_files(data_dir, TOPIC)
    assert len(segments) > 3
    assert all(s.stat().st_size <= 1024 for s in segments)
    # each file is named after the offset of its first record
    for segment in segments:
        first = store.reader(TOPIC, 0, offset=int(segment.stem)).poll()
        assert first is not None and first.offset == int(segment.stem)
    assert [r.value["i"] for r in store.reader(TOPIC, 0)] == list(range(50))


def test_a_roll_that_fails_is_a_storage_error_and_loses_nothing(
    store: Store, data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A new segment that cannot be created (no room for the file, too many open files)
    fails that append with StorageError, stores nothing of it, and the next append, once
    the cause is gone, rolls and goes on at the next offset."""
    store.create_topic(TOPIC, segment_bytes=1024)
    offset = 0
    while len(segment_files(data_dir, TOPIC)) < 2:
        offset = store.append(TOPIC, {"i": offset, "pad": "x" * 60}).offset + 1
    last = segment_files(data_dir, TOPIC)[-1]
    while last.stat().st_size + 100 <= 1024:  # fill the active segment to just below a roll
        offset = store.append(TOPIC, {"i": offset, "pad": "x" * 60}).offset + 1

    def no_room(self: object, base: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    with monkeypatch.context() as patch:
        patch.setattr(SegmentFiles, "create", no_room)
        with pytest.raises(StorageError, match="rolling t/0 to a new segment failed"):
            store.append(TOPIC, {"i": "lost", "pad": "x" * 60})
    assert store.log_end_offset(TOPIC, 0) == offset
    assert store.append(TOPIC, {"i": offset, "pad": "x" * 60}).offset == offset
    assert [r.value["i"] for r in store.reader(TOPIC, 0)] == list(range(offset + 1))
    assert store.check() == []


def test_segments_roll_by_age(store: Store, data_dir: Path, clock: ManualClock) -> None:
    store.create_topic(TOPIC, segment_ms=60_000)
    store.append(TOPIC, 1)
    clock.advance(59_999)
    store.append(TOPIC, 2)
    assert len(segment_files(data_dir, TOPIC)) == 1
    clock.advance(1)
    store.append(TOPIC, 3)
    assert [int(s.stem) for s in segment_files(data_dir, TOPIC)] == [0, 2]


def test_timestamps_never_decrease_across_a_roll(store: Store, clock: ManualClock) -> None:
    store.create_topic(TOPIC, segment_bytes=1024)
    stamps = []
    for _ in range(40):
        stamps.append(store.append(TOPIC, "x" * 100).timestamp)
        clock.advance(-1000)  # the wall clock goes backwards
    assert stamps == [stamps[0]] * 40
    assert [r.timestamp for r in store.reader(TOPIC, 0)] == stamps


def fill(store: Store, clock: ManualClock, count: int, **settings: object) -> None:
    store.create_topic(TOPIC, segment_bytes=1024, **settings)
    for i in range(count):
        store.append(TOPIC, {"i": i, "pad": "x" * 80})
        clock.advance(1000)


@pytest.mark.parametrize("age", [0, 15_000, 30_000, 59_000, 70_000])
def test_retention_by_time(store: Store, clock: ManualClock, data_dir: Path, age: int) -> None:
    fill(store, clock, 60, retention_ms=20_000)
    bases = [int(s.stem) for s in segment_files(data_dir, TOPIC)]
    stamps = {r.offset: r.timestamp for r in store.reader(TOPIC, 0)}
    now = clock.now_ms() + age
    # expected: the longest prefix of closed segments whose newest record is > 20 s old
    expected_start = 0
    for next_base in bases[1:]:
        if now - stamps[next_base - 1] > 20_000:
            expected_start = next_base
        else:
            break
    clock.advance(age)
    result = store.enforce_retention(TOPIC)
    assert store.log_start_offset(TOPIC, 0) == expected_start
    assert result.log_start_offsets[(TOPIC, 0)] == expected_start
    assert result.deleted_segments == bases.index(expected_start)
    assert [r.offset for r in store.reader(TOPIC, 0)] == list(range(expected_start, 60))
    assert store.append(TOPIC, "new").offset == 60  # offsets are never reused


def test_retention_default_is_fourteen_days(store: Store, clock: ManualClock) -> None:
    fill(store, clock, 30)
    assert store.topic_config(TOPIC).retention_ms == 14 * DAY_MS
    clock.advance(13 * DAY_MS)
    assert store.enforce_retention().deleted_segments == 0
    clock.advance(2 * DAY_MS)
    assert store.enforce_retention().deleted_segments > 0
    assert store.log_start_offset(TOPIC, 0) == store.partition_log(TOPIC, 0).segment_bases()[-1]


def test_retention_by_bytes(store: Store, clock: ManualClock, data_dir: Path) -> None:
    fill(store, clock, 80, retention_bytes=2500, retention_ms=-1)
    clock.advance(100 * DAY_MS)
    store.enforce_retention()
    sizes = [s.stat().st_size for s in segment_files(data_dir, TOPIC)]
    assert sum(sizes) >= 2500 or len(sizes) == 1
    assert sum(sizes[1:]) < 2500  # one more deletion would go below the limit
    assert store.enforce_retention().deleted_segments == 0


def test_retention_while_a_reader_is_in_a_segment(store: Store, clock: ManualClock) -> None:
    fill(store, clock, 60, retention_ms=1)
    reader = store.reader(TOPIC, 0)
    assert reader.poll().offset == 0  # type: ignore[union-attr]
    clock.advance(10)
    store.enforce_retention()
    start = store.log_start_offset(TOPIC, 0)
    assert start > 10
    # the open segment is still readable to its end; then the reader finds its offset gone
    offsets = []
    with pytest.raises(OffsetOutOfRangeError, match="deleted by retention"):
        while (record := reader.poll()) is not None:
            offsets.append(record.offset)
    assert offsets == list(range(1, offsets[-1] + 1))
    reader.seek_to_beginning()
    assert reader.poll().offset == start  # type: ignore[union-attr]


def test_compaction_keeps_the_newest_per_key(store: Store, clock: ManualClock) -> None:
    store.create_topic(TOPIC, cleanup_policy="compact", segment_bytes=1024)
    expected: dict[str, int] = {}
    for i in range(120):
        key = f"k{i % 7}"
        # batches of 3: compaction removes parts of batches
        store.append_batch(TOPIC, [Message({"i": i, "j": j}, key=key) for j in range(3)])
        expected[key] = i
        clock.advance(10)
    store.append(TOPIC, "no key")
    active = store.partition_log(TOPIC, 0).segment_bases()[-1]
    before = list(store.reader(TOPIC, 0))
    result = store.compact(TOPIC)
    after = list(store.reader(TOPIC, 0))
    assert result.removed_records == len(before) - len(after) > 0
    closed_after = [r for r in after if r.offset < active]
    keys = [r.key for r in closed_after]
    # in closed segments, a key appears only if none of its later records exist anywhere
    last_offset = {r.key: r.offset for r in before}
    assert all(r.offset == last_offset[r.key] for r in closed_after if r.key is not None)
    assert len(keys) == len(set(keys))
    # the active segment is untouched; the newest value of every key survives
    assert [r for r in after if r.offset >= active] == [r for r in before if r.offset >= active]
    newest = {r.key: r.value for r in after if r.key is not None}
    assert {k: v["i"] for k, v in newest.items()} == expected
    assert [r.offset for r in after] == sorted(r.offset for r in after)
    assert store.check() == []
    # compacting again finds nothing more to remove, and reading still works
    assert store.compact(TOPIC).removed_records == 0


def test_compaction_tombstones_and_grace_period(store: Store, clock: ManualClock) -> None:
    store.create_topic(
        TOPIC, cleanup_policy="compact", segment_bytes=1024, tombstone_retention_ms=5000
    )
    store.append(TOPIC, "v1", key="gone")
    store.append(TOPIC, "v1", key="kept")
    store.append(TOPIC, None, key="gone")  # tombstone
    deleted_at = clock.now_ms()
    for i in range(30):  # push everything into closed segments
        store.append(TOPIC, {"filler": i, "pad": "x" * 80}, key=f"f{i}")
    clock.set(deleted_at + 5000)
    store.compact(TOPIC)
    values = {r.key: r.value for r in store.reader(TOPIC, 0)}
    assert values["gone"] is None  # the delete is still visible within the grace period
    assert values["kept"] == "v1"
    clock.advance(1)
    store.compact(TOPIC)
    keys = [r.key for r in store.reader(TOPIC, 0)]
    assert "gone" not in keys
    assert "kept" in keys


def test_a_reader_in_a_segment_being_compacted(store: Store, clock: ManualClock) -> None:
    store.create_topic(TOPIC, cleanup_policy="compact", segment_bytes=2048)
    for i in range(60):
        store.append_batch(TOPIC, [Message(i, key="same"), Message(i, key=f"u{i}")])
    other = Store(store.path)  # another process's view, with its own cached indexes
    other_reader = other.reader(TOPIC, 0, offset=10)
    assert other_reader.poll().offset == 10  # type: ignore[union-attr]
    store.compact(TOPIC)
    # the open reader finishes its old copy of the segment, then carries on
    offsets = [r.offset for r in other_reader]
    assert offsets == sorted(offsets) and offsets[0] == 11 and offsets[-1] == 119
    # a fresh seek in the other process uses the new file, not its cached index
    survivors = [r.offset for r in store.reader(TOPIC, 0)]
    for target in survivors[::5]:
        assert other.reader(TOPIC, 0, offset=target).poll().offset == target  # type: ignore[union-attr]
    other.close()


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    sizes=st.lists(st.integers(1, 30), min_size=1, max_size=25),
    steps=st.lists(st.integers(0, 3), min_size=25, max_size=25),
    data=st.data(),
)
def test_seek_by_offset_and_by_time(
    tmp_path_factory: pytest.TempPathFactory,
    sizes: list[int],
    steps: list[int],
    data: st.DataObject,
) -> None:
    clock = ManualClock(START_MS)
    data_dir = tmp_path_factory.mktemp("seek")
    records: list[tuple[int, int]] = []  # (offset, timestamp)
    with Store(data_dir, config={"index_interval_bytes": 64}, clock=clock) as store:
        store.create_topic(TOPIC, segment_bytes=2048)
        for size, step in zip(sizes, steps, strict=False):
            clock.advance(step)
            positions = store.append_batch(
                TOPIC, [Message({"n": len(records) + k}) for k in range(size)]
            )
            records.extend((p.offset, p.timestamp) for p in positions)
        end = len(records)
        for offset in data.draw(st.lists(st.integers(0, end - 1), max_size=10)):
            record = store.reader(TOPIC, 0, offset=offset).poll()
            assert record is not None and (record.offset, record.value) == (
                offset,
                {"n": offset},
            )
        assert store.reader(TOPIC, 0, offset=end).poll() is None
        low, high = records[0][1] - 2, records[-1][1] + 2
        for stamp in data.draw(st.lists(st.integers(low, high), max_size=10)):
            expected = next((o for o, t in records if t >= stamp), end)
            assert store.offset_for_timestamp(TOPIC, 0, stamp) == expected
            found = store.reader(TOPIC, 0, timestamp=stamp).poll()
            assert (found.offset if found else end) == expected


def test_a_caught_up_reader_sees_new_records(store: Store) -> None:
    store.create_topic(TOPIC, segment_bytes=1024)
    reader = store.reader(TOPIC, 0)
    assert reader.poll() is None
    writer = Store(store.path)  # appends from "another process", rolling segments
    for i in range(30):
        writer.append(TOPIC, {"i": i, "pad": "y" * 80})
        record = reader.poll()
        assert record is not None and record.value["i"] == i
        assert reader.poll() is None
    writer.close()


def test_two_readers_are_independent(store: Store) -> None:
    for i in range(20):
        store.append(TOPIC, i)
    first, second = store.reader(TOPIC, 0), store.reader(TOPIC, 0)
    assert [first.poll().value for _ in range(5)] == [0, 1, 2, 3, 4]  # type: ignore[union-attr]
    assert [r.value for r in second] == list(range(20))
    assert [r.value for r in first] == list(range(5, 20))
    late = store.reader(TOPIC, 0, offset="latest")
    store.append(TOPIC, 20)
    assert [r.value for r in late] == [20]
    assert [r.value for r in first] == [20]


def test_a_reader_dropped_without_close_gives_its_descriptor_back(store: Store) -> None:
    for i in range(20):
        store.append(TOPIC, i)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(50):
        reader = store.reader(TOPIC, 0)
        assert reader.poll() is not None  # an open segment file
        del reader  # abandoned mid-way, never closed
    assert len(os.listdir("/proc/self/fd")) <= before


def test_log_end_offset_follows_other_writers(store: Store) -> None:
    store.create_topic(TOPIC, segment_bytes=1024)
    other = Store(store.path)
    for i in range(1, 40):
        other.append(TOPIC, "z" * 90)
        assert store.log_end_offset(TOPIC, 0) == i
    other.close()


def test_looking_up_records_one_by_one(store: Store, clock: ManualClock) -> None:
    """``Reader.read_many``: any offsets, across segments, in batches of many records and
    with long lines; those retention deleted are told apart from those compaction removed
    (in neither answer), and a damaged line is reported, never returned."""
    store.create_topic(TOPIC, cleanup_policy="compact", segment_bytes=8192, retention_ms=50_000)
    for i in range(40):
        batch = [Message({"i": i, "j": j}, key=f"k{j}") for j in range(5)]
        if i == 20:
            batch.append(Message({"i": i, "pad": "x" * 20_000}))  # longer than one read
        store.append_batch(TOPIC, batch)
        clock.advance(1000)
    everything = {r.offset: r.value for r in store.reader(TOPIC, 0)}
    reader = store.reader(TOPIC, 0)
    wanted = sorted({0, 3, 57, 104, 105, 150, 199, max(everything)})
    found, deleted = reader.read_many(wanted)
    assert deleted == []
    assert {o: orjson.loads(line)["value"] for o, (_, line) in found.items()} == {
        o: everything[o] for o in wanted
    }
    assert all(fields["offset"] == o for o, (fields, _) in found.items())
    # Compaction removes most of the closed segments' records; retention the oldest.
    store.compact(TOPIC)
    kept = {r.offset for r in store.reader(TOPIC, 0)}
    clock.advance(30_000)
    store.enforce_retention(TOPIC)
    start = store.log_start_offset(TOPIC, 0)
    assert start > 0
    found, deleted = store.reader(TOPIC, 0).read_many(wanted)
    assert deleted == [o for o in wanted if o < start]
    assert sorted(found) == [o for o in wanted if o >= start and o in kept]


def test_a_damaged_record_is_reported_by_a_look_up(store: Store, data_dir: Path) -> None:
    store.create_topic(TOPIC)
    for i in range(10):
        store.append(TOPIC, {"i": i})
    (segment,) = segment_files(data_dir, TOPIC)
    data = segment.read_bytes()
    fifth = data.index(b'{"offset":5,')
    segment.write_bytes(data[: fifth + 30] + b"X" + data[fifth + 31 :])
    with pytest.raises(CorruptRecordError):
        store.reader(TOPIC, 0).read_many([5])
    found, _ = store.reader(TOPIC, 0).read_many([4, 6])
    assert sorted(found) == [4, 6]
