"""Bounded reading and writing of Kafka's wire primitives.

Every request byte comes from an untrusted socket, so the :class:`Reader` checks
each length against the bytes actually left *before* it slices or allocates:
a string that claims 2 GB in a 40-byte frame, an array of a billion elements, a
varint that never ends, all raise :class:`KafkaDecodeError` at once. The server
turns that error into "close this one connection"; nothing else is affected.

Kafka's encoding is big-endian fixed-width integers, int16-length strings
(-1 = null), int32-length byte strings (-1 = null), int32-count arrays (-1 =
null) and, inside record batches, zigzag varints. The "compact" forms
(unsigned varint length + 1) and tagged fields belong to the flexible versions
(KIP-482); the versions we advertise (docs/KAFKA.md) predate them, but the
reader has them so a later table can use them without a new decoder.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TypeVar

from spoolmq.errors import KafkaDecodeError

__all__ = ["KafkaDecodeError", "Reader", "Writer"]

T = TypeVar("T")

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_U32 = struct.Struct(">I")

# A 64-bit varint needs at most 10 bytes of 7 bits; a 32-bit one 5. Beyond
# that the input is hostile or corrupt, and we stop instead of looping on.
MAX_VARINT_BYTES = 10
MAX_VARINT32_BYTES = 5


class Reader:
    """A cursor over one request body that never reads past its end."""

    __slots__ = ("_data", "_end", "_pos")

    def __init__(self, data: bytes | bytearray | memoryview, start: int = 0) -> None:
        self._data = memoryview(data).cast("B") if not isinstance(data, bytes) else data
        self._pos = start
        self._end = len(data)

    # -- position -------------------------------------------------------------

    @property
    def position(self) -> int:
        return self._pos

    @property
    def remaining(self) -> int:
        return self._end - self._pos

    def _need(self, n: int) -> int:
        if n < 0 or n > self._end - self._pos:
            raise KafkaDecodeError(
                f"frame needs {n} more bytes at offset {self._pos}, "
                f"only {self._end - self._pos} left"
            )
        pos = self._pos
        self._pos = pos + n
        return pos

    def raw(self, n: int) -> bytes:
        """``n`` bytes as they are (the length was checked first)."""
        pos = self._need(n)
        return bytes(self._data[pos : pos + n])

    def rest(self) -> bytes:
        """Everything not read yet."""
        return self.raw(self.remaining)

    def sub(self, n: int) -> Reader:
        """A reader over the next ``n`` bytes only (a record batch, a nested blob)."""
        pos = self._need(n)
        return Reader(bytes(self._data[pos : pos + n]))

    # -- fixed-width integers ---------------------------------------------------

    def int8(self) -> int:
        pos = self._need(1)
        return int(_I8.unpack_from(self._data, pos)[0])

    def boolean(self) -> bool:
        return self.int8() != 0

    def int16(self) -> int:
        pos = self._need(2)
        return int(_I16.unpack_from(self._data, pos)[0])

    def int32(self) -> int:
        pos = self._need(4)
        return int(_I32.unpack_from(self._data, pos)[0])

    def uint32(self) -> int:
        pos = self._need(4)
        return int(_U32.unpack_from(self._data, pos)[0])

    def int64(self) -> int:
        pos = self._need(8)
        return int(_I64.unpack_from(self._data, pos)[0])

    # -- varints ------------------------------------------------------------------

    def uvarint(self, max_bytes: int = MAX_VARINT32_BYTES) -> int:
        """An unsigned LEB128 varint of at most ``max_bytes`` bytes."""
        result = 0
        shift = 0
        for _ in range(max_bytes):
            pos = self._need(1)
            byte = self._data[pos]
            result |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return result
            shift += 7
        raise KafkaDecodeError(f"varint longer than {max_bytes} bytes at offset {self._pos}")

    def varint(self) -> int:
        """A zigzag-encoded signed 32-bit varint (record lengths, deltas, key sizes)."""
        n = self.uvarint(MAX_VARINT32_BYTES)
        return (n >> 1) ^ -(n & 1)

    def varlong(self) -> int:
        """A zigzag-encoded signed 64-bit varint (timestamp deltas)."""
        n = self.uvarint(MAX_VARINT_BYTES)
        return (n >> 1) ^ -(n & 1)

    # -- strings and bytes ---------------------------------------------------------

    def _text(self, n: int) -> str:
        raw = self.raw(n)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise KafkaDecodeError(f"string is not UTF-8: {exc}") from None

    def string(self) -> str:
        n = self.int16()
        if n < 0:
            raise KafkaDecodeError("null where a string is required")
        return self._text(n)

    def nullable_string(self) -> str | None:
        n = self.int16()
        if n == -1:
            return None
        if n < 0:
            raise KafkaDecodeError(f"bad string length {n}")
        return self._text(n)

    def bytes_(self) -> bytes:
        n = self.int32()
        if n < 0:
            raise KafkaDecodeError("null where bytes are required")
        return self.raw(n)

    def nullable_bytes(self) -> bytes | None:
        n = self.int32()
        if n == -1:
            return None
        if n < 0:
            raise KafkaDecodeError(f"bad bytes length {n}")
        return self.raw(n)

    def var_bytes(self) -> bytes | None:
        """Record-level bytes: a zigzag varint length, -1 for null (keys, values, headers)."""
        n = self.varint()
        if n == -1:
            return None
        if n < 0:
            raise KafkaDecodeError(f"bad varint length {n}")
        return self.raw(n)

    # -- compact (flexible-version) forms ----------------------------------------------

    def compact_string(self) -> str:
        n = self.uvarint() - 1
        if n < 0:
            raise KafkaDecodeError("null where a compact string is required")
        return self._text(n)

    def compact_nullable_string(self) -> str | None:
        n = self.uvarint() - 1
        return None if n < 0 else self._text(n)

    def compact_bytes(self) -> bytes:
        n = self.uvarint() - 1
        if n < 0:
            raise KafkaDecodeError("null where compact bytes are required")
        return self.raw(n)

    def compact_nullable_bytes(self) -> bytes | None:
        n = self.uvarint() - 1
        return None if n < 0 else self.raw(n)

    def tagged_fields(self) -> dict[int, bytes]:
        """The tagged-field section of a flexible version (we keep the raw values)."""
        count = self._count(self.uvarint(), min_size=2)
        fields: dict[int, bytes] = {}
        for _ in range(count):
            tag = self.uvarint()
            fields[tag] = self.raw(self.uvarint())
        return fields

    # -- arrays ----------------------------------------------------------------------

    def _count(self, n: int, min_size: int) -> int:
        # Each element takes at least ``min_size`` bytes, so a count that could
        # not fit in what is left is refused before a list of that size exists.
        if n < 0 or n * max(min_size, 1) > self.remaining:
            raise KafkaDecodeError(f"array of {n} elements cannot fit in {self.remaining} bytes")
        return n

    def array_count(self, min_size: int = 1) -> int:
        """An int32 element count, checked against the bytes left (null is refused)."""
        return self._count(self.int32(), min_size)

    def nullable_array_count(self, min_size: int = 1) -> int | None:
        n = self.int32()
        if n == -1:
            return None
        return self._count(n, min_size)

    def compact_array_count(self, min_size: int = 1) -> int | None:
        n = self.uvarint() - 1
        if n < 0:
            return None
        return self._count(n, min_size)

    def array(self, item: Callable[[Reader], T], min_size: int = 1) -> list[T]:
        """A non-null int32-counted array whose elements ``item`` reads."""
        return [item(self) for _ in range(self.array_count(min_size))]

    def nullable_array(self, item: Callable[[Reader], T], min_size: int = 1) -> list[T] | None:
        n = self.nullable_array_count(min_size)
        if n is None:
            return None
        return [item(self) for _ in range(n)]


class Writer:
    """Appends Kafka primitives to a growing buffer (responses are ours, so no limits)."""

    __slots__ = ("_buf",)

    def __init__(self) -> None:
        self._buf = bytearray()

    def getvalue(self) -> bytes:
        return bytes(self._buf)

    def __len__(self) -> int:
        return len(self._buf)

    def raw(self, data: bytes | bytearray | memoryview) -> Writer:
        self._buf += data
        return self

    def int8(self, v: int) -> Writer:
        self._buf += _I8.pack(v)
        return self

    def boolean(self, v: bool) -> Writer:
        return self.int8(1 if v else 0)

    def int16(self, v: int) -> Writer:
        self._buf += _I16.pack(v)
        return self

    def int32(self, v: int) -> Writer:
        self._buf += _I32.pack(v)
        return self

    def uint32(self, v: int) -> Writer:
        self._buf += _U32.pack(v)
        return self

    def int64(self, v: int) -> Writer:
        self._buf += _I64.pack(v)
        return self

    def uvarint(self, v: int) -> Writer:
        if v < 0:
            raise ValueError("uvarint of a negative number")
        while v >= 0x80:
            self._buf.append((v & 0x7F) | 0x80)
            v >>= 7
        self._buf.append(v)
        return self

    def varint(self, v: int) -> Writer:
        """Zigzag signed varint (32- or 64-bit: the encoding is the same)."""
        return self.uvarint((v << 1) ^ (v >> 63))

    varlong = varint

    def string(self, v: str) -> Writer:
        data = v.encode("utf-8")
        return self.int16(len(data)).raw(data)

    def nullable_string(self, v: str | None) -> Writer:
        return self.int16(-1) if v is None else self.string(v)

    def bytes_(self, v: bytes | bytearray | memoryview) -> Writer:
        return self.int32(len(v)).raw(v)

    def nullable_bytes(self, v: bytes | None) -> Writer:
        return self.int32(-1) if v is None else self.bytes_(v)

    def var_bytes(self, v: bytes | None) -> Writer:
        if v is None:
            return self.varint(-1)
        return self.varint(len(v)).raw(v)

    def compact_string(self, v: str | None) -> Writer:
        if v is None:
            return self.uvarint(0)
        data = v.encode("utf-8")
        return self.uvarint(len(data) + 1).raw(data)

    def compact_bytes(self, v: bytes | None) -> Writer:
        if v is None:
            return self.uvarint(0)
        return self.uvarint(len(v) + 1).raw(v)

    def tagged_fields(self) -> Writer:
        """An empty tagged-field section (we never send tags)."""
        return self.uvarint(0)

    def array(self, items: list[T], item: Callable[[Writer, T], object]) -> Writer:
        self.int32(len(items))
        for it in items:
            item(self, it)
        return self

    def nullable_array(self, items: list[T] | None, item: Callable[[Writer, T], object]) -> Writer:
        if items is None:
            return self.int32(-1)
        return self.array(items, item)
