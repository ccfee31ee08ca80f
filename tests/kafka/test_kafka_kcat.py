"""kcat (librdkafka's command-line client) against the Kafka front: -L, -P, -C."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from kafka_helpers import kafka_broker

from spoolmq import Store

pytestmark = pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat is not installed")


def _kcat(*args: str, stdin: str | None = None) -> str:
    done = subprocess.run(["kcat", *args], input=stdin, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kcat_lists_produces_and_consumes(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    with Store(data) as store:
        store.create_topic("orders", partitions=3)
    with kafka_broker(data) as (_, address):
        listing = json.loads(_kcat("-b", address, "-L", "-J"))
        orders = next(t for t in listing["topics"] if t["topic"] == "orders")
        assert len(orders["partitions"]) == 3
        assert [b["id"] for b in listing["brokers"]] == [0]

        lines = [f"order-{i}" for i in range(20)]
        _kcat("-b", address, "-P", "-t", "orders", "-p", "1", stdin="\n".join(lines) + "\n")
        _kcat("-b", address, "-P", "-t", "orders", "-K", ":", stdin='cust-1:{"n":1}\n')

        out = _kcat("-b", address, "-C", "-t", "orders", "-p", "1", "-e", "-f", "%o %s\n")
        # (librdkafka's own partitioner may put the keyed record on partition 1 too.)
        assert out.splitlines()[:20] == [f"{i} order-{i}" for i in range(20)]
        keyed = _kcat("-b", address, "-C", "-t", "orders", "-e", "-f", "%k=%s\n")
        assert 'cust-1={"n":1}' in keyed.splitlines()
    # What kcat produced is in the store: JSON as data, other text as bytes.
    with Store(data) as store:
        values = [r.value for p in range(3) for r in store.reader("orders", p).poll_batch(100)]
    assert {"n": 1} in values and b"order-0" in values
