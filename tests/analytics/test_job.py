"""The job over stores that are empty, damaged, or being written to (in-process, one session)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
from analytics_helpers import record_line
from pyspark.sql import SparkSession

from spoolmq import Message, Store
from spoolmq.analytics import job, report, run, transform
from spoolmq.analytics.job import default_out_dir
from spoolmq.cli import main as cli_main
from spoolmq.testing import wait_until

pytestmark = pytest.mark.spark

TABLES = {
    "lines", "partitions", "throughput_per_minute", "latency", "processing_time",
    "delivery_attempts", "outcomes", "failure_reasons", "consumers", "lag_now",
    "lag_over_time", "top_keys",
    "payload_sizes", "throughput_by_group_per_minute", "throughput_by_consumer_per_minute",
    "tasks", "periodic",
}  # fmt: skip


def test_a_missing_data_directory_is_one_line_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = cli_main(["analytics", "--data", str(tmp_path / "nothing-here")])
    assert status == 2
    err = capsys.readouterr().err
    assert err.startswith("spoolmq: no data directory at ") and err.count("\n") == 1


@pytest.mark.parametrize(
    "master",
    ["local", "local[*]", "local[1]", "local[16]", "local[01]", "local[2,3]", "local[*,4]",
     "local-cluster[2,1,1024]", "spark://h:7077", "spark://a:7077,b:7077", "yarn",
     "k8s://https://h:6443", "mesos://h:5050"],
)  # fmt: skip
def test_spark_master_urls_are_taken(master: str) -> None:
    assert job._SPARK_MASTER.fullmatch(master)


@pytest.mark.parametrize(
    "master", ["local[0]", "local[00]", "local[-1]", "local[0,2]", "local[]", "local[x]", "lokal"]
)
def test_a_master_spark_would_fail_on_is_refused_before_it_starts(
    master: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """local[0] was taken, then Spark failed as it started: a traceback, exit status 1."""
    (tmp_path / "queue_data").mkdir()
    data, out = str(tmp_path / "queue_data"), str(tmp_path / "out")
    status = cli_main(["analytics", "--data", data, "--out", out, "--master", master])
    assert status == 2
    err = capsys.readouterr().err
    assert err == f"spoolmq: --master {master!r} is not a Spark master URL " + (
        "(local, local[N] with N >= 1, local[*], spark://HOST:PORT, yarn, k8s://...)\n"
    )


def test_default_out_dir_is_next_to_the_data(tmp_path: Path) -> None:
    assert default_out_dir(tmp_path / "queue_data") == tmp_path.resolve() / "analytics_out"


def test_an_empty_directory_gives_an_empty_report(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "queue_data").mkdir()
    result = run(spark, tmp_path / "queue_data", tmp_path / "out")
    summary = orjson.loads((tmp_path / "out" / "summary.json").read_bytes())
    assert summary == result.summary
    assert summary["topics"] == {} and summary["groups"] == {}
    assert summary["inputs"] == {
        "segment_files": 0, "segment_lines": 0, "event_files": 0, "event_lines": 0,
    }  # fmt: skip
    assert {p.name for p in (tmp_path / "out" / "tables").iterdir()} == TABLES
    assert spark.read.parquet(str(tmp_path / "out" / "tables" / "partitions")).count() == 0
    assert {p.name for p in (tmp_path / "out" / "charts").iterdir()} == {
        "throughput.png", "latency.png", "lag.png", "attempts.png", "consumers.png",
    }  # fmt: skip
    assert "Every line was read" in result.report.read_text()


def test_what_the_job_writes_is_private(spark: SparkSession, tmp_path: Path) -> None:
    """The tables and the report name keys, consumers and failure reasons: a directory the
    job makes is 0700, its tables and charts 0700 in any directory, its files 0600; an
    existing --out keeps its mode, and an older run's wider modes are narrowed."""
    with Store(tmp_path / "queue_data") as store:
        store.append("t", [Message(value={"n": 1}, key="customer-42")])
    old_umask = os.umask(0o022)  # what a user's shell has: Spark's files take it
    try:
        made = tmp_path / "a" / "out"
        run(spark, tmp_path / "queue_data", made)
        shared = tmp_path / "shared"
        shared.mkdir(mode=0o755)
        (shared / "tables").mkdir(mode=0o755)
        (shared / "summary.json").write_text("{}")
        os.chmod(shared / "summary.json", 0o644)
        run(spark, tmp_path / "queue_data", shared)
    finally:
        os.umask(old_umask)
    mode = lambda path: stat.S_IMODE(path.stat().st_mode)  # noqa: E731
    assert mode(made) == 0o700
    assert mode(shared) == 0o755
    for out in (made, shared):
        assert mode(out / "tables") == 0o700 and mode(out / "charts") == 0o700
        assert mode(out / "summary.json") == 0o600 and mode(out / "report.html") == 0o600
        assert orjson.loads((out / "summary.json").read_bytes())["topics"]["t"]["messages"] == 1


