"""Idempotent publishing as ranges: where each producer's recent sequences were stored.

A Publisher numbers its messages 0, 1, 2, ... and a frame usually carries a run of
consecutive numbers that the broker stores at consecutive offsets of one partition. So the
PublisherBroker keeps, per producer, its highest sequence seen and a bounded, sorted list of
runs (``spoolmq.store.state.RunRow``: first sequence, count, topic, partition, first
offset, timestamp): a frame whose
numbers are all above the highest is new (one comparison per frame), and a retry is looked
up by bisection, on whichever partition its first copy went to.

The runs reach ``state.db`` in batches after the answers went out (:meth:`unsaved`), never
between the ``fdatasync`` and the answer; after a crash, the PublisherBroker reads each
partition's log from the end of what was saved (``producer_marks``) and adds what it finds
there (records carry their producer id and sequence), so nothing stored is forgotten.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable
from typing import NamedTuple

from spoolmq.store.state import RunRow


class StoredAt(NamedTuple):
    """Where one sequence's first copy is."""

    topic: str
    partition: int
    offset: int
    timestamp: int


class _Producer:
    __slots__ = ("firsts", "last", "runs")

    def __init__(self) -> None:
        self.last = -1  # the highest sequence stored
        self.firsts: list[int] = []  # runs[i].first_sequence, for bisect
        self.runs: list[RunRow] = []


class ProducerRanges:
    """Every producer's recent runs, in memory. Not thread-safe: the broker loop owns it.

    ``keep`` bounds what is remembered: runs whose sequences are all more than ``keep``
    below the producer's highest are forgotten (a client only ever resends its in-flight
    window, a few thousand messages at most), as ``state.db`` prunes them.
    """

    def __init__(self, *, keep: int = 100_000) -> None:
        self.keep = keep
        self._producers: dict[str, _Producer] = {}
        self._unsaved: list[RunRow] = []

    def last(self, producer_id: str) -> int:
        """The highest sequence stored for ``producer_id``, -1 if none."""
        producer = self._producers.get(producer_id)
        return -1 if producer is None else producer.last

    def find(self, producer_id: str, sequence: int) -> StoredAt | None:
        """Where ``sequence`` of ``producer_id`` was stored, or None."""
        producer = self._producers.get(producer_id)
        if producer is None or sequence > producer.last:
            return None
        i = bisect.bisect_right(producer.firsts, sequence) - 1
        if i < 0:
            return None
        run = producer.runs[i]
        delta = sequence - run.first_sequence
        if delta >= run.size:
            return None
        return StoredAt(run.topic, run.partition, run.first_offset + delta, run.timestamp)

    def add(self, run: RunRow, *, saved: bool = False) -> None:
        """Remember ``run`` (which no known run overlaps); ``saved`` when it comes from
        ``state.db``, so it is not written back."""
        producer_id = run.producer_id
        producer = self._producers.get(producer_id)
        if producer is None:
            producer = self._producers[producer_id] = _Producer()
        runs, firsts = producer.runs, producer.firsts
        end = run.first_sequence + run.size - 1
        if not runs or run.first_sequence > firsts[-1]:
            previous = runs[-1] if runs else None
            if (
                previous is not None
                and previous.first_sequence + previous.size == run.first_sequence
                and previous.topic == run.topic
                and previous.partition == run.partition
                and previous.first_offset + previous.size == run.first_offset
                and previous.timestamp == run.timestamp
            ):
                # The same run goes on (records read back one by one, or frames stored
                # back to back): one run, saved as one row (its key is its first sequence).
                merged = runs[-1] = previous._replace(size=previous.size + run.size)
                unsaved = self._unsaved
                if not saved and unsaved and unsaved[-1] == previous:
                    unsaved[-1] = merged
                    saved = True  # already queued
                run = merged
            else:
                runs.append(run)
                firsts.append(run.first_sequence)
        else:
            i = bisect.bisect_right(firsts, run.first_sequence)
            runs.insert(i, run)
            firsts.insert(i, run.first_sequence)
        if end > producer.last:
            producer.last = end
        if not saved:
            self._unsaved.append(run)
        if (
            len(runs) > 64
            and runs[0].first_sequence + runs[0].size - 1 < producer.last - 2 * self.keep
        ):
            self._forget_old(producer)

    def _forget_old(self, producer: _Producer) -> None:
        floor = producer.last - self.keep
        cut = 0
        while cut < len(producer.runs) and (
            producer.runs[cut].first_sequence + producer.runs[cut].size - 1 < floor
        ):
            cut += 1
        del producer.runs[:cut]
        del producer.firsts[:cut]

    def unsaved(self) -> list[RunRow]:
        """The runs added since the last call (``state.db`` must get them), oldest first."""
        runs, self._unsaved = self._unsaved, []
        return runs

    def unsaved_count(self) -> int:
        return len(self._unsaved)

    def requeue(self, runs: list[RunRow]) -> None:
        """Runs ``unsaved`` gave whose save failed: they go first in the next one."""
        self._unsaved[:0] = runs

    def add_all(self, rows: Iterable[RunRow]) -> None:
        """Add runs read back from ``state.db``."""
        for run in rows:
            if self.find(run.producer_id, run.first_sequence) is None:
                self.add(run, saved=True)

    def drop_topic(self, topic: str) -> None:
        """Forget every run stored in ``topic`` (it was deleted): a retry of one of their
        sequences must never be answered with an offset of the deleted log. A producer's
        highest sequence stays, so its next sequences are still checked in order; a retry
        of a forgotten one is stored anew."""
        for producer in self._producers.values():
            kept = [run for run in producer.runs if run.topic != topic]
            if len(kept) != len(producer.runs):
                producer.runs = kept
                producer.firsts = [run.first_sequence for run in kept]
        self._unsaved = [run for run in self._unsaved if run.topic != topic]

    def __len__(self) -> int:
        return sum(len(p.runs) for p in self._producers.values())
