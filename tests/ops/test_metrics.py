"""Prometheus metrics: scrape a live broker started with ``--metrics`` and parse the text
with prometheus-client's own parser."""

from __future__ import annotations

import json
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from spoolmq import Consumer, Publisher, Store
from spoolmq.broker.metrics import Buckets, Snapshot, check_loopback, render
from spoolmq.errors import InvalidArgumentError
from spoolmq.store.state import ParkedRow
from spoolmq.testing import BrokerProcess, wait_until


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample, keyed by name and sorted labels."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: dict[Any, float], name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def stored_lines(data_dir: Path, topic: str) -> dict[tuple[int, int], bytes]:
    """Every stored line of ``topic`` by (partition, offset), straight from the files."""
    lines = {}
    for segment in (data_dir / "logs" / topic).glob("*/*.jsonl"):
        partition = int(segment.parent.name)
        for line in segment.read_bytes().splitlines(keepends=True):
            lines[(partition, json.loads(line)["offset"])] = line
    return lines


def test_a_live_broker_s_metrics(tmp_path: Path, data_dir: Path) -> None:
    started = time.time()
    port = free_port()
    with Store(data_dir) as store:
        store.create_topic("orders", partitions=2)
    with BrokerProcess(
        data_dir, args=["--metrics", f"127.0.0.1:{port}"], log_file=tmp_path / "broker.log"
    ) as broker:
        with Publisher(data=data_dir) as publisher:
            for n in range(30):
                publisher.publish("orders", {"n": n}, partition=n % 2)
            publisher.publish("other", "x" * 100)
        acked_at: set[tuple[int, int]] = set()
        nacked_at: set[tuple[int, int]] = set()
        with Consumer("orders", "billing", data=data_dir, max_deliveries=1) as consumer:
            acked = 0
            while acked < 10:
                message = consumer.receive(timeout=30)
                assert message is not None
                if message.value["n"] == 0:
                    message.nack(reason="bad order")  # one delivery allowed: dead-lettered
                    nacked_at.add((message.partition, message.offset))
                else:
                    message.ack()
                    acked += 1
                    acked_at.add((message.partition, message.offset))

            def settled() -> dict[Any, float] | None:
                samples = scrape(port)
                done = (
                    value(samples, "spoolmq_messages_acked_total", topic="orders") == 10
                    and value(samples, "spoolmq_messages_published_total", topic="orders") == 30
                )
                return (
                    samples
                    if done and value(samples, "spoolmq_dlq_depth_messages", topic="orders") == 1
                    else None
                )

            samples = wait_until(settled, 60, "the ACKs and the dead letter in the metrics")
            assert value(samples, "spoolmq_broker_up") == 1
            assert value(samples, "spoolmq_connected_clients", role="consumer") == 1
            assert value(samples, "spoolmq_connected_clients", role="publisher") == 0

        assert value(samples, "spoolmq_messages_published_total", topic="orders") == 30
        assert value(samples, "spoolmq_messages_published_total", topic="other") == 1
        # The bytes of the stored lines, read here from the segment files (they counted
        # the records without their offset, timestamp and CRC).
        for topic in ("orders", "other"):
            stored = sum(map(len, stored_lines(data_dir, topic).values()))
            assert value(samples, "spoolmq_published_bytes_total", topic=topic) == stored
        assert value(samples, "spoolmq_messages_dead_lettered_total", topic="orders") == 1
        assert value(samples, "spoolmq_messages_nacked_total", topic="orders") == 1
        delivered = value(samples, "spoolmq_messages_delivered_total", topic="orders")
        assert delivered is not None and delivered >= 11
        assert value(samples, "spoolmq_delivered_bytes_total", topic="orders")
        # The settled bytes are those of the stored lines, read here from the segment files.
        lines = stored_lines(data_dir, "orders")
        assert value(samples, "spoolmq_acked_bytes_total", topic="orders") == sum(
            len(lines[at]) for at in acked_at
        )
        nacked_bytes = sum(len(lines[at]) for at in nacked_at)
        assert nacked_bytes > 0
        assert value(samples, "spoolmq_nacked_bytes_total", topic="orders") == nacked_bytes
        assert value(samples, "spoolmq_dead_lettered_bytes_total", topic="orders") == nacked_bytes
        assert value(samples, "spoolmq_expired_bytes_total", topic="orders") == 0
        # Publish -> ACK: one observation per ACKed message, each at most the test's length.
        acks = value(samples, "spoolmq_ack_latency_seconds_count", topic="orders")
        assert acks == 10
        assert value(samples, "spoolmq_ack_latency_seconds_bucket", topic="orders", le="+Inf") == 10
        assert (
            0
            <= value(samples, "spoolmq_ack_latency_seconds_sum", topic="orders")
            <= 10
            * (  # type: ignore[operator]
                time.time() - started
            )
        )
        for partition in ("0", "1"):
            assert (
                value(samples, "spoolmq_log_end_offset", topic="orders", partition=partition) == 15
            )
            assert (
                value(samples, "spoolmq_log_start_offset", topic="orders", partition=partition) == 0
            )
        # The group's committed offsets and lag add up to what it finished: 11 of 30.
        committed = [
            value(
                samples,
                "spoolmq_group_committed_offset",
                group="billing",
                topic="orders",
                partition=p,
            )
            for p in ("0", "1")
        ]
        lags = [
            value(
                samples, "spoolmq_group_lag_messages", group="billing", topic="orders", partition=p
            )
            for p in ("0", "1")
        ]
        assert all(c is not None for c in committed), samples
        assert [c + lag for c, lag in zip(committed, lags, strict=True)] == [15, 15]  # type: ignore[operator]
        # The histograms were observed once per group commit: 31 publishes, acks=all.
        assert value(samples, "spoolmq_group_commit_messages_count") == value(
            samples, "spoolmq_group_commit_messages_bucket", le="+Inf"
        )
        # Dead letters are written by the consumer broker, not a publisher's group commit.
        assert value(samples, "spoolmq_group_commit_messages_sum") == 31
        assert value(samples, "spoolmq_publish_ack_duration_seconds_count") == 31
        assert value(samples, "spoolmq_fsync_duration_seconds_count")

        # A restarted child is counted.
        old = broker.child_pids()["consumer"]
        broker.kill_child("consumer")
        broker.wait_child_replaced("consumer", old, 60)
        restarted = wait_until(
            lambda: (
                value(s := scrape(port), "spoolmq_child_restarts_total", child="consumer") == 1
                and s
            ),
            60,
            "the restart in the metrics",
        )
        assert value(restarted, "spoolmq_child_restarts_total", child="publisher") == 0
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=30)
        assert refused.value.code == 404


