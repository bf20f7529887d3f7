"""Read-only access to a partition's segment and index files, for the log tools.

Nothing here goes through ``storage.loader`` or ``LogSegment``: those open files read-write
and recovery truncates, rebuilds or deletes, while a dump or a verify must leave the files
exactly as it found them. Files are opened read-only and read sequentially.

How a segment is scanned: framing (the 12-byte offset/length prefix, the length bounds and
the magic byte, none of which the CRC covers) decides where the next batch starts. While the
framing holds, every batch is yielded, CRC-valid or not, with its bytes and computed CRC.
When the framing breaks nothing after it can be located, so the scan ends with a
:class:`BrokenTail` naming the byte position. The file size is taken once, at open, so a
segment still being appended to is read up to that size.

Index files are arrays of fixed-size entries (layout in ``storage/index.py``); a file that
is still pre-allocated ends in zero-filled slots, which are not entries and are dropped here.
No real entry is all zeros: the first batch of a segment (position 0) is never indexed.
"""

from __future__ import annotations

import os
import re
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, BinaryIO

from storage.batch import (
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    compute_crc,
    unpack_header,
)
from storage.segment import INDEX_SUFFIX, LOG_SUFFIX, TIME_INDEX_SUFFIX

if TYPE_CHECKING:
    from storage.records import DecodedBatch

SEGMENT_NAME = re.compile(r"^(\d{20})\.log$")
MIN_BATCH_LENGTH = HEADER_SIZE - LOG_OVERHEAD  # batch_length counts the header after it
OFFSET_ENTRY_BYTES = 8
TIME_ENTRY_BYTES = 12

_PREFIX = struct.Struct(">qi")  # base offset, batch length
_POS_MAGIC = 16
_READ_BUFFER_BYTES = 1024 * 1024
_OFFSET_ENTRY = struct.Struct(">ii")  # relative offset, position
_TIME_ENTRY = struct.Struct(">qi")  # timestamp, relative offset


@dataclass(frozen=True, slots=True)
class SegmentFile:
    """One ``.log`` file; ``base_offset`` is None when its name is not ``<20 digits>.log``."""

    path: Path
    base_offset: int | None

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def offset_index_path(self) -> Path | None:
        return self._sibling(INDEX_SUFFIX)

    @property
    def time_index_path(self) -> Path | None:
        return self._sibling(TIME_INDEX_SUFFIX)

    def _sibling(self, suffix: str) -> Path | None:
        if self.base_offset is None:
            return None
        return self.path.with_name(self.path.name.removesuffix(LOG_SUFFIX) + suffix)


@dataclass(frozen=True, slots=True)
class ScannedBatch:
    """A batch whose framing holds: its position in the file, header, bytes and real CRC."""

    position: int
    header: BatchHeader
    data: bytes
    computed_crc: int

    @property
    def crc_valid(self) -> bool:
        return self.computed_crc == self.header.crc

    def decode(self, max_decompressed_bytes: int | None) -> DecodedBatch:
        """Decompress and decode the records (None: the engine's size limit). Raises
        StorageError. The records module, with every compression library, loads here on
        first use: most runs never decode a record."""
        from storage.records import DEFAULT_MAX_UNCOMPRESSED_BYTES, decode_batch

        limit = max_decompressed_bytes or DEFAULT_MAX_UNCOMPRESSED_BYTES
        return decode_batch(self.data, max_uncompressed_bytes=limit)


@dataclass(frozen=True, slots=True)
class BrokenTail:
    """Bytes from ``position`` on do not frame a batch (a torn write or garbage)."""

    position: int
    reason: str


ScanItem = ScannedBatch | BrokenTail


@dataclass(frozen=True, slots=True)
class IndexEntry:
    """One index entry: slot number, the byte position of the entry in the index file and
    its two fields (offsets already made absolute)."""

    slot: int
    file_position: int
    first: int  # offset index: absolute offset; time index: timestamp
    second: int  # offset index: position in the .log; time index: absolute offset
    relative_offset: int


@dataclass(frozen=True, slots=True)
class IndexContents:
    """The entries of one index file, with the shape of the file around them."""

    path: Path
    size_bytes: int
    entries: tuple[IndexEntry, ...]
    padding_slots: int  # zero-filled pre-allocated slots after the last entry
    partial_bytes: int  # bytes after the last whole slot (a corrupt file when non-zero)


_EntryDecoder = Callable[[bytes, int, int], IndexEntry]  # (raw file, slot, base offset)


