"""`spoolmq bench` on a tiny workload: every figure present, nothing duplicated or missing.

No speed is asserted: figures are recorded in BENCHMARKS.md, never checked by tests.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from spoolmq.bench import count_ids, percentile


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.99) == 99.0
    assert percentile([3.0], 0.999) == 3.0


def test_count_ids_finds_duplicates_and_missing() -> None:
    assert count_ids([0, 1, 1, 3], 5) == {"received": 4, "duplicates": 1, "missing": 2}


def test_tiny_bench_with_redis_comparison(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run installs it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [
            sys.executable,
            "-m",
            "spoolmq",
            "bench",
            "--n",
            "2000",
            "--duration",
            "2",
            "--rate",
            "200",
            "--compare",
            "redis",
            "--json",
            str(out),
        ],
        capture_output=True,
        timeout=240,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    result = orjson.loads(out.read_bytes())
    assert set(result) >= {"parameters", "machine", "spoolmq", "redis", "ratios"}
    assert result["parameters"]["n"] == 2000
    assert result["machine"]["cpus"] >= 1
    produce = result["spoolmq"]["produce"]
    consume = result["spoolmq"]["consume"]
    latency = result["spoolmq"]["latency"]
    for figures in (produce, consume, result["redis"]["produce"], result["redis"]["consume"]):
        assert figures["duplicates"] == 0
        assert figures["missing"] == 0
        assert figures["msgs_per_s"] > 0
    assert consume["completed"] is True
    assert produce["broker_rss_peak_mib"] > 10
    assert produce["bytes_per_message"] > 200  # a 200-byte payload plus the record's fields
    assert latency["messages"] == 400
    assert latency["duplicates"] == 0 and latency["missing"] == 0
    assert 0 < latency["p50_ms"] <= latency["p99_ms"] <= latency["p999_ms"] <= latency["max_ms"]
    assert set(result["ratios"]) == {"produce", "consume"}
    ratio = produce["msgs_per_s"] / result["redis"]["produce"]["msgs_per_s"]
    assert abs(result["ratios"]["produce"] - ratio) < 0.01
