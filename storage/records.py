"""Record-level encode and decode of Kafka v2 batches.

The log itself handles batches as opaque bytes (``batch.py``); this module is for the places
that need the records inside: building batches (control markers, compaction, tools, tests)
and reading them back (dump, verify, compaction).

A batch is the 61-byte header followed by the records section, which is compressed as a whole
when the header names a codec (``codecs.py``). Each record in the (uncompressed) section is::

    length            varint   bytes after this field
    attributes        int8     unused, always 0
    timestamp_delta   varlong  relative to the batch's base timestamp
    offset_delta      varint   relative to the batch's base offset
    key_length        varint   -1 for a null key
    key               bytes
    value_length      varint   -1 for a null value
    value             bytes
    header_count      varint
    headers           header_count times: varint key length, UTF-8 key,
                                          varint value length (-1 for null), value

Varints are Protocol Buffers style base-128, little-endian groups of 7 bits, with zigzag
encoding so small negative numbers stay short.

Decoding trusts nothing: ``decode_batch`` checks the CRC and framing first, bounds the
decompressed size, then checks every length against the bytes that remain. Malformed input
raises ``CorruptRecordError`` (broken bytes) or ``InvalidRecordError`` (well-formed bytes
breaking a rule), never ``IndexError`` or ``struct.error``. All functions are pure and
thread-safe.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from storage import codecs
from storage.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    NO_PARTITION_LEADER_EPOCH,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    BatchHeader,
    CompressionType,
    TimestampType,
    compiled_check,
    compute_crc,
    validate_batch,
)
from storage.errors import CorruptRecordError, InvalidRecordError

_compiled_record_count: Callable[[_Buffer], int] | None
try:  # the compiled framing walk (storage/_framing.c); optional, see setup.py
    from storage._framing import record_count as _compiled_record_count
except ImportError:  # pragma: no cover - depends on the build
    _compiled_record_count = None

__all__ = [
    "DEFAULT_MAX_UNCOMPRESSED_BYTES",
    "DecodedBatch",
    "Headers",
    "Record",
    "RecordInput",
    "build_batch",
    "compiled_framing",
    "decode_batch",
    "iter_decoded",
    "walk_record_lengths",
]

DEFAULT_MAX_UNCOMPRESSED_BYTES = 64 * 1024 * 1024

Headers = tuple[tuple[str, bytes | None], ...]
_Buffer = bytes | bytearray | memoryview

_HEADER = struct.Struct(">qiibIhiqqqhii")  # the layout documented in batch.py
_CRC = struct.Struct(">I")
_POS_CRC = CRC_START - _CRC.size  # the CRC field sits just before the bytes it covers


def compiled_framing() -> bool:
    """Whether the compiled ``storage._framing`` is used: ``check_record_framing``'s walk
    and ``storage.batch.validate_batch``'s checks (a stale build may lack the latter)."""
    return _compiled_record_count is not None and compiled_check()


_INT32_MAX = (1 << 31) - 1
_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_VARINT_MAX_BYTES = 5  # ceil(32 / 7)
_VARLONG_MAX_BYTES = 10  # ceil(64 / 7)
# attributes, timestamp delta, offset delta, key length, value length, header count
_MIN_RECORD_BODY_BYTES = 6


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record with absolute offset and timestamp (ms)."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: Headers = ()


