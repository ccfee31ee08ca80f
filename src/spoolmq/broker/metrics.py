"""Prometheus metrics: the broker's figures in the text exposition format, read at scrape
time.

Nothing here runs per message. The children already count what they do per frame and per
batch (``PublisherBroker.figures``, ``ConsumerBroker.figures``) and send those figures to
the manager every second; histograms are kept the same way, one ``observe`` per group
commit, per sync and per answered commit (:class:`Buckets`). A scrape asks for a
:class:`Snapshot` (the manager's ``stats`` and the live group view), reads log offsets from
the store's files, and turns both into metric families with a custom collector, so the
values are at most a second old and the hot path pays nothing for them.

``spoolmq broker --metrics 127.0.0.1:9464`` serves ``GET /metrics`` from a small HTTP
thread in the manager (:class:`MetricsServer`, loopback by default); ``spoolmq ui`` calls
:func:`render` with a snapshot it got over the admin connection.
"""

from __future__ import annotations

import bisect
import contextlib
import ipaddress
import logging
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from spoolmq.broker.dead_letter import dlq_depth
from spoolmq.broker.group_view import add_parked, partition_rows
from spoolmq.config import address_family
from spoolmq.errors import CorruptRecordError, InvalidArgumentError, SpoolError
from spoolmq.store import Store
from spoolmq.store.names import DLQ_SUFFIX, dlq_topic

logger = logging.getLogger("spoolmq.metrics")

