"""The real broker, a workload from the public clients, then ``spoolmq analytics`` as a user
runs it; every figure of summary.json is checked against a computation in plain Python over
the same files (segments, events, state.db), written here independently of the job.

The report of that run is then opened in headless Chromium.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import zlib
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import analytics_workers
import orjson
import pytest
from analytics_helpers import need

from spoolmq import Publisher, Store
from spoolmq.testing import wait_until

pytestmark = pytest.mark.spark

MESSAGES = 240
TIMEOUT_S = 120


@dataclass(frozen=True)
class Run:
    data: Path
    out: Path
    stdout: str
    stderr: str


def _workload(data: Path) -> None:
    """Two billing consumers (NACKs, a poison message per 40, a held key) and one audit
    consumer, in their own processes, while this process publishes."""
    context = multiprocessing.get_context("spawn")
    consumers = []
    for group, name in (("billing", "billing-1"), ("billing", "billing-2"), ("audit", "audit-1")):
        ready = data.parent / f"ready-{name}"
        consumers.append(
            (
                context.Process(
                    target=analytics_workers.consume,
                    # Idle this long: done. Generous: the publishing starts only once all
                    # three are up, and a busy machine may pause any of them for seconds.
                    args=(str(data), group, name, str(ready), 10.0),
                    name=name,
                ),
                ready,
            )
        )
    try:
        for process, _ in consumers:
            process.start()
        for process, ready in consumers:
            wait_until(ready.exists, TIMEOUT_S, f"consumer {process.name}")
        with Publisher(data=data, name="e2e-publisher") as publisher:
            futures = [
                publisher.publish_async(
                    "orders",
                    {"n": n, "note": "naïve €"} if n % 5 == 0 else {"n": n},
                    key=None if n % 11 == 0 else f"customer-{n % 9}",
                    headers={"source": "e2e"},
                )
                for n in range(1, MESSAGES + 1)
            ]
            # A message that holds its key for a while in billing, and one behind it that
            # lives for 0.5 s: billing sees it expire.
            publisher.publish("orders", {"n": 0, "hold": True}, key="held")
            publisher.publish("orders", {"n": 0}, key="held", ttl=0.5)
            for future in futures:
                future.result()
        for process, _ in consumers:
            process.join(TIMEOUT_S)
            assert process.exitcode == 0, f"{process.name} exited with {process.exitcode}"
    finally:
        for process, _ in consumers:
            if process.is_alive():
                process.terminate()
                process.join(10)


def _tear_last_lines(data: Path) -> None:
    """A crash mid-write: a cut line at the end of a segment and of an events file."""
    segment = sorted((data / "logs" / "orders" / "0").glob("*.jsonl"))[-1]
    with segment.open("ab") as file:
        file.write(b'{"offset":99999,"timestamp":17')
    events = sorted((data / "events").glob("date=*/*.jsonl"))[-1]
    with events.open("ab") as file:
        file.write(b'{"ts":1763830000123,"type":"acked","gro')


@pytest.fixture(scope="module")
def e2e() -> Iterator[Run]:
    need("java", "openjdk-17-jre-headless")
    root = Path(tempfile.mkdtemp(prefix="spoolmq-e2e-analytics-"))
    data = root / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=2)
    broker = subprocess.Popen(
        [sys.executable, "-m", "spoolmq", "broker", "--data", str(data), "--log-level", "warning"],
        stdin=subprocess.DEVNULL,
    )
    try:
        wait_until((data / "broker.sock").exists, 60, "the broker's socket")
        _workload(data)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(60)
        except subprocess.TimeoutExpired:
            broker.kill()
            broker.wait(10)
    assert broker.returncode == 0
    _tear_last_lines(data)
    out = root / "out"
    command = [sys.executable, "-m", "spoolmq", "analytics", "--data", str(data)]
    completed = subprocess.run(
        [*command, "--out", str(out), "--master", "local[1]"],
        capture_output=True,
        timeout=600,
        check=False,
        env={**os.environ, "SPARK_LOCAL_IP": "127.0.0.1"},
    )
    assert completed.returncode == 0, completed.stderr.decode()[-3000:]
    yield Run(
        data=data, out=out, stdout=completed.stdout.decode(), stderr=completed.stderr.decode()
    )
    shutil.rmtree(root, ignore_errors=True)


# -- the independent computation ----------------------------------------------------------


def _lines(path: Path) -> list[bytes]:
    """Lines as a text reader sees them: split on newlines, a last line without one kept."""
    pieces = path.read_bytes().split(b"\n")
    return pieces[:-1] if pieces[-1] == b"" else pieces


def _record(line: bytes) -> tuple[dict[str, Any] | None, str | None]:
    try:
        fields = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None, "unparsable"
    if not isinstance(fields, dict) or not all(
        type(fields.get(name)) is int for name in ("offset", "timestamp", "crc")
    ):
        return None, "unparsable"
    if zlib.crc32(line[: line.rfind(b',"crc":')]) != fields["crc"]:
        return None, "checksum mismatch"
    return fields, None


def _percentile(values: list[float], fraction: float) -> float:
    """Exact, linear interpolation between the closest ranks (Spark's ``percentile``)."""
    ordered = sorted(values)
    position = fraction * (len(ordered) - 1)
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _figures(values: list[float], *extra: str) -> dict[str, float] | None:
    if not values:
        return None
    out: dict[str, float] = {}
    if "min" in extra:
        out["min"] = float(min(values))
    if "mean" in extra:
        out["mean"] = sum(values) / len(values)
    for name, fraction in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99)):
        out[name] = _percentile(values, fraction)
    out["max"] = float(max(values))
    return out


