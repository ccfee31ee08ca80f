"""The core Kafka APIs served by this front (metadata, produce, fetch, offsets, topics).

Each API lives in a module of its own; this one only gathers their handlers so
kafka/dispatch.py has a single list to join with groups.py and sasl.py.
"""

from __future__ import annotations

from spoolmq.kafka import fetch, produce, topics
from spoolmq.kafka.api import ApiHandler

APIS: list[ApiHandler] = [*produce.APIS, *fetch.APIS, *topics.APIS]
