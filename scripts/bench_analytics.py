"""Benchmark of ``spoolmq analytics`` (issue 4): a cold run over a store of N messages.

    uv run python scripts/bench_analytics.py                       # 1M messages
    uv run python scripts/bench_analytics.py --messages 100000 --messages 1000000
    uv run python scripts/bench_analytics.py --messages 100000 --event-shape old

Builds the store directly in the documented format (docs/FORMAT.md) in a temporary
directory: the segments through the store library (``Store.append_batch``), the delivery
events (a line per frame by default, ``--event-shape old`` a line per message: the same
history) and lag snapshots as JSON lines written with orjson, committed offsets in
``state.db``. Then runs ``python -m spoolmq analytics`` as a new process (a cold JVM) and
reports its wall time and the peak RSS of the driver: the Python process and its JVM,
sampled every 0.1 s. Prints a Markdown table for BENCHMARKS.md; deletes the store.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import psutil

from spoolmq import Message, Store
from spoolmq.store.message import Position

TOPIC = "orders"
GROUP = "billing"
PARTITIONS = 4
BATCH = 1000
FRAME = 50  # messages per dispatched frame (a consumer's prefetch)
CONSUMERS = [f"c{n}-bench#{n}" for n in range(4)]
LAG_EVERY_MS = 5_000


class EventWriter:
    """Writes one group's delivery events in either shape (docs/FORMAT.md): ``new``, one
    ``delivered`` line per dispatched frame and one ``acked`` line per ACK frame (runs of
    offsets, processing times as an array), as brokers since issue 10 write them; ``old``,
    a line per message. Other types are a line per message in both."""

    def __init__(self, shape: str) -> None:
        self.shape = shape
        self.lines: list[dict[str, Any]] = []

    def frame(
        self,
        ts: int,
        kind: str,
        consumer: str,
        messages: list[tuple[Position, int]],
        times: list[float] | None = None,
    ) -> None:
        """A frame of (position, attempt) in that order; ``times`` per message for ACKs."""
        if self.shape == "old":
            for n, (position, attempt) in enumerate(messages):
                line = self._message(ts, kind, consumer, position, attempt)
                if times is not None:
                    line["processing_ms"] = times[n]
                self.lines.append(line)
            return
        runs: list[list[Any]] = []
        for position, attempt in messages:
            head = runs[-1] if runs else None
            if head and (head[1], head[2] + head[3], head[4]) == (
                position.partition,
                position.offset,
                attempt,
            ):
                head[3] += 1
            else:
                runs.append([TOPIC, position.partition, position.offset, 1, attempt])
        line = {"ts": ts, "type": kind, "group": GROUP, "consumer": consumer, "runs": runs}
        if times is not None:
            line["processing_ms"] = times
        self.lines.append(line)

    def one(self, ts: int, kind: str, consumer: str, position: Position, attempt: int,
            **extra: Any) -> None:  # fmt: skip
        self.lines.append({**self._message(ts, kind, consumer, position, attempt), **extra})

    @staticmethod
    def _message(
        ts: int, kind: str, consumer: str, position: Position, attempt: int
    ) -> dict[str, Any]:
        return {
            "ts": ts,
            "type": kind,
            "group": GROUP,
            "topic": TOPIC,
            "partition": position.partition,
            "offset": position.offset,
            "key": None,
            "consumer": consumer,
            "attempt": attempt,
            "published_at": position.timestamp,
            "bytes": 110,
        }


def build_store(
    data: Path, count: int, shape: str = "new", seed: int = 7, start_at: int = 0
) -> dict[str, int]:
    """N messages on 4 partitions with one group's events: ~3 % retried once, ~0.1 %
    dead-lettered after 3 attempts; delivered in frames of up to FRAME messages (sorted by
    partition and offset, so a frame is a run or two) and ACKed in frames, the events
    written in ``shape``. ``start_at`` > 0 adds to a store built before (order ids from
    ``start_at`` on, events in a new file). Returns counts of what was written."""
    rng = random.Random(seed + start_at)
    events_dir = data / "events" / f"date={time.strftime('%Y-%m-%d', time.gmtime())}"
    with Store(data) as store:
        store.create_topic(TOPIC, partitions=PARTITIONS)
        events_dir.mkdir(parents=True, mode=0o700, exist_ok=True)
        out = (events_dir / f"{int(time.time() * 1000)}-{os.getpid()}.jsonl").open("wb")
        written = {"messages": 0, "events": 0, "dead_lettered": 0}
        ends = [store.log_end_offset(TOPIC, p) for p in range(PARTITIONS)]
        next_lag = 0
        for start in range(start_at, start_at + count, BATCH):
            batch = [
                Message(
                    {"order_id": i, "customer": f"customer-{i % 997}", "amount": 12.5, "items": 3},
                    key=f"customer-{i % 997}",
                )
                for i in range(start, min(start_at + count, start + BATCH))
            ]
            positions = store.append_batch(TOPIC, batch, acks="1")
            events = EventWriter(shape)
            ordered = sorted(positions, key=lambda p: (p.partition, p.offset))
            for first in range(0, len(ordered), FRAME):
                chunk = ordered[first : first + FRAME]
                for position in chunk:
                    ends[position.partition] = position.offset + 1
                ts = max(p.timestamp for p in chunk) + rng.randint(0, 20)
                # Each message's attempts: 1 (ACKed), 2 (NACKed, then ACKed) or 3 (NACKed
                # three times, then dead-lettered). Each attempt is a frame.
                going = []
                for position in chunk:
                    roll = rng.random()
                    going.append((position, 3 if roll < 0.001 else 2 if roll < 0.03 else 1))
                for attempt in (1, 2, 3):
                    if not going:
                        break
                    consumer = rng.choice(CONSUMERS)
                    events.frame(ts, "delivered", consumer, [(p, attempt) for p, _ in going])
                    acked: list[tuple[Position, int]] = []
                    times: list[float] = []
                    for position, attempts in going:
                        worked = float(rng.randint(1, 30))
                        if attempts == attempt < 3:
                            acked.append((position, attempt))
                            times.append(worked)
                            continue
                        events.one(ts + int(worked), "nacked", consumer, position, attempt,
                                   processing_ms=worked)  # fmt: skip
                        if attempts == attempt:
                            events.one(ts + int(worked), "dead_lettered", consumer, position,
                                       attempt, reason="bad address")  # fmt: skip
                            written["dead_lettered"] += 1
                    if acked:
                        events.frame(ts + 30, "acked", consumer, acked, times)
                    going = [(p, attempts) for p, attempts in going if attempts > attempt]
                    ts += 230
            if positions and positions[-1].timestamp >= next_lag:
                for partition in range(PARTITIONS):
                    committed = max(0, ends[partition] - rng.randint(0, 500))
                    events.lines.append(
                        {
                            "ts": positions[-1].timestamp,
                            "type": "lag",
                            "group": GROUP,
                            "topic": TOPIC,
                            "partition": partition,
                            "committed": committed,
                            "log_end_offset": ends[partition],
                            "lag": ends[partition] - committed,
                        }
                    )
                next_lag = positions[-1].timestamp + LAG_EVERY_MS
            out.write(b"".join(orjson.dumps(line) + b"\n" for line in events.lines))
            written["messages"] += len(positions)
            written["events"] += len(events.lines)
        out.close()
    db = sqlite3.connect(data / "state.db")
    with db:
        db.executemany(
            "INSERT OR REPLACE INTO group_offsets VALUES (?, ?, ?, ?, ?)",
            [(GROUP, TOPIC, p, ends[p], int(time.time() * 1000)) for p in range(PARTITIONS)],
        )
    db.close()
    return written


def _cpu_seconds(process: psutil.Process) -> float:
    """CPU time (user + system) of the process and its children (the JVM) so far."""
    total = 0.0
    for each in (process, *process.children(recursive=True)):
        try:
            times = each.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def _thread_cpu(pid: int, seen: dict[tuple[int, int], tuple[str, float]]) -> None:
    """Record the CPU seconds so far of each thread of process ``pid`` in ``seen`` (by
    thread id and start time, as ids are reused: a thread that ends keeps its last figure),
    named as the kernel shows it."""
    tick = os.sysconf("SC_CLK_TCK")
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
            name = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            seen[int(tid), int(fields[19])] = (name, (int(fields[11]) + int(fields[12])) / tick)
        except (OSError, ValueError, IndexError):  # gone, or read as it ended
            continue


def thread_kinds(
    seen: dict[tuple[int, int], tuple[str, float]], jvm_cpu: float
) -> list[tuple[str, float]]:
    """CPU seconds by kind of thread (numbers in names dropped: "C2 CompilerThre0" and
    "C1 CompilerThre1" are one kind, "CN CompilerThre"), the largest first, and what the
    samples missed of the JVM's ``jvm_cpu``: threads that lived less than a sample apart,
    and the last part of those that ended between two (the JIT starts and stops compiler
    threads as it goes)."""
    kinds: dict[str, float] = {}
    for name, seconds in seen.values():
        kind = re.sub(r"\d+", "N", name)
        kinds[kind] = kinds.get(kind, 0.0) + seconds
    ranked = sorted(kinds.items(), key=lambda item: -item[1])
    return [*ranked, ("(not seen by a sample)", max(0.0, jvm_cpu - sum(kinds.values())))]


def run_job(data: Path, out: Path, master: str, *, full: bool = False) -> dict[str, Any]:
    """Run the job as a new process: its wall time, CPU time, the driver's peak RSS, and
    wall and CPU time per step (the job names each step on stderr as it starts it; a
    step's figures run to the next step's line), and the JVM's CPU by kind of thread
    (task threads, the JIT's compiler threads, the GC's, the driver's). ``full``:
    ``--full`` (no parse cache)."""
    command = [
        sys.executable,
        "-m",
        "spoolmq",
        "analytics",
        "--data",
        str(data),
        "--out",
        str(out),
        "--master",
        master,
        *(["--full"] if full else []),
    ]
    load_before = os.getloadavg()[0]
    started = time.perf_counter()
    process = psutil.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    marks: list[tuple[str, float, float]] = [("starting Python and the JVM", started, 0.0)]
    output: list[str] = []

    def read() -> None:  # step lines as they come, with the time and CPU so far
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.decode(errors="replace").rstrip()
            output.append(line)
            if line.startswith("  ") and line.strip():
                marks.append((line.strip(), time.perf_counter(), _cpu_seconds(process)))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    peak_total = peak_python = peak_jvm = peak_anonymous = 0
    cpu_seconds: dict[int, float] = {}  # last seen per process: CPU is a figure less
    # disturbed than wall time by other work on a shared machine
    threads: dict[tuple[int, int], tuple[str, float]] = {}  # the JVM's, last seen per thread
    jvm_pids: set[int] = set()
    while process.poll() is None:
        try:
            children = process.children(recursive=True)
            # Memory of the driver's Python and its JVM (its direct child) only: a process
            # the JVM spawns (Hadoop runs ``chmod`` for files it writes) shares the JVM's
            # memory until it execs, and counting it too reported twice the JVM's RSS.
            memory = [each.memory_info() for each in (process, *process.children(recursive=False))]
            python_rss = memory[0].rss
            jvm_rss = sum(m.rss for m in memory[1:])
            # RSS also counts file pages mapped in (Spark maps spilled cache blocks and
            # jars): what is reclaimable; resident minus shared is the memory it holds.
            peak_anonymous = max(peak_anonymous, sum(m.rss - m.shared for m in memory))
            for each in (process, *children):
                times = each.cpu_times()
                cpu_seconds[each.pid] = times.user + times.system
            for jvm in process.children(recursive=False):
                jvm_pids.add(jvm.pid)
                _thread_cpu(jvm.pid, threads)
        except psutil.Error:
            python_rss = jvm_rss = 0
        peak_python = max(peak_python, python_rss)
        peak_jvm = max(peak_jvm, jvm_rss)
        peak_total = max(peak_total, python_rss + jvm_rss)
        time.sleep(0.1)  # sampling another process's memory: nothing to wait on
    wall = time.perf_counter() - started
    reader.join(30)
    if process.returncode != 0:
        text = "\n".join(output)
        raise SystemExit(f"the job failed ({process.returncode}):\n{text[-3000:]}")
    cpu = sum(cpu_seconds.values())
    ends = [*marks[1:], ("end", started + wall, cpu)]
    steps = [
        (name, end_at - at, max(0.0, end_cpu - at_cpu))
        for (name, at, at_cpu), (_, end_at, end_cpu) in zip(marks, ends, strict=True)
    ]
    return {
        "wall_s": wall,
        "cpu_s": cpu,
        "load_1min": (load_before + os.getloadavg()[0]) / 2,
        "rss_total_mib": peak_total / 2**20,
        "anonymous_mib": peak_anonymous / 2**20,
        "rss_python_mib": peak_python / 2**20,
        "rss_jvm_mib": peak_jvm / 2**20,
        "steps": steps,
        "jvm_threads": thread_kinds(threads, sum(cpu_seconds.get(pid, 0.0) for pid in jvm_pids)),
    }


def _figures_of(summary: dict[str, Any]) -> dict[str, Any]:
    """A summary less what differs between runs over the same store."""
    return {k: v for k, v in summary.items() if k not in ("run", "data")}


def grow(
    root: Path, count: int, args: argparse.Namespace, before: dict[str, Any]
) -> list[tuple[str, int, int, dict[str, Any]]]:
    """Add ``args.grow`` % to the store, re-run into the same output, run cold into another;
    the two must agree. Returns their table rows."""
    data = root / "queue_data"
    added = int(count * args.grow / 100)
    written = build_store(data, added, args.event_shape, start_at=count)
    size = sum(p.stat().st_size for p in data.rglob("*.jsonl"))
    rows = []
    for label, out, full in (
        (f"{count:,} + {args.grow:g} %, re-run", root / "analytics_out", False),
        (f"{count:,} + {args.grow:g} %, cold (--full)", root / "analytics_cold", True),
    ):
        figures = run_job(data, out, args.master, full=full)
        summary = orjson.loads((out / "summary.json").read_bytes())
        if summary["topics"][TOPIC]["messages"] != count + added:
            raise SystemExit(f"the job counted {summary['topics'][TOPIC]['messages']}")
        figures["run"] = summary["run"]
        rows.append((label, before["inputs"]["event_lines"] + written["events"], size, figures))
        print(
            label,
            {k: v for k, v in figures.items() if k not in ("steps", "jvm_threads")},
            flush=True,
        )
    re_run, cold = (orjson.loads((root / name / "summary.json").read_bytes())
                    for name in ("analytics_out", "analytics_cold"))  # fmt: skip
    if _figures_of(re_run) != _figures_of(cold):
        raise SystemExit("the re-run's summary.json differs from the cold run's")
    print("the re-run's summary.json figures equal the cold run's", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--messages",
        type=int,
        action="append",
        help="store size; repeat for several (default: 1000000)",
    )
    parser.add_argument("--master", default="local[*]")
    parser.add_argument(
        "--event-shape",
        choices=("old", "new"),
        default="new",
        help="delivery events a line per frame (new, as brokers write since issue 10) or a "
        "line per message (old)",
    )
    parser.add_argument(
        "--grow",
        type=float,
        default=0.0,
        metavar="PERCENT",
        help="then add this many percent more messages (and their events), run the job "
        "again into the same output (incremental), and once more with --full into another "
        "(cold), and check that both give the same figures",
    )
    parser.add_argument("--keep", action="store_true", help="keep the stores (prints where)")
    args = parser.parse_args()
    sizes = args.messages or [1_000_000]
    rows = []
    for count in sizes:
        root = Path(tempfile.mkdtemp(prefix="spoolmq-bench-analytics-"))
        try:
            started = time.perf_counter()
            written = build_store(root / "queue_data", count, args.event_shape)
            built = time.perf_counter() - started
            size = sum(p.stat().st_size for p in (root / "queue_data").rglob("*.jsonl"))
            print(
                f"built {written} ({size / 2**20:.0f} MiB of JSON lines) in {built:.1f} s",
                flush=True,
            )
            figures = run_job(root / "queue_data", root / "analytics_out", args.master)
            summary = orjson.loads((root / "analytics_out" / "summary.json").read_bytes())
            if summary["topics"][TOPIC]["messages"] != count:
                raise SystemExit(f"the job counted {summary['topics'][TOPIC]['messages']}")
            rows.append((f"{count:,}", written["events"], size, figures))
            print(
                {k: v for k, v in figures.items() if k not in ("steps", "jvm_threads")}, flush=True
            )
            if args.grow > 0:
                rows += grow(root, count, args, summary)
        finally:
            if args.keep:
                print(f"kept {root}")
            else:
                shutil.rmtree(root, ignore_errors=True)
    print(
        f"\nmachine: {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
        f"Python {platform.python_version()}, master {args.master}, "
        f"events in the {args.event_shape} shape\n"
    )
    print(
        "| messages | events | JSON lines | wall | CPU | driver peak RSS (Python + JVM) "
        "| of which not file-backed | load average (1 min, start/end mean) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for count, events, size, f in rows:
        print(
            f"| {count} | {events:,} | {size / 2**20:.0f} MiB | {f['wall_s']:.1f} s | "
            f"{f['cpu_s']:.0f} s | "
            f"{f['rss_total_mib']:.0f} MiB ({f['rss_python_mib']:.0f} + "
            f"{f['rss_jvm_mib']:.0f}) | {f['anonymous_mib']:.0f} MiB | {f['load_1min']:.1f} |"
        )
    for count, _, _, f in rows:
        print(f"\nper step, {count} messages (wall s / CPU s, Python + JVM):\n")
        print("| step | wall | CPU |\n|---|---|---|")
        for name, wall, cpu in f["steps"]:
            print(f"| {name} | {wall:.1f} s | {cpu:.1f} s |")
        print(f"\nthe JVM's CPU by thread, {count} messages (sampled every 0.1 s):\n")
        print("| threads | CPU |\n|---|---|")
        for kind, seconds in f["jvm_threads"]:
            if seconds >= 0.5:
                print(f"| {kind} | {seconds:.1f} s |")


if __name__ == "__main__":
    main()
