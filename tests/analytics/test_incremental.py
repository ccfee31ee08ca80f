"""Re-runs read only what is new (analytics/cache.py), and give exactly what a cold run gives:
after the store grew, after retention deleted a segment and compaction rewrote others,
around a half-written line, and after a run that stopped between writing and recording."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import orjson
import pytest
from analytics_helpers import event_file
from pyspark.sql import SparkSession
from test_end_to_end import assert_same, expected_summary, without_attention
from test_event_shapes import delivery_history

import spoolmq.analytics
import spoolmq.analytics.kept
import spoolmq.analytics.settled
from spoolmq import Message, Store
from spoolmq.analytics import job, run
from spoolmq.analytics.cache import ParseCache
from spoolmq.cli import main as cli_main

pytestmark = pytest.mark.spark

DAY = "date=2026-11-23"


def _append_orders(data: Path, first: int, count: int) -> list[Any]:
    with Store(data) as store:
        return [
            position
            for start in range(first, first + count, 10)
            for position in store.append_batch(
                "orders",
                [
                    Message({"n": n, "pad": "x" * 40}, key=f"k{n % 5}")
                    for n in range(start, start + 10)
                ],
            )
        ]


def _store(root: Path) -> Path:
    """Orders on 2 partitions in 1 KiB segments (so several files each), one events file."""
    data = root / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=2, segment_bytes=1024)
        store.create_topic("profiles", partitions=1, segment_bytes=1024, cleanup_policy="compact")
        for round_ in range(4):
            store.append_batch(
                "profiles",
                [Message({"v": round_, "pad": "y" * 30}, key=f"p{i}") for i in range(7)]
                + [Message({"v": round_}, key=f"once{round_}")],  # kept by compaction
            )
    positions = _append_orders(data, 0, 80)
    day = data / "events" / DAY
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(event_file(delivery_history(positions), "new"))
    return data


def _outputs(spark: SparkSession, out: Path) -> dict[str, Any]:
    """The summary (less what the run parsed), every table's rows (sorted) and the charts."""
    summary = orjson.loads((out / "summary.json").read_bytes())
    summary.pop("run")
    summary.pop("data")
    tables = {
        path.name: sorted((tuple(row) for row in spark.read.parquet(str(path)).collect()), key=repr)
        for path in sorted((out / "tables").iterdir())
    }
    charts = {p.name: p.read_bytes() for p in sorted((out / "charts").iterdir())}
    return {"summary": summary, "tables": tables, "charts": charts}


def _same_as_cold(spark: SparkSession, data: Path, out: Path, scratch: Path) -> dict[str, Any]:
    """Re-run into ``out``, run cold into a new directory: the outputs are equal (and the
    figures are the plain Python computation's). Returns the re-run's summary."""
    again = run(spark, data, out).summary
    cold_out = scratch / "cold"
    shutil.rmtree(cold_out, ignore_errors=True)
    cold = run(spark, data, cold_out, full=True).summary
    assert cold["run"]["full"] and not again["run"]["full"]
    assert _outputs(spark, out) == _outputs(spark, cold_out)
    assert_same(without_attention({k: v for k, v in again.items() if k != "data"}),
                {k: v for k, v in expected_summary(data).items() if k != "data"})  # fmt: skip
    return again


