"""The durable store: partitioned JSON-lines segments plus ``state.db``.

A library that knows nothing of processes or sockets; the broker sits on top of it and the
embedded API (:class:`Store`) uses it directly.
"""

from spoolmq.store.message import Message, Position
from spoolmq.store.reader import Reader
from spoolmq.store.record import Record
from spoolmq.store.recovery import RecoveryReport
from spoolmq.store.store import CheckProblem, CompactionResult, RetentionResult, Store

__all__ = [
    "CheckProblem",
    "CompactionResult",
    "Message",
    "Position",
    "Reader",
    "Record",
    "RecoveryReport",
    "RetentionResult",
    "Store",
]
