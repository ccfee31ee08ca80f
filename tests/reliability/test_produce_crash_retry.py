"""Idempotence across a crash, through the producer ranges the PublisherBroker rebuilds from
the log: a publish stored and answered, then the PublisherBroker SIGKILLed before it saved
the publish's runs to state.db; the retry, sent to another partition, is answered as a
duplicate at its first copy's offset, and a partly stored frame is stored only in part."""

from __future__ import annotations

import os
import sqlite3
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from spoolmq import Store, protocol
from spoolmq.testing import BrokerProcess

TOPIC = "retried"
READ_BACK = f"{TOPIC}/0: 5 producer sequence(s) read back"


def publisher(data_dir: Path) -> Connection:
    key = (data_dir / protocol.AUTHKEY_FILE).read_bytes()
    conn = Client(str(data_dir / protocol.SOCKET_FILE), family="AF_UNIX", authkey=key)
    hello = {"op": "hello", "version": protocol.PROTOCOL_VERSION, "role": "publisher"}
    protocol.send(conn, {**hello, "pid": os.getpid()})
    assert protocol.receive(conn)["op"] == "welcome"
    return conn


def publish(
    conn: Connection, producer_id: str, sequences: range, partition: int | None
) -> dict[str, Any]:
    records = [
        {"key": None, "value": {"n": s}, "headers": [], "sequence": s, "producer_id": producer_id}
        for s in sequences
    ]
    frame = {
        "op": "publish",
        "id": sequences[0],
        "producer_id": producer_id,
        "topic": TOPIC,
        "partition": partition,
        "records": records,
    }
    protocol.send(conn, frame)
    answer = protocol.receive(conn)
    assert answer["op"] == "published", answer
    return answer


def saved_runs(data_dir: Path, producer_id: str) -> int:
    with sqlite3.connect(data_dir / "state.db") as db:
        row = db.execute(
            "SELECT COUNT(*) FROM producer_runs WHERE producer_id = ?", (producer_id,)
        ).fetchone()
    return int(row[0])


def stored(data_dir: Path, partition: int) -> list[tuple[int, str | None, int | None]]:
    with Store(data_dir) as store:
        return [(r.offset, r.producer_id, r.sequence) for r in store.reader(TOPIC, partition)]


def test_a_retry_after_a_crash_is_found_on_another_partition(
    data_dir: Path, tmp_path: Path
) -> None:
    with Store(data_dir) as store:
        store.create_topic(TOPIC, partitions=2)
    broker = BrokerProcess(data_dir, log_file=tmp_path / "broker.log", log_level="info")
    broker.start()
    try:
        # The broker saves runs half a second after storing them: kill it before that.
        # Should this machine be too slow to kill it in time, try again with a new producer.
        log = tmp_path / "broker.log"
        for attempt in range(10):
            producer_id = f"p-crash-{attempt}"
            conn = publisher(data_dir)
            first = publish(conn, producer_id, range(0, 5), partition=0)
            read_back = log.read_text().count(READ_BACK)
            old = broker.kill_child("publisher")
            conn.close()
            broker.wait_child_replaced("publisher", old)
            # The new PublisherBroker found this publish in the log, not in state.db.
            if log.read_text().count(READ_BACK) > read_back:
                assert saved_runs(data_dir, producer_id) == 1  # saved once read back
                break
        else:
            raise AssertionError("the broker saved the runs before every kill")
        assert first["r"] == [[0, first["r"][0][1], first["r"][0][2], 5]]
        offset, timestamp = first["r"][0][1], first["r"][0][2]
        conn = publisher(data_dir)
        # The retry goes to partition 1: only the rebuilt ranges know where its copy is.
        retry = publish(conn, producer_id, range(0, 5), partition=1)
        assert retry["r"] == [[0, offset, timestamp, 5, 1]]
        assert "errors" not in retry
        # A frame of which the first half was stored: only the second half is new.
        partly = publish(conn, producer_id, range(0, 10), partition=1)
        assert partly["r"][0] == [0, offset, timestamp, 5, 1]
        assert [entry[0] for entry in partly["r"][1:]] == [1]
        assert partly["r"][1][3] == 5
        conn.close()
    finally:
        broker.stop()
    mine = [(o, s) for o, p, s in stored(data_dir, 0) if p == producer_id]
    assert mine == [(offset + i, i) for i in range(5)]
    assert [s for _, p, s in stored(data_dir, 1) if p == producer_id] == [5, 6, 7, 8, 9]