def test_a_rerun_after_the_store_grew_reads_only_the_new_bytes(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = _store(tmp_path)
    out = tmp_path / "out"
    first = run(spark, data, out).summary["run"]
    segments = list((data / "logs").glob("*/*/*.jsonl"))
    assert first["segments_files_reused"] == 0
    assert first["segments_files_parsed"] == len(segments) > 4
    assert first["segments_parsed_bytes"] == sum(p.stat().st_size for p in segments)

    # Grow: more records (the newest segment of each partition grows, new ones are rolled),
    # events appended to the events file and a second events file.
    positions = _append_orders(data, 80, 20)
    history = delivery_history(positions)
    with (data / "events" / DAY / "1-1.jsonl").open("ab") as file:
        file.write(event_file(history[: len(history) // 2], "new"))
    (data / "events" / DAY / "2-2.jsonl").write_bytes(
        event_file(history[len(history) // 2 :], "old")
    )
    again = _same_as_cold(spark, data, out, tmp_path)["run"]
    grown = list((data / "logs").glob("*/*/*.jsonl"))
    total = sum(p.stat().st_size for p in grown)
    assert again["segments_files_reused"] >= len(segments) - 2  # all but the newest two
    assert 0 < again["segments_parsed_bytes"] < total / 2
    assert again["segments_parsed_bytes"] + again["segments_reused_bytes"] == total
    assert again["events_files_parsed"] == 2 and again["events_reused_bytes"] > 0

    # Nothing new: nothing parsed.
    idle = run(spark, data, out).summary["run"]
    assert idle["segments_parsed_bytes"] == idle["events_parsed_bytes"] == 0
    assert _outputs(spark, out) == _outputs(spark, tmp_path / "cold")


def test_retention_and_compaction_leave_only_current_data_in_the_figures(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = _store(tmp_path)
    out = tmp_path / "out"
    run(spark, data, out)
    before = {p: p.stat().st_ino for p in (data / "logs" / "profiles").glob("*/*.jsonl")}
    with Store(data) as store:
        store.alter_topic("orders", retention_bytes=3000)
        assert store.enforce_retention("orders").deleted_segments > 0
        assert store.compact("profiles").removed_records > 0
    after = {p: p.stat().st_ino for p in (data / "logs" / "profiles").glob("*/*.jsonl")}
    assert any(before.get(p) != ino for p, ino in after.items())  # rewritten files
    again = _same_as_cold(spark, data, out, tmp_path)["run"]
    assert again["segments_files_dropped"] > 0 and again["segments_files_parsed"] > 0


def test_a_half_written_line_counts_as_in_a_cold_run_until_it_is_whole(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = _store(tmp_path)
    out = tmp_path / "out"
    run(spark, data, out)
    events = data / "events" / DAY / "1-1.jsonl"
    line = orjson.dumps(
        {"ts": 1763830000123, "type": "nacked", "group": "billing", "topic": "orders",
         "partition": 0, "offset": 0, "consumer": "c9", "attempt": 1, "processing_ms": 2.0,
         "reason": "late"}
    )  # fmt: skip
    with events.open("ab") as file:
        file.write(line[:30])
    half = _same_as_cold(spark, data, out, tmp_path)
    assert half["skipped"]["events"] == {"unparsable": 1}
    with events.open("ab") as file:
        file.write(line[30:] + b"\n")
    whole = _same_as_cold(spark, data, out, tmp_path)
    assert whole["skipped"]["events"] == {}
    assert whole["by_group"]["billing"]["orders"]["nack_reasons"].get("late") == 1


def test_rows_a_stopped_run_wrote_but_did_not_record_are_not_counted(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = _store(tmp_path)
    out = tmp_path / "out"
    run(spark, data, out)
    cache = out / "cache"
    manifest = orjson.loads((cache / "manifest.json").read_bytes())
    assert set(manifest["files"]) == {"segments", "events"}
    # As if a run had written another copy of a file's rows and stopped before recording:
    # a part file the manifest does not list, and a directory of a file it does not know.
    directory = next((cache / "events").glob("file_id=*"))
    part = next(p for p in directory.iterdir() if p.suffix == ".parquet")
    shutil.copy(part, directory / ("part-99999-stray" + "".join(part.suffixes)))
    shutil.copytree(directory, cache / "events" / "file_id=fstray")
    _same_as_cold(spark, data, out, tmp_path)
    assert not (cache / "events" / "file_id=fstray").exists()
    assert (cache.stat().st_mode & 0o777) == 0o700


def test_another_data_directory_or_a_damaged_manifest_starts_again(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = _store(tmp_path / "a")
    out = tmp_path / "out"
    run(spark, data, out)
    other = _store(tmp_path / "b")
    _append_orders(other, 80, 10)
    moved = run(spark, other, out).summary
    assert moved["run"]["segments_reused_bytes"] == 0
    assert moved["topics"]["orders"]["messages"] == 90
    (out / "cache" / "manifest.json").write_bytes(b'{"version": 1, "files": ')
    assert run(spark, other, out).summary["run"]["segments_reused_bytes"] == 0


def test_the_cli_passes_full_to_the_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []
    monkeypatch.setattr(spoolmq.analytics, "main", lambda argv: seen.append(argv) or 0)
    (tmp_path / "d").mkdir()
    assert cli_main(["analytics", "--data", str(tmp_path / "d"), "--full"]) == 0
    assert cli_main(["analytics", "--data", str(tmp_path / "d")]) == 0
    assert seen[0][-1] == "--full" and "--full" not in seen[1]
    args = spoolmq.analytics.job.build_parser().parse_args(["--full"])
    assert args.full


def _message_event(ts: int, kind: str, p: Any, attempt: int = 1, **extra: Any) -> dict[str, Any]:
    return {"ts": ts, "type": kind, "group": "billing", "topic": p.topic,
            "partition": p.partition, "offset": p.offset, "key": f"k{p.offset % 5}",
            "published_at": p.timestamp, "bytes": 99, "consumer": "c1", "attempt": attempt,
            **extra}  # fmt: skip


def _worked(p: Any, ts: int, attempt: int = 1) -> list[dict[str, Any]]:
    return [
        _message_event(ts, "delivered", p, attempt),
        _message_event(ts + 5, "acked", p, attempt, processing_ms=5.0),
    ]


def _commit(data: Path, offsets: dict[int, int]) -> None:
    import sqlite3

    db = sqlite3.connect(data / "state.db")
    with db:
        db.executemany(
            "INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?)",
            [("billing", "orders", p, offset, 0) for p, offset in offsets.items()],
        )
    db.close()


def _marks(out: Path) -> dict[int, int]:
    data = orjson.loads((out / "cache" / "outcomes" / "marks.json").read_bytes())
    return {
        p: to for group, topic, p, to in data["marks"] if (group, topic) == ("billing", "orders")
    }


def test_settled_outcomes_are_kept_and_the_others_computed_again(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run keeps the counts of the messages that can no longer change: finished, with
    their record read, and before the group's committed offset. The next run computes the
    others (a message ACKed late, whose key held later ones back; a delayed message the
    group had not delivered yet), and gives what a cold run gives; a group reset that
    delivers settled messages again makes it compute every outcome again."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=2)
    positions = _append_orders(data, 0, 60)
    by_partition = {n: [p for p in positions if p.partition == n] for n in (0, 1)}
    late = by_partition[0][10]  # delivered, ACKed only after the first run
    delayed = by_partition[1][7]  # not delivered before the first run
    events: list[dict[str, Any]] = []
    for p in positions:
        if p == late:
            events.append(_message_event(p.timestamp + 2, "delivered", p))
        elif p != delayed:
            events += _worked(p, p.timestamp + 2)
    day = data / "events" / DAY
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(event_file(events, "new"))
    _commit(data, {0: by_partition[0][-1].offset + 1, 1: delayed.offset})

    seen: list[bool] = []
    outcomes = spoolmq.analytics.transform.delivery_outcomes

    def spied(*args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("settled_to") is not None)
        return outcomes(*args, **kwargs)

    monkeypatch.setattr(spoolmq.analytics.transform, "delivery_outcomes", spied)
    out = tmp_path / "out"
    run(spark, data, out)
    assert _marks(out) == {0: late.offset, 1: delayed.offset}

    # Later: the late one ACKed after the key's next messages were published (they were
    # held back by it), the delayed one delivered, and more messages.
    more = _append_orders(data, 60, 20)
    end = max(p.timestamp for p in more) + 100
    events = [_message_event(end, "acked", late, processing_ms=9.0)]
    events += _worked(delayed, end + 1) + [e for p in more for e in _worked(p, p.timestamp + 2)]
    (day / "2-2.jsonl").write_bytes(event_file(events, "new"))
    _commit(data, {n: max(p.offset for p in [*by_partition[n], *more] if p.partition == n) + 1
                   for n in (0, 1)})  # fmt: skip
    seen.clear()
    again = _same_as_cold(spark, data, out, tmp_path)
    assert seen == [True, False]  # the re-run kept what was settled; the cold run did not
    assert again["by_group"]["billing"]["orders"]["acked"] == 80
    assert _marks(out) == {
        n: max(p.offset for p in [*by_partition[n], *more] if p.partition == n) + 1 for n in (0, 1)
    }

    # A new group reads the partitions from their start: its outcomes need every record
    # of them, though the other group's marks are far on.
    audit = [{**e, "group": "audit"} for p in positions[:30] for e in _worked(p, end + 300)]
    (day / "3-2.jsonl").write_bytes(event_file(audit, "new"))
    seen.clear()
    grown = _same_as_cold(spark, data, out, tmp_path)
    assert seen == [True, False]
    assert grown["by_group"]["audit"]["orders"]["acked"] == 30

    # A group reset: settled messages delivered and ACKed again.
    first = by_partition[0][0]
    (day / "3-3.jsonl").write_bytes(event_file(_worked(first, end + 500, attempt=2), "old"))
    seen.clear()
    _same_as_cold(spark, data, out, tmp_path)
    assert seen == [False, False]  # the state no longer held: every outcome again


def test_a_rerun_adds_only_the_new_rows_to_the_kept_aggregates(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tables that are sums (per partition, key, size, consumer, reason, second) keep
    their partial aggregates: a re-run reads the records after where the kept ones end and
    the event part files written since, and gives what a cold run gives; when the store's
    span grows past what per-second counts chart (the charts' buckets become whole
    minutes), the kept per-second counts are summed per minute."""
    data = _store(tmp_path)
    out = tmp_path / "out"
    run(spark, data, out)
    kept = orjson.loads((out / "cache" / "kept" / "kept.json").read_bytes())
    assert kept["resolution"] == 1_000
    assert {"partition_counts", "key_counts", "size_counts", "consumer_counts",
            "failure_reasons", "throughput", "lag_over_time"} <= set(kept["names"])  # fmt: skip
    ends = {(t, p): to for t, p, to in kept["records_to"]}
    assert ends[("orders", 0)] + ends[("orders", 1)] == 80

    # What the re-run gives its partials: the new records only, and the new event rows.
    seen: dict[str, int] = {}
    counts = spoolmq.analytics.transform.partition_counts
    consumers = spoolmq.analytics.transform.consumer_counts

    def spied(name: str, real: Any) -> Any:
        def call(rows: Any) -> Any:
            seen[name] = rows.count()
            return real(rows)

        return call

    monkeypatch.setattr(spoolmq.analytics.transform, "partition_counts", spied("records", counts))
    monkeypatch.setattr(spoolmq.analytics.transform, "consumer_counts", spied("events", consumers))
    positions = _append_orders(data, 80, 20)
    later = [{**e, "ts": e["ts"] + 2 * 3_600_000} for e in delivery_history(positions)]
    (data / "events" / DAY / "2-2.jsonl").write_bytes(event_file(later, "old"))
    again = run(spark, data, out).summary
    assert seen["records"] == 20
    assert seen["events"] == len(later)  # one line, and one row, per event
    assert orjson.loads((out / "cache" / "kept" / "kept.json").read_bytes())["resolution"] == 60_000
    monkeypatch.undo()
    cold = run(spark, data, tmp_path / "cold", full=True).summary
    assert _outputs(spark, out) == _outputs(spark, tmp_path / "cold")
    assert again["topics"] == cold["topics"]


def test_a_run_stopped_before_it_saved_what_it_keeps_is_made_up_by_the_next(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run that recorded new rows in the parse cache but stopped before swapping in the
    kept aggregates and settled outcomes: the next run still finds those rows new (the
    states list what they cover, not what the cache holds)."""
    data = _store(tmp_path)
    out = tmp_path / "out"
    run(spark, data, out)
    positions = _append_orders(data, 80, 20)
    (data / "events" / DAY / "2-2.jsonl").write_bytes(
        event_file(delivery_history(positions), "new")
    )

    def stop(self: Any) -> None:
        raise RuntimeError("stopped")

    monkeypatch.setattr(spoolmq.analytics.kept.KeptTables, "save", stop)
    monkeypatch.setattr(spoolmq.analytics.settled.SettledOutcomes, "save", stop)
    with pytest.raises(RuntimeError, match="stopped"):
        run(spark, data, out)
    monkeypatch.undo()
    again = _same_as_cold(spark, data, out, tmp_path)
    assert again["run"]["segments_parsed_bytes"] == 0  # the stopped run parsed them
    assert again["topics"]["orders"]["messages"] == 100


def test_rows_a_stopped_run_dropped_before_its_manifest_said_so_reset_what_is_kept(
    spark: SparkSession, tmp_path: Path
) -> None:
    """Retention deleted a segment, and a run dropped its cached rows but stopped before
    writing its manifest: the next run finds the manifest listing rows that are gone, and
    computes again what it had kept (which counted them)."""
    data = _store(tmp_path)
    out = tmp_path / "out"
    run(spark, data, out)
    with Store(data) as store:
        store.alter_topic("orders", retention_bytes=3000)
        assert store.enforce_retention("orders").deleted_segments > 0
    cache = ParseCache(out / "cache", data, fingerprint=job._fingerprint())
    segments = sorted((data / "logs").glob("*/*/*.jsonl"))
    assert cache.plan("segments", segments).files_dropped > 0  # and no commit: a stop
    again = _same_as_cold(spark, data, out, tmp_path)
    assert again["topics"]["orders"]["messages"] < 80


def _kept(out: Path) -> dict[str, Any]:
    return orjson.loads((out / "cache" / "kept" / "kept.json").read_bytes())


def _rows_given(monkeypatch: pytest.MonkeyPatch, name: str) -> list[int]:
    """How many rows each call of the transform ``name`` is given (its first argument)."""
    seen: list[int] = []
    real = getattr(spoolmq.analytics.transform, name)

    def spied(rows: Any, *args: Any) -> Any:
        seen.append(rows.count())
        return real(rows, *args)

    monkeypatch.setattr(spoolmq.analytics.transform, name, spied)
    return seen


def test_consumer_activity_is_kept_up_to_its_oldest_open_delivery(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer's busy and idle time is a union of its deliveries' spans: a run keeps the
    summary of the spans before the oldest delivery not ended yet, and the next reads the
    event rows from there on (and the new ones), and gives what a cold run gives. A new
    delivery from before that point (a clock that went back) makes it read every row."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=2)
    positions = _append_orders(data, 0, 40)
    base = max(p.timestamp for p in positions) + 1_000
    events: list[dict[str, Any]] = []
    for n, p in enumerate(positions[:30]):
        who = {"consumer": "c1" if n % 2 else "c2"}
        events += [{**e, **who} for e in _worked(p, base + 40 * n)]  # gaps of 35 ms
    open_at = base + 40 * 30
    held = positions[30]  # delivered to c1, not ended before the next run
    events.append({**_message_event(open_at, "delivered", held), "consumer": "c1"})
    for n, p in enumerate(positions[31:35]):  # c2 goes on meanwhile
        events += [{**e, "consumer": "c2"} for e in _worked(p, open_at + 10 + 40 * n)]
    day = data / "events" / DAY
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(event_file(events, "old"))
    out = tmp_path / "out"
    run(spark, data, out)
    assert _kept(out)["activity_from"] == open_at

    rows_seen = _rows_given(monkeypatch, "activity_attempts")
    # Then: the held delivery ends, and a minute later c1 gets more work.
    later = open_at + 60_000
    more = [{**_message_event(open_at + 50, "acked", held, processing_ms=50.0), "consumer": "c1"}]
    for n, p in enumerate(positions[35:]):
        more += [{**e, "consumer": "c1"} for e in _worked(p, later + 100 + 40 * n)]
    (day / "2-2.jsonl").write_bytes(event_file(more, "old"))
    _same_as_cold(spark, data, out, tmp_path)
    # The re-run read the rows from the open delivery on: its own, c2's 4 deliveries and
    # their ACKs, and the new ones; the cold run read them all.
    assert rows_seen == [1 + 8 + len(more), len(events) + len(more)]
    assert _kept(out)["activity_from"] == later + 100 + 40 * 4  # the newest delivery
    consumers = {
        row.consumer: row for row in spark.read.parquet(str(out / "tables" / "consumers")).collect()
    }
    assert consumers["c1"].idle_ms > 59_000  # the wait for work after the held delivery
    assert consumers["c1"].busy_ms < 1_000

    # A delivery stamped before that point (the clock went back): every row again.
    rows_seen.clear()
    back = [{**e, "consumer": "c3"} for e in _worked(positions[0], base - 500, attempt=2)]
    (day / "3-3.jsonl").write_bytes(event_file(back, "old"))
    _same_as_cold(spark, data, out, tmp_path)
    assert rows_seen[0] == rows_seen[1] == len(events) + len(more) + len(back)


def test_deliveries_that_lost_their_end_in_a_broker_restart(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A broker that stops without writing how its open deliveries ended delivers those
    messages again, often under the same attempt number (numbers younger than a checkpoint
    come again) and to a consumer id that comes again too. A delivery that a later one of
    the same message followed will not end: it does not hold ``activity_from`` back. Two
    deliveries of one consumer id and attempt number are one row: it stays open while it
    has fewer ends than deliveries. Each re-run gives what a cold run gives."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=2)
    positions = _append_orders(data, 0, 40)
    base = max(p.timestamp for p in positions) + 1_000

    def by(consumer: str, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{**row, "consumer": consumer} for row in rows]

    # Before the restart: two deliveries to c1 that no event ends. After it (30 s on), the
    # first again under the same number to c2, the second under the next number.
    again = base + 30_000
    events = by("c1", [_message_event(base, "delivered", positions[0])])
    events += by("c1", [_message_event(base + 10, "delivered", positions[1])])
    events += by("c2", _worked(positions[0], again) + _worked(positions[1], again + 10, attempt=2))
    for n, p in enumerate(positions[2:20]):
        events += by("c1" if n % 2 else "c2", _worked(p, again + 40 * (n + 1)))
    day = data / "events" / DAY
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(event_file(events, "old"))
    out = tmp_path / "out"
    run(spark, data, out)
    newest = again + 40 * 18
    assert _kept(out)["activity_from"] == newest  # not ``base``
    consumers = {
        row.consumer: row for row in spark.read.parquet(str(out / "tables" / "consumers")).collect()
    }
    assert consumers["c1"].idle_ms >= 30_000  # its two lost deliveries count as moments

    # A NACK, a restart, then the same message to the same consumer id under the same
    # number: one attempt row with two deliveries and one end, open.
    rows_seen = _rows_given(monkeypatch, "activity_attempts")
    first = newest + 1_000
    more = by("c1", [_message_event(first, "delivered", positions[20])])
    more += by("c1", [_message_event(first + 5, "nacked", positions[20])])
    more += by("c1", [_message_event(first + 20_000, "delivered", positions[20])])
    for n, p in enumerate(positions[21:30]):
        more += by("c2", _worked(p, first + 20_100 + 40 * n))
    (day / "2-2.jsonl").write_bytes(event_file(more, "old"))
    _same_as_cold(spark, data, out, tmp_path)
    # The re-run read the newest delivery's two rows and the new ones; the cold run all.
    # Each read them twice: a delivery is open, so the attempts are looked at again.
    assert rows_seen == [2 + len(more)] * 2 + [len(events) + len(more)] * 2
    assert _kept(out)["activity_from"] == first

    # Its ACK comes: the re-run reads from that delivery on, and agrees with a cold run.
    rows_seen.clear()
    last = by("c1", [_message_event(first + 20_050, "acked", positions[20], processing_ms=50.0)])
    for n, p in enumerate(positions[30:]):
        last += by("c1", _worked(p, first + 30_000 + 40 * n))
    (day / "3-3.jsonl").write_bytes(event_file(last, "old"))
    _same_as_cold(spark, data, out, tmp_path)
    # Nothing is open from that delivery on; the cold run finds the two lost deliveries.
    assert rows_seen == [len(more) + len(last)] + [len(events) + len(more) + len(last)] * 2
    assert _kept(out)["activity_from"] == first + 30_000 + 40 * 9


def test_an_incomplete_batch_completed_later_counts_as_in_a_cold_run(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where each partition ends (and so whether its newest batch is whole) and the line
    counts are kept per parsed part file: a re-run parses the rest of a batch it saw in
    part, and counts its records as used, as a cold run does."""
    data = _store(tmp_path)
    with Store(data) as store:
        store.append_batch("orders", [Message({"n": n}, key="k0") for n in range(3)])
    newest = max((data / "logs" / "orders").glob("*/*.jsonl"), key=lambda p: p.stat().st_mtime)
    whole = newest.read_bytes()
    last = whole[:-1].rfind(b"\n") + 1
    newest.write_bytes(whole[:last])  # the batch's last line not written yet
    out = tmp_path / "out"
    first = run(spark, data, out).summary
    assert first["skipped"]["segments"] == {"incomplete batch": 2}
    assert _kept(out)["ends"]

    seen = _rows_given(monkeypatch, "end_partials")
    with newest.open("ab") as file:
        file.write(whole[last:])
    again = _same_as_cold(spark, data, out, tmp_path)
    assert seen == [1, 83 + 32]  # the new line; every line of both topics, cold
    assert again["skipped"]["segments"] == {}
    assert again["topics"]["orders"]["messages"] == 83
