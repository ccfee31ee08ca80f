"""Produce (api key 0, v3-v6) and InitProducerId (22, v0-v1): Kafka writes through the
PublisherBroker's group commit.

Each partition's record set becomes one native publish frame (docs/PROTOCOL.md),
sent on the child's :class:`~spoolmq.kafka.link.PublisherLink`, so ``acks=-1`` is
answered after ``fdatasync``, ``acks=1`` after the write and ``acks=0`` not at all,
exactly as for spoolmq's own publishers; an error becomes a Kafka error code, never
a success the store did not give.

Idempotence: an idempotent Kafka producer numbers each partition's records from
``base_sequence``. Each (producer id, epoch, topic, partition) becomes one spoolmq
producer id and each record keeps its Kafka sequence, so a batch the producer
retries (after a timeout, a broker restart, a lost answer) is recognised by the
PublisherBroker and answered with its first copy's offsets, never stored twice.

Timestamps: spoolmq gives each record the time it was stored (its partitions'
timestamps never go back, which seeking by time relies on), so the Kafka front
behaves as a topic with ``message.timestamp.type=LogAppendTime``: the answer
carries that time in ``log_append_time`` and Fetch returns it.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson

from spoolmq.errors import BrokerUnavailableError, KafkaDecodeError, SpoolError
from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.core import KafkaCore, core_of, error_code_for, record_body
from spoolmq.kafka.records import RecordBatch, UnsupportedCompression, decode_batches
from spoolmq.kafka.wire import Reader, Writer
from spoolmq.protocol.publish import encode_publish_frame
from spoolmq.store.record import RECORD_OVERHEAD

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53

# What one partition's compressed record set may inflate to (a compression bomb
# stops here; a real batch is bounded by the producer's batch.size, 1 MiB at most
# by default).
MAX_INFLATED_BYTES = 128 * 1024 * 1024

# The producer id a non-idempotent Kafka producer's frames carry (no sequences).
_PLAIN_PRODUCER = "kafka-front"


def spool_producer_id(producer_id: int, epoch: int, topic: str, partition: int) -> str:
    """The spoolmq producer id of one Kafka producer's records on one partition.

    Kafka numbers sequences per partition and restarts them when the epoch changes.

    >>> spool_producer_id(42, 0, "orders", 2)
    'kafka-42.0.orders.2'
    """
    return f"kafka-{producer_id}.{epoch}.{topic}.{partition}"


class _PartitionResult:
    __slots__ = ("base_offset", "error", "log_append_time", "log_start_offset")

    def __init__(self, error: int, base_offset: int = -1, log_append_time: int = -1) -> None:
        self.error = error
        self.base_offset = base_offset
        self.log_append_time = log_append_time
        self.log_start_offset = -1


async def handle_produce(ctx: RequestContext, version: int, r: Reader) -> bytes | None:
    core = core_of(ctx)
    transactional_id = r.nullable_string()
    acks = r.int16()
    timeout_ms = r.int32()
    topics: list[tuple[str, list[tuple[int, bytes | None]]]] = []
    for _ in range(r.array_count(min_size=6)):
        topic = r.string()
        parts = []
        for _ in range(r.array_count(min_size=8)):
            parts.append((r.int32(), r.nullable_bytes()))
        topics.append((topic, parts))
    if transactional_id is not None:
        results = {
            (t, p): _PartitionResult(TRANSACTIONAL_ID_AUTHORIZATION_FAILED)
            for t, parts in topics
            for p, _ in parts
        }
    elif acks not in (-1, 0, 1):
        results = {
            (t, p): _PartitionResult(ErrorCode.INVALID_REQUIRED_ACKS)
            for t, parts in topics
            for p, _ in parts
        }
    else:
        jobs = [
            _produce_partition(core, topic, partition, data, acks, timeout_ms)
            for topic, parts in topics
            for partition, data in parts
        ]
        done = await asyncio.gather(*jobs)
        keys = [(t, p) for t, parts in topics for p, _ in parts]
        results = dict(zip(keys, done, strict=True))
    if acks == 0:
        return None  # Kafka sends no answer at all for acks=0
    w = Writer().int32(len(topics))
    for topic, parts in topics:
        w.string(topic).int32(len(parts))
        for partition, _ in parts:
            res = results[(topic, partition)]
            w.int32(partition).int16(res.error).int64(res.base_offset)
            w.int64(res.log_append_time)
            if version >= 5:
                w.int64(res.log_start_offset)
    w.int32(0)  # throttle_time_ms
    return w.getvalue()


async def _produce_partition(
    core: KafkaCore, topic: str, partition: int, data: bytes | None, acks: int, timeout_ms: int
) -> _PartitionResult:
    store = core.store
    try:
        config = store.topic_config(topic)
    except SpoolError as exc:
        return _PartitionResult(error_code_for(exc.code))
    if not 0 <= partition < config.partitions:
        return _PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    max_bytes = store.config.max_message_bytes
    try:
        batches = decode_batches(data or b"", MAX_INFLATED_BYTES)
    except UnsupportedCompression:
        return _PartitionResult(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
    except KafkaDecodeError:
        return _PartitionResult(ErrorCode.CORRUPT_MESSAGE)
    if not batches or any(b.transactional or b.control for b in batches):
        return _PartitionResult(
            ErrorCode.CORRUPT_MESSAGE if not batches else ErrorCode.INVALID_TXN_STATE
        )
    frames = []
    for batch in batches:
        built = _frame_records(batch, topic, partition, max_bytes)
        if isinstance(built, int):
            return _PartitionResult(built)
        frames.append(built)
    first: _PartitionResult | None = None
    for producer_id, records in frames:
        frame_id = core.link.next_id()
        frame = encode_publish_frame(
            frame_id, "all" if acks == -1 else str(acks), producer_id, topic, partition, records
        )
        try:
            answer = await asyncio.wait_for(
                core.link.publish(frame_id, frame, answer=acks != 0),
                timeout=max(timeout_ms, 1000) / 1000 + 30,
            )
        except (BrokerUnavailableError, TimeoutError):
            return _PartitionResult(ErrorCode.REQUEST_TIMED_OUT)
        core.count("produced_records", len(records))
        result = _PartitionResult(ErrorCode.NONE) if answer is None else _result_of(answer)
        if result.error != ErrorCode.NONE:
            return result
        if first is None:
            first = result
    return first if first is not None else _PartitionResult(ErrorCode.NONE)


def _frame_records(
    batch: RecordBatch, topic: str, partition: int, max_bytes: int
) -> tuple[str, list[bytes]] | int:
    """The publish-frame records of one batch and its producer id, or a Kafka error."""
    idempotent = batch.producer_id >= 0 and batch.base_sequence >= 0
    producer = (
        spool_producer_id(batch.producer_id, batch.producer_epoch, topic, partition)
        if idempotent
        else _PLAIN_PRODUCER
    )
    records = []
    limit = max_bytes - RECORD_OVERHEAD
    producer_json = orjson.dumps(producer)
    for index, rec in enumerate(batch.records):
        if rec.headers and any(not name for name, _ in rec.headers):
            return int(ErrorCode.CORRUPT_MESSAGE)
        # Kafka sequences wrap at 2^31; spoolmq's do not need to.
        tail = (
            b',"sequence":%d,"producer_id":%s' % (batch.base_sequence + index, producer_json)
            if idempotent
            else b""
        )
        body = record_body(rec.key, rec.value, rec.headers, tail)
        if len(body) > limit:
            return int(ErrorCode.MESSAGE_TOO_LARGE)
        records.append(body)
    return producer, records


def _result_of(answer: dict[str, Any]) -> _PartitionResult:
    if answer.get("op") == "error":
        return _PartitionResult(error_code_for(str(answer.get("code"))))
    errors = answer.get("errors")
    if errors:
        # The records were checked here first, so this is rare (a limit changed).
        first_error = next(iter(errors.values()))
        return _PartitionResult(error_code_for(str(first_error.get("code"))))
    ranges = answer.get("r") or []
    if not ranges:
        return _PartitionResult(ErrorCode.UNKNOWN_SERVER_ERROR)
    first = ranges[0]
    return _PartitionResult(ErrorCode.NONE, int(first[1]), int(first[2]))


# -- InitProducerId -----------------------------------------------------------------------


async def handle_init_producer_id(ctx: RequestContext, version: int, r: Reader) -> bytes:
    transactional_id = r.nullable_string()
    r.int32()  # transaction_timeout_ms
    w = Writer().int32(0)
    if transactional_id is not None:
        # Transactions are not supported (docs/KAFKA.md): a fatal error for the client.
        return w.int16(TRANSACTIONAL_ID_AUTHORIZATION_FAILED).int64(-1).int16(-1).getvalue()
    # A fresh random 47-bit id per producer session: unique without shared state,
    # and a restarted Kafka child never hands out an id still in use.
    producer_id = int.from_bytes(os.urandom(6), "big") >> 1
    return w.int16(ErrorCode.NONE).int64(producer_id).int16(0).getvalue()


APIS = [
    ApiHandler(ApiKey.PRODUCE, 3, 6, handle_produce, name="Produce"),
    ApiHandler(ApiKey.INIT_PRODUCER_ID, 0, 1, handle_init_producer_id, name="InitProducerId"),
]
