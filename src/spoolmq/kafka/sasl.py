"""SASL authentication of the Kafka front (owned by the kafka-groups work).

SaslHandshake (17) and SaslAuthenticate (36) with SCRAM-SHA-256, at the versions
docs/KAFKA.md lists. A handler that accepts the client sets
``ctx.authenticated = True`` and ``ctx.principal``; the server then serves every
other API on that connection. kafka/dispatch.py registers ``APIS``.
"""

from __future__ import annotations

from spoolmq.kafka.api import ApiHandler

APIS: list[ApiHandler] = []
