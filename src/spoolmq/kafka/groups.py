"""The group coordinator APIs of the Kafka front (owned by the kafka-groups work).

FindCoordinator, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, OffsetCommit,
OffsetFetch, ListGroups and DescribeGroups, at the versions docs/KAFKA.md lists.
kafka/dispatch.py registers every handler in ``APIS`` and advertises it in the
ApiVersions answer, so an API appears on the wire as soon as it is listed here.
"""

from __future__ import annotations

from spoolmq.kafka.api import ApiHandler

APIS: list[ApiHandler] = []