def _frame_events(
    line: dict[str, Any], stamps: dict[tuple[str, int, int], int]
) -> list[dict[str, Any]] | None:
    """The per-message events a ``delivered`` or ``acked`` line of the frame shape stands
    for (docs/FORMAT.md), in the order of its runs; None when it is not a whole one."""
    runs, times = line.get("runs"), line.get("processing_ms")
    if "offset" in line or not isinstance(runs, list) or not runs:
        return None
    events = []
    for run in runs:
        if not (isinstance(run, list) and len(run) == 5 and isinstance(run[3], int)):
            return None
        topic, partition, first, count, attempt = run
        if count < 1:
            return None
        for offset in range(first, first + count):
            events.append(
                {
                    **{k: v for k, v in line.items() if k not in ("runs", "processing_ms")},
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    "attempt": attempt,
                    "published_at": stamps.get((topic, partition, offset)),
                }
            )
    if times is not None:
        if not isinstance(times, list) or len(times) != len(events):
            return None
        for event, ms in zip(events, times, strict=True):
            event["processing_ms"] = ms
    elif line.get("type") == "acked" and line.get("reason") == "auto_ack":
        for event in events:
            event["processing_ms"] = 0.0
    return events


def expected_summary(data: Path) -> dict[str, Any]:
    db = sqlite3.connect(f"{(data / 'state.db').as_uri()}?mode=ro", uri=True)
    declared = dict(db.execute("SELECT name, partitions FROM topics").fetchall())
    rows = db.execute("SELECT topic, partition, log_end_offset FROM partitions").fetchall()
    state_ends = {(topic, partition): end for topic, partition, end in rows}
    committed = db.execute(
        "SELECT group_name, topic, partition, committed_offset FROM group_offsets"
    ).fetchall()
    db.close()

    # Segments: good records, minus an incomplete newest batch per partition.
    segment_files = sorted((data / "logs").glob("*/*/" + "[0-9]" * 20 + ".jsonl"))
    segment_status: Counter[str] = Counter()
    good: dict[tuple[str, int], list[tuple[dict[str, Any], int]]] = defaultdict(list)
    for path in segment_files:
        where = (path.parent.parent.name, int(path.parent.name))
        for line in _lines(path):
            fields, problem = _record(line)
            if fields is None:
                segment_status[problem or ""] += 1
            else:
                good[where].append((fields, len(line) + 1))
    for where, records in good.items():
        heads = [f for f, _ in records if f.get("batch_records") is not None]
        newest = max((f["offset"] for f, _ in records), default=-1)
        if heads:
            head = max(heads, key=lambda f: f["offset"])
            if head["offset"] + head["batch_records"] - 1 > newest:
                kept = [(f, b) for f, b in records if f["offset"] < head["offset"]]
                segment_status["incomplete batch"] += len(records) - len(kept)
                good[where] = kept
    segment_status["used"] = sum(len(r) for r in good.values())

    # Events and each (group, message)'s outcome. A frame line (a broker of issue 10 and
    # later) stands for one event per message, whose publish time is its record's.
    stamps = {
        (topic, partition, f["offset"]): f["timestamp"]
        for (topic, partition), records in good.items()
        for f, _ in records
    }
    stored = {
        (topic, partition, f["offset"]): f
        for (topic, partition), records in good.items()
        for f, _ in records
    }
    event_files = sorted((data / "events").glob("date=*/*.jsonl"))
    events: list[dict[str, Any]] = []
    event_status: Counter[str] = Counter()
    for path in event_files:
        for line in _lines(path):
            try:
                event = orjson.loads(line)
            except orjson.JSONDecodeError:
                event = None
            if isinstance(event, dict) and "runs" in event:
                expanded = _frame_events(event, stamps)
            elif isinstance(event, dict) and all(
                event.get(name) is not None for name in ("topic", "partition")
            ):
                expanded = [event]
            else:
                expanded = None
            if expanded is None or any(
                e.get(name) is None for e in expanded for name in ("ts", "type", "group")
            ):
                event_status["unparsable"] += 1
            else:
                event_status["used"] += 1
                events.extend(expanded)
    outcomes: dict[tuple[str, str, int, int], dict[str, Any]] = {}
    for e in events:
        if e["type"] == "lag" or e.get("offset") is None:
            continue
        o = outcomes.setdefault(
            (e["group"], e["topic"], e["partition"], e["offset"]),
            {"published_at": None, "first": None, "attempts": None, "acked_at": None,
             "dead": False, "expired": False, "cancelled": False, "finished": None},
        )  # fmt: skip
        if e.get("published_at") is not None:
            o["published_at"] = max(o["published_at"] or 0, e["published_at"])
        if e["type"] == "delivered":
            o["first"] = e["ts"] if o["first"] is None else min(o["first"], e["ts"])
            o["attempts"] = max(o["attempts"] or 0, e["attempt"])
        elif e["type"] == "acked":
            o["acked_at"] = e["ts"] if o["acked_at"] is None else min(o["acked_at"], e["ts"])
        o["dead"] |= e["type"] == "dead_lettered"
        o["expired"] |= e["type"] == "expired"
        o["cancelled"] |= e["type"] == "cancelled"
        if e["type"] in ("acked", "dead_lettered", "expired", "cancelled"):
            o["finished"] = min(o["finished"] or e["ts"], e["ts"])
    # Held back: delayed, or published while an earlier message of its key (same group and
    # partition) was unfinished; unknown (None) when its record is gone.
    for (group, topic, partition, offset), o in outcomes.items():
        record = stored.get((topic, partition, offset))
        if o["published_at"] is None and record is not None:
            o["published_at"] = record["timestamp"]
        if record is None:
            o["held_back"] = None
            continue
        key = _key(record)
        due = record.get("deliver_at")
        o["held_back"] = (due is not None and due > o["published_at"]) or (
            key is not None
            and any(
                (other["finished"] is None or other["finished"] > o["published_at"])
                for (g, t, p, n), other in outcomes.items()
                if (g, t, p) == (group, topic, partition)
                and n < offset
                and _key(stored.get((t, p, n)) or {}) == key
            )
        )

    partitions: dict[str, set[int]] = defaultdict(set)
    for topic, count in declared.items():
        partitions[topic].update(range(count))
    for topic, partition in [*state_ends, *good]:
        partitions[topic].add(partition)
    names = set(partitions) | {key[1] for key in outcomes}
    topics: dict[str, Any] = {}
    ends: dict[tuple[str, int], int] = {}
    for topic in sorted(names):
        parts = {}
        for partition in sorted(partitions[topic]):
            records = good.get((topic, partition), [])
            newest = max((f["offset"] for f, _ in records), default=-1)
            end = max(state_ends.get((topic, partition), 0), newest + 1)
            ends[(topic, partition)] = end
            parts[str(partition)] = {
                "messages": len(records),
                "bytes": sum(b for _, b in records),
                "log_end_offset": end,
            }
        mine = [o for key, o in outcomes.items() if key[1] == topic]
        histogram = Counter(o["attempts"] for o in mine if o["attempts"] is not None)
        sizes = [float(b) for p in partitions[topic] for _, b in good.get((topic, p), [])]
        tracked = len(mine)
        counts = {
            "delivered": sum(o["attempts"] is not None for o in mine),
            "acked": sum(o["acked_at"] is not None for o in mine),
            "retried": sum((o["attempts"] or 0) > 1 for o in mine),
            "dead_lettered": sum(o["dead"] for o in mine),
            "expired": sum(o["expired"] for o in mine),
            "cancelled": sum(o["cancelled"] for o in mine),
        }
        topics[topic] = {
            "messages": sum(p["messages"] for p in parts.values()),
            "bytes": sum(p["bytes"] for p in parts.values()),
            "partitions": parts,
            "e2e_latency_ms": _figures(
                [o["first"] - o["published_at"] for o in mine
                 if o["first"] is not None and o["published_at"] is not None]
            ),
            "queue_latency_ms": _queue_figures(mine),
            "ack_latency_ms": _figures(
                [o["acked_at"] - o["published_at"] for o in mine
                 if o["acked_at"] is not None and o["published_at"] is not None]
            ),
            "delivery_attempts": {str(k): histogram[k] for k in sorted(histogram)},
            "tracked": tracked,
            **counts,
            "retry_rate": counts["retried"] / tracked if tracked else None,
            "dlq_rate": counts["dead_lettered"] / tracked if tracked else None,
            "expiry_rate": counts["expired"] / tracked if tracked else None,
            "payload_bytes": _figures(sizes, "min", "mean"),
        }  # fmt: skip

    groups: dict[str, Any] = defaultdict(lambda: defaultdict(dict))
    for group, topic, partition, offset in committed:
        end = max(ends.get((topic, partition), offset), offset)
        groups[group][topic][str(partition)] = {
            "committed": offset, "log_end_offset": end, "lag": end - offset,
        }  # fmt: skip

    consumers: dict[str, Any] = defaultdict(dict)
    worked: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("consumer") is not None and e["type"] in (
            "delivered", "acked", "nacked", "lease_expired", "released",
        ):  # fmt: skip
            worked[(e["group"], e["consumer"])].append(e)
    for (group, consumer), mine_events in worked.items():
        kinds = Counter(e["type"] for e in mine_events)
        failures = kinds["nacked"] + kinds["lease_expired"] + kinds["released"]
        times = [
            float(e["processing_ms"])
            for e in mine_events
            if e["type"] == "acked" and e.get("processing_ms") is not None
        ]
        # Busy: the union of its deliveries' spans (delivery to the event that ended that
        # attempt); idle: the rest of first delivery to last end.
        spans: dict[tuple[Any, ...], list[int | None]] = {}
        for e in mine_events:
            if e.get("offset") is None:
                continue
            span = spans.setdefault((e["topic"], e["partition"], e["offset"], e["attempt"]),
                                    [None, None])  # fmt: skip
            if e["type"] == "delivered":
                span[0] = e["ts"] if span[0] is None else min(span[0], e["ts"])
            else:
                span[1] = e["ts"] if span[1] is None else max(span[1], e["ts"])
        intervals = sorted((a, max(a, b if b is not None else a))
                           for a, b in spans.values() if a is not None)  # fmt: skip
        busy = idle = 0
        if intervals:
            start, end = intervals[0]
            for a, b in intervals[1:]:
                if a > end:
                    busy, idle = busy + end - start, idle + a - end
                    start, end = a, b
                else:
                    end = max(end, b)
            busy += end - start
        span_ms = busy + idle
        consumers[group][consumer] = {
            "deliveries": kinds["delivered"],
            "acked": kinds["acked"],
            "failures": failures,
            "failure_rate": failures / kinds["delivered"] if kinds["delivered"] else None,
            "busy_ms": busy if intervals else None,
            "idle_ms": idle if intervals else None,
            "idle_share": (idle / span_ms if span_ms else None) if intervals else None,
            "processing_ms": _figures(times, "mean"),
        }

    return {
        "data": str(data),
        "inputs": {
            "segment_files": len(segment_files),
            "segment_lines": sum(segment_status.values()),
            "event_files": len(event_files),
            "event_lines": sum(event_status.values()),
        },
        "skipped": {
            "segments": {k: v for k, v in segment_status.items() if k != "used"},
            "events": {k: v for k, v in event_status.items() if k != "used"},
        },
        "topics": topics,
        "groups": {g: dict(t) for g, t in groups.items()},
        "by_group": _by_group(outcomes, events),
        "consumers": dict(consumers),
        **_expected_tasks(data),
    }


