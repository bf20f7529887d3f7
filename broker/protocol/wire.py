"""Leaf helpers shared by the generated encoders and decoders: varints and the parts list.

How this works. Generated code inlines the common cases (a one-byte varint, a fixed-size
run of fields) and calls these helpers for the rest. Decoding helpers take a buffer and a
position and return ``(value, new_position)``; they raise ``ProtocolError`` themselves for
malformed input or let ``IndexError``/``struct.error`` escape, which the top-level decode
converts. An encoded message is a list of parts: bytes-like chunks and, for records held in a
segment file, the file region itself, so the network layer can ``os.sendfile`` it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Protocol, TypeAlias

from broker.protocol.errors import ProtocolError

__all__ = [
    "FileRegion",
    "Part",
    "parts_size",
    "read_uvarint",
    "uvarint",
]

_CACHED_ARRAY_LENGTH = 16  # packers for short int arrays (replica lists) are kept
_ARRAY_PACKERS: dict[tuple[str, int], Callable[..., bytes]] = {}
_SMALL_UVARINTS = tuple(bytes((n,)) for n in range(0x80))


class FileRegion(Protocol):
    """A byte range of an open file (``storage.segment.FileSlice`` is one)."""

    @property
    def fd(self) -> int: ...
    @property
    def position(self) -> int: ...
    @property
    def length(self) -> int: ...
    def read(self) -> bytes: ...


Part: TypeAlias = bytes | bytearray | memoryview | FileRegion


def parts_size(parts: Sequence[Part]) -> int:
    """Total number of bytes the parts put on the wire."""
    total = 0
    for part in parts:
        kind = type(part)  # exact types first: isinstance misses are slow
        if kind is bytearray or kind is bytes:
            total += len(part)  # type: ignore[arg-type]
        elif kind is memoryview:
            total += part.nbytes  # type: ignore[union-attr]
        elif isinstance(part, bytes | bytearray):
            total += len(part)
        else:
            total += part.length  # type: ignore[union-attr]
    return total


def uvarint(n: int) -> bytes:
    """Unsigned varint (7 bits per byte, low bits first)."""
    if n < 0x80:
        return _SMALL_UVARINTS[n]
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def read_uvarint(buf: memoryview, pos: int) -> tuple[int, int]:
    """``(value, new_pos)``; unrolled because compact lengths are read for every field."""
    b = buf[pos]
    if b < 0x80:
        return b, pos + 1
    result = b & 0x7F
    b = buf[pos + 1]
    if b < 0x80:
        return result | b << 7, pos + 2
    result |= (b & 0x7F) << 7
    b = buf[pos + 2]
    if b < 0x80:
        return result | b << 14, pos + 3
    result |= (b & 0x7F) << 14
    b = buf[pos + 3]
    if b < 0x80:
        return result | b << 21, pos + 4
    result |= (b & 0x7F) << 21
    b = buf[pos + 4]
    if b < 0x80:
        return result | b << 28, pos + 5
    raise ProtocolError(f"unsigned varint at byte {pos} is longer than 5 bytes")


def fail(message: str, pos: int) -> ProtocolError:
    return ProtocolError(f"{message} (at byte {pos})")


def pack_array(fmt: str, values: Sequence[object]) -> bytes:
    """A run of fixed-size primitives, e.g. ``pack_array("i", [1, 2])``."""
    n = len(values)
    packer = _ARRAY_PACKERS.get((fmt, n)) if n < _CACHED_ARRAY_LENGTH else None
    if packer is None:
        packer = struct.Struct(f">{n}{fmt}").pack
        if n < _CACHED_ARRAY_LENGTH:
            _ARRAY_PACKERS[(fmt, n)] = packer
    return packer(*values)


def unpack_array(fmt: str, n: int, buf: memoryview, pos: int) -> list[object]:
    return list(struct.unpack_from(f">{n}{fmt}", buf, pos))
