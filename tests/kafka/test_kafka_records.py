"""Record batches checked against another implementation, kafka-python's: Produce's
decoding against its ``DefaultRecordBatchBuilder`` (varints of one, two and more bytes,
null and empty keys and values, negative timestamp deltas, headers, damaged records), and
Fetch's encoding against its ``DefaultRecordBatch`` reader."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka.records import OutRecord, crc32c, decode_batches, encode_batch

MAX = 1 << 26
Header = tuple[str, bytes | None]
Entry = tuple[int, bytes | None, bytes | None, list[Header]]
KEYS = st.none() | st.binary(max_size=300)
VALUES = st.none() | st.binary(max_size=20_000)
HEADERS = st.lists(st.tuples(st.text(min_size=1, max_size=20), st.none() | st.binary()), max_size=3)


def built(entries: list[Entry], *, base_timestamp: int = 1_763_830_000_000) -> bytes:
    """A magic-2 batch of ``entries`` (timestamp delta, key, value, headers), uncompressed,
    as kafka-python's producer builds it."""
    builder = DefaultRecordBatchBuilder(2, 0, False, 7, 0, 100, batch_size=1 << 30)
    for offset, (delta, key, value, headers) in enumerate(entries):
        builder.append(offset, base_timestamp + delta, key, value, headers)
    return bytes(builder.build())


def test_records_of_every_varint_width_come_back_as_sent() -> None:
    entries: list[Entry] = [
        (0, None, b'{"id":1}', []),  # one-byte lengths
        (5, b"k", b"v" * 200, []),  # a two-byte value length
        (-3, b"", b"", [("h", b"x"), ("empty", b""), ("null", None)]),  # a negative delta
        (70_000, b"k" * 70, b"w" * 9_000, []),  # a three-byte length, a long delta
        (1, b"\xff\xfe", None, [("n" * 100, b"y" * 300)]),  # a tombstone, long header
        (2, None, b"z" * 300_000, []),  # a length of three bytes and more
    ]
    (batch,) = decode_batches(built(entries), MAX)
    assert (batch.producer_id, batch.producer_epoch, batch.base_sequence) == (7, 0, 100)
    first = batch.first_timestamp
    got = [
        (r.offset_delta, r.timestamp - first, r.key, r.value, list(r.headers))
        for r in batch.records
    ]
    assert got == [(i, d, k, v, h) for i, (d, k, v, h) in enumerate(entries)]


def test_offset_deltas_and_lengths_across_each_varint_width_boundary() -> None:
    """8,200 records: offset deltas of one, two and three bytes (zigzag 63/64 and
    8191/8192), timestamp deltas and value lengths (and so record lengths) on either side
    of the same boundaries: the decoder reads the one- and two-byte forms inline."""
    sizes = [0, 62, 63, 64, 65, 8_180, 8_191, 8_192, 8_200]
    deltas = [0, 31, 32, -32, -33, 63, 64, 4_095, 4_096, -4_096, -4_097, 70_000]
    entries: list[Entry] = [
        (deltas[i % len(deltas)], None, b"v" * sizes[i % len(sizes)], []) for i in range(8_200)
    ]
    (batch,) = decode_batches(built(entries), MAX)
    assert [r.offset_delta for r in batch.records] == list(range(8_200))
    assert [r.value for r in batch.records] == [v for _, _, v, _ in entries]
    assert [r.timestamp - batch.first_timestamp for r in batch.records] == [d for d, *_ in entries]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(-(2**31), 2**31),
            KEYS,
            VALUES,
            HEADERS,
        ),
        min_size=1,
        max_size=20,
    )
)
def test_any_batch_another_encoder_builds_decodes_to_what_it_holds(entries: list[Entry]) -> None:
    (batch,) = decode_batches(built(entries, base_timestamp=2**40), MAX)
    got = [
        (r.timestamp - 2**40 - entries[0][0], r.key, r.value, list(r.headers))
        for r in batch.records
    ]
    # The first record's timestamp is the batch's: the others are deltas from it.
    assert got == [(d - entries[0][0], k, v, h) for d, k, v, h in entries]
    assert [r.offset_delta for r in batch.records] == list(range(len(entries)))


