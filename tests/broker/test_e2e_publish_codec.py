"""The Publisher client and a real broker agree on the publish frame, whatever the producer
id and options hold."""

from __future__ import annotations

from pathlib import Path

from spoolmq import Publisher, Store
from spoolmq.testing import BrokerProcess


def test_a_producer_id_with_quotes_and_backslashes_publishes(
    broker: BrokerProcess, data_dir: Path
) -> None:
    producer_id = 'we"ird\\id'
    # A short delivery timeout: a frame the broker cannot parse is resent until it runs out.
    with Publisher(data=data_dir, producer_id=producer_id, delivery_timeout=20) as publisher:
        first = publisher.publish("odd", {"n": 1}, key=b"\x00k", headers={"h": b"\xff"})
        second = publisher.publish("odd", {"n": 2}, tags=["vip"], ttl=600)
    assert (first.partition, first.offset, second.offset) == (0, 0, 1)
    with Store(data_dir) as store:
        records = list(store.reader("odd", 0))
    assert [r.value for r in records] == [{"n": 1}, {"n": 2}]
    assert [(r.producer_id, r.sequence) for r in records] == [(producer_id, 0), (producer_id, 1)]
    assert (records[0].key, records[0].headers) == (b"\x00k", [("h", b"\xff")])
    assert records[1].tags == ("vip",)
    # The broker fixes expires_at from its clock as it takes the frame, just before the
    # record's timestamp.
    expires_at = records[1].expires_at
    assert expires_at is not None and 590_000 <= expires_at - records[1].timestamp <= 600_000