# Histogram bucket bounds: messages per group commit, and seconds for a sync or for a
# publish frame from read to answer (fsync-bound: from 100 µs on a fast disk up).
COMMIT_SIZE_BOUNDS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000)
SECONDS_BOUNDS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
# Seconds from a record's storing to its ACK: immediate work, backlogs, delays of hours.
ACK_LATENCY_BOUNDS = (
    *SECONDS_BOUNDS[SECONDS_BOUNDS.index(0.001) :],
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
    900.0,
    3600.0,
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Buckets:
    """A histogram as plain counts, cheap enough for a loop: ``observe`` is one bisect and
    three additions. The figures travel to the manager as JSON (:meth:`figures`)."""

    __slots__ = ("bounds", "count", "counts", "total")

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last: above every bound
        self.total = 0.0
        self.count = 0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total += value * times
        self.count += times

    def figures(self) -> dict[str, Any]:
        return {
            "bounds": list(self.bounds),
            "counts": list(self.counts),
            "sum": self.total,
            "count": self.count,
        }


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What a scrape reads from a running broker: the admin ``stats`` answer and the live
    groups (``describe_groups``); both None when no broker runs (only the store is read)."""

    stats: Mapping[str, Any] | None = None
    groups: Mapping[str, Any] | None = None


def dlq_depths(store: Store) -> dict[str, int]:
    """Per topic (not itself a DLQ), how many dead letters its ``<topic>.dlq`` holds
    (purged ones not counted, as ``spoolmq dlq list`` does not list them)."""
    topics = store.topics()
    depths = {}
    for name in topics:
        if name.endswith(DLQ_SUFFIX):
            continue
        dlq = dlq_topic(name)
        if dlq not in topics:
            depths[name] = 0
            continue
        try:
            depths[name] = dlq_depth(store, dlq, topics[dlq].partitions)
        except CorruptRecordError as exc:  # a damaged purged.json: every record counts
            logger.warning("%s", exc)
            depths[name] = dlq_depth(store, dlq, topics[dlq].partitions, purged={})
    return depths


def _families(data_dir: Path, snapshot: Snapshot) -> Iterator[Any]:
    from prometheus_client.core import (
        CounterMetricFamily,
        GaugeMetricFamily,
        HistogramMetricFamily,
    )

    stats = snapshot.stats
    up = GaugeMetricFamily("spoolmq_broker_up", "1 when a broker runs on the data directory")
    up.add_metric([], 1 if stats is not None else 0)
    yield up

    # -- from the store: offsets, DLQ depth, committed offsets of groups not held live ----
    log_end = GaugeMetricFamily(
        "spoolmq_log_end_offset",
        "the next offset a partition will store",
        labels=["topic", "partition"],
    )
    log_start = GaugeMetricFamily(
        "spoolmq_log_start_offset",
        "the oldest offset a partition still holds (retention moves it)",
        labels=["topic", "partition"],
    )
    dlq = GaugeMetricFamily(
        "spoolmq_dlq_depth_messages",
        "dead letters in a topic's dead-letter topic (purged ones not counted)",
        labels=["topic"],
    )
    ends: dict[tuple[str, int], int] = {}
    groups: dict[str, list[dict[str, Any]]] = {}
    with Store(data_dir) as store:
        topics = store.topics()
        for name, config in sorted(topics.items()):
            for partition in range(config.partitions):
                end = store.log_end_offset(name, partition)
                start = store.log_start_offset(name, partition)
                ends[(name, partition)] = end
                log_end.add_metric([name, str(partition)], end)
                log_start.add_metric([name, str(partition)], start)
        for name, depth in sorted(dlq_depths(store).items()):
            dlq.add_metric([name], depth)
        live = snapshot.groups or {}
        for name, info in live.items():
            groups[name] = [dict(row) for row in info["partitions"]]  # rows get "parked"
        for name in store.state.groups():
            if name not in groups:
                committed = store.state.committed_offsets(name)
                groups[name] = partition_rows(committed, {tp: ends.get(tp, 0) for tp in committed})
        add_parked(groups, store.state.parked_by_partition())
    yield log_end
    yield log_start
    yield dlq

    group_labels = ["group", "topic", "partition"]
    committed_f = GaugeMetricFamily(
        "spoolmq_group_committed_offset",
        "the offset below which a group has finished every message",
        labels=group_labels,
    )
    lag_f = GaugeMetricFamily(
        "spoolmq_group_lag_messages",
        "messages of a partition a group has not finished (log end - committed)",
        labels=group_labels,
    )
    in_flight_f = GaugeMetricFamily(
        "spoolmq_group_in_flight_messages",
        "messages delivered to a group's consumers and not yet ACKed or NACKed",
        labels=group_labels,
    )
    parked_f = GaugeMetricFamily(
        "spoolmq_group_parked_messages",
        "delayed messages of a group waiting in state.db until they are due (past its "
        "committed offset, so not in its lag), as the broker last saved them",
        labels=group_labels,
    )
    for name in sorted(groups):
        for row in groups[name]:
            labels = [name, row["topic"], str(row["partition"])]
            committed_f.add_metric(labels, row["committed"])
            lag_f.add_metric(labels, row["lag"])
            in_flight_f.add_metric(labels, row["in_flight"])
            parked_f.add_metric(labels, row["parked"])
    yield committed_f
    yield lag_f
    yield in_flight_f
    yield parked_f

    if stats is None:
        return
    # -- from the children's figures (at most a second old) ---------------------------------
    publisher = stats.get("publisher") or {}
    consumer = stats.get("consumer") or {}
    yield _one_label(
        CounterMetricFamily,
        "spoolmq_messages_published",
        "messages stored for publishers",
        "topic",
        publisher.get("by_topic"),
    )
    yield _one_label(
        CounterMetricFamily,
        "spoolmq_published_bytes",
        "bytes of stored records published",
        "topic",
        publisher.get("bytes_by_topic"),
    )
    yield from _per_kind(
        CounterMetricFamily,
        "spoolmq_messages_{}",
        consumer.get("by_topic"),
        (
            ("delivered", "messages handed to consumers (a redelivery counts again)"),
            ("acked", "messages ACKed by consumers"),
            ("nacked", "messages NACKed by consumers"),
            ("dead_lettered", "messages moved to a dead-letter topic"),
            ("expired", "messages dropped because their TTL passed before delivery"),
            ("skipped", "messages deleted by retention before a group read them (per group)"),
        ),
    )
    yield _one_label(
        CounterMetricFamily,
        "spoolmq_delivered_bytes",
        "bytes of records handed to consumers",
        "topic",
        consumer.get("bytes_by_topic"),
    )
    yield from _per_kind(
        CounterMetricFamily,
        "spoolmq_{}_bytes",
        consumer.get("settled_bytes_by_topic"),
        (
            ("acked", "bytes of records ACKed by consumers"),
            ("nacked", "bytes of records NACKed by consumers (each NACK counts)"),
            ("dead_lettered", "bytes of records moved to a dead-letter topic"),
            ("expired", "bytes of records dropped because their TTL passed"),
        ),
    )
    ack_latency = HistogramMetricFamily(
        "spoolmq_ack_latency_seconds",
        "time from a record's storing to its consumer's ACK (per ACKed run: the run's first "
        "record, counted once per message of the run)",
        labels=["topic"],
    )
    for topic, figures in sorted((consumer.get("ack_latency") or {}).items()):
        ack_latency.add_metric([topic], _cumulative(figures), figures["sum"])
    yield ack_latency
    yield _one_label(
        GaugeMetricFamily,
        "spoolmq_connected_clients",
        "clients connected to the broker",
        "role",
        stats.get("clients"),
    )
    yield _one_label(
        CounterMetricFamily,
        "spoolmq_child_restarts",
        "times the manager restarted a broker child",
        "child",
        stats.get("restarts"),
    )

    for key, name, what in (
        ("commit_size", "spoolmq_group_commit_messages", "messages stored per group commit"),
        ("fsync_seconds", "spoolmq_fsync_duration_seconds", "time of one sync of the log"),
        (
            "ack_seconds",
            "spoolmq_publish_ack_duration_seconds",
            "time from reading a publish frame to answering it (write and fsync)",
        ),
    ):
        figures = publisher.get(key)
        histogram = HistogramMetricFamily(name, what)
        if figures:
            histogram.add_metric([], _cumulative(figures), figures["sum"])
        yield histogram


def _per_kind(
    kind: Any,
    name: str,
    by_topic: Mapping[str, Mapping[str, float]] | None,
    kinds: Sequence[tuple[str, str]],
) -> Iterator[Any]:
    """One family per ``(kind, what)`` of ``kinds``, named ``name.format(kind)``, with a
    sample per topic of ``by_topic[topic][kind]`` (a child's per-topic figures)."""
    for figure, what in kinds:
        values = {topic: figures.get(figure, 0) for topic, figures in (by_topic or {}).items()}
        yield _one_label(kind, name.format(figure), what, "topic", values)


def _one_label(
    kind: Any, name: str, what: str, label: str, values: Mapping[str, float] | None
) -> Any:
    """A family with one label, a sample per entry of ``values`` (none yet: no samples)."""
    family = kind(name, what, labels=[label])
    for key, count in sorted((values or {}).items()):
        family.add_metric([key], count)
    return family


def _cumulative(figures: Mapping[str, Any]) -> list[tuple[str, float]]:
    """Prometheus buckets (``le`` and the count at or below it) from :class:`Buckets`
    figures."""
    buckets = []
    running = 0
    for bound, count in zip(figures["bounds"], figures["counts"], strict=False):
        running += count
        buckets.append((repr(float(bound)), running))
    buckets.append(("+Inf", running + figures["counts"][-1]))
    return buckets


class _Collector:
    """A prometheus-client collector that reads everything when scraped."""

    def __init__(self, data_dir: Path, snapshot: Snapshot) -> None:
        self._data_dir = data_dir
        self._snapshot = snapshot

    def collect(self) -> Iterator[Any]:
        yield from _families(self._data_dir, self._snapshot)


def render(data_dir: Path, snapshot: Snapshot) -> bytes:
    """The metrics text of ``data_dir`` (and its broker's ``snapshot``) for ``/metrics``."""
    from prometheus_client import CollectorRegistry, generate_latest

    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Collector(data_dir, snapshot))
    return generate_latest(registry)


def check_loopback(address: tuple[str, int]) -> tuple[str, int]:
    """The metrics endpoint has no login, and anything another host can reach must
    authenticate: so it listens on loopback only (scrape it through an authenticating
    reverse proxy, or run Prometheus' agent on the same host)."""
    host = address[0]
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = host == "localhost"
    if not loopback:
        raise InvalidArgumentError(
            f"metrics are served without a login, so only on a loopback address "
            f"(127.0.0.1, ::1), not {host!r}"
        )
    return address


class _HTTPServer(ThreadingHTTPServer):
    """An HTTP server on an IPv4 or IPv6 address, as ``host`` names (``::1`` too)."""

    daemon_threads = True

    def __init__(self, address: tuple[str, int], handler: type[BaseHTTPRequestHandler]) -> None:
        self.address_family = address_family(address[0])
        super().__init__(address, handler)


class MetricsServer:
    """``GET /metrics`` on a thread of its own: a scrape reads files and asks the consumer
    broker for its groups, which must not hold up the manager's supervision."""

    def __init__(
        self, address: tuple[str, int], data_dir: Path, snapshot: Callable[[], Snapshot]
    ) -> None:
        check_loopback(address)
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404, "only /metrics is served here")
                    return
                try:
                    body = render(owner.data_dir, owner.snapshot())
                except (SpoolError, OSError) as exc:
                    logger.error("a metrics scrape failed: %s", exc)
                    self.send_error(503, "the broker's figures are not available")
                    return
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                return  # one line per scrape would drown the broker's log

        self.data_dir = data_dir
        self.snapshot = snapshot
        self._server = _HTTPServer(address, Handler)
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="spoolmq-metrics", daemon=True
        )

    @property
    def address(self) -> tuple[str, int]:
        host, port = self._server.server_address[:2]
        return str(host), int(port)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            if self._thread.is_alive():  # shutdown() would wait for ever on a server never run
                self._server.shutdown()
            self._server.server_close()
