"""The bench's reporting: which of repeated runs is kept, and the ratios beside it."""

from __future__ import annotations

from typing import Any

from spoolmq.bench.report import compare_with_empty, median_run, throughput_ratios
from spoolmq.bench.workers import shares


def test_median_run_keeps_the_middle_run_and_every_throughput() -> None:
    runs: list[dict[str, Any]] = [
        {"msgs_per_s": 30.0, "run": "a"},
        {"msgs_per_s": 10.0, "run": "b"},
    ]
    runs.append({"msgs_per_s": 20.0, "run": "c"})
    assert median_run(runs) == {"msgs_per_s": 20.0, "run": "c", "runs_msgs_per_s": [30, 10, 20]}
    assert median_run(runs[:2])["run"] == "b"  # even count: the lower middle, not a mean
    assert median_run(runs[:1])["runs_msgs_per_s"] == [30.0]


def test_throughput_ratios_cover_the_phases_both_systems_ran() -> None:
    spool = {"produce": {"msgs_per_s": 900.0}, "consume": {"msgs_per_s": 100.0}, "latency": {}}
    redis = {"client": {}, "produce": {"msgs_per_s": 1200.0}}
    assert throughput_ratios(spool, redis) == {"produce": 0.75}
    assert throughput_ratios({"consume": {"msgs_per_s": 2}}, {"consume": {"msgs_per_s": 3}}) == {
        "consume": 0.667  # rounded to three decimals
    }


def test_prefilled_figures_get_their_ratios_to_the_empty_store() -> None:
    empty = {
        "produce": {"msgs_per_s": 1000.0, "broker_cpu_us_per_message": 10.0},
        "consume": {"msgs_per_s": 400.0, "broker_cpu_us_per_message": 20.0},
    }
    prefilled: dict[str, Any] = {
        "stored": 5,
        "produce": {"msgs_per_s": 500.0, "broker_cpu_us_per_message": 12.0},
        "consume": {"msgs_per_s": 400.0, "broker_cpu_us_per_message": 25.0},
    }
    compare_with_empty(prefilled, empty)
    assert prefilled["vs_empty"] == {"produce": 0.5, "consume": 1.0}
    assert prefilled["broker_cpu_vs_empty"] == {"produce": 1.2, "consume": 1.25}


def test_shares_split_the_ids_among_the_workers_without_gap_or_overlap() -> None:
    assert shares(7, 2) == [(0, 3), (3, 4)]
    assert shares(5, 1, first=10) == [(10, 5)]
    assert shares(2, 3) == [(0, 0), (0, 0), (0, 2)]  # fewer ids than workers: the last sends all
