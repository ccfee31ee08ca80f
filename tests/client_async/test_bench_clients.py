"""``spoolmq bench --client native,asyncio``: both clients run every phase in one run, each
counting its messages exactly; an unknown client is one line and a non-zero exit."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson


def test_bench_runs_each_client_and_compares_them(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    completed = subprocess.run(
        [sys.executable, "-m", "spoolmq", "bench", "--n", "600", "--producers", "1",
         "--consumers", "1", "--rate", "200", "--duration", "1", "--client", "native,asyncio",
         "--json", str(out)],
        capture_output=True, timeout=300, check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr.decode()[-2000:]
    results = orjson.loads(out.read_bytes())
    assert results["parameters"]["client"] == ["native", "asyncio"]
    clients = results["clients"]
    assert set(clients) == {"native", "asyncio"}
    for figures in clients.values():
        for phase in ("produce", "consume"):
            assert figures[phase]["duplicates"] == 0 and figures[phase]["missing"] == 0
            assert figures[phase]["msgs_per_s"] > 0
        assert figures["latency"]["messages"] == 200
        assert figures["latency"]["missing"] == 0
    # The main figures are the first client's.
    assert results["spoolmq"]["latency"] == clients["native"]["latency"]
    assert "asyncio / native" in completed.stdout.decode() + completed.stderr.decode()


def test_unknown_client_is_refused(tmp_path: Path) -> None:
    completed = subprocess.run(
        [sys.executable, "-m", "spoolmq", "bench", "--client", "native,grpc"],
        capture_output=True, timeout=120, check=False,
    )  # fmt: skip
    assert completed.returncode != 0
    error = completed.stderr.decode()
    assert "grpc" in error and "native,asyncio" in error
    assert "Traceback" not in error
