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
import functools
import os
from typing import Any

from spoolmq.errors import BrokerUnavailableError, KafkaDecodeError, SpoolError
from spoolmq.kafka.api import ApiHandler, ApiKey, ErrorCode, RequestContext
from spoolmq.kafka.core import KafkaCore, batch_bodies, core_of, error_code_for
from spoolmq.kafka.records import (
    Budget,
    ExtraBatch,
    InflatesTooLarge,
    RecordBatch,
    TooManyRecords,
    UnstorableRecord,
    UnsupportedCompression,
    decode_batches,
)
from spoolmq.kafka.wire import Reader, Writer
from spoolmq.protocol.frames import MAX_FRAME_BYTES
from spoolmq.protocol.publish import encode_checked_frame, encode_publish_frame, frame_count
from spoolmq.store.record import RECORD_OVERHEAD

TRANSACTIONAL_ID_AUTHORIZATION_FAILED = 53

# What the compressed batches of one Produce request may inflate to, all partitions
# together (a compression bomb stops here, and no more than this is ever allocated for
# it; a real batch is bounded by the producer's batch.size, 1 MiB by default, and a
# request by max.request.size, 1 MiB in Java, before compression).
MAX_INFLATED_BYTES = 128 * 1024 * 1024
# The records one Produce request may hold, all partitions together, and what a record
# takes in memory once decoded and made into a publish-frame record (measured: 276 bytes
# for a one-byte value, which goes on the wire in 10). Java's and librdkafka's requests
# are 1 MB at most by default: some 100,000 records of a few bytes. 200,000 records take
# about a second of the child's loop to decode and frame.
MAX_RECORDS_PER_REQUEST = 200_000
HELD_PER_RECORD = 280

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
        budget = _Budget()
        prepared = [
            _prepare(core, topic, partition, data, budget)
            for topic, parts in topics
            for partition, data in parts
        ]
        ctx.holds(budget.held())  # until answered, as the frame is
        done = await _send_in_turn(ctx, core, prepared, acks, timeout_ms)
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


class _Frame:
    """One partition's record set (one batch), checked and made into a publish frame's
    producer id and records, with what the pre-checked form carries beside them: the
    first record's sequence, the key identities (None: no key) and the records with
    headers."""

    __slots__ = (
        "first_sequence",
        "headed",
        "identities",
        "partition",
        "producer_id",
        "records",
        "topic",
    )

    def __init__(self, topic: str, partition: int, built: _Built) -> None:
        self.topic, self.partition = topic, partition
        self.producer_id, self.records, self.first_sequence, self.identities, self.headed = built