def test_topics_without_messages_show_their_partitions(spark: SparkSession, tmp_path: Path) -> None:
    with Store(tmp_path / "queue_data") as store:
        store.create_topic("idle", partitions=2)
    summary = run(spark, tmp_path / "queue_data", tmp_path / "out").summary
    empty = {"messages": 0, "bytes": 0, "log_end_offset": 0}
    assert summary["topics"]["idle"]["partitions"] == {"0": empty, "1": empty}
    assert summary["topics"]["idle"]["e2e_latency_ms"] is None


def _query_threads() -> list[threading.Thread]:
    names = ("spoolmq-parse", "spoolmq-outcomes", "spoolmq-table")
    return [t for t in threading.enumerate() if t.name.startswith(names)]


def test_an_interrupted_run_drops_the_queries_it_queued(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or an error) while the tables are computed ends the run at once: the queries
    queued behind the running ones are dropped, not run first (a 1M-message store's run
    went on for 9 s after Ctrl-C), and it raises once the running ones have ended."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("t", partitions=1)
        store.append_batch("t", [Message({"n": n}, key=f"k{n % 3}") for n in range(30)])
    # Every table but the partitions (which the run waits for before the charts) waits to
    # be written until the interrupt: only the queries running then can write theirs.
    interrupted = threading.Event()
    write = job._write_table

    def held_write(frame: Any, out_dir: Path, name: str) -> None:
        if name != "partitions":
            assert interrupted.wait(120)
        write(frame, out_dir, name)

    monkeypatch.setattr(job, "_write_table", held_write)

    def step(text: str) -> None:
        if text == "charts":  # every table's and chart's query is queued by now
            interrupted.set()
            raise KeyboardInterrupt

    root = spark.sparkContext._jvm.org.apache.logging.log4j.LogManager.getRootLogger()  # type: ignore[union-attr]
    try:
        spark.sparkContext.setLogLevel("WARN")  # a library caller's own level
        with pytest.raises(KeyboardInterrupt):
            run(spark, data, tmp_path / "out", step)
        # Spark's log was off while the running queries were cancelled, and is back.
        assert str(root.getLevel().name()) == "WARN"
        assert _query_threads() == []  # none left running
        written = {p.name for p in (tmp_path / "out" / "tables").iterdir()}
        assert "partitions" in written
        # The partitions, and at most one table per query thread.
        assert len(written) <= 1 + job.TABLE_THREADS, written
    finally:
        spark.sparkContext.setLogLevel("ERROR")  # as build_session leaves it
        spark.catalog.clearCache()  # what the run had persisted, for the next tests


def _segment(data: Path, topic: str) -> Path:
    return sorted((data / "logs" / topic / "0").glob("*.jsonl"))[-1]