def segment_file(path: Path) -> SegmentFile:
    match = SEGMENT_NAME.match(path.name)
    return SegmentFile(path, int(match.group(1)) if match else None)


def find_segments(directory: Path) -> list[SegmentFile]:
    """The ``<20 digits>.log`` files of a partition directory, in base-offset order."""
    found = [segment_file(p) for p in directory.iterdir() if SEGMENT_NAME.match(p.name)]
    return sorted(found, key=lambda s: s.base_offset or 0)


def scan_segment(path: Path) -> Iterator[ScanItem]:
    """Yield every framed batch of the file in order, then a BrokenTail if bytes remain."""
    with open(path, "rb", buffering=_READ_BUFFER_BYTES) as f:
        size = os.fstat(f.fileno()).st_size
        position = 0
        while position < size:
            item = _next_batch(f, position, size)
            yield item
            if isinstance(item, BrokenTail):
                return
            position += len(item.data)


def _next_batch(f: BinaryIO, position: int, size: int) -> ScanItem:
    remaining = size - position
    prefix = f.read(LOG_OVERHEAD)
    if len(prefix) < LOG_OVERHEAD:
        return BrokenTail(position, f"{remaining} trailing bytes, fewer than a batch prefix")
    base_offset, length = _PREFIX.unpack(prefix)
    if prefix == bytes(LOG_OVERHEAD):
        return BrokenTail(position, "zero bytes where a batch should start (a hole), not a batch")
    if length < MIN_BATCH_LENGTH:
        return BrokenTail(
            position,
            f"batch length {length} (base offset {base_offset}) is below the "
            f"{MIN_BATCH_LENGTH}-byte minimum: garbage, not a batch",
        )
    if LOG_OVERHEAD + length > remaining:
        return BrokenTail(
            position,
            f"truncated batch (base offset {base_offset}): declares {LOG_OVERHEAD + length} "
            f"bytes, {remaining} remain in the file",
        )
    body = f.read(length)
    if len(body) < length:  # the file shrank while being read
        return BrokenTail(position, f"file ends {len(body)} bytes into a {length}-byte batch")
    data = prefix + body
    if data[_POS_MAGIC] != MAGIC_V2:
        return BrokenTail(
            position,
            f"batch (base offset {base_offset}) has magic {data[_POS_MAGIC]}, expected "
            f"{MAGIC_V2}: garbage or an unsupported format",
        )
    return ScannedBatch(position, unpack_header(data), data, compute_crc(data, 0, len(data)))


def read_offset_index(path: Path, base_offset: int) -> IndexContents:
    """Decode a ``.index`` file: entries (absolute offset, position in the .log)."""
    return _read_index(path, base_offset, OFFSET_ENTRY_BYTES, _offset_entry)


def read_time_index(path: Path, base_offset: int) -> IndexContents:
    """Decode a ``.timeindex`` file: entries (timestamp, absolute offset)."""
    return _read_index(path, base_offset, TIME_ENTRY_BYTES, _time_entry)


def _offset_entry(raw: bytes, slot: int, base_offset: int) -> IndexEntry:
    relative, position = _OFFSET_ENTRY.unpack_from(raw, slot * OFFSET_ENTRY_BYTES)
    return IndexEntry(slot, slot * OFFSET_ENTRY_BYTES, base_offset + relative, position, relative)


def _time_entry(raw: bytes, slot: int, base_offset: int) -> IndexEntry:
    timestamp, relative = _TIME_ENTRY.unpack_from(raw, slot * TIME_ENTRY_BYTES)
    return IndexEntry(slot, slot * TIME_ENTRY_BYTES, timestamp, base_offset + relative, relative)


def _read_index(
    path: Path,
    base_offset: int,
    entry_bytes: int,
    decode: _EntryDecoder,
) -> IndexContents:
    with open(path, "rb") as f:
        raw = f.read()
    slots = len(raw) // entry_bytes
    used = _used_slots(raw, slots, entry_bytes)
    entries = tuple(decode(raw, slot, base_offset) for slot in range(used))
    return IndexContents(path, len(raw), entries, slots - used, len(raw) % entry_bytes)


def _used_slots(raw: bytes, slots: int, entry_bytes: int) -> int:
    """Slots up to the last one that is not all zeros."""
    zero = bytes(entry_bytes)
    used = slots
    while used > 0 and raw[(used - 1) * entry_bytes : used * entry_bytes] == zero:
        used -= 1
    return used