def _expected_tasks(data: Path) -> dict[str, Any]:
    """summary.json's ``tasks`` and ``periodic``, from every row of tasks.db."""
    tasks: dict[str, Any] = {}
    periodic: dict[str, Any] = {}
    if (data / "tasks.db").exists():
        db = sqlite3.connect(f"{(data / 'tasks.db').as_uri()}?mode=ro", uri=True)
        rows = db.execute("SELECT name, state, started_ms, finished_ms FROM tasks").fetchall()
        jobs = db.execute("SELECT * FROM periodic").fetchall()
        db.close()
        for name in sorted({r[0] for r in rows}):
            mine = [r for r in rows if r[0] == name]
            runs = [r[3] - r[2] for r in mine
                    if r[1] in ("succeeded", "failed") and None not in (r[2], r[3])]  # fmt: skip
            tasks[name] = {
                "states": dict(sorted(Counter(r[1] for r in mine).items())),
                "run_ms": {"mean": sum(runs) / len(runs), "max": float(max(runs))}
                if runs else None,
            }  # fmt: skip
        for name, task, schedule, last_tick, last_fired, next_ms in sorted(jobs):
            periodic[name] = {"task": task, "schedule": schedule, "last_tick": last_tick,
                              "last_run_ms": last_fired, "next_run_ms": next_ms}  # fmt: skip
    return {"tasks": tasks, "periodic": periodic}


