"""The task layer's own state: ``<data>/tasks.db`` (SQLite, WAL, mode 0600).

One row per task (its state, arguments, attempts and, once finished, its result or the
error and traceback that ended it), the unique-task windows and the periodic jobs' last
ticks. It lives beside the broker's ``state.db`` but apart from it: the broker never opens
it, so a task's result survives a broker restart (and a broker that is down), and any
process that can read the data directory can read a result by task id. Its layout is in
docs/FORMAT.md ("tasks.db").

Every write is one short ``BEGIN IMMEDIATE`` transaction, so two processes racing for the
same row (a worker claiming a task while a client cancels it; two senders of one unique
task) are serialised by SQLite, and exactly one of them wins.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from spoolmq.errors import SchemaVersionError, StorageError
from spoolmq.files import chmod_sqlite_side_files, make_private_dirs, open_sqlite
from spoolmq.tasks.schedule import tick_ms

SCHEMA_VERSION = 2
FILE_NAME = "tasks.db"

# A task's states. ``queued`` -> ``running`` -> ``succeeded`` | ``failed``; a failed attempt
# that will be retried goes back to ``retrying``; only a ``queued``/``retrying`` task can be
# ``cancelled``. A task whose message the broker gave up on (``<topic>.dlq``: no worker knew
# the task, or its workers died ``max_deliveries`` times) is ``dead_lettered``: ended for
# ``result()``, yet not final, so a redriven message (``spoolmq dlq replay``) runs it.
QUEUED, RUNNING, RETRYING = "queued", "running", "retrying"
SUCCEEDED, FAILED, CANCELLED = "succeeded", "failed", "cancelled"
DEAD_LETTERED = "dead_lettered"
FINAL_STATES = (SUCCEEDED, FAILED, CANCELLED)
ENDED_STATES = (*FINAL_STATES, DEAD_LETTERED)  # what result() waits for
STATES = (QUEUED, RUNNING, RETRYING, *ENDED_STATES)

_SCHEMA = """
CREATE TABLE tasks (
    id TEXT PRIMARY KEY,
    name TEXT NOT NULL,
    topic TEXT NOT NULL,
    state TEXT NOT NULL,
    args TEXT NOT NULL,
    key TEXT,
    priority INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    eta_ms INTEGER,
    started_ms INTEGER,
    finished_ms INTEGER,
    attempts INTEGER NOT NULL DEFAULT 0,
    worker TEXT,
    result TEXT,
    error TEXT,
    traceback TEXT,
    result_ttl_ms INTEGER,
    expires_ms INTEGER,
    unique_key TEXT,
    msg_partition INTEGER,
    msg_offset INTEGER
);
CREATE INDEX tasks_created ON tasks (created_ms);
CREATE INDEX tasks_expires ON tasks (expires_ms) WHERE expires_ms IS NOT NULL;
CREATE TABLE uniques (
    key TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    until_ms INTEGER NOT NULL
);
CREATE TABLE periodic (
    name TEXT PRIMARY KEY,
    task TEXT NOT NULL,
    schedule TEXT NOT NULL,
    last_tick INTEGER,
    last_fired_ms INTEGER,
    next_ms INTEGER
);
"""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class TaskRow:
    """One task as ``tasks.db`` holds it (``result`` decoded from JSON)."""

    id: str
    name: str
    topic: str
    state: str
    args: dict[str, Any]
    key: str | None
    priority: int
    created_ms: int
    eta_ms: int | None
    started_ms: int | None
    finished_ms: int | None
    attempts: int
    worker: str | None
    result: Any
    error: str | None
    traceback: str | None
    expires_ms: int | None

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


_COLUMNS = (
    "id, name, topic, state, args, key, priority, created_ms, eta_ms, started_ms, "
    "finished_ms, attempts, worker, result, error, traceback, expires_ms"
)


def _row(values: tuple[Any, ...]) -> TaskRow:
    fields = list(values)
    fields[4] = orjson.loads(fields[4])
    fields[13] = None if fields[13] is None else orjson.loads(fields[13])
    return TaskRow(*fields)


class ResultStore:
    """``tasks.db``, opened lazily once per process and thread-safe within it."""

    def __init__(self, data: Path, *, busy_timeout_ms: int = 30_000) -> None:
        self.path = data / FILE_NAME
        self.data = data
        self.busy_timeout_ms = busy_timeout_ms
        self._connection: sqlite3.Connection | None = None
        self._owner_pid = -1
        self._lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        if self._connection is not None and self._owner_pid == os.getpid():
            return self._connection
        self._connection = None  # inherited through fork: the parent's, never used here
        make_private_dirs(self.data)
        connection = open_sqlite(self.path, self.busy_timeout_ms)
        try:
            self._migrate(connection)
        except sqlite3.Error as exc:
            connection.close()
            raise StorageError(f"cannot open {self.path}: {exc}") from None
        except BaseException:
            connection.close()
            raise
        chmod_sqlite_side_files(self.path)
        self._connection = connection
        self._owner_pid = os.getpid()
        return connection

    def _migrate(self, connection: sqlite3.Connection) -> None:
        connection.execute("BEGIN IMMEDIATE")
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise SchemaVersionError(
                    f"{self.path} has schema version {version}, newer than this spoolmq's "
                    f"{SCHEMA_VERSION}; upgrade spoolmq to open it"
                )
            if version == 0:
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        connection.execute(statement)
            elif version == 1:  # where each task's message is stored (to cancel it)
                connection.execute("ALTER TABLE tasks ADD COLUMN msg_partition INTEGER")
                connection.execute("ALTER TABLE tasks ADD COLUMN msg_offset INTEGER")
            if version < SCHEMA_VERSION:
                connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One ``BEGIN IMMEDIATE`` transaction: the write lock is taken first, so a
        read-then-write inside it sees no other process's write in between."""
        with self._lock:
            connection = self._connect()
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def _read(self, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            return self._connect().execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            if self._connection is not None and self._owner_pid == os.getpid():
                self._connection.close()
            self._connection = None

    # -- senders ----------------------------------------------------------------------

    def add(
        self,
        task_id: str,
        *,
        name: str,
        topic: str,
        args: dict[str, Any],
        key: str | None,
        priority: int,
        eta_ms: int | None,
        result_ttl_ms: int | None,
        unique_key: str | None = None,
        unique_for_ms: int | None = None,
    ) -> tuple[str, bool]:
        """Record a new queued task; returns ``(task id, created)``. With a unique key
        whose window is still open, nothing is added and the first task's id comes back
        with ``created`` False. ``INSERT OR IGNORE``: a periodic tick's fixed id, added
        twice by two racing schedulers, is one row."""
        now = now_ms()
        with self._write() as db:
            if unique_key is not None and unique_for_ms is not None:
                found = db.execute(
                    "SELECT task_id FROM uniques WHERE key = ? AND until_ms > ?",
                    (unique_key, now),
                ).fetchone()
                if found is not None:
                    return str(found[0]), False
                db.execute(
                    "INSERT OR REPLACE INTO uniques (key, task_id, until_ms) VALUES (?, ?, ?)",
                    (unique_key, task_id, now + unique_for_ms),
                )
            cursor = db.execute(
                "INSERT OR IGNORE INTO tasks (id, name, topic, state, args, key, priority, "
                "created_ms, eta_ms, result_ttl_ms, unique_key) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    task_id,
                    name,
                    topic,
                    QUEUED,
                    orjson.dumps(args).decode(),
                    key,
                    priority,
                    now,
                    eta_ms,
                    result_ttl_ms,
                    unique_key,
                ),
            )
            return task_id, cursor.rowcount == 1

    def forget(self, task_id: str) -> None:
        """Remove a task whose message could not be published (and its unique window)."""
        with self._write() as db:
            db.execute("DELETE FROM tasks WHERE id = ?", (task_id,))
            db.execute("DELETE FROM uniques WHERE task_id = ?", (task_id,))

    def set_position(self, task_id: str, partition: int, offset: int) -> None:
        """Where the task's message was stored (in its topic)."""
        with self._write() as db:
            db.execute(
                "UPDATE tasks SET msg_partition = ?, msg_offset = ? WHERE id = ?",
                (partition, offset, task_id),
            )

    def position(self, task_id: str) -> tuple[str, int, int] | None:
        """The task's message as (topic, partition, offset), None if not known."""
        with self._write() as db:
            row = db.execute(
                "SELECT topic, msg_partition, msg_offset FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
        if row is None or row[1] is None:
            return None
        return str(row[0]), int(row[1]), int(row[2])

    def cancel(self, task_id: str) -> bool:
        """Cancel a task that has not started: True if it is (now or already) cancelled
        and so will never run."""
        now = now_ms()
        with self._write() as db:
            row = db.execute(
                "SELECT state, result_ttl_ms FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None:
                return False
            state, ttl = row
            if state == CANCELLED:
                return True
            if state not in (QUEUED, RETRYING):
                return False
            db.execute(
                "UPDATE tasks SET state = ?, finished_ms = ?, error = ?, expires_ms = ? "
                "WHERE id = ?",
                (
                    CANCELLED,
                    now,
                    # A retrying task ran (and failed) already: its next run is what stops.
                    "cancelled before it started"
                    if state == QUEUED
                    else "cancelled while waiting for a retry",
                    _expiry(now, ttl),
                    task_id,
                ),
            )
            db.execute("DELETE FROM uniques WHERE task_id = ?", (task_id,))
            return True

    # -- workers ----------------------------------------------------------------------

    def claim(self, task_id: str, attempt: int, worker: str, fallback: dict[str, Any]) -> str:
        """A worker received the task's message: mark it running unless it is final.
        Returns the state found (``cancelled`` or another final state: do not run it).
        A message with no row (its sender crashed between publishing and recording it, or
        the row's result expired) gets one from ``fallback``, so its result is readable."""
        now = now_ms()
        with self._write() as db:
            row = db.execute("SELECT state FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO tasks (id, name, topic, state, args, key, priority, "
                    "created_ms, result_ttl_ms) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        task_id,
                        fallback["name"],
                        fallback["topic"],
                        RUNNING,
                        orjson.dumps(fallback["args"]).decode(),
                        fallback.get("key"),
                        fallback.get("priority", 0),
                        now,
                        fallback.get("result_ttl_ms"),
                    ),
                )
                state = QUEUED
            else:
                state = str(row[0])
            if state in FINAL_STATES:
                return state
            db.execute(
                # (A redriven dead-lettered task had an expiry: running, it has none.)
                "UPDATE tasks SET state = ?, started_ms = ?, attempts = ?, worker = ?, "
                "expires_ms = NULL WHERE id = ?",
                (RUNNING, now, attempt, worker, task_id),
            )
            return state

    def finish(
        self,
        task_id: str,
        state: str,
        *,
        result: Any = None,
        error: str | None = None,
        traceback: str | None = None,
    ) -> None:
        """Record how an attempt ended: ``succeeded``/``failed`` are final (the result
        expires after the task's result TTL), ``retrying`` keeps the error until the next
        attempt."""
        now = now_ms()
        with self._write() as db:
            row = db.execute("SELECT result_ttl_ms FROM tasks WHERE id = ?", (task_id,)).fetchone()
            ttl = None if row is None else row[0]
            expires = _expiry(now, ttl) if state in ENDED_STATES else None
            db.execute(
                "UPDATE tasks SET state = ?, finished_ms = ?, result = ?, error = ?, "
                "traceback = ?, expires_ms = ? WHERE id = ?",
                (
                    state,
                    now,
                    None if result is None else orjson.dumps(result).decode(),
                    error,
                    traceback,
                    expires,
                    task_id,
                ),
            )

    def dead_lettered(self, task_id: str, reason: str) -> bool:
        """The broker dead-lettered the task's message: a task not already final becomes
        ``dead_lettered`` with ``reason`` as its error. True if it changed."""
        now = now_ms()
        with self._write() as db:
            row = db.execute(
                "SELECT state, result_ttl_ms FROM tasks WHERE id = ?", (task_id,)
            ).fetchone()
            if row is None or row[0] in ENDED_STATES:
                return False
            db.execute(
                "UPDATE tasks SET state = ?, finished_ms = ?, error = ?, traceback = NULL, "
                "expires_ms = ? WHERE id = ?",
                (DEAD_LETTERED, now, reason, _expiry(now, row[1]), task_id),
            )
            return True

    def redriven(self, task_ids: Iterable[str]) -> int:
        """The dead-lettered tasks among ``task_ids``, whose messages were published again
        (``spoolmq dlq replay``), are ``queued`` again, so ``result()`` waits for the run
        to come instead of raising the old dead letter's TaskFailed. A task that a worker
        took up meanwhile, or that ended otherwise, is left as it is. Returns how many."""
        with self._write() as db:
            return sum(
                db.execute(
                    "UPDATE tasks SET state = ?, finished_ms = NULL, error = NULL, "
                    "traceback = NULL, expires_ms = NULL WHERE id = ? AND state = ?",
                    (QUEUED, task_id, DEAD_LETTERED),
                ).rowcount
                for task_id in dict.fromkeys(task_ids)
            )

    def purge_expired(self) -> int:
        """Delete finished tasks whose result TTL has passed, and closed unique windows."""
        now = now_ms()
        with self._write() as db:
            deleted = db.execute(
                "DELETE FROM tasks WHERE expires_ms IS NOT NULL AND expires_ms <= ?", (now,)
            ).rowcount
            db.execute("DELETE FROM uniques WHERE until_ms <= ?", (now,))
            return int(deleted)

    # -- readers ----------------------------------------------------------------------

    def get(self, task_id: str) -> TaskRow | None:
        """The task, or None if unknown or its result has expired."""
        rows = self._read(
            f"SELECT {_COLUMNS} FROM tasks WHERE id = ? AND (expires_ms IS NULL OR expires_ms > ?)",
            (task_id, now_ms()),
        )
        return _row(rows[0]) if rows else None

    def recent(
        self, *, state: str | None = None, name: str | None = None, limit: int = 100
    ) -> list[TaskRow]:
        """The newest tasks first, optionally of one state or task name."""
        where = ["(expires_ms IS NULL OR expires_ms > ?)"]
        params: list[Any] = [now_ms()]
        if state is not None:
            where.append("state = ?")
            params.append(state)
        if name is not None:
            where.append("name = ?")
            params.append(name)
        rows = self._read(
            f"SELECT {_COLUMNS} FROM tasks WHERE {' AND '.join(where)} "
            "ORDER BY created_ms DESC, id LIMIT ?",
            (*params, limit),
        )
        return [_row(values) for values in rows]

    # -- periodic jobs ----------------------------------------------------------------

    def periodic_last_tick(self, name: str, task: str, schedule: str) -> int | None:
        """The last tick fired for job ``name`` (registering the job if new), as an epoch
        millisecond: one an earlier spoolmq numbered otherwise is read with the schedule
        it was recorded under (``tick_ms``), before ``schedule`` replaces it."""
        with self._write() as db:
            row = db.execute(
                "SELECT last_tick, schedule FROM periodic WHERE name = ?", (name,)
            ).fetchone()
            if row is None:
                db.execute(
                    "INSERT INTO periodic (name, task, schedule) VALUES (?, ?, ?)",
                    (name, task, schedule),
                )
                return None
            db.execute(
                "UPDATE periodic SET task = ?, schedule = ? WHERE name = ?", (task, schedule, name)
            )
            return None if row[0] is None else tick_ms(str(row[1]), int(row[0]))

    def periodic_advance(self, name: str, tick: int, next_ms: int | None, fired: bool) -> None:
        """Record that ``tick`` was handled (fired, or skipped without catch-up); never
        moves back, so a slower scheduler cannot undo a faster one."""
        with self._write() as db:
            db.execute(
                "UPDATE periodic SET last_tick = ?, next_ms = ?, "
                "last_fired_ms = CASE WHEN ? THEN ? ELSE last_fired_ms END "
                "WHERE name = ? AND (last_tick IS NULL OR last_tick < ?)",
                (tick, next_ms, fired, now_ms(), name, tick),
            )

    def periodic_jobs(self) -> list[dict[str, Any]]:
        rows = self._read(
            "SELECT name, task, schedule, last_tick, last_fired_ms, next_ms FROM periodic "
            "ORDER BY name"
        )
        keys = ("name", "task", "schedule", "last_tick", "last_fired_ms", "next_ms")
        return [dict(zip(keys, row, strict=True)) for row in rows]


def _expiry(now: int, ttl_ms: int | None) -> int | None:
    return None if ttl_ms is None or ttl_ms < 0 else now + ttl_ms