def test_render_without_a_broker(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("t")
        store.append("t", 1)
        store.append("t", 2)
        store.state.reset_group("g", {("t", 0): 1})  # type: ignore[dict-item]
        # Two delayed messages of g that the broker parked (rows as its checkpoint writes).
        store.state.checkpoint(
            committed={},
            deliveries=[],
            scheduled=[],
            finished=[],
            parked=[ParkedRow("g", "t", 0, n, 4_000_000_000_000, 0, None) for n in (5, 6)],
        )
    text = render(data_dir, Snapshot()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert value(samples, "spoolmq_broker_up") == 0
    assert value(samples, "spoolmq_log_end_offset", topic="t", partition="0") == 2
    assert value(samples, "spoolmq_group_lag_messages", group="g", topic="t", partition="0") == 1
    parked = value(samples, "spoolmq_group_parked_messages", group="g", topic="t", partition="0")
    assert parked == 2
    assert value(samples, "spoolmq_messages_published_total", topic="t") is None


def test_buckets() -> None:
    buckets = Buckets((1, 10))
    for observed in (0.5, 1, 5, 50):
        buckets.observe(observed)
    buckets.observe(2, times=3)
    assert buckets.figures() == {"bounds": [1, 10], "counts": [2, 4, 1], "sum": 62.5, "count": 7}


def test_metrics_on_ipv6_loopback(tmp_path: Path, data_dir: Path) -> None:
    """``--metrics [::1]:PORT`` serves: the server was IPv4 only ("Address family for
    hostname not supported"), though ::1 passes the loopback check."""
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
            port = int(probe.getsockname()[1])
    except OSError as exc:  # a host (a container) with IPv6 off: nothing to serve on
        pytest.skip(f"no IPv6 loopback here: {exc}")
    log = tmp_path / "broker.log"
    metrics = ["--metrics", f"[::1]:{port}"]
    with BrokerProcess(data_dir, args=metrics, log_level="info", log_file=log):
        with urllib.request.urlopen(f"http://[::1]:{port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        families = {f.name: f for f in text_string_to_metric_families(text)}
        assert families["spoolmq_broker_up"].samples[0].value == 1
        assert f"metrics on http://[::1]:{port}/metrics" in log.read_text()


def test_only_loopback() -> None:
    assert check_loopback(("127.0.0.1", 9464)) == ("127.0.0.1", 9464)
    assert check_loopback(("::1", 9464)) == ("::1", 9464)
    with pytest.raises(InvalidArgumentError, match="loopback"):
        check_loopback(("0.0.0.0", 9464))


def test_metrics_text_for_a_data_dir(broker: BrokerProcess, data_dir: Path) -> None:
    """What ``spoolmq ui`` serves: the live figures over the admin connection."""
    from spoolmq.commands.stats import metrics_text

    with Publisher(data=data_dir) as publisher:
        for n in range(3):
            publisher.publish("seen", n)

    def published() -> dict[Any, float] | None:
        text = metrics_text(data_dir).decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        found = value(samples, "spoolmq_messages_published_total", topic="seen") == 3
        return samples if found else None

    samples = wait_until(published, 60, "3 published in the metrics text")
    assert value(samples, "spoolmq_broker_up") == 1
    assert value(samples, "spoolmq_log_end_offset", topic="seen", partition="0") == 3


def test_the_dlq_depth_leaves_out_purged_dead_letters(data_dir: Path) -> None:
    """`dlq purge` hides dead letters from `dlq list`; the depth gauge still counted
    them, so an alert on it could not be cleared by purging."""
    from spoolmq.operations import purge_dead_letters

    with Store(data_dir) as store:
        store.create_topic("jobs")
        store.create_topic("jobs.dlq")
        for n in range(3):
            store.append("jobs.dlq", {"n": n})

    def depth() -> float | None:
        text = render(data_dir, Snapshot()).decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }
        return value(samples, "spoolmq_dlq_depth_messages", topic="jobs")

    assert depth() == 3
    with Store(data_dir) as store:
        assert purge_dead_letters(store, "jobs", offsets=[(0, 1)]) == 1
    assert depth() == 2


def test_a_damaged_purged_file_costs_the_dlq_gauge_its_purges_not_the_scrape(
    data_dir: Path,
) -> None:
    """purged.json that does not parse made every scrape fail (503, all series lost)."""
    with Store(data_dir) as store:
        store.create_topic("jobs")
        store.create_topic("jobs.dlq")
        for n in range(3):
            store.append("jobs.dlq", {"n": n})
    (data_dir / "logs" / "jobs.dlq" / "purged.json").write_text("{bad")
    text = render(data_dir, Snapshot()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert value(samples, "spoolmq_dlq_depth_messages", topic="jobs") == 3
    assert value(samples, "spoolmq_broker_up") == 0


def test_retention_skips_are_counted_per_topic(data_dir: Path) -> None:
    """The ConsumerBroker's per-topic figures of messages retention deleted before a group
    read them (the skip itself is tested end to end in tests/broker/test_e2e_groups.py)
    become ``spoolmq_messages_skipped_total`` beside the other outcomes."""
    with Store(data_dir) as store:
        store.create_topic("t")
    counts = {"delivered": 5, "acked": 4, "nacked": 0, "dead_lettered": 0, "expired": 0}
    stats = {"consumer": {"by_topic": {"t": {**counts, "skipped": 146}}}}
    text = render(data_dir, Snapshot(stats=stats)).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert value(samples, "spoolmq_messages_skipped_total", topic="t") == 146
    assert value(samples, "spoolmq_messages_acked_total", topic="t") == 4
