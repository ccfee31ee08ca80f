"""Clients: they speak the wire protocol and never import the broker."""

from spoolmq.client.admin import Admin
from spoolmq.client.aio import AsyncConsumer, AsyncPublisher, AsyncReceivedMessage
from spoolmq.client.consumer import Consumer, ReceivedMessage
from spoolmq.client.publisher import Publisher
from spoolmq.client.workers import run_workers

__all__ = [
    "Admin",
    "AsyncConsumer",
    "AsyncPublisher",
    "AsyncReceivedMessage",
    "Consumer",
    "Publisher",
    "ReceivedMessage",
    "run_workers",
]
