"""CRC-32C: the C implementation (google-crc32c, the `kafka` extra) and the pure-Python
reference agree, and both give the standard check value."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from spoolmq.kafka import records
from spoolmq.kafka.records import crc32c, crc32c_python

CHECK = 0xE3069283  # CRC-32C of b"123456789" (RFC 3720, appendix B.4)


def test_the_check_value() -> None:
    assert records._extend_c is not None, "the kafka extra (google-crc32c) is installed here"
    assert crc32c(b"123456789") == CHECK
    assert crc32c_python(b"123456789") == CHECK
    assert crc32c(memoryview(b"xx123456789")[2:]) == CHECK
    assert crc32c(b"") == crc32c_python(b"") == 0


@given(st.binary(max_size=4096), st.binary(max_size=512))
def test_c_and_python_agree_whole_and_continued(first: bytes, second: bytes) -> None:
    assert crc32c(first) == crc32c_python(first)
    assert crc32c(second, crc32c(first)) == crc32c_python(first + second)
