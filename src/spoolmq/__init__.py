"""spoolmq: a durable, file-based, multi-process message and task queue for one host."""

from spoolmq import errors
from spoolmq.allocator import tune_allocator
from spoolmq.client import (
    Admin,
    AsyncConsumer,
    AsyncPublisher,
    AsyncReceivedMessage,
    Consumer,
    Publisher,
    ReceivedMessage,
    run_workers,
)
from spoolmq.config import StoreConfig, TopicConfig
from spoolmq.store import Message, Position, Reader, Record, Store
from spoolmq.tasks import Tasks

__version__ = "0.1.0"

__all__ = [
    "Admin",
    "AsyncConsumer",
    "AsyncPublisher",
    "AsyncReceivedMessage",
    "Consumer",
    "Message",
    "Position",
    "Publisher",
    "Reader",
    "ReceivedMessage",
    "Record",
    "Store",
    "StoreConfig",
    "Tasks",
    "TopicConfig",
    "__version__",
    "errors",
    "run_workers",
    "tune_allocator",
]
