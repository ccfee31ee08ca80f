"""The admin client: broker stats and live consumer-group views."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from typing import Any

from spoolmq import protocol
from spoolmq.client.connection import Address, connect, resolve
from spoolmq.config import known_settings
from spoolmq.errors import BrokerUnavailableError
from spoolmq.types import TopicPartition


class Admin:
    @known_settings
    def __init__(
        self,
        data: str | os.PathLike[str] | None = None,
        *,
        address: Address | None = None,
        authkey: bytes | None = None,
    ) -> None:
        target, key, _ = resolve(data, address, authkey)
        self._conn, self.client_id = connect(target, key, "admin")
        self._ids = 0

    def request(self, action: str, **fields: Any) -> dict[str, Any]:
        """Send one admin request and return its answer (the error it carries raised);
        BrokerUnavailableError if the broker is gone (stopped, or restarted: an Admin
        does not reconnect)."""
        self._ids += 1
        try:
            protocol.send(self._conn, {"op": "admin", "id": self._ids, "action": action, **fields})
            reply = protocol.receive(self._conn)
        except (EOFError, OSError) as exc:
            raise BrokerUnavailableError(
                f"lost the broker during {action!r} ({type(exc).__name__}): it stopped or restarted"
            ) from None
        protocol.raise_if_error(reply)
        return reply

    def stats(self) -> dict[str, Any]:
        return self.request("stats")

    def describe_groups(self) -> dict[str, Any]:
        groups: dict[str, Any] = self.request("describe_groups")["groups"]
        return groups

    def reset_group(self, group: str, offsets: Mapping[TopicPartition, int]) -> int:
        """Move ``group`` to ``offsets``; refused while it has live consumers."""
        reply = self.request(
            "reset_group", group=group, offsets=[[t, p, o] for (t, p), o in offsets.items()]
        )
        return int(reply.get("reset", 0))

    def delete_group(self, group: str) -> None:
        """Forget ``group`` (offsets, open deliveries); refused while it has live consumers."""
        self.request("delete_group", group=group)

    def delete_topic(self, topic: str) -> dict[str, Any]:
        """Delete ``topic`` while the broker runs: it stops serving it, tells its consumers
        (they drop what they hold of it), then deletes its files and state. Its DLQ
        (``<topic>.dlq``) is a topic of its own and stays. Returns ``{"deleted", "partitions",
        "groups", "consumers_told"}``; UnknownTopicError if there is no such topic."""
        reply = self.request("delete_topic", topic=topic)
        return {key: reply[key] for key in ("deleted", "partitions", "groups", "consumers_told")}

    def cancel_message(
        self, topic: str, partition: int, offset: int, *, reason: str | None = None
    ) -> dict[str, str]:
        """Cancel the stored message at ``topic``/``partition``@``offset``: no consumer
        group delivers it from now on, each recording a ``cancelled`` event (with
        ``reason``); one a consumer already holds is left alone. Kept in ``state.db``, so
        it holds across a broker restart. Returns per group what happened: ``cancelled``,
        ``pending`` (the group has not read that far yet: it passes over it when it does),
        ``in_flight`` (a consumer has it: not cancelled for that group) or ``finished``
        (already ACKed, dead-lettered or expired). Groups that start later pass over it.
        Kafka consumers, which read the log itself, still see it."""
        reply = self.request(
            "cancel", topic=topic, partition=partition, offset=offset, reason=reason
        )
        return dict(reply["groups"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            protocol.send(self._conn, {"op": "bye"})
        self._conn.close()

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
