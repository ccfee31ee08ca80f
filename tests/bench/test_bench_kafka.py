"""``spoolmq bench --client kafka`` (and ``kafka-defaults``, its producers without
idempotence): the produce, consume and latency phases through confluent-kafka against the
broker's Kafka listener, every message counted exactly (by id, from the store for produce
and from what the consumer got for consume)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest


@pytest.mark.parametrize("client", ["kafka", "kafka-defaults"])
def test_bench_through_kafka_clients(tmp_path: Path, client: str) -> None:
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "-m", "spoolmq", "bench", "--data", str(tmp_path / "data"),
         "--n", "600", "--producers", "1", "--consumers", "1", "--rate", "200",
         "--duration", "1", "--client", client, "--json", str(out)],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    results = orjson.loads(out.read_bytes())
    assert results["parameters"]["client"] == [client]
    figures = results["spoolmq"]  # the only client's figures are the main ones
    for phase in ("produce", "consume"):
        assert figures[phase]["duplicates"] == 0 and figures[phase]["missing"] == 0
        assert figures[phase]["msgs_per_s"] > 0
    assert figures["produce"]["publishers_cpu_us_per_message"] >= 0
    consume = figures["consume"]  # joining the group is in the phase, and said apart
    assert 0 < consume["first_received_s"] < consume["seconds"]
    assert consume["msgs_per_s_after_first"] > 0
    assert figures["latency"]["messages"] == 200
    assert figures["latency"]["missing"] == 0


def test_kafka_defaults_producers_leave_idempotence_off() -> None:
    """The two Kafka clients differ in the producers' idempotence only."""
    from spoolmq.bench.clients import CLIENTS

    plain, idempotent = CLIENTS["kafka-defaults"], CLIENTS["kafka"]
    for made in (plain.producer, plain.latency_publisher):
        assert made.keywords == {"idempotent": False}  # type: ignore[attr-defined]
    assert plain.consumer is idempotent.consumer
    assert plain.broker_args == idempotent.broker_args