def _key(record: dict[str, Any]) -> str | None:
    key = record.get("key")
    return key if key is not None else record.get("key_b64")


def _queue_figures(mine: list[dict[str, Any]]) -> dict[str, float] | None:
    return _figures(
        [o["first"] - o["published_at"] for o in mine
         if o["first"] is not None and o["held_back"] is False]
    )  # fmt: skip


def _reasons(events: list[dict[str, Any]], group: str, topic: str, kind: str) -> dict[str, int]:
    """The five commonest reasons of ``kind`` events, most frequent first."""
    counts = Counter(
        e.get("reason") or "(none)"
        for e in events
        if (e["group"], e.get("topic"), e["type"]) == (group, topic, kind)
    )
    return dict(sorted(counts.items(), key=lambda item: (-item[1], item[0]))[:5])


def _by_group(
    outcomes: dict[tuple[str, str, int, int], dict[str, Any]], events: list[dict[str, Any]]
) -> dict[str, Any]:
    """Each group's own figures per topic, counted from its outcomes alone."""
    split: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for (group, topic, _, _), o in outcomes.items():
        split[(group, topic)].append(o)
    by_group: dict[str, Any] = defaultdict(dict)
    for (group, topic), mine in sorted(split.items()):
        tracked, retried = len(mine), sum((o["attempts"] or 0) > 1 for o in mine)
        dead = sum(o["dead"] for o in mine)
        by_group[group][topic] = {
            "tracked": tracked,
            "delivered": sum(o["attempts"] is not None for o in mine),
            "acked": sum(o["acked_at"] is not None for o in mine),
            "retried": retried,
            "dead_lettered": dead,
            "expired": sum(o["expired"] for o in mine),
            "cancelled": sum(o["cancelled"] for o in mine),
            "retry_rate": retried / tracked,
            "dlq_rate": dead / tracked,
            "e2e_latency_ms": _figures(
                [o["first"] - o["published_at"] for o in mine
                 if o["first"] is not None and o["published_at"] is not None]
            ),
            "queue_latency_ms": _queue_figures(mine),
            "ack_latency_ms": _figures(
                [o["acked_at"] - o["published_at"] for o in mine
                 if o["acked_at"] is not None and o["published_at"] is not None]
            ),
            "nack_reasons": _reasons(events, group, topic, "nacked"),
            "dead_letter_reasons": _reasons(events, group, topic, "dead_lettered"),
        }  # fmt: skip
    return dict(by_group)


