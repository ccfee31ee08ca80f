"""Compressed Produce batches inflate within a bound, and never past it: each of Kafka's
four codecs gives back what was compressed up to the limit and refuses one byte more, a
record set's batches share one limit, and a compression bomb (a few kilobytes that
claim a gigabyte) is refused without the gigabyte ever being allocated, in-process and
through a running broker's Kafka listener."""

from __future__ import annotations

import socket
import struct
import subprocess
import sys
import textwrap
import tracemalloc
import zlib
from pathlib import Path

import cramjam
import pytest
from kafka_helpers import batch_around, call, kafka_broker, produce_answer, produce_body

from spoolmq.errors import KafkaDecodeError
from spoolmq.kafka import records
from spoolmq.kafka.api import ApiKey, ErrorCode
from spoolmq.kafka.records import (
    COMPRESSION_GZIP,
    COMPRESSION_LZ4,
    COMPRESSION_SNAPPY,
    COMPRESSION_ZSTD,
    ExtraBatch,
    InflatesTooLarge,
    OutRecord,
    TooManyRecords,
    compress,
    decode_batches,
    decompress,
    encode_batch,
)

MIB = 1024 * 1024
CODECS = {
    "gzip": COMPRESSION_GZIP,
    "snappy": COMPRESSION_SNAPPY,
    "lz4": COMPRESSION_LZ4,
    "zstd": COMPRESSION_ZSTD,
}


