"""Requests a client sends without waiting for the answers (Kafka clients keep up to five
Produce requests in flight): answered in request order and stored in request order, with
errors and other requests among them."""

from __future__ import annotations

import socket
import struct
from pathlib import Path

from kafka_helpers import (
    call,
    kafka_broker,
    produce_answer,
    produce_body,
    recv_exact,
    request_frame,
)

from spoolmq import Store
from spoolmq.kafka.api import ApiKey, ErrorCode
from spoolmq.kafka.records import OutRecord, encode_batch
from spoolmq.kafka.wire import Reader


def _batch(producer_id: int, sequence: int, values: list[bytes]) -> bytes:
    records = [OutRecord(i, 1000, None, v, []) for i, v in enumerate(values)]
    return encode_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=sequence)


def _answer(sock: socket.socket) -> tuple[int, Reader]:
    (size,) = struct.unpack(">i", recv_exact(sock, 4))
    reader = Reader(recv_exact(sock, size))
    return reader.int32(), reader


def test_back_to_back_requests_are_answered_and_stored_in_order(tmp_path: Path) -> None:
    data = tmp_path / "queue_data"
    metadata = struct.pack(">i", 1) + struct.pack(">h", 4) + b"pipe"
    with (
        kafka_broker(data) as (_, address),
        socket.create_connection(tuple(address.split(":")), timeout=60) as sock,  # type: ignore[arg-type]
    ):
        call(sock, ApiKey.METADATA, 1, metadata)  # creates the topic
        # The first Produce connects the Kafka child to the PublisherBroker.
        warm = _batch(77, 0, [b"w"])
        assert produce_answer(call(sock, ApiKey.PRODUCE, 3, produce_body("pipe", 0, warm)))[0] == 0
        requests: list[tuple[int, bytes]] = []
        answers: list[tuple[int, int] | None] = []  # (error, base offset) of each Produce
        expected: list[bytes] = [b"w"]
        sequence, offset = 1, 1
        for i in range(12):
            if i == 5:
                requests.append((ApiKey.METADATA, metadata))  # served in turn
                answers.append(None)
                continue
            values = [b"r%d-%d" % (i, j) for j in range(3)]
            partition = 9 if i == 3 else 0  # the topic has one partition
            if i == 10:
                record_set = b"\0" * 70  # not a batch
                answers.append((ErrorCode.CORRUPT_MESSAGE, -1))
            elif partition != 0:
                record_set = _batch(88, 0, values)
                answers.append((ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, -1))
            else:
                record_set = _batch(77, sequence, values)
                if i == 8:
                    # Two batches for one partition: refused whole, as Kafka does from
                    # Produce v3 on; nothing of it is stored, and the sequence goes on.
                    record_set += _batch(77, sequence + 3, [b"r%d-more" % i])
                    answers.append((ErrorCode.INVALID_RECORD, -1))
                else:
                    answers.append((ErrorCode.NONE, offset))
                    sequence += len(values)
                    offset += len(values)
                    expected += values
            requests.append((ApiKey.PRODUCE, produce_body("pipe", partition, record_set)))
        # All at once, before reading any answer.
        sock.sendall(
            b"".join(
                request_frame(api, 1 if api == ApiKey.METADATA else 3, 100 + n, body)
                for n, (api, body) in enumerate(requests)
            )
        )
        for n, answer in enumerate(answers):
            correlation_id, reader = _answer(sock)
            assert correlation_id == 100 + n
            if answer is not None:
                # Each request's records right after the previous stored request's.
                assert produce_answer(reader) == answer, f"request {n}"
    with Store(data) as store:
        stored = [r.value for r in store.reader("pipe", 0).poll_batch(1000)]
    assert stored == expected
