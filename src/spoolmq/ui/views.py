"""What the console's pages show, read from the data directory (and the running broker).

Plain blocking functions: the application runs each one in a worker thread, so that a
slow disk or a long scan never holds up the event loop serving other requests. Every
input arrives here already checked (:mod:`spoolmq.ui.inputs`); each function opens its own
:class:`Store` because a request's thread is not the one that opened any other.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from spoolmq import operations
from spoolmq.broker.manager import broker_running
from spoolmq.broker.metrics import Snapshot
from spoolmq.broker.metrics import render as render_metrics
from spoolmq.browse import BrowseCounts, Start, browse, json_shown
from spoolmq.client import Admin
from spoolmq.errors import CorruptRecordError, SpoolError, TopicDeletedError, UnknownTopicError
from spoolmq.store import Record, Store
from spoolmq.store.names import dlq_topic, partition_dir
from spoolmq.types import TopicPartition
from spoolmq.ui.inputs import Search


def message(record: Record, partition: int) -> dict[str, Any]:
    return {
        "partition": partition,
        "offset": record.offset,
        "timestamp": record.timestamp,
        "key": json_shown(record.key),
        "value": json_shown(record.value),
        "headers": [[name, json_shown(value)] for name, value in record.headers],
        "tags": list(record.tags),
        "deliver_at": record.deliver_at,
        "expires_at": record.expires_at,
    }


# -- the broker -----------------------------------------------------------------------------


def _uptime_s(pid: int) -> float | None:
    """Seconds since process ``pid`` started (Linux /proc), None where that is unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rsplit(b")", 1)[1].split()
        with open("/proc/uptime", "rb") as uptime:
            boot_uptime = float(uptime.read().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of stat, after pid/comm
    return round(boot_uptime - started, 1)


def broker(data: Path) -> dict[str, Any]:
    """The broker's processes, restarts, uptime and counters; ``running`` False (and the
    pages show what is on disk) when none holds the data directory."""
    if not broker_running(data):
        return {"running": False}
    try:
        with Admin(data) as admin:
            stats = admin.stats()
    except SpoolError as exc:  # it stopped between the two looks
        return {"running": False, "error": str(exc)}
    stats.pop("op", None)
    stats.pop("id", None)
    processes = [{"role": "manager", "pid": stats["pid"], "uptime_s": _uptime_s(stats["pid"])}]
    for role, pid in stats.get("pids", {}).items():
        processes.append(
            {
                "role": role,
                "pid": pid,
                "uptime_s": _uptime_s(pid) if pid else None,
                "restarts": stats.get("restarts", {}).get(role, 0),
            }
        )
    return {"running": True, "processes": processes, "stats": stats}


def metrics(data: Path) -> bytes:
    """Prometheus' text format for ``GET /metrics`` (:mod:`spoolmq.broker.metrics`, the
    same figures ``spoolmq broker --metrics`` serves): the store's, plus the broker's
    counters and live groups when one runs."""
    snapshot = Snapshot()
    if broker_running(data):
        try:
            with Admin(data) as admin:
                snapshot = Snapshot(admin.stats(), admin.describe_groups())
        except SpoolError:
            pass  # it stopped between the two looks: the files alone
    return render_metrics(data, snapshot)


# -- topics ---------------------------------------------------------------------------------


def _size(directory: Path) -> int:
    try:
        return sum(entry.stat().st_size for entry in os.scandir(directory) if entry.is_file())
    except FileNotFoundError:
        return 0


def topics(data: Path) -> list[dict[str, Any]]:
    with Store(data) as store:
        found = []
        for name, config in sorted(store.topics().items()):
            partitions = []
            for p in range(config.partitions):
                partitions.append(
                    {
                        "partition": p,
                        "log_start_offset": store.log_start_offset(name, p),
                        "log_end_offset": store.log_end_offset(name, p),
                        "bytes": _size(partition_dir(data, TopicPartition(name, p))),
                    }
                )
            found.append(
                {
                    "name": name,
                    **config.as_dict(),
                    "messages": sum(
                        p["log_end_offset"] - p["log_start_offset"] for p in partitions
                    ),
                    "bytes": sum(p["bytes"] for p in partitions),
                    "partitions": partitions,
                }
            )
    return found


def existing(store: Store, topic: str, partition: int) -> None:
    """UnknownTopicError unless ``topic`` exists and has ``partition``."""
    config = store.topic_config(topic)  # UnknownTopicError for a topic that is not there
    if partition >= config.partitions:
        raise UnknownTopicError(
            f"topic {topic!r} has {config.partitions} partition(s); no partition {partition}"
        )


def page(
    data: Path,
    topic: str,
    partition: int,
    *,
    offset: int | None,
    timestamp: int | None,
    limit: int,
    backwards: bool,
) -> dict[str, Any]:
    """One page of a partition: ``limit`` messages from ``offset`` (or the first at or after
    ``timestamp``; else the newest page), or the ``limit`` before ``offset`` going back."""
    with Store(data) as store:
        existing(store, topic, partition)
        first = store.log_start_offset(topic, partition)
        end = store.log_end_offset(topic, partition)
        if timestamp is not None:
            offset = store.offset_for_timestamp(topic, partition, timestamp)
        if offset is None:
            offset, backwards = end, True
        offset = min(max(offset, first), end)
        until = None
        if backwards:  # the page that ends just before ``offset``
            until, offset = offset, max(first, offset - limit)
        found = browse(
            store,
            topic,
            partitions=[partition],
            start=Start("offset", offset),
            until=until,
            limit=limit,
        )
        messages = [message(f.record, partition) for f in found]
    return {
        "topic": topic,
        "partition": partition,
        "log_start_offset": first,
        "log_end_offset": end,
        "offset": offset,
        "messages": messages,
    }


def search(data: Path, topic: str, query: Search) -> Iterator[dict[str, Any]]:
    """Stream the messages of ``topic`` that match ``query`` as ``{"match": ...}`` items,
    then one ``{"done": ...}`` with the counts. :func:`spoolmq.browse.browse` reads (the
    same search as ``spoolmq read``): at most ``query.max_scan`` records, so a search of a
    big topic has a bound the user sets and sees (``bounded``: it stopped there)."""
    counts = BrowseCounts()
    with Store(data) as store:
        partitions = None if query.partition is None else [query.partition]
        if query.partition is not None:
            existing(store, topic, query.partition)
        for found in browse(
            store,
            topic,
            partitions=partitions,
            start=query.start,
            filters=query.filters,
            limit=query.max_results,
            scan_limit=query.max_scan,
            counts=counts,
        ):
            yield {"match": message(found.record, found.partition)}
        # A topic deleted during the scan leaves its readers at the end of what they had
        # open, with no error: the scan stopped short, and must not say it is whole.
        try:
            store.current_topic_config(topic)
        except UnknownTopicError:
            raise TopicDeletedError(
                f"topic {topic!r} was deleted during the search, after {counts.scanned} "
                "message(s) scanned: the rest could not be searched"
            ) from None
    bounded = counts.truncated or counts.matched >= query.max_results
    yield {"done": True, "scanned": counts.scanned, "matches": counts.matched, "bounded": bounded}


# -- groups, scheduled and in-flight -----------------------------------------------------------


def groups(data: Path) -> dict[str, Any]:
    """Per group its partitions' committed offset, log end, lag, in-flight, parked and consumers,
    and, while a broker runs, its members as the broker sees them (consumer id, kind, pid,
    name, last seen, in flight, and a Kafka member's host: what ``groups describe
    --members`` shows)."""
    rows = operations.group_rows(data)
    try:
        members = operations.members_by_group(data)
    except SpoolError:
        members = {}  # it stopped meanwhile: the rows from state.db are what there is
    result = {}
    for name, partitions in sorted(rows.items()):
        result[name] = {
            "lag": sum(r["lag"] for r in partitions),
            "in_flight": sum(r["in_flight"] for r in partitions),
            "parked": sum(r["parked"] for r in partitions),
            "consumers": [
                {
                    "id": m["consumer"],
                    "kind": m["kind"],
                    "pid": m.get("pid"),
                    "name": m.get("name"),
                    "last_seen": m.get("last_seen"),
                    "in_flight": m.get("in_flight"),
                    **({"host": m["host"]} if m["kind"] == "kafka" else {}),
                }
                for m in sorted(members.get(name, []), key=lambda m: str(m["consumer"]))
            ],
            "partitions": partitions,
        }
    return result


def pending(data: Path, *, limit: int = 500) -> dict[str, Any]:
    """Retries waiting for their time (``scheduled``, and ``parked`` rows that failed
    before) and deliveries in flight, as the
    ConsumerBroker last checkpointed them to ``state.db``, and delayed messages (a
    ``deliver_at`` still ahead, not cancelled) among the newest ``limit`` records of each
    partition; a partition where a damaged record stops that reading is listed in
    ``damaged``."""
    now = int(time.time() * 1000)
    with Store(data) as store:
        # A retry with a backoff over 5 s is parked (a ``parked`` row with its attempts).
        # A delivery row with no lease is a message back from its consumer (lost, or its
        # lease expired) waiting for the next one: due now, unless a retry is scheduled.
        retries = store.state.query(
            "SELECT group_name, topic, partition, offset, due_at, attempt, reason "
            "FROM scheduled UNION ALL "
            "SELECT group_name, topic, partition, offset, due_at, attempt, reason "
            "FROM parked WHERE attempt > 0 UNION ALL "
            "SELECT d.group_name, d.topic, d.partition, d.offset, 0, d.attempt, NULL "
            "FROM deliveries d LEFT JOIN scheduled s "
            "USING (group_name, topic, partition, offset) "
            "WHERE d.lease_expires_at = 0 AND s.due_at IS NULL ORDER BY 5 LIMIT ?",
            (limit,),
        )
        deliveries = store.state.query(
            "SELECT group_name, topic, partition, offset, consumer_id, attempt, delivered_at, "
            "lease_expires_at FROM deliveries WHERE lease_expires_at > 0 "
            "ORDER BY delivered_at LIMIT ?",
            (limit,),
        )
        cancels = store.state.cancels()  # a cancelled message waits for nothing
        delayed: list[dict[str, Any]] = []
        damaged = []
        for name, config in sorted(store.topics().items()):
            for p in range(config.partitions):
                try:
                    _delayed(store, name, p, now, limit, cancels, delayed)
                except CorruptRecordError as exc:
                    # One damaged record hides that partition's delayed messages past it,
                    # not everything else: the answer says which partition and why.
                    damaged.append({"topic": name, "partition": p, "error": str(exc)})
    keys = ("group", "topic", "partition", "offset")
    return {
        "checkpointed": True,
        "scheduled": [
            dict(zip((*keys, "due_at", "attempt", "reason"), r, strict=True)) for r in retries
        ],
        "in_flight": [
            dict(
                zip(
                    (*keys, "consumer", "attempt", "delivered_at", "lease_expires_at"),
                    r,
                    strict=True,
                )
            )
            for r in deliveries
        ],
        "delayed": delayed[:limit],
        "damaged": damaged,
    }


def _delayed(
    store: Store,
    topic: str,
    partition: int,
    now: int,
    limit: int,
    cancels: dict[TopicPartition, dict[int, str | None]],
    found: list[dict[str, Any]],
) -> None:
    """Add to ``found`` the messages among the newest ``limit`` of the partition whose
    ``deliver_at`` is still ahead and that are not cancelled."""
    cancelled = cancels.get(TopicPartition(topic, partition), {})
    end = store.log_end_offset(topic, partition)
    start = max(store.log_start_offset(topic, partition), end - limit)
    with store.reader(topic, partition, offset=start) as reader:
        for record in reader:
            if (
                record.deliver_at is not None
                and record.deliver_at > now
                and record.offset not in cancelled
            ):
                found.append({"topic": topic, **message(record, partition)})


# -- dead letters -----------------------------------------------------------------------------


def dead_letters(data: Path, topic: str, query: Search | None = None) -> dict[str, Any]:
    with Store(data) as store:
        # UnknownTopicError unless the topic or its DLQ exists: a deleted topic's dead
        # letters stay in its DLQ, which `spoolmq dlq` still reaches, and so does this.
        letters = operations.dead_letters(store, topic)
    rows = []
    for d in letters:
        if query is not None and not query.filters.matches(d.record):
            continue
        rows.append(
            {
                "dlq_partition": d.dlq_partition,
                "dlq_offset": d.dlq_offset,
                "origin": {
                    "topic": d.topic,
                    "partition": d.partition,
                    "offset": d.offset,
                },
                "group": d.group,
                "attempts": d.attempts,
                "reason": d.reason,
                "message": message(d.record, d.dlq_partition),
            }
        )
    return {"topic": topic, "dlq_topic": dlq_topic(topic), "dead_letters": rows}
