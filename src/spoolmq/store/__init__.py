"""The durable store: partitioned JSON-lines segments plus ``state.db``.

A library that knows nothing of processes or sockets; the broker sits on top of it and the
embedded API (:class:`Log`) uses it directly.
"""

from spoolmq.store.log import CheckProblem, CompactionResult, Log, Position, RetentionResult
from spoolmq.store.partition import RecoveryReport
from spoolmq.store.reader import Reader
from spoolmq.store.record import Message, Record

__all__ = [
    "CheckProblem",
    "CompactionResult",
    "Log",
    "Message",
    "Position",
    "Reader",
    "Record",
    "RecoveryReport",
    "RetentionResult",
]
