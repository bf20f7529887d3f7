"""Kafka record batch (magic v2) headers: parse and validate without decoding records.

The hot path treats a batch as opaque bytes. This module reads the fixed 61-byte header and
checks the CRC; the log (``Log.append_as_leader``) writes the fields it owns (base offset,
partition leader epoch, max timestamp) as a new header prefix ahead of the caller's bytes.
Record-level encode/decode lives in ``records.py``.

Layout (big-endian), offsets in bytes from the batch start::

    0  base_offset            int64    not covered by the CRC
    8  batch_length           int32    bytes after this field (= size - 12)
   12  partition_leader_epoch int32    not covered by the CRC
   16  magic                  int8     always 2
   17  crc                    uint32   CRC-32C of bytes 21 .. end
   21  attributes             int16    bits 0-2 codec, 3 timestamp type, 4 transactional,
                                       5 control, 6 delete horizon set
   23  last_offset_delta      int32
   27  base_timestamp         int64
   35  max_timestamp          int64
   43  producer_id            int64    -1 when not idempotent
   51  producer_epoch         int16
   53  base_sequence          int32
   57  record_count           int32
   61  records ...

All functions are pure and safe to call from any thread.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from enum import IntEnum
from typing import NamedTuple

import crc32c

from storage.errors import CorruptRecordError, InvalidRecordError

MAGIC_V2 = 2
LOG_OVERHEAD = 12  # base_offset + batch_length: bytes not counted by batch_length
HEADER_SIZE = 61
CRC_START = 21
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
NO_SEQUENCE = -1
NO_PARTITION_LEADER_EPOCH = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET_AND_LENGTH = struct.Struct(">qi")
_INT64 = struct.Struct(">q")
_INT32 = struct.Struct(">i")
_UINT32 = struct.Struct(">I")
_INT16 = struct.Struct(">h")

_POS_EPOCH = 12
_POS_MAGIC = 16
_POS_CRC = 17
_POS_ATTRIBUTES = 21
_POS_MAX_TIMESTAMP = 35

ATTR_COMPRESSION_MASK = 0x07
ATTR_TIMESTAMP_TYPE = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
ATTR_DELETE_HORIZON = 0x40


class CompressionType(IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


_MAX_CODEC_ID = 4  # zstd
_CODECS = tuple(CompressionType(i) for i in range(_MAX_CODEC_ID + 1))


class TimestampType(IntEnum):
    CREATE_TIME = 0
    LOG_APPEND_TIME = 1


class BatchHeader(NamedTuple):
    """The decoded fixed header of one v2 batch (a tuple: cheap to build on the hot path)."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    record_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    @property
    def compression(self) -> CompressionType:
        codec_id = self.attributes & ATTR_COMPRESSION_MASK
        if codec_id > _MAX_CODEC_ID:  # a table, not CompressionType(id): it is per batch
            raise InvalidRecordError(f"unknown compression codec id {codec_id}")
        return _CODECS[codec_id]

    @property
    def timestamp_type(self) -> TimestampType:
        return TimestampType((self.attributes & ATTR_TIMESTAMP_TYPE) >> 3)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & ATTR_TRANSACTIONAL)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & ATTR_CONTROL)

    @property
    def has_producer_id(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID

    @property
    def last_sequence(self) -> int:
        if self.base_sequence == NO_SEQUENCE:
            return NO_SEQUENCE
        return (self.base_sequence + self.last_offset_delta) & 0x7FFFFFFF


# BatchHeader._make without its Python-level wrapper: the 13 unpacked fields as they are.
_new_header: Callable[[type[BatchHeader], tuple[int, ...]], BatchHeader] = tuple.__new__

_compiled_check: Callable[..., tuple[int, ...] | None] | None
try:  # validate_batch's checks compiled (storage/_framing.c); optional, see setup.py
    from storage._framing import checked_header as _compiled_check
except ImportError:  # pragma: no cover - depends on the build
    _compiled_check = None

NO_WALK = -1  # checked_header: the records' framing is not walked


def compiled_check() -> bool:
    """Whether ``checked_header`` (and so ``validate_batch``) runs compiled."""
    return _compiled_check is not None


def checked_header(
    buf: bytes | bytearray | memoryview, pos: int = 0, walk_max: int = NO_WALK
) -> BatchHeader | None:
    """The header of the batch at ``pos`` if ``validate_batch`` accepts it and, with
    ``walk_max`` at least 0 and an uncompressed batch, its records section (at most
    ``walk_max`` bytes) passes ``storage.records.check_record_framing``; None if not, or if
    ``storage._framing`` is not built. One compiled call instead of a dozen Python ones; on
    None the caller runs those, which say what is wrong."""
    if _compiled_check is None:
        return None
    fields = _compiled_check(buf, pos, crc32c.crc32c, walk_max)
    return None if fields is None else _new_header(BatchHeader, fields)


def peek_size(buf: bytes | bytearray | memoryview, pos: int = 0) -> tuple[int, int]:
    """Return (base_offset, total size in bytes) of the batch at ``pos``; needs 12 bytes."""
    if len(buf) - pos < LOG_OVERHEAD:
        raise CorruptRecordError(f"truncated batch at byte {pos}: fewer than 12 bytes")
    base_offset, length = _OFFSET_AND_LENGTH.unpack_from(buf, pos)
    return base_offset, length + LOG_OVERHEAD


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at ``pos`` and check framing (size, magic); the CRC is not checked."""
    available = len(buf) - pos
    if available < HEADER_SIZE:
        raise CorruptRecordError(
            f"truncated batch at byte {pos}: {available} bytes, header needs {HEADER_SIZE}"
        )
    header = _new_header(BatchHeader, _HEADER.unpack_from(buf, pos))
    # Field access by name on the hot path: magic, then the declared length.
    if header.magic != MAGIC_V2:
        raise CorruptRecordError(f"batch at byte {pos} has magic {header.magic}, expected 2")
    length = header.batch_length
    if length < HEADER_SIZE - LOG_OVERHEAD:
        raise CorruptRecordError(
            f"batch at byte {pos} declares length {length}, below the header size"
        )
    if length + LOG_OVERHEAD > available:
        raise CorruptRecordError(
            f"truncated batch at byte {pos}: declares {length + LOG_OVERHEAD} bytes, "
            f"{available} present"
        )
    return header


def unpack_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode 61 header bytes with no checks at all (for trusted, already-validated data)."""
    return _new_header(BatchHeader, _HEADER.unpack_from(buf, pos))


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size: int) -> int:
    """CRC-32C over the CRC-covered part (attributes .. end) of the batch at ``pos``."""
    view = memoryview(buf)[pos + CRC_START : pos + size]
    return int(crc32c.crc32c(view))


