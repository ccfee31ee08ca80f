"""A delivered message's record and delivery, and the consumer it came through: the base
of the threaded ``ReceivedMessage`` (client/consumer.py) and the asyncio
``AsyncReceivedMessage`` (client/aio.py), which add ``ack``/``nack``/``extend_lease``
through that consumer."""

from __future__ import annotations

import zlib
from typing import Any

import orjson

from spoolmq.errors import ProtocolError
from spoolmq.store.message import Headers, priority_of
from spoolmq.store.record import Record, check_line, record_from_fields

_CRC_MARK = b',"crc":'
_crc32 = zlib.crc32


class DeliveredRecord:
    """A delivered message: the stored record plus its delivery (attempt, lease); what
    the threaded and the asyncio consumers' messages share (they add ack, nack, extend).

    The stored line is checked (CRC) and decoded once, on the first access to a field of
    the record (``value``, ``key``, ``headers``, ``tags``, ``timestamp``, ...): a handler
    that looks only at some messages, or ACKs them unread, pays for no JSON parse.
    """

    __slots__ = (
        "_consumer",
        "_generation",
        "_line",
        "_parsed",
        "_record",
        "attempt",
        "offset",
        "partition",
        "settled",
        "tag",
        "topic",
    )

    def __init__(
        self,
        consumer: Any,
        generation: int,
        topic: str,
        partition: int,
        offset: int,
        tag: int,
        attempt: int,
        line: bytes,
    ) -> None:
        self._consumer = consumer  # the subclass's consumer, which settles the message
        self._generation = generation
        self.topic = topic
        self.partition = partition
        self.offset = offset
        self.tag = tag
        self.attempt = attempt
        self._line = line
        self._parsed: dict[str, Any] | None = None
        self._record: Record | None = None
        self.settled = False

    def _fields(self) -> dict[str, Any]:
        """The record's fields, its CRC checked, parsed once."""
        fields = self._parsed
        if fields is None:
            # verified_fields, inlined (a call a message less): the CRC of all before
            # `,"crc":`, whose digits end two bytes before the newline; then the parse,
            # which fails unless the object closes right there.
            line = self._line
            head, mark, tail = line.rpartition(_CRC_MARK)
            try:
                if mark and tail[-1:] == b"\n" and _crc32(head) == int(tail[:-2]):
                    fields = orjson.loads(line)
            except ValueError:  # an unreadable checksum, or bad JSON (JSONDecodeError)
                fields = None
            if type(fields) is not dict or type(fields.get("offset")) is not int:
                check_line(self._line)  # raises the CorruptRecordError that says what is wrong
                raise ProtocolError("an unreadable record line")  # pragma: no cover
            if fields["offset"] != self.offset:
                raise ProtocolError(
                    f"delivery {self.tag} says offset {self.offset}, its record {fields['offset']}"
                )
            self._parsed = fields
            self._line = b""  # parsed: the bytes are no longer needed
        return fields

    def _decoded(self) -> Record:
        record = self._record
        if record is None:
            record = self._record = record_from_fields(self._fields())
        return record

    @property
    def value(self) -> Any:
        fields = self._parsed
        if fields is None:
            fields = self._fields()
        if "value_b64" in fields:  # raw bytes: the record decodes its base64
            return self._decoded().value
        return fields.get("value")

    @property
    def key(self) -> str | bytes | None:
        return self._decoded().key

    @property
    def headers(self) -> Headers:
        return self._decoded().headers

    @property
    def priority(self) -> int:
        """0-9, as published (``priority=``); 0 for a message published without one."""
        return priority_of(self.headers)

    @property
    def tags(self) -> tuple[str, ...]:
        return self._decoded().tags

    @property
    def timestamp(self) -> int:
        return self._decoded().timestamp

    @property
    def deliver_at(self) -> int | None:
        return self._decoded().deliver_at

    @property
    def expires_at(self) -> int | None:
        return self._decoded().expires_at

    def __repr__(self) -> str:
        key = repr(self.key) if self._parsed is not None else "<not decoded>"
        return (
            f"{type(self).__name__}(topic={self.topic!r}, partition={self.partition}, "
            f"offset={self.offset}, attempt={self.attempt}, key={key})"
        )
