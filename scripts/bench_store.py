"""Benchmark of the durable log store (issue 2): append, read, seek, open.

    uv run python scripts/bench_store.py                 # everything, 10M-record store in /tmp
    uv run python scripts/bench_store.py --big 1000000   # a smaller seek/open store

Figures are printed as a Markdown table for BENCHMARKS.md. The big store is written to a
temporary directory under /tmp and deleted afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from spoolmq import Message, Store
from spoolmq.stats import percentile
from spoolmq.store.record import EncodedMessage, encode_message

TOPIC = "bench"
BATCH = 1000


def value_for(i: int) -> dict[str, object]:
    # With offset, timestamp, key, headers and crc this makes a line of about 200 bytes.
    return {"order_id": i, "customer": f"customer-{i % 997:04d}", "amount": 12.5, "note": "x" * 62}


def line_size(directory: Path) -> float:
    first = sorted((directory / "logs" / TOPIC / "0").glob("*.jsonl"))[0]
    data = first.read_bytes()
    return len(data) / max(data.count(b"\n"), 1)


def bench_append(directory: Path, count: int, *, encoded: bool) -> float:
    with Store(directory) as store:
        store.create_topic(TOPIC, partitions=1)
        if encoded:
            bodies = [
                encode_message(Message(value_for(i), key=f"k{i % 1000}")) for i in range(BATCH)
            ]
            started = time.perf_counter()
            for _ in range(count // BATCH):
                store.append_encoded(TOPIC, 0, bodies, "all")
        else:
            started = time.perf_counter()
            for start in range(0, count, BATCH):
                batch = [
                    Message(value_for(i), key=f"k{i % 1000}", partition=0)
                    for i in range(start, start + BATCH)
                ]
                store.append_batch(TOPIC, batch, acks="all")
        elapsed = time.perf_counter() - started
    return count / elapsed


def bench_read(directory: Path, count: int, *, records: bool) -> float:
    with Store(directory) as store:
        reader = store.reader(TOPIC, 0)
        seen = 0
        started = time.perf_counter()
        if records:
            while batch := reader.poll_batch(BATCH):
                seen += len(batch)
        else:
            while entries := reader.read_entries(BATCH):
                seen += len(entries)
        elapsed = time.perf_counter() - started
    assert seen == count, (seen, count)
    return count / elapsed


def build_big(directory: Path, count: int) -> None:
    with Store(directory) as store:
        store.create_topic(TOPIC, partitions=1)
        template = encode_message(Message(value_for(0), key="k")).body
        bodies = [EncodedMessage(template)] * BATCH
        for _ in range(count // BATCH):
            store.append_encoded(TOPIC, 0, bodies, "1")
        store.flush()


def percentiles(samples: list[float]) -> tuple[float, float]:
    return percentile(samples, 0.5), percentile(samples, 0.99)


def bench_seeks(directory: Path, count: int, tries: int) -> dict[str, tuple[float, float]]:
    rng = random.Random(7)
    with Store(directory) as store:
        reader = store.reader(TOPIC, 0)
        first = reader.poll()
        reader.seek_to_end()
        assert first is not None
        last_ts = store.reader(TOPIC, 0, offset=count - 1).poll().timestamp  # type: ignore[union-attr]
        by_offset, by_time, by_time_read = [], [], []
        for _ in range(tries):
            target = rng.randrange(count)
            started = time.perf_counter()
            reader.seek(target)
            record = reader.poll()
            by_offset.append(time.perf_counter() - started)
            assert record is not None and record.offset == target
        for _ in range(tries):
            stamp = rng.randrange(first.timestamp, last_ts + 1)
            started = time.perf_counter()
            offset = store.offset_for_timestamp(TOPIC, 0, stamp)
            by_time.append(time.perf_counter() - started)
            started = time.perf_counter()
            reader.seek_to_timestamp(stamp)
            record = reader.poll()
            by_time_read.append(time.perf_counter() - started)
            assert record is not None and record.offset == offset and record.timestamp >= stamp
    return {
        "seek by offset + first poll": percentiles(by_offset),
        "offset for timestamp": percentiles(by_time),
        "seek by timestamp + first poll": percentiles(by_time_read),
    }


OPEN_PROBE = """
import json, resource, sys, time
started = time.perf_counter()
from spoolmq import Store
imported = time.perf_counter()
store = Store(sys.argv[1])
end = store.log_end_offset("bench", 0)
store.append("bench", {"probe": True}, partition=0)   # opens the tail: recovery scan
reader = store.reader("bench", 0, offset=end)
record = reader.poll()
opened = time.perf_counter()
print(json.dumps({"open_s": opened - imported, "import_s": imported - started, "end": end,
                  "probe_offset": record.offset,
                  "rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def bench_open(directory: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", OPEN_PROBE, str(directory)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return json.loads(out)  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="append/read records")
    parser.add_argument("--big", type=int, default=10_000_000, help="records in the seek store")
    parser.add_argument("--seeks", type=int, default=2000, help="random seeks of each kind")
    parser.add_argument("--tmp", default="/tmp", help="where the temporary stores go")
    args = parser.parse_args()

    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}")
    rows: list[tuple[str, str]] = []
    with tempfile.TemporaryDirectory(dir=args.tmp, prefix="spoolmq-bench-") as tmp:
        root = Path(tmp)
        for encoded in (False, True):
            directory = root / ("encoded" if encoded else "messages")
            rate = bench_append(directory, args.records, encoded=encoded)
            path = "append_encoded (pre-encoded)" if encoded else "append_batch (Message objects)"
            rows.append(
                (
                    f"append {args.records:,}, batches of {BATCH}, acks=all, {path}",
                    f"{rate:,.0f} records/s",
                )
            )
            print(rows[-1], flush=True)
        directory = root / "messages"
        rows.append(("average record line", f"{line_size(directory):.0f} bytes"))
        for records in (False, True):
            rate = bench_read(directory, args.records, records=records)
            what = "poll_batch -> Record" if records else "read_entries -> (fields, line)"
            rows.append((f"read {args.records:,} back, {what}", f"{rate:,.0f} records/s"))
            print(rows[-1], flush=True)
        shutil.rmtree(root / "encoded")

        small = root / "small"
        build_big(small, 100_000)
        big = root / "big"
        started = time.perf_counter()
        build_big(big, args.big)
        build_s = time.perf_counter() - started
        size = sum(p.stat().st_size for p in big.rglob("*") if p.is_file())
        segments = len(list(big.rglob("*.jsonl")))
        rows.append(
            (
                f"build {args.big:,}-record partition (acks=1)",
                f"{build_s:.1f} s, {size / 2**30:.2f} GiB, {segments} segments",
            )
        )
        print(rows[-1], flush=True)
        for name, (p50, p99) in bench_seeks(big, args.big, args.seeks).items():
            rows.append(
                (
                    f"{name}, {args.big:,} records, {args.seeks} random",
                    f"p50 {p50 * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms",
                )
            )
            print(rows[-1], flush=True)
        for label, directory in (("100,000", small), (f"{args.big:,}", big)):
            figures = bench_open(directory)
            assert figures["probe_offset"] == figures["end"]
            rows.append(
                (
                    f"open a {label}-record store (new process) + tail recovery + read",
                    f"{figures['open_s'] * 1e3:.0f} ms, max RSS {figures['rss_mib']:.0f} MiB",
                )
            )
            print(rows[-1], flush=True)

    print("\n| measurement | result |\n|---|---|")
    for name, result in rows:
        print(f"| {name} | {result} |")


if __name__ == "__main__":
    main()