class _Budget(Budget):
    """What the partitions of one Produce request may still inflate to and hold, and what
    they hold."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__(MAX_INFLATED_BYTES, MAX_RECORDS_PER_REQUEST)

    def held(self) -> int:
        """The bytes taken: what was inflated, and the records decoded."""
        return self.inflated + self.records_taken * HELD_PER_RECORD


def _prepare(
    core: KafkaCore, topic: str, partition: int, data: bytes | None, budget: _Budget
) -> _Frame | _PartitionResult:
    """Decode and check one partition's record set within what is left of the request's
    ``budget`` (and take its share): its frame, or the error it gets (nothing of it is
    stored then). A record set that does not decode (its records included), or inflates
    past the budget, ends the inflating for the rest of the
    request: a request cannot make the child inflate (and then drop) the budget's worth
    once per partition it lists. One refused for its records' count, from a batch header,
    has inflated nothing and ends nothing. A transactional or control batch is refused
    before its records are read (INVALID_TXN_STATE, whatever they hold); what it inflated
    was drawn from the budget all the same."""
    store = core.store
    try:
        config = store.topic_config(topic)
    except SpoolError as exc:
        return _PartitionResult(error_code_for(exc.code))
    if not 0 <= partition < config.partitions:
        return _PartitionResult(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
    max_bytes = store.config.max_message_bytes
    try:
        # One batch a partition, as Kafka takes from Produce v3 on (clients send one).
        # Its records are read as their publish-frame records are made (_frame_records).
        batches = decode_batches(data or b"", budget, produced=True, records=False)
    except TooManyRecords:  # nothing inflated: refused from the header
        return _PartitionResult(ErrorCode.MESSAGE_TOO_LARGE)
    except KafkaDecodeError as exc:
        budget.inflate = 0
        if isinstance(exc, UnsupportedCompression):
            return _PartitionResult(ErrorCode.UNSUPPORTED_COMPRESSION_TYPE)
        if isinstance(exc, InflatesTooLarge):
            return _PartitionResult(ErrorCode.MESSAGE_TOO_LARGE)
        if isinstance(exc, ExtraBatch):
            return _PartitionResult(ErrorCode.INVALID_RECORD)
        return _PartitionResult(ErrorCode.CORRUPT_MESSAGE)
    if not batches:  # no record set at all
        return _PartitionResult(ErrorCode.CORRUPT_MESSAGE)
    (batch,) = batches
    if batch.transactional or batch.control:
        return _PartitionResult(ErrorCode.INVALID_TXN_STATE)
    built = _frame_records(batch, topic, partition, max_bytes, braces=not core.link.prechecked)
    if isinstance(built, int):
        if built == ErrorCode.CORRUPT_MESSAGE:
            budget.inflate = 0  # records that do not decode end the inflating too
        return _PartitionResult(built)
    return _Frame(topic, partition, built)


# A connection's requests are read and started without waiting for the answers before
# them (server.py pipelines Produce), but must reach the PublisherBroker in the order they
# came: each Produce request sends its frames once the one before it has sent all of its
# own, then waits for its answers beside the later requests. The connection's scratch
# space holds the last request's "all sent" future under this key.
_SENT = "produce_sent"
# A partition's frame once sent: its answer to come (None with acks=0), and the frame.
_Sent = tuple[asyncio.Future[dict[str, Any]] | None, _Frame]


async def _send_in_turn(
    ctx: RequestContext,
    core: KafkaCore,
    prepared: list[_Frame | _PartitionResult],
    acks: int,
    timeout_ms: int,
) -> list[_PartitionResult]:
    """Send the frames of ``prepared`` in this connection's turn, then wait for their
    answers: one result per partition."""
    # Taken before the first await: the server starts a connection's requests in the order
    # they came, and each runs to here before another runs at all.
    before: asyncio.Future[None] | None = ctx.conn.get(_SENT)
    sent: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    ctx.conn[_SENT] = sent
    timeout = max(timeout_ms, 1000) / 1000 + 30
    deadline = asyncio.get_running_loop().time() + timeout  # for connecting and sending
    waits: list[_PartitionResult | _Sent] = []
    try:
        try:
            if before is not None:
                # Shielded: this request cancelled (its connection ending) must not cancel
                # the one before it.
                await asyncio.shield(before)
            for item in prepared:
                waits.append(
                    item
                    if isinstance(item, _PartitionResult)
                    else await _send(core, item, acks, deadline)
                )
        finally:
            if before is not None and not before.done():
                # Cancelled while the one before is still sending: the turn passes on once
                # that one has sent, never earlier.
                before.add_done_callback(functools.partial(_pass_turn, sent))
            else:
                _pass_turn(sent)
            if ctx.conn.get(_SENT) is sent:
                del ctx.conn[_SENT]
        # The partitions' answers, waited for together (each frame has its own timeout).
        answers = iter(
            await asyncio.gather(
                *(_answered(core, *item, timeout) for item in waits if isinstance(item, tuple))
            )
        )
    except BaseException:
        # Cancelled (the connection ended): the answers are not waited for. Cancelled,
        # their futures log nothing when the link is lost later and fails what waits; and
        # cancel() marks the error of one that failed already as seen (asyncio's futures
        # clear their "never retrieved" flag first, done or not).
        for waiting in waits:
            if isinstance(waiting, tuple) and waiting[0] is not None:
                waiting[0].cancel()
        raise
    return [next(answers) if isinstance(item, tuple) else item for item in waits]


def _pass_turn(sent: asyncio.Future[None], _: object = None) -> None:
    if not sent.done():
        sent.set_result(None)


async def _send(
    core: KafkaCore, item: _Frame, acks: int, deadline: float
) -> _PartitionResult | _Sent:
    """Send one partition's frame: its error, or what to wait for (its answer, None with
    ``acks=0``). Connecting takes until the request's ``deadline`` (the event loop's
    clock) at most."""
    link = core.link
    frame_id = link.next_id()
    level = "all" if acks == -1 else str(acks)
    if link.prechecked:  # the records are the stored lines' middles (``_prepare``)
        frame = encode_checked_frame(
            frame_id,
            level,
            item.producer_id,
            item.topic,
            item.partition,
            item.records,
            item.first_sequence,
            item.identities,
            item.headed,
        )
    else:
        frame = encode_publish_frame(
            frame_id, level, item.producer_id, item.topic, item.partition, item.records
        )
    if len(frame) > MAX_FRAME_BYTES:
        # The PublisherBroker would end the link at its length (the identities beside
        # many long keys can make the pre-checked form the longer). A Kafka producer
        # splits a batch refused so and sends it again.
        return _PartitionResult(ErrorCode.MESSAGE_TOO_LARGE)
    try:
        future = await link.send(
            frame_id,
            frame,
            answer=acks != 0,
            connect_timeout=max(deadline - asyncio.get_running_loop().time(), 0.001),
        )
    except (BrokerUnavailableError, TimeoutError):
        return _PartitionResult(ErrorCode.REQUEST_TIMED_OUT)
    return future, item


async def _answered(
    core: KafkaCore, future: asyncio.Future[dict[str, Any]] | None, item: _Frame, timeout: float
) -> _PartitionResult:
    """The result of a sent frame."""
    answer = None
    if future is not None:
        try:
            answer = await asyncio.wait_for(future, timeout=timeout)
        except (BrokerUnavailableError, TimeoutError):
            return _PartitionResult(ErrorCode.REQUEST_TIMED_OUT)
    core.count("produced_records", len(item.records))
    return _PartitionResult(ErrorCode.NONE) if answer is None else _result_of(answer)


# A batch's producer id and publish-frame records, their first sequence, their key
# identities (None: no record has a key) and the indexes of those with headers.
_Built = tuple[str, list[bytes], int | None, list[str | None] | None, list[int]]


def _frame_records(
    batch: RecordBatch, topic: str, partition: int, max_bytes: int, *, braces: bool = True
) -> _Built | int:
    """The publish-frame records of one batch, with its producer id and what the
    pre-checked form carries beside them (``_Built``), or a Kafka error."""
    if batch.producer_id >= 0 and batch.base_sequence >= 0:  # idempotent
        producer = spool_producer_id(batch.producer_id, batch.producer_epoch, topic, partition)
        first_sequence: int | None = batch.base_sequence
    else:
        producer, first_sequence = _PLAIN_PRODUCER, None
    keyed: list[tuple[int, str]] = []
    headed: list[int] = []
    try:
        records = batch_bodies(
            batch.payload,
            batch.count,
            first_sequence,
            producer,
            keyed=keyed,
            headed=headed,
            braces=braces,
        )
    except UnstorableRecord:  # a header with an empty name: not retried by the producer
        return int(ErrorCode.INVALID_RECORD)
    except KafkaDecodeError:  # records that do not decode
        return int(ErrorCode.CORRUPT_MESSAGE)
    # Without braces, each record is two bytes short of what the limit counts.
    if max(map(len, records), default=0) + (0 if braces else 2) > max_bytes - RECORD_OVERHEAD:
        return int(ErrorCode.MESSAGE_TOO_LARGE)
    if frame_count(records) < len(records):
        # More than one publish frame carries (the PublisherBroker would end the link at
        # its length). A Kafka producer splits a batch refused so and sends it again.
        return int(ErrorCode.MESSAGE_TOO_LARGE)
    identities: list[str | None] | None = None
    if keyed:
        identities = [None] * len(records)
        for index, identity in keyed:
            identities[index] = identity
    return producer, records, first_sequence, identities, headed


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
    ApiHandler(ApiKey.PRODUCE, 3, 6, handle_produce, name="Produce", pipelined=True),
    ApiHandler(ApiKey.INIT_PRODUCER_ID, 0, 1, handle_init_producer_id, name="InitProducerId"),
]