def without_attention(summary: dict[str, Any]) -> dict[str, Any]:
    """The summary less its "needs attention" sentences and what the run parsed (tested on
    their own): the figures the plain Python computation gives too."""
    return {k: v for k, v in summary.items() if k not in ("attention", "run")}


def assert_same(actual: Any, expected: Any, where: str = "summary") -> None:
    """Equal, recursively, with the same keys; floats equal up to rounding (1e-9)."""
    if isinstance(expected, dict):
        assert isinstance(actual, dict), where
        assert set(actual) == set(expected), f"{where}: {sorted(actual)} != {sorted(expected)}"
        for key in expected:
            assert_same(actual[key], expected[key], f"{where}.{key}")
    elif isinstance(expected, float) or isinstance(actual, float):
        assert isinstance(actual, int | float) and isinstance(expected, int | float), where
        assert math.isclose(actual, expected, rel_tol=1e-9, abs_tol=1e-9), (
            f"{where}: {actual} != {expected}"
        )
    else:
        assert actual == expected, f"{where}: {actual!r} != {expected!r}"
        assert type(actual) is type(expected), f"{where}: {type(actual)} != {type(expected)}"


def test_every_summary_figure_matches_a_plain_python_count(e2e: Run) -> None:
    summary = orjson.loads((e2e.out / "summary.json").read_bytes())
    expected = expected_summary(e2e.data)
    assert_same(without_attention(summary), expected)
    # The workload did what it was meant to, so the figures above cover every path.
    orders = summary["topics"]["orders"]
    poison = MESSAGES // analytics_workers.POISON_EVERY
    assert orders["messages"] == MESSAGES + 2
    assert orders["dead_lettered"] == poison
    assert summary["topics"]["orders.dlq"]["messages"] == poison
    assert orders["expired"] >= 1
    assert orders["retried"] > poison and orders["delivery_attempts"]["3"] >= poison
    assert set(summary["groups"]) == {"billing", "audit"}
    assert summary["skipped"] == {"segments": {"unparsable": 1}, "events": {"unparsable": 1}}
    assert len(summary["consumers"]["billing"]) == 2
    # Two groups read every message: per group, each ACKed at most the topic's messages,
    # and the topic's count is their sum (the Topics table says so).
    billing, audit = (summary["by_group"][g]["orders"] for g in ("billing", "audit"))
    assert billing["acked"] + audit["acked"] == orders["acked"]
    assert audit["acked"] <= MESSAGES + 2 and billing["dead_lettered"] == poison
    assert billing["queue_latency_ms"] is not None and audit["queue_latency_ms"] is not None
    assert sum(billing["dead_letter_reasons"].values()) == poison
    assert f"group billing dead-lettered {poison} message(s) of orders" in " ".join(
        summary["attention"]
    )
    assert "1 segments line(s) skipped: unparsable" in summary["attention"]


