"""Compression codecs for the records section of v2 batches, in the formats Kafka clients use.

Kafka compresses only the records section of a batch (everything after the 61-byte header);
the header's attribute bits name the codec. Each codec here writes what the Java client writes
and reads what any mainstream client writes:

- GZIP: a gzip stream (RFC 1952) from the standard library; concatenated members are accepted.
- SNAPPY: written in the xerial block framing Kafka inherited from snappy-java, that is a
  16-byte header (``b"\\x82SNAPPY\\x00"``, int32 version 1, int32 compatible version 1)
  followed by blocks of at most 32 KiB of input, each a big-endian int32 length and a raw
  snappy block. Read either framed or as one raw snappy block, as the Java client does.
- LZ4: one standard LZ4 frame with independent 64 KiB blocks and no content checksum (the
  format Kafka uses since magic v1 fixed its header checksum).
- ZSTD: zstd frames at level 3, Kafka's default; read as a stream, so frames without a
  declared content size work.

``decompress`` never produces more than ``max_bytes`` of output, so a small batch cannot
expand into gigabytes of memory (a decompression bomb): each codec is driven incrementally
and stopped as soon as the budget is exceeded. Any failure, whether bomb, truncation or
garbage, surfaces as ``CorruptRecordError``; library exceptions never escape.

The functions are pure and thread-safe: compression contexts are created per call because
the lz4 and zstd context objects must not be shared between threads.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from typing import assert_never

import cramjam
import lz4.frame
import zstandard

from storage.batch import CompressionType
from storage.errors import CorruptRecordError

_Buffer = bytes | bytearray | memoryview

_GZIP_LEVEL = 6  # java.util.zip's default, what the Java producer uses
_GZIP_WBITS = 16 + zlib.MAX_WBITS  # gzip container only, not bare zlib/deflate
_ZSTD_LEVEL = 3  # Kafka's default compression.zstd.level

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = _XERIAL_MAGIC + struct.pack(">ii", 1, 1)
_XERIAL_BLOCK_BYTES = 32 * 1024  # snappy-java's default block size
_INT32 = struct.Struct(">i")

# A zstd block holds at most 128 KiB yet can be encoded in about 4 bytes, so input is fed in
# slices no larger than the remaining budget divided by this ratio: one slice can then
# overshoot the budget by at most a few blocks before the check below stops it.
_ZSTD_WORST_RATIO = 1 << 15
_ZSTD_MIN_FEED_BYTES = 256


def compress(codec: CompressionType, data: _Buffer) -> bytes:
    """Compress ``data`` (a records section) the way the Java producer does for ``codec``."""
    match codec:
        case CompressionType.NONE:
            return bytes(data)
        case CompressionType.GZIP:
            # mtime=0 keeps the output deterministic for identical input.
            return gzip.compress(data, compresslevel=_GZIP_LEVEL, mtime=0)
        case CompressionType.SNAPPY:
            return _snappy_compress_xerial(memoryview(data))
        case CompressionType.LZ4:
            return bytes(
                lz4.frame.compress(
                    data,
                    block_size=lz4.frame.BLOCKSIZE_MAX64KB,
                    block_linked=False,
                    content_checksum=False,
                    # Java's KafkaLZ4BlockOutputStream never writes the content size.
                    store_size=False,
                )
            )
        case CompressionType.ZSTD:
            return bytes(zstandard.ZstdCompressor(level=_ZSTD_LEVEL).compress(data))
        case _:
            assert_never(codec)


def decompress(codec: CompressionType, data: _Buffer, max_bytes: int) -> bytes:
    """Decompress ``data``; raise CorruptRecordError if it is malformed or exceeds ``max_bytes``."""
    try:
        match codec:
            case CompressionType.NONE:
                out = bytes(data)
            case CompressionType.GZIP:
                out = _gzip_decompress(data, max_bytes)
            case CompressionType.SNAPPY:
                out = _snappy_decompress(memoryview(data), max_bytes)
            case CompressionType.LZ4:
                out = _lz4_decompress(data, max_bytes)
            case CompressionType.ZSTD:
                out = _zstd_decompress(memoryview(data), max_bytes)
            case _:
                assert_never(codec)
    except (zlib.error, cramjam.DecompressionError, zstandard.ZstdError) as e:
        raise CorruptRecordError(f"{codec.name} records section is corrupt: {e}") from e
    _check_budget(codec, len(out), max_bytes)
    return out


def records_section(codec: CompressionType, data: _Buffer, max_bytes: int) -> _Buffer:
    """``decompress``, except that an uncompressed section is returned as it is (no copy):
    for readers that only walk it, such as the leader's framing check."""
    if codec is CompressionType.NONE:
        _check_budget(codec, len(data), max_bytes)
        return data
    return decompress(codec, data, max_bytes)