def _data(size: int) -> bytes:
    """``size`` bytes that compress well (so the inflating buffers have to grow) but are
    not all alike (so a wrong slice shows)."""
    line = b"".join(b"%08d," % i for i in range(4096))
    return (line * (size // len(line) + 1))[:size]


def _zero_bomb(codec: str, size: int) -> bytes:
    """A stream that inflates to ``size`` zero bytes, built a mebibyte at a time."""
    chunk = bytes(MIB)
    if codec == "gzip":
        deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        parts = [deflater.compress(chunk) for _ in range(size // MIB)]
        return b"".join(parts) + deflater.flush()
    compressor = cramjam.zstd.Compressor(3) if codec == "zstd" else cramjam.lz4.Compressor()
    for _ in range(size // MIB):
        compressor.compress(chunk)
    return bytes(compressor.finish())


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("size", [0, 1, 70_000, 3 * MIB])
def test_each_codec_gives_back_up_to_the_limit_and_refuses_one_byte_more(
    codec: str, size: int
) -> None:
    data = _data(size)
    packed = compress(CODECS[codec], data)
    assert decompress(CODECS[codec], packed, size) == data
    assert decompress(CODECS[codec], packed, size + 100) == data
    if size:
        with pytest.raises(InflatesTooLarge):
            decompress(CODECS[codec], packed, size - 1)


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize("damage", ["cut short", "bytes after its end", "garbled"])
def test_a_damaged_block_is_refused_as_damaged_at_once(codec: str, damage: str) -> None:
    """Damaged, not too large (CORRUPT_MESSAGE, not MESSAGE_TOO_LARGE), and refused from
    the first small buffer: it is not inflated again into larger ones up to the limit."""
    packed = compress(CODECS[codec], _data(70_000))
    if damage == "cut short":
        damaged = packed[: len(packed) // 2]
    elif damage == "bytes after its end":
        damaged = packed + b"\x00junk\xff"
    else:
        damaged = packed[:12] + bytes(b ^ 0x5A for b in packed[12:40]) + packed[40:]
    tracemalloc.start()
    try:
        with pytest.raises(KafkaDecodeError) as refused:
            decompress(CODECS[codec], damaged, 128 * MIB)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert not isinstance(refused.value, InflatesTooLarge), refused.value
    assert peak < 8 * MIB, f"{peak} bytes taken to refuse a {len(damaged)}-byte block"


def test_a_snappy_block_that_claims_too_much_is_refused_from_its_header() -> None:
    # Raw snappy starts with the inflated length (a varint): here 4 GiB - 1, then junk.
    claim = b"\xff\xff\xff\xff\x0f" + bytes(64)
    with pytest.raises(InflatesTooLarge):
        decompress(COMPRESSION_SNAPPY, claim, MIB)
    # The same in Java's xerial framing: magic, two versions, then sized chunks.
    xerial = b"\x82SNAPPY\x00" + bytes(8)
    chunk = compress(COMPRESSION_SNAPPY, _data(600_000))
    framed = xerial + (len(chunk).to_bytes(4, "big") + chunk) * 2
    assert decompress(COMPRESSION_SNAPPY, framed, 1_200_000) == _data(600_000) * 2
    with pytest.raises(InflatesTooLarge):  # the second chunk passes what is left
        decompress(COMPRESSION_SNAPPY, framed, 1_000_000)


@pytest.mark.parametrize("codec", CODECS)
def test_the_batches_of_a_record_set_share_one_limit(codec: str) -> None:
    values = [_data(200_000) + b"%d" % i for i in range(3)]
    batches = [
        encode_batch([OutRecord(0, 1000, None, value, [])], compression=CODECS[codec])
        for value in values
    ]
    record_set = b"".join(batches)
    decoded = decode_batches(record_set, 3 * 200_100)
    assert [batch.records[0].value for batch in decoded] == values
    assert all(batch.inflated > 200_000 for batch in decoded)
    # Each batch alone fits in this limit; the three together do not.
    assert decode_batches(batches[2], 400_000)[0].records[0].value == values[2]
    with pytest.raises(InflatesTooLarge):
        decode_batches(record_set, 400_000)


BOMB_CHECK = textwrap.dedent(
    """
    import resource, sys
    from pathlib import Path
    from spoolmq.kafka.records import InflatesTooLarge, decompress
    codec, path, limit = int(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    bomb = path.read_bytes()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        decompress(codec, bomb, limit)
    except InflatesTooLarge:
        pass
    else:
        sys.exit("not refused")
    print((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024)
    """
)


@pytest.mark.parametrize(
    ("codec", "claims"), [("zstd", 1024 * MIB), ("lz4", 256 * MIB), ("gzip", 256 * MIB)]
)
def test_a_bomb_is_refused_without_inflating_it(tmp_path: Path, codec: str, claims: int) -> None:
    bomb = tmp_path / "bomb"
    bomb.write_bytes(_zero_bomb(codec, claims))
    assert bomb.stat().st_size < claims // 50
    # In a process of its own, so that its peak memory is this decompression's.
    grown = subprocess.run(
        [sys.executable, "-c", BOMB_CHECK, str(CODECS[codec]), str(bomb), str(16 * MIB)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    # One buffer of the limit (16 MiB) at most, never the claim.
    assert int(grown.stdout) < 64, f"peak memory grew {grown.stdout.strip()} MiB"


def test_a_bomb_sent_to_the_kafka_listener_is_answered_and_costs_no_gigabyte(
    tmp_path: Path,
) -> None:
    block = _zero_bomb("zstd", 2048 * MIB)  # 2 GiB of zeros: past a request's 128 MiB
    bomb = batch_around(block, 1, COMPRESSION_ZSTD)
    with kafka_broker(tmp_path / "data") as (broker, address):
        pid = broker.stats()["pids"]["kafka"]

        def peak_mib() -> int:
            status = Path(f"/proc/{pid}/status").read_text()
            line = next(x for x in status.splitlines() if x.startswith("VmHWM:"))
            return int(line.split()[1]) // 1024

        before = peak_mib()
        host, port = address.split(":")
        with socket.create_connection((host, int(port)), timeout=60) as sock:
            metadata = struct.pack(">ih", 1, 6) + b"bombed"
            call(sock, ApiKey.METADATA, 1, metadata)  # creates the topic
            answer = call(sock, ApiKey.PRODUCE, 3, produce_body("bombed", 0, bomb))
            assert produce_answer(answer)[0] == ErrorCode.MESSAGE_TOO_LARGE
            # The connection still serves, and a real batch is stored.
            good = encode_batch(
                [OutRecord(0, 1000, None, b'{"ok":1}', [])], compression=COMPRESSION_ZSTD
            )
            answer = call(sock, ApiKey.PRODUCE, 3, produce_body("bombed", 0, good), corr=2)
            assert produce_answer(answer) == (ErrorCode.NONE, 0)
        assert peak_mib() - before < 400
        stats = broker.stats()
        assert stats["restarts"].get("kafka", 0) == 0
        assert stats["pids"]["kafka"] == pid


def test_a_record_set_holds_no_more_records_than_its_bound() -> None:
    values = [b'{"n":%d}' % n for n in range(6)]
    batches = [
        encode_batch([OutRecord(i, 1000, None, v, []) for i, v in enumerate(values[:3])]),
        encode_batch([OutRecord(i, 1000, None, v, []) for i, v in enumerate(values[3:])]),
    ]
    decoded = decode_batches(b"".join(batches), MIB, 6)
    assert [r.value for batch in decoded for r in batch.records] == values
    with pytest.raises(TooManyRecords):  # the two batches together
        decode_batches(b"".join(batches), MIB, 5)
    # The count is checked from the header, before the records: a batch that claims a
    # million records in a few bytes is refused as too many, not decoded first.
    claims = records.batch_of(
        [b"\x00" * 8],
        base=0,
        last_offset_delta=0,
        first_timestamp=0,
        max_timestamp=0,
        count=1_000_000,
    )
    with pytest.raises(TooManyRecords):
        decode_batches(claims, MIB, 1000)


def test_a_producer_s_record_set_is_one_batch_of_at_least_one_record() -> None:
    """As Kafka checks a Produce v3+ record set: a second batch is refused before it is
    decoded, and so is a batch of no records or whose last offset delta is not its count
    less one (a fetched batch of a compacted log may have gaps: not refused there)."""
    one = encode_batch([OutRecord(i, 1000, None, b"%d" % i, []) for i in range(3)])
    assert len(decode_batches(one, MIB, produced=True)[0].records) == 3
    with pytest.raises(ExtraBatch):
        decode_batches(one + one, MIB, produced=True)
    assert len(decode_batches(one + one, MIB)) == 2
    empty = records.batch_of(
        [b""], base=0, last_offset_delta=-1, first_timestamp=0, max_timestamp=0, count=0
    )
    with pytest.raises(KafkaDecodeError, match="a batch of 0 records"):
        decode_batches(empty, MIB)
    gapped = encode_batch([OutRecord(i * 2, 1000, None, b"%d" % i, []) for i in range(3)])
    assert len(decode_batches(gapped, MIB)[0].records) == 3
    with pytest.raises(KafkaDecodeError, match="last offset delta 4"):
        decode_batches(gapped, MIB, produced=True)


def test_xerial_chunks_are_charged_a_kibibyte_each_and_none_may_be_empty() -> None:
    header = b"\x82SNAPPY\x00" + bytes(8)

    def chunk(data: bytes) -> bytes:
        raw = compress(COMPRESSION_SNAPPY, data)
        return len(raw).to_bytes(4, "big") + raw

    two = header + chunk(b"0123456789") + chunk(b"abcdefghij")
    assert decompress(COMPRESSION_SNAPPY, two, 2048) == b"0123456789abcdefghij"
    with pytest.raises(InflatesTooLarge):  # 20 bytes, but two chunks: 2 KiB charged
        decompress(COMPRESSION_SNAPPY, two, 1500)
    with pytest.raises(KafkaDecodeError, match="empty snappy chunk"):
        decompress(COMPRESSION_SNAPPY, header + chunk(b"x") + chunk(b""), MIB)