def test_the_job_says_where_the_report_is_and_writes_every_table(e2e: Run) -> None:
    assert f"report: {e2e.out / 'report.html'}" in e2e.stdout
    tables = {p.name for p in (e2e.out / "tables").iterdir()}
    assert tables == {
        "lines", "partitions", "throughput_per_minute", "latency", "processing_time",
        "delivery_attempts", "outcomes", "failure_reasons", "consumers", "lag_now",
        "lag_over_time", "top_keys",
        "payload_sizes", "throughput_by_group_per_minute", "throughput_by_consumer_per_minute",
        "tasks", "periodic",
    }  # fmt: skip
    for table in tables:
        assert list((e2e.out / "tables" / table).glob("part-*.parquet")), table


def test_stderr_has_the_progress_and_no_spark_logging(e2e: Run) -> None:
    # Not a terminal: each step is a line of its own.
    for step in ("parsing message segments and delivery events", "charts"):
        assert f"  {step}\n" in e2e.stderr
    # The job's log4j configuration holds from the JVM's start: no level notice, no
    # WARN lines from Spark or Hadoop (the only JVM line left is the JDK's own notice of
    # the incubator module Spark loads).
    assert "Setting default log level" not in e2e.stderr
    assert " WARN " not in e2e.stderr, e2e.stderr


def test_the_report_renders_in_chromium(e2e: Run, tmp_path: Path) -> None:
    chromium = need("chromium", "chromium")
    chromedriver = need("chromedriver", "chromium-driver")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in (
        "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}", "--window-size=1200,900",
    ):  # fmt: skip
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(chromedriver), options=options)
    try:
        driver.set_page_load_timeout(60)
        driver.get((e2e.out / "report.html").as_uri())
        assert driver.title == "spoolmq analytics"
        widths = driver.execute_script(
            "return Array.from(document.images).map(i => i.complete ? i.naturalWidth : 0)"
        )
        assert len(widths) == 5 and all(width > 0 for width in widths), widths
        text = driver.find_element("tag name", "body").text
        assert "orders.dlq" in text and "billing" in text and "audit" in text
        height = driver.execute_script("return document.body.scrollHeight")
        driver.set_window_size(1200, min(int(height) + 200, 8000))
        shot = tmp_path / "report.png"  # kept by pytest (tmp_path) for a person to look at
        assert driver.save_screenshot(str(shot))
        assert shot.read_bytes().startswith(b"\x89PNG")
        severe = [entry for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]
        assert severe == []
    finally:
        driver.quit()
