"""A model-based property test of the store: random appends, rolls, retention, compaction,
torn tails and reopenings, checked after every step against a plain-Python model.

The model is the list of every record ever appended to each topic. What the log returns
must always be explainable from it:
- a `delete` topic holds exactly the model's suffix from the log start offset (retention
  removes whole old segments, so what is left is contiguous);
- a `compact` topic holds a subset of the model in offset order in which every key's newest
  record is present (a tombstone only until its grace period is over), and the active
  segment is untouched;
- offsets are never reused: the log end offset is the number of records ever appended.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import hypothesis.strategies as st
from hypothesis import HealthCheck, event, settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from store_helpers import START_MS, segment_files

from spoolmq import Message, Store
from spoolmq.clock import ManualClock

PLAIN = "plain"
COMPACTED = "compacted"
TOMBSTONE_GRACE_MS = 5_000

keys = st.sampled_from(["a", "b", "c", "d"])
values = st.one_of(st.none(), st.integers(0, 1000), st.text(max_size=60))
batches = st.lists(st.tuples(keys, values), min_size=1, max_size=8)


class StoreModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="spoolmq-model-"))
        self.data = self.root / "queue_data"
        self.clock = ManualClock(START_MS)
        self.store = self._open()
        self.store.create_topic(PLAIN, segment_bytes=1024, retention_bytes=2500)
        self.store.create_topic(
            COMPACTED,
            cleanup_policy="compact",
            segment_bytes=1024,
            tombstone_retention_ms=TOMBSTONE_GRACE_MS,
        )
        # offset -> (key, value, timestamp) of every record ever appended
        self.model: dict[str, list[tuple[str, Any, int]]] = {PLAIN: [], COMPACTED: []}
        self.log_start = 0

    def _open(self) -> Store:
        return Store(self.data, clock=self.clock)

    def teardown(self) -> None:
        self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    # -- steps -----------------------------------------------------------------------------

    @rule(topic=st.sampled_from([PLAIN, COMPACTED]), batch=batches)
    def append(self, topic: str, batch: list[tuple[str, Any]]) -> None:
        positions = self.store.append_batch(topic, [Message(v, key=k) for k, v in batch])
        expected_first = len(self.model[topic])
        assert [p.offset for p in positions] == list(
            range(expected_first, expected_first + len(batch))
        )
        self.model[topic] += [(k, v, self.clock.now_ms()) for k, v in batch]

    @rule(ms=st.integers(1, 4_000))
    def time_passes(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def retention(self) -> None:
        result = self.store.enforce_retention(PLAIN)
        event(f"retention deleted segments: {result.deleted_segments > 0}")

    @rule()
    def compaction(self) -> None:
        result = self.store.compact(COMPACTED)
        event(f"compaction removed records: {result.removed_records > 0}")

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self._open()

    @precondition(lambda self: self.model[PLAIN])
    @rule(garbage=st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b))
    def crash_mid_write(self, garbage: bytes) -> None:
        """A crash left part of a batch at the end: recovery cuts it off on reopen."""
        self.store.close()
        active = segment_files(self.data, PLAIN)[-1]
        with open(active, "ab") as segment:
            segment.write(b'{"offset":' + garbage)
        self.store = self._open()
        # Readers never see the torn batch; the writer recovers on its first append, which
        # then starts on a clean line.
        assert self.store.log_end_offset(PLAIN, 0) == len(self.model[PLAIN])
        self.append(PLAIN, [("a", "after the crash")])
        assert [r.topic for r in self.store.recovery_reports] == [PLAIN]
        quarantined = list((self.data / "quarantine" / PLAIN / "0").iterdir())
        assert any(path.read_bytes().endswith(garbage) for path in quarantined)

    # -- what must always hold -------------------------------------------------------------

    @invariant()
    def offsets_are_never_reused(self) -> None:
        for topic, records in self.model.items():
            assert self.store.log_end_offset(topic, 0) == len(records)

    @invariant()
    def plain_topic_is_a_contiguous_suffix(self) -> None:
        start = self.store.log_start_offset(PLAIN, 0)
        assert start >= self.log_start  # the log start only moves forward
        self.log_start = start
        got = [(r.offset, r.key, r.value) for r in self.store.reader(PLAIN, 0)]
        expected = [(o, k, v) for o, (k, v, _) in enumerate(self.model[PLAIN]) if o >= start]
        assert got == expected

    @invariant()
    def compacted_topic_keeps_every_newest_record(self) -> None:
        model = self.model[COMPACTED]
        got = list(self.store.reader(COMPACTED, 0))
        offsets = [r.offset for r in got]
        assert offsets == sorted(set(offsets))
        for record in got:
            key, value, _ = model[record.offset]
            assert (record.key, record.value) == (key, value)
        present = set(offsets)
        newest: dict[str, int] = {}
        for offset, (key, _, _) in enumerate(model):
            newest[key] = offset
        for offset in newest.values():
            _, value, stored_at = model[offset]
            tombstone_expired = (
                value is None and self.clock.now_ms() - stored_at > TOMBSTONE_GRACE_MS
            )
            if not tombstone_expired:
                assert offset in present, f"the newest record of its key, {offset}, is gone"
        bases = self.store.partition_log(COMPACTED, 0).segment_bases()
        if not bases:  # nothing appended yet: no segment file either
            assert model == []
            return
        active = bases[-1]
        assert [o for o in offsets if o >= active] == list(range(active, len(model)))

    @invariant()
    def files_stay_private(self) -> None:
        for directory, _, files in os.walk(self.data / "logs"):
            assert os.stat(directory).st_mode & 0o077 == 0
            for name in files:
                assert os.stat(Path(directory, name)).st_mode & 0o077 == 0


StoreModel.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_store_model = StoreModel.TestCase