@dataclass(frozen=True, slots=True)
class DecodedBatch:
    """A batch's header and all its records."""

    header: BatchHeader
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class RecordInput:
    """A record to put in a batch. ``offset_delta=None`` means "previous delta + 1"."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int
    headers: Headers = ()
    offset_delta: int | None = None


# --- building ---------------------------------------------------------------------------


def build_batch(
    records: Sequence[RecordInput],
    *,
    base_offset: int = 0,
    compression: CompressionType = CompressionType.NONE,
    timestamp_type: TimestampType = TimestampType.CREATE_TIME,
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = NO_PRODUCER_EPOCH,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = NO_PARTITION_LEADER_EPOCH,
    is_transactional: bool = False,
    is_control: bool = False,
    max_timestamp: int | None = None,
) -> bytes:
    """Encode ``records`` as one v2 batch, byte for byte what the Java producer writes.

    The base timestamp is the first record's, as in Kafka; ``max_timestamp`` defaults to the
    largest record timestamp (pass the broker time for LogAppendTime). The last offset delta
    is the largest record's, so a compacted batch with gaps keeps its offsets. Raises
    ValueError for an empty batch, offset deltas that do not increase, or header fields
    out of range.
    """
    if not records:
        raise ValueError("a batch needs at least one record")
    deltas = _offset_deltas(records)
    timestamps = [record.timestamp_ms for record in records]
    base_timestamp = timestamps[0]
    for extreme in (min(timestamps), max(timestamps)):
        if not _INT64_MIN <= extreme - base_timestamp <= _INT64_MAX:
            raise ValueError(f"timestamp {extreme} is too far from base {base_timestamp}")
    section = codecs.compress(compression, _encode_records(records, deltas, base_timestamp))
    attributes = (
        compression
        | (ATTR_TIMESTAMP_TYPE if timestamp_type is TimestampType.LOG_APPEND_TIME else 0)
        | (ATTR_TRANSACTIONAL if is_transactional else 0)
        | (ATTR_CONTROL if is_control else 0)
    )
    out = bytearray(HEADER_SIZE)
    out += section
    fields = (
        base_offset,
        len(out) - LOG_OVERHEAD,
        partition_leader_epoch,
        MAGIC_V2,
        0,  # CRC, patched below once the covered bytes are final
        attributes,
        deltas[-1],
        base_timestamp,
        max(timestamps) if max_timestamp is None else max_timestamp,
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    try:
        _HEADER.pack_into(out, 0, *fields)
    except struct.error as e:
        raise ValueError(f"batch header field out of range: {e}") from None
    _CRC.pack_into(out, _POS_CRC, compute_crc(out, 0, len(out)))
    return bytes(out)


def _offset_deltas(records: Sequence[RecordInput]) -> list[int]:
    deltas: list[int] = []
    previous = -1
    for record in records:
        delta = previous + 1 if record.offset_delta is None else record.offset_delta
        if not previous < delta <= _INT32_MAX:
            raise ValueError(f"offset delta {delta} does not follow {previous}")
        deltas.append(delta)
        previous = delta
    return deltas


def _encode_records(
    records: Sequence[RecordInput], deltas: Sequence[int], base_timestamp: int
) -> bytearray:
    out = bytearray()
    body = bytearray()  # reused: each record's length prefix is only known once it is built
    for record, delta in zip(records, deltas, strict=True):
        body.clear()
        body.append(0)  # attributes: unused by every Kafka version so far
        _write_varint(body, record.timestamp_ms - base_timestamp)
        _write_varint(body, delta)
        _write_nullable_bytes(body, record.key)
        _write_nullable_bytes(body, record.value)
        _write_varint(body, len(record.headers))
        for header_key, header_value in record.headers:
            _write_nullable_bytes(body, header_key.encode())
            _write_nullable_bytes(body, header_value)
        _write_varint(out, len(body))
        out += body
    return out


def _write_nullable_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        _write_varint(out, -1)
    else:
        _write_varint(out, len(data))
        out += data


# --- decoding -----------------------------------------------------------------------------


def decode_batch(
    buf: _Buffer, pos: int = 0, *, max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES
) -> DecodedBatch:
    """Validate the batch at ``pos`` (framing, CRC), decompress it and decode every record.

    Records carry absolute offsets and timestamps; in a LogAppendTime batch every record's
    timestamp is the batch's max timestamp, which is what Kafka consumers see.
    """
    header = validate_batch(buf, pos)
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.size_bytes]
    try:
        data = codecs.decompress(header.compression, section, max_uncompressed_bytes)
        records = _decode_records(data, header)
    except (CorruptRecordError, InvalidRecordError) as e:
        raise type(e)(f"batch at byte {pos} (offset {header.base_offset}): {e}") from e
    return DecodedBatch(header, records)


def check_record_framing(
    buf: _Buffer,
    pos: int,
    header: BatchHeader,
    *,
    max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES,
) -> None:
    """Check that the (CRC-valid) batch at ``pos`` holds exactly ``record_count`` records
    whose length prefixes tile its records section, decompressing it first if needed: what
    a leader checks before appending, so that a producer's well-checksummed garbage cannot
    reach consumers. It walks lengths only (one varint per record, no objects); the
    records' inner fields are decoded by readers (``decode_batch``). The walk is compiled
    (``storage._framing``) when that module is built, ``walk_record_lengths`` otherwise.
    Raises CorruptRecordError."""
    section = memoryview(buf)[pos + HEADER_SIZE : pos + header.batch_length + LOG_OVERHEAD]
    if (
        _compiled_record_count is not None
        and not header.attributes & ATTR_COMPRESSION_MASK
        and len(section) <= max_uncompressed_bytes
        and _compiled_record_count(section) == header.record_count
    ):
        return  # the usual case, an uncompressed batch that is well framed
    try:
        data = codecs.records_section(header.compression, section, max_uncompressed_bytes)
    except CorruptRecordError as e:
        raise CorruptRecordError(f"batch at offset {header.base_offset}: {e}") from e
    if _compiled_record_count is not None and _compiled_record_count(data) == header.record_count:
        return
    try:  # the reference walk: the fallback, and the precise message of a failure
        count = walk_record_lengths(bytes(data))
    except CorruptRecordError as e:
        raise CorruptRecordError(f"batch at offset {header.base_offset}: {e}") from e
    if count != header.record_count:
        raise CorruptRecordError(
            f"batch at offset {header.base_offset} declares {header.record_count} records; "
            f"its {len(data)}-byte records section holds {count}"
        )


def walk_record_lengths(data: bytes) -> int:
    """The number of records whose zigzag-varint length prefixes tile ``data`` (a records
    section, decompressed) exactly; CorruptRecordError if they do not. The reference for
    ``storage._framing.record_count``, which answers -1 where this raises."""
    end, at, count = len(data), 0, 0
    while at < end:
        first = data[at]
        if first < 0x80:  # bodies under 64 bytes: one byte (zigzag), inline
            length, at = (first >> 1) ^ -(first & 1), at + 1
        elif at + 1 < end and data[at + 1] < 0x80:  # under 8 KiB: two bytes, inline
            raw = (first & 0x7F) | (data[at + 1] << 7)
            length, at = (raw >> 1) ^ -(raw & 1), at + 2
        else:
            length, at = _read_varint(data, at, end)
        if length < _MIN_RECORD_BODY_BYTES:
            raise CorruptRecordError(
                f"record {count} declares {length} bytes, under the smallest record "
                f"({_MIN_RECORD_BODY_BYTES})"
            )
        if length > end - at:
            raise CorruptRecordError(
                f"record {count} declares {length} bytes; {end - at} remain in the section"
            )
        at += length
        count += 1
    return count


def iter_decoded(
    buf: _Buffer, *, max_uncompressed_bytes: int = DEFAULT_MAX_UNCOMPRESSED_BYTES
) -> Iterator[DecodedBatch]:
    """Decode each of the concatenated batches in ``buf``; raises on a partial tail."""
    pos = 0
    while pos < len(buf):
        batch = decode_batch(buf, pos, max_uncompressed_bytes=max_uncompressed_bytes)
        yield batch
        pos += batch.header.size_bytes


def _decode_records(data: bytes, header: BatchHeader) -> tuple[Record, ...]:
    log_append_time = (
        header.max_timestamp if header.timestamp_type is TimestampType.LOG_APPEND_TIME else None
    )
    records: list[Record] = []
    pos = 0
    previous_delta = -1
    for index in range(header.record_count):
        if pos >= len(data):
            raise CorruptRecordError(
                f"header declares {header.record_count} records, records section holds {index}"
            )
        delta, record, pos = _decode_record(data, pos, header, log_append_time)
        if not previous_delta < delta <= header.last_offset_delta:
            raise InvalidRecordError(
                f"record {index} has offset delta {delta} after {previous_delta}, "
                f"last offset delta is {header.last_offset_delta}"
            )
        records.append(record)
        previous_delta = delta
    if pos != len(data):
        raise CorruptRecordError(
            f"{len(data) - pos} bytes follow the {header.record_count} declared records"
        )
    return tuple(records)


def _decode_record(
    data: bytes, pos: int, header: BatchHeader, log_append_time: int | None
) -> tuple[int, Record, int]:
    """Decode the record at ``pos``; return (offset delta, record, position after it)."""
    start = pos
    length, pos = _read_varint(data, pos, len(data))
    if not _MIN_RECORD_BODY_BYTES <= length <= len(data) - pos:
        raise CorruptRecordError(
            f"record at section byte {start} declares {length} bytes, {len(data) - pos} remain"
        )
    end = pos + length
    pos += 1  # attributes: unused
    timestamp_delta, pos = _read_varlong(data, pos, end)
    offset_delta, pos = _read_varint(data, pos, end)
    key, pos = _read_nullable_bytes(data, pos, end)
    value, pos = _read_nullable_bytes(data, pos, end)
    headers, pos = _read_headers(data, pos, end)
    if pos != end:  # every read above stops at ``end``, so bytes are left over
        raise CorruptRecordError(
            f"record at section byte {start} has {end - pos} bytes after its last field"
        )
    if log_append_time is None:
        timestamp = header.base_timestamp + timestamp_delta
    else:
        timestamp = log_append_time
    record = Record(header.base_offset + offset_delta, timestamp, key, value, headers)
    return offset_delta, record, end


def _read_nullable_bytes(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = _read_varint(data, pos, end)
    if length == -1:
        return None, pos
    if not 0 <= length <= end - pos:
        raise CorruptRecordError(f"field at section byte {pos} has length {length}")
    return data[pos : pos + length], pos + length


def _read_headers(data: bytes, pos: int, end: int) -> tuple[Headers, int]:
    count, pos = _read_varint(data, pos, end)
    if count < 0:
        raise InvalidRecordError(f"record has header count {count}")
    if count > (end - pos) // 2:  # a header takes at least two bytes (both lengths)
        raise CorruptRecordError(f"record declares {count} headers in {end - pos} bytes")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(count):
        raw_key, pos = _read_nullable_bytes(data, pos, end)
        if raw_key is None:
            raise InvalidRecordError(f"record header at section byte {pos} has a null key")
        try:
            header_key = raw_key.decode()
        except UnicodeDecodeError as e:
            raise InvalidRecordError(f"record header key is not UTF-8: {e}") from None
        header_value, pos = _read_nullable_bytes(data, pos, end)
        headers.append((header_key, header_value))
    return tuple(headers), pos


# --- varints ------------------------------------------------------------------------------


def _write_varint(out: bytearray, value: int) -> None:
    """Append ``value`` zigzag-encoded; serves varint and varlong alike."""
    zigzag = (value << 1) ^ (value >> 63)
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)


def _read_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode the zigzag varint (int32) at ``pos``, which must end by ``end``."""
    if pos < end and data[pos] < 0x80:  # the common one-byte case, kept cheap
        byte = data[pos]
        return (byte >> 1) ^ -(byte & 1), pos + 1
    return _read_zigzag(data, pos, end, _VARINT_MAX_BYTES, 32)


def _read_varlong(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """Decode the zigzag varlong (int64) at ``pos``, which must end by ``end``."""
    return _read_zigzag(data, pos, end, _VARLONG_MAX_BYTES, 64)


def _read_zigzag(data: bytes, pos: int, end: int, max_bytes: int, bits: int) -> tuple[int, int]:
    result = 0
    shift = 0
    start = pos
    limit = min(end, pos + max_bytes)
    while pos < limit:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            if result >> bits:
                raise CorruptRecordError(f"varint at section byte {start} overflows {bits} bits")
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
    if pos >= end:
        raise CorruptRecordError(f"varint at section byte {start} runs past its record")
    raise CorruptRecordError(f"varint at section byte {start} is longer than {max_bytes} bytes")
