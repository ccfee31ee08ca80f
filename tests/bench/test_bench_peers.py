"""`spoolmq bench` with the NATS JetStream and RabbitMQ peers started for real by the bench, with
several latency rates and with partitions: every figure present, nothing duplicated or missing,
and bad values of the new flags refused with one line.

No speed is asserted: figures are recorded in BENCHMARKS.md, never checked by tests.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from bench_run import interrupt_bench, run_bench

RABBITMQ_SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"


def _need(program: str, found: bool) -> None:
    """Skip without the server, except in CI, which installs it (.ci/run)."""
    if not found:
        if os.environ.get("CI"):
            pytest.fail(f"{program} is missing in CI: .ci/run installs it")
        pytest.skip(f"{program} is not installed (apt-get install {program})")


def need_nats() -> None:
    _need("nats-server", shutil.which("nats-server") is not None)


def need_rabbitmq() -> None:
    _need(
        "rabbitmq-server",
        Path(RABBITMQ_SERVER).exists() or shutil.which("rabbitmq-server") is not None,
    )


def bench_json(tmp_path: Path, *args: str) -> dict[str, Any]:
    """`spoolmq bench ARGS --json FILE` run as a user does; the JSON it wrote."""
    out = tmp_path / "bench.json"
    run_bench(*args, "--json", str(out))
    result: dict[str, Any] = orjson.loads(out.read_bytes())
    return result


def _check_peer(result: dict[str, Any], peer: str, n: int) -> None:
    """The peer's produce and consume figures are whole, and its ratios are spoolmq's
    throughput over its own."""
    for phase in ("produce", "consume"):
        figures = result[peer][phase]
        assert figures["messages"] == n
        assert figures["duplicates"] == 0 and figures["missing"] == 0, figures
        assert figures["msgs_per_s"] > 0
        assert figures["server_rss_peak_mib"] > 1
        assert figures["server_cpu_us_per_message"] >= 0
        ratio = result["spoolmq"][phase]["msgs_per_s"] / figures["msgs_per_s"]
        assert abs(result["ratios_by_peer"][peer][phase] - ratio) < 0.01
    assert result[peer]["consume"]["completed"] is True
    assert result[peer]["produce"]["publishers_cpu_us_per_message"] > 0
    assert result[peer]["consume"]["consumers_cpu_us_per_message"] > 0
    assert set(result["ratios_by_peer"][peer]) == {"produce", "consume", "consume_after_first"}
    consume = result[peer]["consume"]
    assert 0 < consume["first_received_s"] < consume["seconds"]
    ratio = (
        result["spoolmq"]["consume"]["msgs_per_s_after_first"] / consume["msgs_per_s_after_first"]
    )
    assert abs(result["ratios_by_peer"][peer]["consume_after_first"] - ratio) < 0.01
    assert result["durability"][peer]
    assert "fdatasync" in result["durability"]["spoolmq"]


def test_nats_jetstream_peer(tmp_path: Path) -> None:
    need_nats()
    result = bench_json(tmp_path, "--n", "2000", "--phases", "produce,consume", "--compare", "nats")
    _check_peer(result, "nats", 2000)
    assert result["nats"]["client"]["server"].startswith("nats-server")
    assert "sync_interval" in result["durability"]["nats"]
    assert "ratios" not in result  # the ratios against Redis only when Redis ran
    assert set(result["ratios_by_peer"]) == {"nats"}


@pytest.mark.slow  # two RabbitMQ nodes start, ~8 s each on this machine: ~35 s in all
def test_rabbitmq_peer_beside_redis_and_nats(tmp_path: Path) -> None:
    need_nats()
    need_rabbitmq()
    _need("redis-server", shutil.which("redis-server") is not None)
    result = bench_json(
        tmp_path, "--n", "2000", "--phases", "produce,consume", "--compare", "redis,nats,rabbitmq"
    )
    for peer in ("redis", "nats", "rabbitmq"):
        _check_peer(result, peer, 2000)
    assert result["rabbitmq"]["client"]["pika"]
    assert "quorum" in result["durability"]["rabbitmq"]
    # `ratios` stays spoolmq against Redis, as before the other peers.
    assert result["ratios"] == result["ratios_by_peer"]["redis"]
    assert set(result["ratios_by_peer"]) == {"redis", "nats", "rabbitmq"}


def test_rabbitmq_peer_produce(tmp_path: Path) -> None:
    """The quicker RabbitMQ check every run makes: one node, the produce phase."""
    need_rabbitmq()
    result = bench_json(tmp_path, "--n", "2000", "--phases", "produce", "--compare", "rabbitmq")
    produce = result["rabbitmq"]["produce"]
    assert produce["messages"] == 2000
    assert produce["duplicates"] == 0 and produce["missing"] == 0
    assert produce["msgs_per_s"] > 0 and produce["server_rss_peak_mib"] > 1
    assert set(result["ratios_by_peer"]["rabbitmq"]) == {"produce"}


def test_latency_at_several_rates_and_partitions(tmp_path: Path) -> None:
    result = bench_json(
        tmp_path, "--phases", "produce,latency", "--n", "3000", "--rate", "100,400",
        "--duration", "1", "--partitions", "3",
    )  # fmt: skip
    assert result["parameters"]["rate"] == [100, 400]
    assert result["parameters"]["partitions"] == 3
    spool = result["spoolmq"]
    by_rate = spool["latency_by_rate"]
    assert set(by_rate) == {"100", "400"}
    assert spool["latency"] == by_rate["100"]  # the first rate's figures stay where they were
    for rate, figures in by_rate.items():
        assert figures["offered_per_s"] == int(rate)
        assert figures["messages"] == int(rate)  # one second at that rate
        assert figures["duplicates"] == 0 and figures["missing"] == 0
        assert 0 < figures["p50_ms"] <= figures["p99_ms"] <= figures["p999_ms"]
        assert figures["p999_ms"] <= figures["max_ms"]
        assert figures["achieved_per_s"] > 0
        assert figures["broker_cpu_us_per_message"] > 0
        assert figures["publisher_cpu_us_per_message"] > 0
        assert figures["consumer_cpu_us_per_message"] > 0
    produce = spool["produce"]
    assert produce["duplicates"] == 0 and produce["missing"] == 0
    # No keys: the publishers spread the messages over all 3 partitions.
    assert len(produce["messages_per_partition"]) == 3
    assert sum(produce["messages_per_partition"]) == 3000
    assert all(count > 0 for count in produce["messages_per_partition"])


@pytest.mark.parametrize(
    ("flags", "says"),
    [
        (["--rate", "0"], "--rate must be at least 1"),
        (["--rate", "2000,fast"], "--rate takes whole numbers"),
        (["--rate", "2000,2000"], "--rate names a rate twice"),
        (["--compare", "redis,kafka"], "unknown peer(s) kafka"),
        (["--partitions", "0"], "--partitions must be at least 1"),
    ],
)
def test_bad_values_of_the_new_flags_are_refused_in_one_line(
    tmp_path: Path, flags: list[str], says: str
) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "spoolmq", "bench", "--n", "100", *flags],
        capture_output=True,
        timeout=60,
        check=False,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    assert completed.returncode != 0
    lines = completed.stderr.decode().strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("spoolmq: ") and says in lines[0]
    assert list(tmp_path.iterdir()) == []  # refused before anything was started


def test_interrupted_bench_stops_the_rabbitmq_node_and_its_epmd(tmp_path: Path) -> None:
    need_rabbitmq()
    # Under pytest's private temporary directory the node's directory goes to the node
    # user's home (when the bench is root): it must be gone afterwards too.
    homes = [Path("/var/lib/rabbitmq")] if os.geteuid() == 0 else []
    before = {p for home in homes for p in home.glob("spoolmq-bench-rabbitmq-*")}
    # spoolmq's produce phase first (short), then the node is interrupted while it boots.
    interrupt_bench(
        ["--n", "5000", "--phases", "produce", "--compare", "rabbitmq"],
        tmp_path,
        signal.SIGTERM,
        ["beam.smp", "epmd"],
    )
    assert {p for home in homes for p in home.glob("spoolmq-bench-rabbitmq-*")} <= before
