"""Recovery on open: torn tails are cut and quarantined, damage inside is reported."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
from store_helpers import segment_files

from spoolmq import Message, Store
from spoolmq.errors import CorruptRecordError

TOPIC = "events"


def build_store(data_dir: Path, last_batch: int) -> tuple[bytes, int, int]:
    """Five batches, then a last batch of ``last_batch`` records.

    Returns the segment bytes, where the last batch starts, and its first offset.
    """
    with Store(data_dir, config={"index_interval_bytes": 64}) as store:
        store.create_topic(TOPIC)
        for n in range(5):
            store.append_batch(TOPIC, [Message({"b": n, "i": i}) for i in range(n + 1)])
        first = store.log_end_offset(TOPIC, 0)
        size_before = segment_files(data_dir, TOPIC)[0].stat().st_size
        store.append_batch(TOPIC, [Message({"b": "last", "i": i}) for i in range(last_batch)])
    data = segment_files(data_dir, TOPIC)[0].read_bytes()
    return data, size_before, first


def check_recovered(data_dir: Path, intact: bytes, first: int, cut: bytes) -> None:
    """Open, append once, and check nothing before the torn batch was lost."""
    with Store(data_dir) as store:
        appended = store.append(TOPIC, {"after": "recovery"})
        reports = list(store.recovery_reports)
        records = list(store.reader(TOPIC, 0))
    assert appended.offset == first  # the torn batch's offsets are taken by the next append
    assert len(reports) == 1
    report = reports[0]
    assert report.position == len(intact)
    assert report.quarantined_to is not None
    assert Path(report.quarantined_to).read_bytes() == cut
    assert oct(Path(report.quarantined_to).stat().st_mode & 0o777) == "0o600"
    segment = segment_files(data_dir, TOPIC)[0].read_bytes()
    assert segment.startswith(intact)
    # the appended record starts on a clean line of its own
    assert segment[len(intact) :].count(b"\n") == 1
    assert orjson.loads(segment[len(intact) :])["value"] == {"after": "recovery"}
    assert [r.offset for r in records] == list(range(first + 1))
    assert records[-1].value == {"after": "recovery"}
    assert all(r.value.get("b") != "last" for r in records)


@pytest.mark.parametrize("last_batch", [1, 3])
def test_truncated_at_every_byte_of_the_last_batch(
    tmp_path: Path, last_batch: int, figure: Callable[[str], None]
) -> None:
    template = tmp_path / "template"
    data, intact_size, first = build_store(template, last_batch)
    intact = data[:intact_size]
    last_line_start = data.rfind(b"\n", 0, len(data) - 1) + 1
    # every cut inside the last record; for a multi-record batch also a few inside others
    cuts = list(range(last_line_start + 1, len(data)))
    if last_batch > 1:
        cuts += list(range(intact_size + 1, last_line_start + 1, 7))
    for cut in cuts:
        data_dir = tmp_path / f"cut-{cut}"
        shutil.copytree(template, data_dir)
        segment = segment_files(data_dir, TOPIC)[0]
        os.truncate(segment, cut)
        check_recovered(data_dir, intact, first, data[intact_size:cut])
        shutil.rmtree(data_dir)
    figure(
        f"last batch of {last_batch}: cut at {len(cuts)} byte positions; opened, quarantined, "
        f"0 earlier records lost, next append on a clean line: {len(cuts)} of {len(cuts)}"
    )


@pytest.mark.parametrize("last_batch", [1, 3])
@pytest.mark.parametrize("flip", [0x01, 0x20, ord("\n")])
def test_changed_bytes_in_the_last_record(
    tmp_path: Path, last_batch: int, flip: int, long_run: bool, figure: Callable[[str], None]
) -> None:
    template = tmp_path / "template"
    data, intact_size, first = build_store(template, last_batch)
    last_line_start = data.rfind(b"\n", 0, len(data) - 1) + 1
    changed = 0
    for position in range(last_line_start, len(data), 1 if long_run else 3):
        data_dir = tmp_path / f"flip-{position}"
        shutil.copytree(template, data_dir)
        damaged = bytearray(data)
        damaged[position] = flip if flip == ord("\n") else damaged[position] ^ flip
        if damaged == bytearray(data):
            continue
        segment_files(data_dir, TOPIC)[0].write_bytes(bytes(damaged))
        check_recovered(data_dir, data[:intact_size], first, bytes(damaged[intact_size:]))
        shutil.rmtree(data_dir)
        changed += 1
    figure(
        f"last batch of {last_batch}, byte {'set to newline' if flip == 10 else f'^0x{flip:02x}'}: "
        f"{changed} damaged tails recovered (quarantined, nothing earlier lost) of {changed}"
    )


def test_a_reader_never_returns_part_of_a_batch(tmp_path: Path) -> None:
    data, _, first = build_store(tmp_path, 3)
    segment = segment_files(tmp_path, TOPIC)[0]
    last_line_start = data.rfind(b"\n", 0, len(data) - 1) + 1
    os.truncate(segment, last_line_start)  # two of three records of the batch are there
    with Store(tmp_path) as store:  # reading does not recover: the writer might be mid-write
        reader = store.reader(TOPIC, 0)
        assert [r.offset for r in reader] == list(range(first))
        assert reader.poll() is None
        with open(segment, "ab") as handle:  # the writer finishes the batch
            handle.write(data[last_line_start:])
        assert [r.value["i"] for r in reader] == [0, 1, 2]
        assert store.recovery_reports == []


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, int]:
    """A store with a changed byte in its third record, valid records after it."""
    with Store(tmp_path) as store:
        for i in range(10):
            store.append("events", {"i": i, "text": "some text"})
    segment = segment_files(tmp_path, TOPIC)[0]
    data = bytearray(segment.read_bytes())
    third = data.index(b'{"offset":2,')
    data[third + data[third:].index(b"some text")] ^= 0x01
    segment.write_bytes(bytes(data))
    return tmp_path, third


def test_damage_inside_a_segment_raises_on_read(damaged: tuple[Path, int]) -> None:
    data_dir, position = damaged
    with Store(data_dir) as store:
        reader = store.reader(TOPIC, 0)
        assert [reader.poll().offset, reader.poll().offset] == [0, 1]  # type: ignore[union-attr]
        with pytest.raises(CorruptRecordError, match="failed its checksum") as caught:
            reader.poll()
        assert caught.value.position == position
        assert reader.position == 2  # not skipped: the same error again
        with pytest.raises(CorruptRecordError):
            reader.poll()


def test_damage_inside_a_segment_is_reported_by_check(damaged: tuple[Path, int]) -> None:
    data_dir, position = damaged
    before = segment_files(data_dir, TOPIC)[0].read_bytes()
    with Store(data_dir) as store:
        problems = store.check()
        with pytest.raises(CorruptRecordError, match="not a torn tail"):
            # the damage is after the newest index entry: the writer refuses to cut it
            store.append(TOPIC, "more")
    assert [(p.position, p.topic, p.partition) for p in problems] == [(position, TOPIC, 0)]
    assert "damage inside the segment" in problems[0].problem
    assert segment_files(data_dir, TOPIC)[0].read_bytes() == before  # nothing changed


def test_damage_anywhere_before_the_tail_is_detected_every_time(
    tmp_path: Path, long_run: bool, figure: Callable[[str], None]
) -> None:
    """A changed byte at every position of every record but the last: `check()` reports it
    and a reader raises at it; no damaged record is ever returned."""
    template = tmp_path / "template"
    records = 12 if long_run else 5
    with Store(template) as store:
        for i in range(records):
            store.append(TOPIC, {"i": i, "text": "some text"})
    data = segment_files(template, TOPIC)[0].read_bytes()
    # The newline before the last record is left out: changing it makes one damaged last
    # line, which is a torn tail (the tests above), not damage inside.
    inside = data.rfind(b"\n", 0, len(data) - 1)
    detected = 0
    for position in range(inside):
        data_dir = tmp_path / f"damage-{position}"
        shutil.copytree(template, data_dir)
        damaged = bytearray(data)
        damaged[position] ^= 0x01
        segment_files(data_dir, TOPIC)[0].write_bytes(bytes(damaged))
        with Store(data_dir) as store:
            problems = store.check()
            returned = []
            with pytest.raises(CorruptRecordError):
                for record in store.reader(TOPIC, 0):
                    returned.append(record.value)
        assert problems, position
        assert returned == [{"i": i, "text": "some text"} for i in range(len(returned))]
        assert segment_files(data_dir, TOPIC)[0].read_bytes() == bytes(damaged)
        detected += 1
        shutil.rmtree(data_dir)
    figure(
        f"a flipped bit at each of the {inside} bytes before the last line: "
        f"detected by check() and by a reader {detected} of {inside} times, "
        "never returned, never changed"
    )


def test_check_finds_nothing_in_a_healthy_store(store: Store) -> None:
    store.create_topic("a", partitions=3, segment_bytes=1024)
    for i in range(100):
        store.append("a", {"i": i})
    assert store.check() == []


def test_opening_reads_only_the_tail(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with Store(data_dir) as store:
        store.create_topic(TOPIC, segment_bytes=4096)
        for i in range(40):
            store.append_batch(TOPIC, [Message({"i": i, "pad": "x" * 100})] * 20, acks="0")
    segments = segment_files(data_dir, TOPIC)
    assert len(segments) > 20
    # damage an old segment: opening for append must not even look at it
    old = segments[1]
    old.write_bytes(b"garbage\n" * 10)
    read_bytes = 0
    real_pread = os.pread

    def counting_pread(fd: int, length: int, position: int) -> bytes:
        nonlocal read_bytes
        data = real_pread(fd, length, position)
        read_bytes += len(data)
        return data

    monkeypatch.setattr(os, "pread", counting_pread)
    with Store(data_dir) as store:
        end = store.log_end_offset(TOPIC, 0)
        appended = store.append(TOPIC, "next")
        record = store.reader(TOPIC, 0, offset=end).poll()
    assert appended.offset == end == 800
    assert record is not None and record.value == "next"
    assert read_bytes <= 3 * segments[-1].stat().st_size + 8192


def test_check_beside_a_writer_finds_nothing(data_dir: Path) -> None:
    """``spoolmq check`` next to a broker that is appending: the segment grew between the
    scan and its size being read, and that was reported as trailing bytes."""
    import threading

    with Store(data_dir) as writer, Store(data_dir) as checker:
        writer.create_topic("busy", partitions=1, segment_bytes=64 * 1024)

        def append() -> None:
            for n in range(1500):
                writer.append_batch("busy", [Message({"n": n})] * 50, acks="0")

        thread = threading.Thread(target=append)
        thread.start()
        found = []
        try:
            while thread.is_alive():
                found.append(checker.check("busy"))
        finally:
            thread.join()
    assert found and [problems for problems in found if problems] == []


def test_check_waits_out_a_writer_stopped_mid_batch(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer in another process has written half a batch and is not scheduled again
    until ``check`` has looked: the half batch is the writer's, not a torn tail."""
    import fcntl
    import threading

    from spoolmq.store.writer import PartitionLock

    with Store(data_dir) as store:
        store.create_topic("busy", partitions=1)
        store.append_batch("busy", [Message({"n": n}) for n in range(50)], acks="0")
        store.append_batch("busy", [Message({"n": n}) for n in range(50, 100)], acks="0")
    (segment,) = segment_files(data_dir, "busy")
    data = segment.read_bytes()
    first_batch_end = data.index(b"\n", data.index(b'"offset":49')) + 1
    last_batch = data[first_batch_end:]
    with segment.open("r+b") as file:
        file.truncate(first_batch_end)

    checker = Store(data_dir)
    waiting = threading.Event()
    real_enter = PartitionLock.__enter__

    def enter(lock: PartitionLock) -> None:
        waiting.set()
        real_enter(lock)

    monkeypatch.setattr(PartitionLock, "__enter__", enter)
    lock_fd = os.open(segment.parent / ".lock", os.O_RDWR)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    with segment.open("ab") as file:
        file.write(last_batch[: len(last_batch) // 2])

    def finish_the_batch() -> None:
        waiting.wait(timeout=10)
        with segment.open("ab") as file:
            file.write(last_batch[len(last_batch) // 2 :])
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)

    writer = threading.Thread(target=finish_the_batch)
    writer.start()
    try:
        problems = checker.check("busy")
    finally:
        writer.join()
        checker.close()
    assert problems == []
    with Store(data_dir) as store:
        assert store.log_end_offset("busy", 0) == 100


def test_check_still_finds_a_torn_tail_under_the_writer_lock(data_dir: Path) -> None:
    """What a writer that died mid-batch left stays torn once the lock is free."""
    with Store(data_dir) as store:
        store.create_topic("busy", partitions=1)
        store.append_batch("busy", [Message({"n": n}) for n in range(50)], acks="0")
        whole = sum(f.stat().st_size for f in segment_files(data_dir, "busy"))
        store.append_batch("busy", [Message({"n": n}) for n in range(50, 100)], acks="0")
    (segment,) = segment_files(data_dir, "busy")
    with segment.open("r+b") as file:
        file.truncate((whole + segment.stat().st_size) // 2)
    with Store(data_dir) as store:
        problems = store.check("busy")
    assert [(p.position >= whole, p.problem.startswith("torn tail")) for p in problems] == [
        (True, True)
    ]


def test_check_reports_a_tail_it_cannot_confirm_and_goes_on(data_dir: Path) -> None:
    """A writer that holds a partition's lock past ``lock_timeout_s``: that partition's torn
    tail is reported as not confirmed, and the next partition is still checked."""
    import fcntl

    with Store(data_dir) as store:
        store.create_topic("busy", partitions=2)
        for partition in (0, 1):
            for first in (0, 50):
                batch = [Message({"n": n}, partition=partition) for n in range(first, first + 50)]
                store.append_batch("busy", batch, acks="0")
    for partition in (0, 1):
        segment = segment_files(data_dir, "busy", partition)[-1]
        with segment.open("r+b") as file:
            file.truncate(segment.stat().st_size - 30)
    lock_fd = os.open(segment_files(data_dir, "busy", 0)[-1].parent / ".lock", os.O_RDWR)
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX)
        with Store(data_dir, config={"lock_timeout_s": 0.2}) as checker:
            problems = checker.check("busy")
    finally:
        os.close(lock_fd)
    assert [(p.partition, p.problem.startswith("torn tail")) for p in problems] == [
        (0, True),
        (1, True),
    ]
    assert "not confirmed" in problems[0].problem and "not confirmed" not in problems[1].problem
