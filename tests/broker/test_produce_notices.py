"""The PublisherBroker's notice to the ConsumerBroker (the lead's interfaces.md §1): after
a batch is synced, ``a`` says how far each partition grew, and ``b`` where the batch's
lines are, its offsets, timestamp, keys and the extras of the records that have them."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import orjson
from test_child_loop import pipes_for_test, step_until

from spoolmq import Store, protocol
from spoolmq.broker.publisher_broker import PublisherBroker
from spoolmq.store.record import check_line


def test_a_notice_describes_each_synced_batch(data_dir: Path) -> None:
    with Store(data_dir) as store:
        store.create_topic("t", partitions=1)
    notices_read, notices_write = multiprocessing.Pipe(duplex=False)
    with pipes_for_test() as (manager, channels):
        publisher = PublisherBroker(data_dir, channels)
        publisher.start()
        publisher.notices = notices_write
        client = manager.hand_over("p1-1")
        publisher.loop(0.5)
        records: list[dict[str, Any]] = [
            {"key": None, "value": 1, "headers": []},
            {"key": "k", "value": 2, "headers": []},
            {"key_b64": "AAE=", "value": 3, "headers": [["h", "v"]], "tags": ["vip"]},
            {"key": None, "value": 4, "headers": [], "delay_ms": 1000, "ttl_ms": 5000},
        ]
        protocol.send(client, {"op": "publish", "id": 1, "topic": "t", "records": records})
        step_until(publisher, lambda: client.poll(0), "the answer")
        answer = protocol.decode(client.recv_bytes())
        assert notices_read.poll(10)
        notice = orjson.loads(notices_read.recv_bytes())
        publisher.close()
    [[_, first, timestamp, count]] = answer["r"]
    assert (first, count) == (0, 4)
    assert notice["op"] == "appended" and "a" not in notice
    [entry] = notice["b"]
    topic, partition, segment_base, position, length, offset, n, stamp, keys, extra = entry
    assert (topic, partition, segment_base, position, offset, n, stamp) == (
        "t",
        0,
        0,
        0,
        0,
        4,
        timestamp,
    )
    assert keys == [None, "s:k", "b:AAE=", None]
    # The delay and the ttl are fixed by the broker's clock as it took the frame, which
    # may be a millisecond before the batch's timestamp.
    deliver_at, expires_at, tags, has_headers = extra.pop("3")
    assert timestamp + 1000 - 100 <= deliver_at <= timestamp + 1000
    assert (expires_at - deliver_at, tags, has_headers) == (5000, None, False)
    assert extra == {"2": [None, None, ["vip"], True]}
    segment = data_dir / "logs" / "t" / "0" / f"{0:020d}.jsonl"
    with open(segment, "rb") as handle:
        data = os.pread(handle.fileno(), length, position)
    lines = data.splitlines(keepends=True)
    assert [check_line(line)["offset"] for line in lines] == [0, 1, 2, 3]
