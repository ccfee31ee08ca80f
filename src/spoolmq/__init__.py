"""spoolmq: a durable, file-based, multi-process message and task queue for one host."""

from spoolmq import errors
from spoolmq.client import Admin, Consumer, Publisher, ReceivedMessage, run_workers
from spoolmq.config import StoreConfig, TopicConfig
from spoolmq.store import Log, Message, Position, Reader, Record

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "Consumer",
    "Log",
    "Message",
    "Position",
    "Publisher",
    "Reader",
    "ReceivedMessage",
    "Record",
    "StoreConfig",
    "TopicConfig",
    "__version__",
    "errors",
    "run_workers",
]