def validate_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Parse and fully check one batch: framing, CRC, offsets and counts. Compiled when it
    can be (``checked_header``); the Python below is the reference and says what is wrong."""
    if _compiled_check is not None:
        fields = _compiled_check(buf, pos, crc32c.crc32c, NO_WALK)
        if fields is not None:
            return _new_header(BatchHeader, fields)
    header = parse_header(buf, pos)
    actual = crc32c.crc32c(memoryview(buf)[pos + CRC_START : pos + header.batch_length + 12])
    if actual != header.crc:
        raise CorruptRecordError(
            f"batch at byte {pos} (offset {header.base_offset}) has CRC {header.crc:#010x}, "
            f"computed {actual:#010x}"
        )
    if header.last_offset_delta < 0 or header.record_count < 0 or header.base_offset < 0:
        raise InvalidRecordError(
            f"batch at byte {pos} has base offset {header.base_offset}, last offset delta "
            f"{header.last_offset_delta} and record count {header.record_count}"
        )
    if header.attributes & ATTR_COMPRESSION_MASK > _MAX_CODEC_ID:
        raise InvalidRecordError(
            f"batch at byte {pos} names unknown compression codec "
            f"{header.attributes & ATTR_COMPRESSION_MASK}"
        )
    return header


def iter_headers(
    buf: bytes | bytearray | memoryview, *, check_crc: bool = True
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) for each batch in ``buf``; raises on a partial tail."""
    pos = 0
    end = len(buf)
    while pos < end:
        header = validate_batch(buf, pos) if check_crc else parse_header(buf, pos)
        yield pos, header
        pos += header.size_bytes
