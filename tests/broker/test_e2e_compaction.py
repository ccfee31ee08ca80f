"""A topic created with ``cleanup_policy="compact"`` is compacted by the running broker, on
the timer that enforces retention: nobody has to run ``Store.compact`` by hand."""

from __future__ import annotations

from pathlib import Path

from spoolmq import Publisher, Store
from spoolmq.store.record import decode_line
from spoolmq.testing import BrokerProcess, wait_until


def closed_segment_offsets(data_dir: Path, topic: str) -> tuple[list[int], int]:
    """The offsets of the records in the closed segments of partition 0, read from the
    files; and the base offset of the active segment.

    The running broker deletes and replaces segments while this reads them: a segment
    listed and then gone means the listing is stale, so it is taken again."""
    for _attempt in range(100):
        with Store(data_dir) as store:
            partition_log = store.partition_log(topic, 0)
            *closed, active = partition_log.segment_bases()
            try:
                offsets = [
                    decode_line(line).offset
                    for base in closed
                    for line in partition_log.segment_path(base)
                    .read_bytes()
                    .splitlines(keepends=True)
                ]
            except FileNotFoundError:
                continue
        return offsets, active
    raise AssertionError(f"the segments of {topic} kept changing under 100 listings")


def test_a_running_broker_compacts_a_compacted_topic(broker: BrokerProcess, data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("prices", cleanup_policy="compact", segment_bytes=1024)
    newest: dict[str, int] = {}
    with Publisher(data=data_dir) as publisher:
        # A key written once, early: its only record must survive in a closed segment.
        newest["once"] = publisher.publish("prices", {"v": 0}, key="once").offset
        for n in range(120):
            key = f"item-{n % 4}"
            newest[key] = publisher.publish("prices", {"n": n, "pad": "x" * 60}, key=key).offset
    offsets, active = closed_segment_offsets(data_dir, "prices")
    assert active > 60 and len(offsets) == active, "the records were not spread over segments"
    expected = sorted(offset for offset in newest.values() if offset < active)
    wait_until(
        lambda: closed_segment_offsets(data_dir, "prices") == (expected, active),
        120,  # at once, or within 30 s when a small change came after a compaction
        "closed segments holding only the newest record per key",
    )
    # What a reader sees: the newest value of every key, nothing stale before it.
    with Store(data_dir) as store:
        seen = {record.key: record.offset for record in store.reader("prices", 0)}
        assert seen == newest
        assert len(list(store.reader("prices", 0))) == len(expected) + (121 - active)


def test_topics_alter_takes_effect_in_a_running_broker(
    broker: BrokerProcess, data_dir: Path
) -> None:
    """`spoolmq topics alter` writes state.db from its own process; the broker's store
    kept the settings it had read (retention took effect only after a restart)."""
    from spoolmq.testing import run_spoolmq

    with Store(data_dir) as store:
        store.create_topic("aged", segment_bytes=1024)
    with Publisher(data=data_dir) as publisher:
        for n in range(100):  # a batch at a time: a segment rolls between batches
            publisher.publish("aged", {"n": n, "pad": "y" * 60})
    closed, active = closed_segment_offsets(data_dir, "aged")
    assert active > 50 and len(closed) == active
    altered = run_spoolmq("topics", "alter", "aged", "--retention", "1s", "--data", str(data_dir))
    assert altered.returncode == 0, altered.stderr
    assert altered.stdout.startswith("topic aged now keeps messages 1s (delete)")
    # Retention runs every 5 s; every closed segment is older than 1 s by then.
    wait_until(
        lambda: closed_segment_offsets(data_dir, "aged")[0] == [], 60, "the closed segments to go"
    )
    with Store(data_dir) as store:
        assert store.log_start_offset("aged", 0) == active
