"""An fdatasync that fails in the PublisherBroker's sync thread fails every frame it
covered and every frame written after it and not yet synced: none is answered "stored",
none stays readable, and the partition goes on from where the failed data began."""

from __future__ import annotations

import contextlib
import errno
import threading
from collections.abc import Callable, Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from test_child_loop import pipes_for_test, step_until

from spoolmq import Store, protocol
from spoolmq.broker.publisher_broker import PublisherBroker
from spoolmq.broker.sync_thread import SyncThread


def frame(number: int, values: list[Any]) -> dict[str, Any]:
    records = [
        {"key": None, "value": v, "headers": [], "sequence": number * 10 + i, "producer_id": "p"}
        for i, v in enumerate(values)
    ]
    return {"op": "publish", "id": number, "producer_id": "p", "topic": "t", "records": records}


class FailingSync:
    """fdatasync whose first call waits for ``release``, then fails with EIO."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()
        self.calls = 0

    def __call__(self, fd: int) -> None:
        self.calls += 1
        if self.calls == 1:
            self.entered.set()
            assert self.release.wait(30)
            raise OSError(errno.EIO, "Input/output error")


def answers(publisher: PublisherBroker, client: Connection, count: int) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []

    def arrived() -> bool:
        while client.poll(0):
            found.append(protocol.decode(client.recv_bytes()))
        return len(found) >= count

    step_until(publisher, arrived, f"{count} answers")
    return found


@contextlib.contextmanager
def publisher_syncing_with(
    data_dir: Path, sync: Callable[[int], None]
) -> Iterator[tuple[PublisherBroker, Connection]]:
    """A PublisherBroker on topic ``t`` whose syncs call ``sync``, and a client of it."""
    with Store(data_dir) as store:
        store.create_topic("t")
    with pipes_for_test() as (manager, channels):
        publisher = PublisherBroker(data_dir, channels)
        publisher.start()
        assert publisher._sync is not None
        publisher._sync.close()
        publisher._sync = SyncThread(sync=sync)
        client = manager.hand_over("p1-1")
        publisher.loop(0.5)  # the client is registered
        yield publisher, client


def test_a_failed_sync_fails_its_frames_and_the_unsynced_ones_after_it(data_dir: Path) -> None:
    failing = FailingSync()
    with publisher_syncing_with(data_dir, failing) as (publisher, client):
        publisher.sync_inline = False  # the first sync blocks: it must be the thread's
        protocol.send(client, frame(1, ["a", "b", "c"]))
        step_until(publisher, failing.entered.is_set, "the first sync")
        # Written while the first batch's sync is under way: after it in the file.
        protocol.send(client, frame(2, ["d", "e"]))
        step_until(publisher, lambda: len(publisher._unsynced) == 2, "the second commit")
        failing.release.set()
        first, second = answers(publisher, client, 2)
        assert (first["id"], second["id"]) == (1, 2)
        for answer, count in ((first, 3), (second, 2)):
            assert answer["op"] == "published" and answer["r"] == []
            assert sorted(answer["errors"]) == [str(i) for i in range(count)]
            assert {e["code"] for e in answer["errors"].values()} == {"storage"}
            assert all("Input/output error" in e["message"] for e in answer["errors"].values())
        # Nothing of either is readable; the partition goes on at offset 0, and a retry
        # of a failed frame is stored (it was never stored before).
        protocol.send(client, frame(1, ["a", "b", "c"]))
        [third] = answers(publisher, client, 1)
        assert third["r"] == [[0, 0, third["r"][0][2], 3]] and "errors" not in third
        protocol.send(client, {"op": "bye"})
        step_until(publisher, lambda: not publisher.clients, "the bye")
        publisher.close()
    with Store(data_dir) as store:
        assert [(r.offset, r.value) for r in store.reader("t", 0)] == [(0, "a"), (1, "b"), (2, "c")]


def test_a_lone_frame_is_synced_in_the_loop_and_a_failure_there_fails_it_too(
    data_dir: Path,
) -> None:
    synced_in: list[str] = []

    def failing_once(fd: int) -> None:
        synced_in.append(threading.current_thread().name)
        if len(synced_in) == 1:
            raise OSError(errno.EIO, "Input/output error")

    with publisher_syncing_with(data_dir, failing_once) as (publisher, client):
        protocol.send(client, frame(1, ["a", "b"]))
        [failed] = answers(publisher, client, 1)
        assert failed["r"] == [] and sorted(failed["errors"]) == ["0", "1"]
        assert {e["code"] for e in failed["errors"].values()} == {"storage"}
        protocol.send(client, frame(2, ["c"]))
        [stored] = answers(publisher, client, 1)
        assert stored["r"][0][:2] == [0, 0] and "errors" not in stored  # from offset 0 again
        # Nothing else was syncing and nothing else was there to read: both syncs ran in
        # the loop's own thread, not the sync thread.
        assert synced_in == [threading.current_thread().name] * 2
        protocol.send(client, {"op": "bye"})
        step_until(publisher, lambda: not publisher.clients, "the bye")
        publisher.close()
    with Store(data_dir) as store:
        assert [(r.offset, r.value) for r in store.reader("t", 0)] == [(0, "c")]