def test_damaged_lines_are_skipped_and_reported(spark: SparkSession, tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("t", partitions=1)
        store.append_batch("t", [Message({"n": n}, key=f"k{n % 2}") for n in range(5)])
        for n in range(5, 8):
            store.append("t", {"n": n}, key="k1")
    segment = _segment(data, "t")
    lines = segment.read_bytes().splitlines(keepends=True)
    # Damage in the middle: one value changed after its checksum was computed.
    assert b'{"n":2}' in lines[2]
    lines[2] = lines[2].replace(b'{"n":2}', b'{"n":9}')
    # A batch of 3 of which 2 lines are written, then a line cut mid-write.
    stamp = orjson.loads(lines[-1])["timestamp"]
    tail = [
        record_line(offset=8, timestamp=stamp, key="k0", value=8, headers=[], batch_records=3),
        record_line(offset=9, timestamp=stamp, key="k1", value=9, headers=[]),
    ]
    segment.write_bytes(
        b"".join(lines) + "".join(f"{line}\n" for line in tail).encode() + b'{"offset":10,"ti'
    )
    day = data / "events" / "date=2026-11-23"
    day.mkdir(parents=True)
    good = {"group": "g", "topic": "t", "partition": 0, "consumer": "c", "published_at": stamp}
    (day / "1-1.jsonl").write_bytes(
        orjson.dumps({"ts": stamp + 5, "type": "delivered", "offset": 0, "attempt": 1, **good})
        + b"\n"
        + orjson.dumps({"ts": stamp + 9, "type": "acked", "offset": 0, "attempt": 1, **good})
        + b'\n{"ts": 17, "type": "del'
    )
    summary = run(spark, data, tmp_path / "out").summary
    assert summary["skipped"] == {
        "segments": {"checksum mismatch": 1, "incomplete batch": 2, "unparsable": 1},
        "events": {"unparsable": 1},
    }
    # 8 stored + 2 of the incomplete batch + the cut line; 2 events + the cut one.
    assert summary["inputs"]["segment_lines"] == 11 and summary["inputs"]["event_lines"] == 3
    topic = summary["topics"]["t"]
    assert topic["messages"] == 7
    assert topic["partitions"]["0"]["log_end_offset"] == 8  # offset 7 is the newest whole one
    assert topic["acked"] == 1 and topic["delivery_attempts"] == {"1": 1}
    assert topic["e2e_latency_ms"] == {"p50": 5.0, "p90": 5.0, "p99": 5.0, "max": 5.0}
    page = (tmp_path / "out" / "report.html").read_text()
    assert "2 segments line(s): incomplete batch" in page
    assert "1 events line(s): unparsable" in page


_WRITER = """
import os, sys, time
from pathlib import Path
from spoolmq import Message, Store
data, stop = Path(sys.argv[1]), Path(sys.argv[2])
with Store(data) as store:
    n = 0
    while not stop.exists():
        store.append_batch("busy", [Message({"n": n + i}, key=f"k{i}") for i in range(50)], acks=1)
        n += 50
        # Replaced whole, never truncated, so a reader never sees it empty.
        (data.parent / "written.tmp").write_text(str(n))
        os.replace(data.parent / "written.tmp", data.parent / "written")
"""


def test_a_store_being_written_to_is_read_without_failing(
    spark: SparkSession, tmp_path: Path
) -> None:
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("busy", partitions=2, segment_bytes=64 * 1024)
    stop = tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", _WRITER, str(data), str(stop)])
    try:
        written = tmp_path / "written"

        def going() -> bool:
            assert writer.poll() is None, "the writer died"
            return written.exists() and int(written.read_text()) >= 2000

        wait_until(going, 120, "the writer to get going")
        before = int(written.read_text())
        summary: dict[str, Any] = run(spark, data, tmp_path / "out").summary
        assert writer.poll() is None, "the writer stopped while the job ran"
    finally:
        stop.touch()
        writer.wait(30)
    after = int(written.read_text())
    assert writer.returncode == 0
    messages = summary["topics"]["busy"]["messages"]
    # Whatever was stored when the job began is counted; nothing is counted twice; a
    # batch being written at that moment is either counted whole or reported as skipped.
    assert before <= messages <= after
    skipped = summary["skipped"]["segments"]
    assert set(skipped) <= {"incomplete batch", "unparsable"}
    parts = summary["topics"]["busy"]["partitions"]
    assert sum(p["messages"] for p in parts.values()) == messages
    for partition in parts.values():
        assert partition["log_end_offset"] >= partition["messages"]


def test_tasks_and_periodic_jobs_from_tasks_db(spark: SparkSession, tmp_path: Path) -> None:
    import sqlite3

    from spoolmq.tasks.results import ResultStore

    data = tmp_path / "queue_data"
    data.mkdir()
    store = ResultStore(data)
    common = {"topic": "tasks", "args": {}, "key": None, "priority": 0, "eta_ms": None,
              "result_ttl_ms": None}  # fmt: skip
    for n in range(4):
        store.add(f"t{n}", name="send_email", **common)
    store.add("r0", name="resize", **common)
    for task_id, state in (("t0", "succeeded"), ("t1", "succeeded"), ("t2", "failed")):
        store.claim(task_id, 1, "w1", {})
        store.finish(task_id, state)
    assert store.cancel("t3")
    store.periodic_last_tick("nightly", "resize", "0 3 * * *")
    store.periodic_advance("nightly", 12, 1_800_000_000_000, fired=True)
    store.close()
    # Known run times (start to finish): 100 and 300 ms succeeded, 50 ms failed.
    db = sqlite3.connect(data / "tasks.db")
    with db:
        for task_id, ran in (("t0", 100), ("t1", 300), ("t2", 50)):
            db.execute("UPDATE tasks SET started_ms = 1000, finished_ms = ? WHERE id = ?",
                       (1000 + ran, task_id))  # fmt: skip
    db.close()

    result = run(spark, data, tmp_path / "out")
    assert result.summary["tasks"] == {
        "resize": {"states": {"queued": 1}, "run_ms": None},
        "send_email": {
            "states": {"cancelled": 1, "failed": 1, "succeeded": 2},
            "run_ms": {"mean": 150.0, "max": 300.0},
        },
    }
    nightly = result.summary["periodic"]["nightly"]
    assert (nightly["task"], nightly["schedule"], nightly["last_tick"]) == (
        "resize", "0 3 * * *", 12,
    )  # fmt: skip
    assert nightly["next_run_ms"] == 1_800_000_000_000 and nightly["last_run_ms"] > 0
    rows = spark.read.parquet(str(tmp_path / "out" / "tables" / "tasks")).collect()
    assert sorted((r["task"], r["state"], r["tasks"]) for r in rows) == [
        ("resize", "queued", 1), ("send_email", "cancelled", 1),
        ("send_email", "failed", 1), ("send_email", "succeeded", 2),
    ]  # fmt: skip
    page = result.report.read_text()
    assert "nightly" in page and "2027-01-15 08:00:00" in page  # next run, in UTC


def test_a_long_store_charts_whole_minute_buckets_summed_from_the_per_minute_tables(
    spark: SparkSession, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A store spanning five and a half hours gets 5-minute chart buckets, which the job sums
    from its per-minute counts instead of going over the records and events again: the
    charts get exactly the counts per bucket that the lines written here give."""
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("t", partitions=1)
        store.append("t", {"n": 0})
    t0 = 1_790_000_000_000 // 3_600_000 * 3_600_000
    minutes = [0, 2, 4, 7, 61, 62, 200, 330]  # span > 300 one-minute buckets
    stamps = [t0 + m * 60_000 + n * 1_000 for n, m in enumerate(minutes)]
    lines = [
        record_line(offset=n, timestamp=ts, key=f"k{n}", value=n, headers=[], batch_records=1)
        for n, ts in enumerate(stamps)
    ]
    _segment(data, "t").write_text("".join(f"{line}\n" for line in lines))
    events = []
    for n, ts in enumerate(stamps):
        where = {"group": "g", "topic": "t", "partition": 0, "offset": n, "published_at": ts}
        consumer = f"c{n % 2}"
        # Delivered 90 s after the publish: the minute at 4 is delivered in the next bucket.
        events.append({"ts": ts + 90_000, "type": "delivered", "consumer": consumer,
                       "attempt": 1, **where})  # fmt: skip
        if n != 3:  # one message never ACKed
            events.append({"ts": ts + 100_000, "type": "acked", "consumer": consumer,
                           "attempt": 1, "processing_ms": 10.0, **where})  # fmt: skip
    day = data / "events" / "date=2026-10-21"
    day.mkdir(parents=True)
    (day / "1-1.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))

    seen: dict[str, Any] = {}
    real_throughput, real_consumers = report.throughput_chart, report.consumers_chart

    def throughput_chart(rows: Any, group_rows: Any, bucket_ms: int, path: Path) -> Path:
        seen.update(throughput=rows, by_group=group_rows, bucket=bucket_ms)
        return real_throughput(rows, group_rows, bucket_ms, path)

    def consumers_chart(rows: Any, bucket_ms: int, path: Path) -> Path:
        seen.update(by_consumer=rows, consumer_bucket=bucket_ms)
        return real_consumers(rows, bucket_ms, path)

    rebucketed: list[tuple[int, tuple[str, ...]]] = []
    real_rebucket = transform.rebucket

    def rebucket(table: Any, bucket_ms: int, keys: Any) -> Any:
        rebucketed.append((bucket_ms, tuple(keys)))
        return real_rebucket(table, bucket_ms, keys)

    monkeypatch.setattr(report, "throughput_chart", throughput_chart)
    monkeypatch.setattr(report, "consumers_chart", consumers_chart)
    monkeypatch.setattr(transform, "rebucket", rebucket)
    run(spark, data, tmp_path / "out")

    bucket = 300_000
    assert seen["bucket"] == seen["consumer_bucket"] == bucket
    # The three series were counted per minute once (the per-minute tables are those
    # counts), and the charts' buckets summed from them, not from the events again.
    assert sorted(r for r in rebucketed if r[0] == bucket) == [
        (bucket, ("group", "consumer")), (bucket, ("topic",)), (bucket, ("topic", "group")),
    ]  # fmt: skip
    assert {ms for ms, _ in rebucketed} == {60_000, bucket}

    def start(ms: int) -> int:
        return ms - ms % bucket

    stored: dict[int, list[int]] = {}
    for ts, line in zip(stamps, lines, strict=True):
        counts = stored.setdefault(start(ts), [0, 0])
        counts[0] += 1
        counts[1] += len(line) + 1
    worked: dict[tuple[str, int], list[int]] = {}
    for e in events:
        counts = worked.setdefault((e["consumer"], start(e["ts"])), [0, 0])
        counts[0 if e["type"] == "delivered" else 1] += 1
    per_bucket: dict[int, list[int]] = {}
    for (_, at), (delivered, acked) in worked.items():
        counts = per_bucket.setdefault(at, [0, 0])
        counts[0] += delivered
        counts[1] += acked
    # The fixture as meant: the first bucket stored three messages, and delivered two of
    # them (the third, published at minute 4, in the next bucket).
    assert stored[t0][0] == 3 and per_bucket[t0] == [2, 2]

    got = {
        r["bucket_start_ms"]: (r["published"], r["bytes"], r["delivered"], r["acked"])
        for r in seen["throughput"]
        if r["topic"] == "t"
    }
    expected = {
        at: (*stored.get(at, (0, 0)), *per_bucket.get(at, (0, 0)))
        for at in stored.keys() | per_bucket.keys()
    }
    assert got == expected
    assert {
        r["bucket_start_ms"]: (r["delivered"], r["acked"])
        for r in seen["by_group"]
        if (r["topic"], r["group"]) == ("t", "g")
    } == {at: tuple(counts) for at, counts in per_bucket.items()}
    assert {
        (r["consumer"], r["bucket_start_ms"]): (r["delivered"], r["acked"])
        for r in seen["by_consumer"]
        if r["group"] == "g"
    } == {key: tuple(counts) for key, counts in worked.items()}
