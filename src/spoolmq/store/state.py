"""``state.db``: the SQLite file that holds everything that is not a message.

Topics and their settings, committed group offsets, in-flight deliveries with their leases,
scheduled redeliveries, producer sequences for idempotent publishing, and per-partition
figures for analytics. WAL mode, ``BEGIN IMMEDIATE`` for every write, a busy timeout, and one
connection per process, opened lazily in the process that uses it (a connection is never
carried across fork or spawn). The schema has a version (``PRAGMA user_version``) and is
migrated on open; a file from a newer spoolmq is refused.

Every SQL statement the queue runs is here, behind methods, so the schema and its queries
are read together (the analytics job reads the file with its own three queries, as it reads
every file, without spoolmq's store code): one cohesive thing, kept whole past 500 lines.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from spoolmq.clock import SYSTEM_CLOCK, Clock
from spoolmq.config import TopicConfig
from spoolmq.errors import SchemaVersionError, StorageError, TopicExistsError, UnknownTopicError
from spoolmq.files import chmod_sqlite_side_files, open_sqlite
from spoolmq.types import TopicPartition

SCHEMA_VERSION = 5

_MIGRATIONS: dict[int, str] = {
    1: """
    CREATE TABLE topics (
        name TEXT PRIMARY KEY,
        partitions INTEGER NOT NULL,
        retention_ms INTEGER NOT NULL,
        retention_bytes INTEGER NOT NULL,
        cleanup_policy TEXT NOT NULL CHECK (cleanup_policy IN ('delete', 'compact')),
        segment_bytes INTEGER NOT NULL,
        segment_ms INTEGER NOT NULL,
        tombstone_retention_ms INTEGER NOT NULL,
        created_at INTEGER NOT NULL
    );
    CREATE TABLE partitions (
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        log_start_offset INTEGER NOT NULL,
        log_end_offset INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (topic, partition)
    ) WITHOUT ROWID;
    CREATE TABLE group_offsets (
        group_name TEXT NOT NULL,
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        committed_offset INTEGER NOT NULL,
        updated_at INTEGER NOT NULL,
        PRIMARY KEY (group_name, topic, partition)
    ) WITHOUT ROWID;
    CREATE TABLE deliveries (
        group_name TEXT NOT NULL,
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        consumer_id TEXT NOT NULL,
        attempt INTEGER NOT NULL,
        delivered_at INTEGER NOT NULL,
        lease_expires_at INTEGER NOT NULL,
        PRIMARY KEY (group_name, topic, partition, offset)
    ) WITHOUT ROWID;
    CREATE TABLE scheduled (
        group_name TEXT NOT NULL,
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        due_at INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        reason TEXT,
        PRIMARY KEY (group_name, topic, partition, offset)
    ) WITHOUT ROWID;
    CREATE INDEX scheduled_by_due ON scheduled (due_at);
    CREATE TABLE producers (
        producer_id TEXT PRIMARY KEY,
        last_sequence INTEGER NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE TABLE producer_sequences (
        producer_id TEXT NOT NULL,
        sequence INTEGER NOT NULL,
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        PRIMARY KEY (producer_id, sequence)
    ) WITHOUT ROWID;
    """,
    # Version 2: the PublisherBroker keeps producer sequences as runs (one row per run of
    # consecutive sequences stored at consecutive offsets, not one per message), and per
    # partition the offset below which every record's sequence is in a run or a row
    # (``producer_marks``): after a crash it reads the log from there. Version 1's rows
    # are converted to runs, and each partition version 1 wrote to is marked at its last
    # recorded end (version 1 recorded every sequence as it stored it).
    2: """
    CREATE TABLE producer_runs (
        producer_id TEXT NOT NULL,
        first_sequence INTEGER NOT NULL,
        count INTEGER NOT NULL,
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        first_offset INTEGER NOT NULL,
        timestamp INTEGER NOT NULL,
        PRIMARY KEY (producer_id, first_sequence)
    ) WITHOUT ROWID;
    CREATE TABLE producer_marks (
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        end_offset INTEGER NOT NULL,
        PRIMARY KEY (topic, partition)
    ) WITHOUT ROWID;
    INSERT INTO producer_runs
        SELECT producer_id, MIN(sequence), COUNT(*), topic, partition, MIN(offset), -1
        FROM (
            SELECT producer_id, sequence, topic, partition, offset,
                sequence - ROW_NUMBER() OVER (
                    PARTITION BY producer_id, topic, partition, offset - sequence
                    ORDER BY sequence
                ) AS run
            FROM producer_sequences
        )
        GROUP BY producer_id, topic, partition, offset - sequence, run;
    DELETE FROM producer_sequences;
    INSERT INTO producer_marks SELECT topic, partition, log_end_offset FROM partitions;
    """,
    # Version 3: the Kafka front's group coordinator records each Kafka consumer group's
    # membership (on every rebalance, never per heartbeat) so ``spoolmq groups`` can show
    # the members and refuse a reset while they are joined. Their offsets go in
    # ``group_offsets`` like every group's. Nothing older needs converting.
    3: """
    CREATE TABLE kafka_groups (
        group_name TEXT PRIMARY KEY,
        state TEXT NOT NULL,
        generation INTEGER NOT NULL,
        protocol_type TEXT NOT NULL,
        protocol TEXT NOT NULL,
        leader_id TEXT NOT NULL,
        updated_at INTEGER NOT NULL
    );
    CREATE TABLE kafka_members (
        group_name TEXT NOT NULL,
        member_id TEXT NOT NULL,
        client_id TEXT NOT NULL,
        client_host TEXT NOT NULL,
        assignment TEXT,
        PRIMARY KEY (group_name, member_id)
    ) WITHOUT ROWID;
    """,
    # Version 4: cancelled messages (``Admin.cancel_message``, a task's ``cancel``): every
    # group passes over them, also one that reads them after a broker restart.
    4: """
    CREATE TABLE cancels (
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        reason TEXT,
        cancelled_at INTEGER NOT NULL,
        PRIMARY KEY (topic, partition, offset)
    ) WITHOUT ROWID;
    """,
    # Version 5: parked messages. A message a group reads that is due later than the
    # broker's horizon (a delay, a retry's backoff) leaves the group's in-memory window for
    # this table, saved in the same transaction as the committed offset that passes it; the
    # ConsumerBroker reads it back by due time and the record by offset when it is due.
    5: """
    CREATE TABLE parked (
        group_name TEXT NOT NULL,
        topic TEXT NOT NULL,
        partition INTEGER NOT NULL,
        offset INTEGER NOT NULL,
        due_at INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        reason TEXT,
        PRIMARY KEY (group_name, topic, partition, offset)
    ) WITHOUT ROWID;
    CREATE INDEX parked_by_due ON parked (group_name, due_at, topic, partition, offset);
    """,
}

_TOPIC_COLUMNS = (
    "partitions",
    "retention_ms",
    "retention_bytes",
    "cleanup_policy",
    "segment_bytes",
    "segment_ms",
    "tombstone_retention_ms",
)


def _rollback(connection: sqlite3.Connection) -> None:
    """Roll back what is left of a failed transaction. After some errors (a full disk)
    SQLite has already rolled it back, and a second ROLLBACK would raise instead."""
    if connection.in_transaction:
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")


class RunRow(NamedTuple):
    """A row of ``producer_runs``: sequences ``first_sequence`` .. ``+ size - 1`` of one
    producer, stored at consecutive offsets from ``first_offset`` (``timestamp`` -1 when
    not known: runs converted from version 1)."""

    producer_id: str
    first_sequence: int
    size: int
    topic: str
    partition: int
    first_offset: int
    timestamp: int


class SequenceRow(NamedTuple):
    """Where one (producer, sequence) was stored; a tuple in the table's column order, so
    a batch's rows go to SQLite as they are (one is made per published message)."""

    producer_id: str
    sequence: int
    topic: str
    partition: int
    offset: int


# Offsets by partition.
PartitionOffsets = Mapping[TopicPartition, int]


class OpenDelivery(NamedTuple):
    """A delivery a group had not finished at its broker's last checkpoint."""

    attempt: int  # deliveries made so far
    due_at: int  # when its scheduled retry is due (ms); 0: none scheduled
    out: bool = False  # its row was of a delivery out with a consumer (it had a lease)


class DeliveryRow(NamedTuple):
    """A row of ``deliveries`` (an open delivery), in the table's column order."""

    group_name: str
    topic: str
    partition: int
    offset: int
    consumer_id: str
    attempt: int
    delivered_at: int
    lease_expires_at: int


class ScheduledRow(NamedTuple):
    """A row of ``scheduled`` (a retry and when it is due), in the table's column order."""

    group_name: str
    topic: str
    partition: int
    offset: int
    due_at: int
    attempt: int
    reason: str | None


class ParkedRow(NamedTuple):
    """A row of ``parked`` (a message out of its group's window until it is due), in the
    table's column order. ``attempt``: deliveries that failed before it was parked."""

    group_name: str
    topic: str
    partition: int
    offset: int
    due_at: int
    attempt: int
    reason: str | None


class DeliveryKey(NamedTuple):
    """Which message of which group a delivery row is about."""

    group_name: str
    topic: str
    partition: int
    offset: int


_UPSERT_COMMITTED = (
    "INSERT INTO group_offsets VALUES (?, ?, ?, ?, ?) "
    "ON CONFLICT (group_name, topic, partition) DO UPDATE SET "
    "committed_offset = excluded.committed_offset, updated_at = excluded.updated_at"
)


_UPSERT_PARKED = (
    "INSERT INTO parked VALUES (?, ?, ?, ?, ?, ?, ?) "
    "ON CONFLICT (group_name, topic, partition, offset) DO UPDATE SET "
    "due_at = excluded.due_at, attempt = excluded.attempt, reason = excluded.reason "
    "WHERE excluded.attempt > 0"
)


class KafkaGroupRow(NamedTuple):
    """A Kafka consumer group as its coordinator last recorded it."""

    group_name: str
    state: str
    generation: int
    protocol_type: str
    protocol: str
    leader_id: str
    updated_at: int


class KafkaMemberRow(NamedTuple):
    """One member of a Kafka consumer group; ``assignment`` is its partitions as JSON
    (``{"topic": [0, 1]}``), or None when the assignment is not the consumer protocol's."""

    group_name: str
    member_id: str
    client_id: str
    client_host: str
    assignment: str | None


class StateDB:
    """The per-process handle on ``state.db``; safe to share between threads."""

    def __init__(
        self, path: Path, *, busy_timeout_ms: int = 30_000, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self.path = path
        self.busy_timeout_ms = busy_timeout_ms
        self._clock = clock
        self._connection: sqlite3.Connection | None = None
        self._owner_pid = -1
        self._lock = threading.RLock()

    # -- connection ---------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._connection is not None and self._owner_pid == os.getpid():
            return self._connection
        # A connection inherited through fork belongs to the parent: drop, never use it.
        self._connection = None
        connection = open_sqlite(self.path, self.busy_timeout_ms)
        connection.execute("PRAGMA foreign_keys = ON")
        self._migrate(connection)
        chmod_sqlite_side_files(self.path)
        self._connection = connection
        self._owner_pid = os.getpid()
        return connection

    def _migrate(self, connection: sqlite3.Connection) -> None:
        version = connection.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise SchemaVersionError(
                f"{self.path} has schema version {version}, newer than this spoolmq's "
                f"{SCHEMA_VERSION}; upgrade spoolmq to open it"
            )
        if version == SCHEMA_VERSION:
            return
        connection.execute("BEGIN IMMEDIATE")
        try:
            # Re-read under the write lock: another process may have migrated meanwhile.
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            for target in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[target].split(";"):
                    if statement.strip():
                        connection.execute(statement)
                connection.execute(f"PRAGMA user_version = {target}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    def connect(self) -> None:
        """Open the database now: create or migrate it, or refuse a newer schema."""
        with self._lock:
            self._connect()

    def close(self) -> None:
        with self._lock:
            if self._connection is not None and self._owner_pid == os.getpid():
                self._connection.close()
            self._connection = None

    @contextmanager
    def write(self) -> Iterator[sqlite3.Connection]:
        """A write transaction (``BEGIN IMMEDIATE``), committed on success."""
        with self._lock:
            connection = self._connect()
            try:
                connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise StorageError(f"state.db is busy or unwritable: {exc}") from None
            try:
                yield connection
            except sqlite3.OperationalError as exc:  # e.g. "database or disk is full"
                _rollback(connection)
                raise StorageError(f"writing to state.db failed: {exc}") from None
            except BaseException:
                _rollback(connection)
                raise
            try:
                connection.execute("COMMIT")
            except sqlite3.OperationalError as exc:
                _rollback(connection)
                raise StorageError(f"committing to state.db failed: {exc}") from None

    def query(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._connect().execute(sql, parameters).fetchall()

    # -- topics -------------------------------------------------------------------

    def create_topic(self, name: str, config: TopicConfig, *, exist_ok: bool) -> TopicConfig:
        with self.write() as db:
            row = db.execute(
                f"SELECT {', '.join(_TOPIC_COLUMNS)} FROM topics WHERE name = ?", (name,)
            ).fetchone()
            if row is not None:
                existing = TopicConfig(**dict(zip(_TOPIC_COLUMNS, row, strict=True)))
                if not exist_ok and existing != config:
                    raise TopicExistsError(
                        f"topic {name!r} already exists with other settings: "
                        f"{existing.differences(config)}"
                    )
                return existing
            values = [getattr(config, column) for column in _TOPIC_COLUMNS]
            db.execute(
                f"INSERT INTO topics (name, {', '.join(_TOPIC_COLUMNS)}, created_at) "
                f"VALUES (?, {', '.join('?' * len(_TOPIC_COLUMNS))}, ?)",
                (name, *values, self._clock.now_ms()),
            )
            return config

    def alter_topic(self, name: str, update: Callable[[TopicConfig], TopicConfig]) -> TopicConfig:
        with self.write() as db:
            row = db.execute(
                f"SELECT {', '.join(_TOPIC_COLUMNS)} FROM topics WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                raise UnknownTopicError(f"topic {name!r} does not exist")
            config = update(TopicConfig(**dict(zip(_TOPIC_COLUMNS, row, strict=True))))
            db.execute(
                f"UPDATE topics SET {', '.join(c + ' = ?' for c in _TOPIC_COLUMNS)} WHERE name = ?",
                (*[getattr(config, c) for c in _TOPIC_COLUMNS], name),
            )
            return config

    def topic(self, name: str) -> TopicConfig | None:
        rows = self.query(f"SELECT {', '.join(_TOPIC_COLUMNS)} FROM topics WHERE name = ?", (name,))
        return TopicConfig(**dict(zip(_TOPIC_COLUMNS, rows[0], strict=True))) if rows else None

    def topics(self) -> dict[str, TopicConfig]:
        rows = self.query(f"SELECT name, {', '.join(_TOPIC_COLUMNS)} FROM topics ORDER BY name")
        return {
            row[0]: TopicConfig(**dict(zip(_TOPIC_COLUMNS, row[1:], strict=True))) for row in rows
        }

    def delete_topic(self, name: str) -> None:
        with self.write() as db:
            for table in (
                "partitions",
                "group_offsets",
                "deliveries",
                "scheduled",
                "parked",
                "cancels",
            ):
                db.execute(f"DELETE FROM {table} WHERE topic = ?", (name,))
            for table in ("producer_sequences", "producer_runs", "producer_marks"):
                db.execute(f"DELETE FROM {table} WHERE topic = ?", (name,))
            db.execute("DELETE FROM topics WHERE name = ?", (name,))

    # -- cancelled messages ---------------------------------------------------------

    def add_cancel(self, topic: str, partition: int, offset: int, reason: str | None) -> None:
        """Record that the message at (topic, partition, offset) is cancelled: no group
        delivers it from now on (the ConsumerBroker reads these rows when it starts)."""
        with self.write() as db:
            db.execute(
                "INSERT OR IGNORE INTO cancels VALUES (?, ?, ?, ?, ?)",
                (topic, partition, offset, reason, self._clock.now_ms()),
            )

    def cancels(self) -> dict[TopicPartition, dict[int, str | None]]:
        """Every cancelled message, per partition by offset, with its reason."""
        found: dict[TopicPartition, dict[int, str | None]] = {}
        rows = self.query("SELECT topic, partition, offset, reason FROM cancels")
        for topic, partition, offset, reason in rows:
            found.setdefault(TopicPartition(topic, partition), {})[offset] = reason
        return found

    def prune_cancels(self, log_starts: Mapping[TopicPartition, int]) -> int:
        """Forget the cancels of messages retention has deleted (below ``log_starts``)."""
        with self.write() as db:
            return sum(
                db.execute(
                    "DELETE FROM cancels WHERE topic = ? AND partition = ? AND offset < ?",
                    (topic, partition, start),
                ).rowcount
                for (topic, partition), start in log_starts.items()
            )

    # -- partition figures ----------------------------------------------------------

    def record_partition(self, topic: str, partition: int, start: int, end: int) -> None:
        with self.write() as db:
            db.execute(
                "INSERT INTO partitions VALUES (?, ?, ?, ?, ?) ON CONFLICT (topic, partition) "
                "DO UPDATE SET log_start_offset = excluded.log_start_offset, "
                "log_end_offset = MAX(log_end_offset, excluded.log_end_offset), "
                "updated_at = excluded.updated_at",
                (topic, partition, start, end, self._clock.now_ms()),
            )

    # -- producer sequences (idempotent publishing) -----------------------------------

    def find_sequences(
        self, pairs: Iterable[tuple[str, int]]
    ) -> dict[tuple[str, int], SequenceRow]:
        """The stored position of each (producer_id, sequence) already seen.

        One range query per producer: a client numbers its messages consecutively, so the
        sequences of a batch are a narrow range and the common answer is "none stored".
        """
        wanted: dict[str, set[int]] = {}
        for producer_id, sequence in pairs:
            wanted.setdefault(producer_id, set()).add(sequence)
        found: dict[tuple[str, int], SequenceRow] = {}
        with self._lock:
            db = self._connect()
            for producer_id, sequences in wanted.items():
                rows = db.execute(
                    "SELECT sequence, topic, partition, offset FROM producer_sequences "
                    "WHERE producer_id = ? AND sequence BETWEEN ? AND ?",
                    (producer_id, min(sequences), max(sequences)),
                ).fetchall()
                for sequence, topic, partition, offset in rows:
                    if sequence in sequences:
                        found[(producer_id, sequence)] = SequenceRow(
                            producer_id, sequence, topic, partition, offset
                        )
                runs = db.execute(
                    "SELECT first_sequence, count, topic, partition, first_offset "
                    "FROM producer_runs WHERE producer_id = ? AND first_sequence <= ? "
                    "AND first_sequence + count > ?",
                    (producer_id, max(sequences), min(sequences)),
                ).fetchall()
                for first, count, topic, partition, offset in runs:
                    for sequence in sequences:
                        if first <= sequence < first + count:
                            found[(producer_id, sequence)] = SequenceRow(
                                producer_id, sequence, topic, partition, offset + sequence - first
                            )
        return found

    # -- producer runs (the PublisherBroker's idempotence state) ----------------------

    def save_runs(self, runs: Sequence[RunRow], marks: Mapping[tuple[str, int], int]) -> None:
        """Add ``runs`` and move each partition's mark up to its offset in ``marks`` (every
        record below it has its sequence saved), in one transaction."""
        if not runs and not marks:
            return
        timestamp = self._clock.now_ms()
        last: dict[str, int] = {}
        for run in runs:
            end = run.first_sequence + run.size - 1
            if end > last.get(run.producer_id, -1):
                last[run.producer_id] = end
        with self.write() as db:
            db.executemany(
                "INSERT OR REPLACE INTO producer_runs VALUES (?, ?, ?, ?, ?, ?, ?)", runs
            )
            db.executemany(
                "INSERT INTO producer_marks VALUES (?, ?, ?) ON CONFLICT (topic, partition) "
                "DO UPDATE SET end_offset = MAX(end_offset, excluded.end_offset)",
                [(topic, partition, end) for (topic, partition), end in marks.items()],
            )
            db.executemany(
                "INSERT INTO producers VALUES (?, ?, ?) ON CONFLICT (producer_id) DO UPDATE SET "
                "last_sequence = MAX(last_sequence, excluded.last_sequence), "
                "updated_at = excluded.updated_at",
                [(pid, sequence, timestamp) for pid, sequence in last.items()],
            )

    def load_runs(self) -> list[RunRow]:
        """Every saved run, and the rows of ``producer_sequences`` (embedded appends) as
        runs of one."""
        rows = self.query("SELECT * FROM producer_runs ORDER BY producer_id, first_sequence")
        rows += self.query(
            "SELECT producer_id, sequence, 1, topic, partition, offset, -1 "
            "FROM producer_sequences ORDER BY producer_id, sequence"
        )
        return [RunRow(*row) for row in rows]

    def producer_marks(self) -> dict[tuple[str, int], int]:
        """Per partition, the offset below which every record's sequence is saved."""
        return {(t, p): end for t, p, end in self.query("SELECT * FROM producer_marks")}

    def set_wal_autocheckpoint(self, pages: int) -> None:
        """SQLite checkpoints the WAL into the database file when a commit leaves it over
        ``pages`` pages: inside that commit, on whatever path it is. 0 turns that off, for a
        process that checkpoints on a timer instead (:meth:`checkpoint_wal`)."""
        with self._lock:
            self._connect().execute(f"PRAGMA wal_autocheckpoint = {int(pages)}")

    def checkpoint_wal(self) -> None:
        """A PASSIVE checkpoint: copies what it can without waiting for readers or writers."""
        with self._lock:
            self._connect().execute("PRAGMA wal_checkpoint(PASSIVE)")

    def record_sequences(self, rows: Sequence[SequenceRow]) -> None:
        if not rows:
            return
        timestamp = self._clock.now_ms()
        last: dict[str, int] = {}
        for row in rows:
            last[row.producer_id] = max(last.get(row.producer_id, -1), row.sequence)
        with self.write() as db:
            db.executemany("INSERT OR IGNORE INTO producer_sequences VALUES (?, ?, ?, ?, ?)", rows)
            db.executemany(
                "INSERT INTO producers VALUES (?, ?, ?) ON CONFLICT (producer_id) DO UPDATE SET "
                "last_sequence = MAX(last_sequence, excluded.last_sequence), "
                "updated_at = excluded.updated_at",
                [(pid, sequence, timestamp) for pid, sequence in last.items()],
            )

    def prune_sequences(self, *, keep: int = 100_000, idle_ms: int = 7 * 24 * 3600 * 1000) -> int:
        """Forget sequences more than ``keep`` below each producer's newest, and producers idle for
        ``idle_ms``. A client only ever resends its in-flight window (a few thousand
        messages at most), so older sequences can never be asked about again."""
        with self.write() as db:
            cursor = db.execute(
                "DELETE FROM producer_sequences WHERE sequence < ("
                "SELECT p.last_sequence FROM producers p "
                "WHERE p.producer_id = producer_sequences.producer_id) - ?",
                (keep,),
            )
            removed = cursor.rowcount
            stale = self._clock.now_ms() - idle_ms
            db.execute(
                "DELETE FROM producer_runs WHERE first_sequence + count - 1 < ("
                "SELECT p.last_sequence FROM producers p "
                "WHERE p.producer_id = producer_runs.producer_id) - ?",
                (keep,),
            )
            for table in ("producer_sequences", "producer_runs"):
                db.execute(
                    f"DELETE FROM {table} WHERE producer_id IN "
                    "(SELECT producer_id FROM producers WHERE updated_at < ?)",
                    (stale,),
                )
            db.execute("DELETE FROM producers WHERE updated_at < ?", (stale,))
        return int(removed)

    def last_sequence(self, producer_id: str) -> int | None:
        rows = self.query(
            "SELECT last_sequence FROM producers WHERE producer_id = ?", (producer_id,)
        )
        return rows[0][0] if rows else None

    # -- group offsets ----------------------------------------------------------------

    def committed_offsets(self, group: str, topic: str | None = None) -> dict[TopicPartition, int]:
        sql = "SELECT topic, partition, committed_offset FROM group_offsets WHERE group_name = ?"
        params: list[Any] = [group]
        if topic is not None:
            sql += " AND topic = ?"
            params.append(topic)
        return {TopicPartition(t, p): o for t, p, o in self.query(sql, params)}

    def readers_of(self, topic: str, partition: int, offset: int) -> dict[str, tuple[int, bool]]:
        """Every group with a committed offset in ``topic``: its committed offset in
        ``partition`` (0 if none there yet) and whether it has parked ``offset`` of it.
        Three queries, however many groups (a cancel asks on the ConsumerBroker's loop)."""
        committed = dict(
            self.query(
                "SELECT group_name, committed_offset FROM group_offsets "
                "WHERE topic = ? AND partition = ?",
                (topic, partition),
            )
        )
        names = self.groups_reading(topic)
        parked = {
            row[0]
            for row in self.query(
                "SELECT group_name FROM parked WHERE topic = ? AND partition = ? AND offset = ?",
                (topic, partition, offset),
            )
        }
        return {name: (int(committed.get(name, 0)), name in parked) for name in names}

    def groups_reading(self, topic: str) -> list[str]:
        """Every group with a committed offset in ``topic``, by name."""
        return [
            row[0]
            for row in self.query(
                "SELECT DISTINCT group_name FROM group_offsets WHERE topic = ? ORDER BY 1",
                (topic,),
            )
        ]

    def commit_offsets(self, group: str, offsets: PartitionOffsets) -> None:
        timestamp = self._clock.now_ms()
        with self.write() as db:
            db.executemany(
                _UPSERT_COMMITTED,
                [(group, t, p, o, timestamp) for (t, p), o in offsets.items()],
            )

    def reset_group(self, group: str, offsets: PartitionOffsets) -> None:
        """Move a group to new offsets and forget its open deliveries and scheduled retries
        in those partitions, in one transaction: its work there starts over."""
        timestamp = self._clock.now_ms()
        with self.write() as db:
            db.executemany(
                _UPSERT_COMMITTED,
                [(group, t, p, o, timestamp) for (t, p), o in offsets.items()],
            )
            for table in ("deliveries", "scheduled", "parked"):
                db.executemany(
                    f"DELETE FROM {table} WHERE group_name = ? AND topic = ? AND partition = ?",
                    [(group, t, p) for t, p in offsets],
                )

    def delete_group(self, group: str) -> None:
        """Forget everything about ``group``: its offsets, open deliveries and retries."""
        with self.write() as db:
            for table in ("group_offsets", "deliveries", "scheduled", "parked"):
                db.execute(f"DELETE FROM {table} WHERE group_name = ?", (group,))

    def groups(self) -> list[str]:
        """Every group with committed offsets, and every Kafka group that has members."""
        return [
            row[0]
            for row in self.query(
                "SELECT group_name FROM group_offsets UNION "
                "SELECT group_name FROM kafka_members ORDER BY 1"
            )
        ]

    # -- Kafka group membership (the Kafka front's coordinator) --------------------------

    def record_kafka_group(self, group: KafkaGroupRow, members: Sequence[KafkaMemberRow]) -> None:
        """Replace what is recorded of ``group`` (its row and all its members) at once."""
        with self.write() as db:
            db.execute("INSERT OR REPLACE INTO kafka_groups VALUES (?, ?, ?, ?, ?, ?, ?)", group)
            db.execute("DELETE FROM kafka_members WHERE group_name = ?", (group.group_name,))
            db.executemany("INSERT INTO kafka_members VALUES (?, ?, ?, ?, ?)", members)

    def clear_kafka_members(self) -> None:
        """Forget every Kafka membership: a new Kafka child starts with no member joined
        (clients rejoin), so what the previous one recorded no longer holds."""
        with self.write() as db:
            db.execute("DELETE FROM kafka_members")
            db.execute("UPDATE kafka_groups SET state = 'Empty', leader_id = ''")

    def kafka_group(self, group: str) -> KafkaGroupRow | None:
        rows = self.query("SELECT * FROM kafka_groups WHERE group_name = ?", (group,))
        return KafkaGroupRow(*rows[0]) if rows else None

    def kafka_groups(self) -> list[KafkaGroupRow]:
        return [KafkaGroupRow(*row) for row in self.query("SELECT * FROM kafka_groups ORDER BY 1")]

    def kafka_members(self, group: str | None = None) -> list[KafkaMemberRow]:
        """The recorded members of Kafka ``group``, or of every Kafka group."""
        if group is None:
            rows = self.query("SELECT * FROM kafka_members ORDER BY group_name, member_id")
        else:
            rows = self.query(
                "SELECT * FROM kafka_members WHERE group_name = ? ORDER BY member_id", (group,)
            )
        return [KafkaMemberRow(*row) for row in rows]

    # -- deliveries (the ConsumerBroker's checkpoint) -------------------------------------

    def checkpoint(
        self,
        *,
        committed: Mapping[str, Mapping[TopicPartition, int]],
        deliveries: Sequence[DeliveryRow],
        scheduled: Sequence[ScheduledRow],
        finished: Sequence[DeliveryKey],
        parked: Sequence[ParkedRow] = (),
        unparked: Sequence[DeliveryKey] = (),
    ) -> None:
        """Save a ConsumerBroker's progress in one transaction: the ``committed`` offsets
        that moved (per group), the open ``deliveries`` and ``scheduled`` retries (written
        over their old rows), the rows of deliveries ``finished`` since (deleted), messages
        ``parked`` (a row with no failed attempt never replaces one: it is a record read
        again after a restart) and parked messages finished since (``unparked``)."""
        timestamp = self._clock.now_ms()
        with self.write() as db:
            db.executemany(
                _UPSERT_COMMITTED,
                [
                    (group, t, p, o, timestamp)
                    for group, offsets in committed.items()
                    for (t, p), o in offsets.items()
                ],
            )
            for table in ("deliveries", "scheduled"):
                db.executemany(
                    f"DELETE FROM {table} WHERE group_name = ? AND topic = ? "
                    "AND partition = ? AND offset = ?",
                    finished,
                )
            db.executemany(
                "INSERT OR REPLACE INTO deliveries VALUES (?, ?, ?, ?, ?, ?, ?, ?)", deliveries
            )
            db.executemany(
                "INSERT OR REPLACE INTO scheduled VALUES (?, ?, ?, ?, ?, ?, ?)", scheduled
            )
            db.executemany(
                "DELETE FROM parked WHERE group_name = ? AND topic = ? AND partition = ? "
                "AND offset = ?",
                unparked,
            )
            db.executemany(_UPSERT_PARKED, parked)

    def open_deliveries(self, group: str) -> dict[tuple[str, int, int], OpenDelivery]:
        """What ``group`` had in flight or waiting for a retry at its last checkpoint, by
        (topic, partition, offset): so its attempts keep counting across a restart."""
        rows = self.query(
            "SELECT d.topic, d.partition, d.offset, d.attempt, COALESCE(s.due_at, 0), "
            "d.lease_expires_at > 0 "
            "FROM deliveries d LEFT JOIN scheduled s "
            "USING (group_name, topic, partition, offset) WHERE d.group_name = ?",
            (group,),
        )
        return {
            (t, p, o): OpenDelivery(attempt, due, bool(out)) for t, p, o, attempt, due, out in rows
        }

    # -- parked messages (the ConsumerBroker's delay index) -------------------------------

    def parked_due(
        self, group: str, until: int, after: tuple[int, str, int, int] | None, limit: int
    ) -> tuple[list[ParkedRow], int | None]:
        """Up to ``limit`` of ``group``'s parked messages due by ``until`` (ms), in due
        order, after the position ``after`` (due_at, topic, partition, offset) of the last
        one read; and when the next one not returned is due (None: no other)."""
        low = after if after is not None else (-(1 << 62), "", -1, -1)
        rows = self.query(
            "SELECT group_name, topic, partition, offset, due_at, attempt, reason FROM parked "
            "WHERE group_name = ? AND (due_at, topic, partition, offset) > (?, ?, ?, ?) "
            "ORDER BY due_at, topic, partition, offset LIMIT ?",
            (group, *low, limit + 1),
        )
        found = [ParkedRow(*row) for row in rows]
        taken = [row for row in found[:limit] if row.due_at <= until]
        rest = found[len(taken) :]
        return taken, rest[0].due_at if rest else None

    def parked_offsets(
        self, group: str, topic: str, partition: int, first: int, last: int
    ) -> set[int]:
        """The offsets in ``[first, last]`` of a partition that ``group`` has parked."""
        rows = self.query(
            "SELECT offset FROM parked WHERE group_name = ? AND topic = ? AND partition = ? "
            "AND offset BETWEEN ? AND ?",
            (group, topic, partition, first, last),
        )
        return {row[0] for row in rows}

    def parked_end(self, group: str, topic: str, partition: int) -> int:
        """One past the highest offset of the partition that ``group`` has parked (0: none)."""
        rows = self.query(
            "SELECT MAX(offset) FROM parked WHERE group_name = ? AND topic = ? AND partition = ?",
            (group, topic, partition),
        )
        return 0 if rows[0][0] is None else int(rows[0][0]) + 1

    def parked_counts(self) -> dict[str, int]:
        """How many messages each group has parked."""
        return {name: sum(counts.values()) for name, counts in self.parked_by_partition().items()}

    def parked_by_partition(self) -> dict[str, dict[TopicPartition, int]]:
        """How many messages each group has parked, per partition."""
        rows = self.query(
            "SELECT group_name, topic, partition, COUNT(*) FROM parked "
            "GROUP BY group_name, topic, partition"
        )
        counts: dict[str, dict[TopicPartition, int]] = {}
        for name, topic, partition, count in rows:
            counts.setdefault(name, {})[TopicPartition(topic, partition)] = count
        return counts
