"""Settled delivery outcomes: what a re-run does not compute again.

A message's delivery outcome for a group (transform.delivery_outcomes) is computed from every
delivery event about it, its record, and the finish of the earlier messages of its key; it
changes as long as events about it can still come. Per (group, topic, partition), the
messages before ``settled_to`` are *settled*: each was finished (ACKed, dead-lettered,
expired or cancelled) with its record read, or its record can no longer come (the log holds
later ones: deleted by retention or compaction, or damaged), and the group had committed
past it. What the outcome tables need of them is kept, as counts that add up
(transform.outcome_counts), with each key's latest finish among them (for ``held_back`` of
the messages after them); a run computes the outcomes of the other messages only, and adds
their counts to the kept ones.

The state is dropped, and every outcome computed again, when it might not hold:

- the parse cache dropped or re-parsed a file (retention, compaction, a rewrite): the kept
  counts could include lines that are gone (the job calls ``clear``);
- delivery events about a settled message appeared (a group reset to an earlier offset
  delivers it again): the state lists the parse cache's event part files it has seen, and
  a run checks the rows of the others (``check``);
- ``--full``, another spoolmq (the parse cache's fingerprint), or a damaged state.

A run with a file's last line half-written (the parse cache's fragments) settles nothing
new: that line's events or record are not for keeping yet.

Every (group, topic, partition) with events in the part files seen has a mark, so a run
reads of those files only the row groups that can hold events at or after a mark (a filter
of literals on the offset that Parquet applies to each row group's statistics), and of the
records only those at or after a partition's lowest mark (all of a partition where a group
without a mark has new events).

Layout under ``<out>/cache/outcomes/``: ``marks.json`` (the version, per group, topic and
partition ``settled_to``, and ``events_parts``: the part files seen), ``counts/`` and
``keys/`` (Parquet). A run writes the next state to ``outcomes.next/`` and swaps it in
whole.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from pathlib import Path

import orjson

from spoolmq.files import start_next_dir, swap_in

STATE_VERSION = 2
Where = tuple[str, str, int]  # group, topic, partition


class SettledOutcomes:
    """The settled outcomes kept in one output directory's cache."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.next = start_next_dir(root)
        self.events_parts: dict[str, list[str]] = {}
        self.marks: dict[Where, int] = self._load()
        self._next_marks: dict[Where, int] | None = None
        self._next_parts: dict[str, list[str]] = {}

    def _load(self) -> dict[Where, int]:
        try:
            data = orjson.loads((self.root / "marks.json").read_bytes())
            if data["version"] != STATE_VERSION:
                raise ValueError("another version")
            marks = {(str(g), str(t), int(p)): int(to) for g, t, p, to in data["marks"]}
            if marks and not all((self.root / name).is_dir() for name in ("counts", "keys")):
                raise ValueError("incomplete")
            self.events_parts = {str(k): list(v) for k, v in data["events_parts"].items()}
            return marks
        except (OSError, ValueError, KeyError, TypeError):
            self.clear()  # none yet, or not whole: start again
            return {}

    @property
    def counts(self) -> Path:
        return self.root / "counts"

    @property
    def keys(self) -> Path:
        return self.root / "keys"

    def holds(self) -> bool:
        """Whether any message is settled."""
        return bool(self.marks)

    def clear(self) -> None:
        """Forget every settled outcome (the next computation starts from none)."""
        shutil.rmtree(self.root, ignore_errors=True)
        self.marks, self.events_parts = {}, {}

    def rows(self) -> list[tuple[str, str, int, int]]:
        """(group, topic, partition, settled_to) per mark."""
        return [(*where, to) for where, to in sorted(self.marks.items())]

    def floors(self) -> dict[tuple[str, int], int]:
        """Per (topic, partition), the lowest mark of any group."""
        floors: dict[tuple[str, int], int] = {}
        for (_, topic, partition), to in self.marks.items():
            floors[topic, partition] = min(to, floors.get((topic, partition), to))
        return floors

    def check(self, events_below: int) -> bool:
        """Whether no new delivery event is about a settled message (``events_below``: how
        many of the rows of the part files not seen yet are before their group's mark);
        if one is, forget the state."""
        if events_below:
            self.clear()
            return False
        return True

    def advance(
        self,
        candidates: Iterable[tuple[Where, int | None, int]],
        committed: dict[Where, int],
        *,
        settle: bool,
    ) -> dict[Where, int]:
        """The next ``settled_to`` per (group, topic, partition), from this run's outcomes:
        ``candidates`` gives, for each one that has any, the first offset that may still
        change (None: none may) and the last offset. A mark never moves past the group's
        committed offset (a message before it may be delivered later: delayed, or held
        back by its key) and never back. ``settle`` False keeps every mark where it is."""
        marks = dict(self.marks)
        if not settle:
            return marks
        for where, open_from, last in candidates:
            limit = last + 1 if open_from is None else open_from
            if where in committed:
                limit = min(limit, committed[where])
            marks[where] = max(marks.get(where, 0), limit)
        return marks

    def prepare(self, settled_to: dict[Where, int], events_parts: dict[str, list[str]]) -> None:
        """Write the marks into the next state (whose ``counts`` and ``keys`` the caller
        wrote), with the event part files its outcomes were computed from."""
        data = {
            "version": STATE_VERSION,
            "marks": [[*where, to] for where, to in sorted(settled_to.items())],
            "events_parts": events_parts,
        }
        (self.next / "marks.json").write_bytes(orjson.dumps(data))
        self._next_marks = dict(settled_to)
        self._next_parts = events_parts

    def save(self) -> None:
        """Swap the prepared state in (once nothing reads the one before)."""
        if self._next_marks is None:
            raise RuntimeError("no next state prepared")
        swap_in(self.next, self.root)
        self.marks, self._next_marks = self._next_marks, None
        self.events_parts = self._next_parts