def _with_payload(batch: bytes, payload: bytes, count: int) -> bytes:
    """``batch`` with its records replaced by ``payload`` (count and CRC made to match), so
    that a damaged record reaches the record decoder rather than the CRC check."""
    head = bytearray(batch[:61])
    struct.pack_into(">i", head, 57, count)
    struct.pack_into(">i", head, 8, len(head) + len(payload) - 12)
    struct.pack_into(">I", head, 17, crc32c(bytes(head[21:]) + payload))
    return bytes(head) + payload


@pytest.mark.parametrize(
    "minus_one", [b"\x01", b"\x81\x00", b"\x81\x80\x00", b"\x81\x80\x80\x80\x00"]
)
def test_a_null_key_or_value_may_have_its_length_written_longer(minus_one: bytes) -> None:
    """-1 (null) in any varint form Kafka's own reader takes, not only the shortest."""
    fields = b"\x00\x00\x00" + minus_one + minus_one + b"\x00"
    payload = bytes([len(fields) << 1]) + fields
    (batch,) = decode_batches(_with_payload(built([(0, None, b"v", [])]), payload, 1), MAX)
    assert [(r.key, r.value) for r in batch.records] == [(None, None)]


@pytest.mark.parametrize(
    ("payload", "count", "says"),
    [
        # Length 6, then the header count is missing: the batch ends inside the record.
        (b"\x0c\x00\x00\x00\x01\x02v", 1, "past the end of its batch"),
        (b"\x08\x00\x00\x00\x7f\x00\x00\x00", 1, "key length -64"),
        (b"\x08\x00\x00\x00\x0ekkkkkkk", 1, "key length 7"),  # 7 bytes in a record of 4
        (b"\x0a\x00\x00\x00\x01\x10vvvvvvvv\x00", 1, "value length 8"),
        (b"\x0c\x00\x00\x00\x01\x01\x06", 1, "3 headers cannot fit in 0 bytes"),
        (b"\x0c\x00" + b"\xff" * 10 + b"\x01", 1, "varint longer than 10 bytes"),
        (b"\x0f\x00\x00\x00\x01\x01\x00", 1, "record length -8"),
        # Length 4, but its null value and header count take two bytes more.
        (b"\x08\x00\x00\x00\x01\x01\x00", 1, "runs past its length"),
    ],
)
def test_a_damaged_record_is_a_decode_error(payload: bytes, count: int, says: str) -> None:
    """The same error from decoding the records and from Produce's one pass over them,
    which makes their publish-frame records as it reads them."""
    from spoolmq.kafka.core import batch_bodies

    batch = _with_payload(built([(0, None, b"v", [])]), payload, count)
    with pytest.raises(KafkaDecodeError, match=says):
        decode_batches(batch, MAX)
    (undecoded,) = decode_batches(batch, MAX, records=False)
    with pytest.raises(KafkaDecodeError, match=says):
        batch_bodies(undecoded.payload, undecoded.count)


Out = tuple[int, int, bytes | None, bytes | None, list[Header]]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(0, 2**20),  # offset gaps (compaction)
            st.integers(0, 2**33),  # timestamp steps
            KEYS,
            VALUES,
            HEADERS,
        ),
        min_size=1,
        max_size=20,
    )
)
def test_fetch_batches_read_back_in_another_decoder(entries: list[Out]) -> None:
    """What Fetch sends, read by kafka-python's own batch reader (CRC checked)."""
    offset, timestamp = 1_000, 1_763_830_000_000
    records = []
    for gap, step, key, value, headers in entries:
        offset += gap + 1
        timestamp += step
        records.append(OutRecord(offset, timestamp, key, value, headers))
    batch = DefaultRecordBatch(encode_batch(records))
    assert batch.validate_crc()
    assert (batch.base_offset, batch.records_count) == (records[0].offset, len(records))
    got = [(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch]
    assert got == [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in records]