def _check_budget(codec: CompressionType, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise CorruptRecordError(
            f"{codec.name} records section decompresses to more than {max_bytes} bytes"
        )


def _truncated(codec: CompressionType) -> CorruptRecordError:
    return CorruptRecordError(f"{codec.name} records section is truncated")


def _gzip_decompress(data: _Buffer, max_bytes: int) -> bytes:
    out = bytearray()
    remaining: _Buffer = data
    while True:  # once per gzip member; the Java GZIPInputStream reads members back to back
        member = zlib.decompressobj(wbits=_GZIP_WBITS)
        # max_length (never 0, which would mean unlimited) stops inflating one byte past the
        # budget, so a bomb costs at most max_bytes of memory.
        out += member.decompress(remaining, max_bytes - len(out) + 1)
        _check_budget(CompressionType.GZIP, len(out), max_bytes)
        if not member.eof:
            raise _truncated(CompressionType.GZIP)
        remaining = member.unused_data
        if not remaining:
            return bytes(out)


def _snappy_compress_xerial(data: memoryview) -> bytes:
    out = bytearray(_XERIAL_HEADER)
    for start in range(0, len(data), _XERIAL_BLOCK_BYTES):
        block = cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK_BYTES])
        out += _INT32.pack(len(block))
        out += block
    return bytes(out)


def _snappy_decompress(data: memoryview, max_bytes: int) -> bytes:
    # Version and compat words are ignored on purpose: some producers (redpanda) write them
    # little-endian, and there has only ever been one version of the framing.
    if len(data) >= len(_XERIAL_HEADER) and data[: len(_XERIAL_MAGIC)] == _XERIAL_MAGIC:
        return _snappy_decompress_xerial(data[len(_XERIAL_HEADER) :], max_bytes)
    out = bytearray()
    _snappy_decompress_block(data, out, max_bytes)
    return bytes(out)


def _snappy_decompress_xerial(blocks: memoryview, max_bytes: int) -> bytes:
    out = bytearray()
    pos = 0
    while pos < len(blocks):
        if len(blocks) - pos < _INT32.size:
            raise _truncated(CompressionType.SNAPPY)
        (length,) = _INT32.unpack_from(blocks, pos)
        pos += _INT32.size
        if length < 0 or length > len(blocks) - pos:
            raise CorruptRecordError(
                f"SNAPPY block at byte {pos} declares {length} bytes, {len(blocks) - pos} remain"
            )
        _snappy_decompress_block(blocks[pos : pos + length], out, max_bytes)
        pos += length
    return bytes(out)


def _snappy_decompress_block(block: memoryview, out: bytearray, max_bytes: int) -> None:
    # A raw snappy block starts with its uncompressed length: check it before inflating.
    declared = int(cramjam.snappy.decompress_raw_len(block))
    _check_budget(CompressionType.SNAPPY, len(out) + declared, max_bytes)
    out += cramjam.snappy.decompress_raw(block)


def _lz4_decompress(data: _Buffer, max_bytes: int) -> bytes:
    decompressor = lz4.frame.LZ4FrameDecompressor()
    try:
        out = bytes(decompressor.decompress(data, max_length=max_bytes + 1))
    except RuntimeError as e:  # lz4.frame's only way of reporting a corrupt frame
        raise CorruptRecordError(f"LZ4 records section is corrupt: {e}") from e
    _check_budget(CompressionType.LZ4, len(out), max_bytes)
    if not decompressor.eof:
        raise _truncated(CompressionType.LZ4)
    if decompressor.unused_data:
        raise CorruptRecordError(
            f"LZ4 records section has {len(decompressor.unused_data)} bytes after its frame"
        )
    return out


def _zstd_decompress(data: memoryview, max_bytes: int) -> bytes:
    context = zstandard.ZstdDecompressor()
    out = bytearray()
    pos = 0
    while True:  # once per frame; zstd-jni streams read frames back to back
        frame = context.decompressobj()
        while not frame.eof:
            if pos >= len(data):
                raise _truncated(CompressionType.ZSTD)
            feed = max(_ZSTD_MIN_FEED_BYTES, (max_bytes - len(out)) // _ZSTD_WORST_RATIO)
            chunk = data[pos : pos + feed]
            pos += len(chunk)
            out += frame.decompress(chunk)
            _check_budget(CompressionType.ZSTD, len(out), max_bytes)
        pos -= len(frame.unused_data)
        if pos >= len(data):
            return bytes(out)
