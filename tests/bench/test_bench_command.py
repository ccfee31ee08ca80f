"""`spoolmq bench` on a tiny workload: every figure present, nothing duplicated or missing.

No speed is asserted: figures are recorded in BENCHMARKS.md, never checked by tests.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import orjson
import pytest
from bench_run import interrupt_bench, run_bench


def test_tiny_bench_with_redis_comparison(tmp_path: Path) -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run installs it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    out = tmp_path / "bench.json"
    run_bench(
        "--n", "2000", "--duration", "2", "--rate", "200", "--prefill", "3000",
        "--compare", "redis", "--json", str(out),
    )  # fmt: skip
    result = orjson.loads(out.read_bytes())
    assert set(result) >= {"parameters", "machine", "spoolmq", "redis", "ratios"}
    assert result["parameters"]["n"] == 2000
    machine = result["machine"]
    assert machine["cpus"] >= 1
    assert machine["python"].count(".") == 2
    assert len(machine["load_average_start"]) == len(machine["load_average_end"]) == 3
    assert machine["disk_filesystem"] and machine["disk_mount"].startswith("/")
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
    assert 0 < latency["disk_fdatasync_p50_ms"] <= latency["disk_fdatasync_p99_ms"]
    # Another process's CPU time is read in clock ticks of 10 ms: the broker's share of a
    # 2,000-message produce (about 10 ms) can round down to 0, never below.
    assert produce["broker_cpu_us_per_message"] >= 0 and produce["broker_restarts"] == 0
    # Group commit: 2 publishers with frames of 100 and several in flight; at least a frame
    # per commit, at most every message of the phase in one.
    assert 1 <= produce["messages_per_group_commit"] <= 2000
    # As for produce: 2,000 messages consumed take the broker ~5 ms of CPU (2.5 us each),
    # which 10 ms clock ticks can read as 0.
    assert consume["broker_cpu_us_per_message"] >= 0 and consume["broker_rss_peak_mib"] > 10
    prefilled = result["spoolmq"]["prefilled"]
    assert prefilled["stored"] == 3000
    assert prefilled["store_bytes"] > 3000 * 200
    assert prefilled["broker_start_s"] > 0 and prefilled["broker_rss_idle_mib"] > 10
    for phase in ("produce", "consume"):
        figures = prefilled[phase]
        assert figures["messages"] == 2000
        assert figures["duplicates"] == 0 and figures["missing"] == 0
        assert figures["broker_rss_peak_mib"] > 10
        ratio = figures["msgs_per_s"] / result["spoolmq"][phase]["msgs_per_s"]
        assert abs(prefilled["vs_empty"][phase] - ratio) < 0.01
        cpu = figures["broker_cpu_us_per_message"]
        empty_cpu = result["spoolmq"][phase]["broker_cpu_us_per_message"]
        if empty_cpu == 0:  # 10 ms clock ticks: a short phase's CPU can read 0
            assert prefilled["broker_cpu_vs_empty"][phase] is None
        else:
            assert abs(prefilled["broker_cpu_vs_empty"][phase] - cpu / empty_cpu) < 0.01
    assert prefilled["consume"]["completed"] is True
    assert result["redis"]["produce"]["server_rss_peak_mib"] > 1
    assert result["redis"]["client"]["hiredis_parser"] is True
    assert set(result["ratios"]) == {"produce", "consume", "consume_after_first"}
    ratio = produce["msgs_per_s"] / result["redis"]["produce"]["msgs_per_s"]
    assert abs(result["ratios"]["produce"] - ratio) < 0.01
    # The consume rate without the consumers' start: from their first count to the last.
    for figures in (consume, result["redis"]["consume"]):
        assert 0 < figures["first_received_s"] < figures["seconds"]
        assert figures["msgs_per_s_after_first"] > 0
    ratio = consume["msgs_per_s_after_first"] / result["redis"]["consume"]["msgs_per_s_after_first"]
    assert abs(result["ratios"]["consume_after_first"] - ratio) < 0.01


def test_without_redis_server_it_says_how_to_install_it_and_runs_spoolmq_alone(
    tmp_path: Path,
) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    out = tmp_path / "bench.json"
    completed = run_bench(
        "--n", "500", "--phases", "produce", "--repeat", "2", "--compare", "redis",
        "--json", str(out),
        env={**os.environ, "PATH": str(empty)},  # no redis-server to be found
    )  # fmt: skip
    assert b"apt-get install redis-server" in completed.stderr
    result = orjson.loads(out.read_bytes())
    assert "redis" not in result and "ratios" not in result
    produce = result["spoolmq"]["produce"]
    assert produce["missing"] == 0 and produce["duplicates"] == 0
    assert len(produce["runs_msgs_per_s"]) == 2
    assert produce["msgs_per_s"] == min(produce["runs_msgs_per_s"])  # lower middle of two


@pytest.mark.parametrize(
    ("signum", "wait_for"), [(signal.SIGINT, "redis-server"), (signal.SIGTERM, "spoolmq broker")]
)
def test_interrupted_bench_stops_what_it_started_and_removes_its_files(
    tmp_path: Path, signum: int, wait_for: str
) -> None:
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is missing in CI: .ci/run installs it")
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    interrupt_bench(
        ["--n", "300000", "--phases", "consume", "--compare", "redis"], tmp_path, signum, [wait_for]
    )
