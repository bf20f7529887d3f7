"""Byte-by-byte verification of a partition log on disk, read-only (``runnel log verify``).

How this works: segments are checked in base-offset order; within a segment the ``.log``
file first (every batch: framing, magic, CRC, header fields, offsets strictly increasing
within and across segments and never below the segment's base, leader epochs never going
back), then its ``.index`` and ``.timeindex``. The first problem stops the run and is raised
as :class:`LogProblem`, which names the file, the byte position in it and the offset.

Index rules. Offset index: entries strictly increasing, each entry's position the start of
a batch whose last offset is the entry's offset. Time index: timestamps and offsets never
decreasing, offsets within the segment. A missing index file is not a problem (the loader
rebuilds it), and neither are zero-filled pre-allocated slots after the last entry.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from runnel.segment_reader import (
    OFFSET_ENTRY_BYTES,
    TIME_ENTRY_BYTES,
    BrokenTail,
    IndexContents,
    IndexEntry,
    ScannedBatch,
    SegmentFile,
    read_offset_index,
    read_time_index,
    scan_segment,
)
from storage.batch import (
    ATTR_COMPRESSION_MASK,
    NO_PARTITION_LEADER_EPOCH,
    BatchHeader,
    CompressionType,
)
from storage.errors import StorageError

_MAX_RELATIVE_OFFSET = 2**31 - 1


class LogProblem(Exception):
    """The first thing found wrong: ``<file>: byte <position>: <what>``."""

    def __init__(self, file_name: str, position: int, detail: str) -> None:
        super().__init__(f"{file_name}: byte {position}: {detail}")
        self.file_name = file_name
        self.position = position
        self.detail = detail


@dataclass(frozen=True, slots=True)
class VerifyOptions:
    decode_records: bool = False
    max_decompressed_bytes: int | None = None  # None: the engine's limit


@dataclass(slots=True)
class VerifySummary:
    """What a successful run covered; also the running state while verifying."""

    segments: int = 0
    batches: int = 0
    records: int = 0
    size_bytes: int = 0
    first_offset: int | None = None
    last_offset: int | None = None
    offset_gaps: int = 0  # normal in a compacted log, a sign of lost data in any other
    last_epoch: int = NO_PARTITION_LEADER_EPOCH
    last_file: str = ""

    def count(self, file_name: str, header: BatchHeader) -> None:
        """Account for a batch that passed every check."""
        self.batches += 1
        self.records += header.record_count
        if self.last_offset is not None and header.base_offset > self.last_offset + 1:
            self.offset_gaps += 1
        if self.first_offset is None:
            self.first_offset = header.base_offset
        self.last_offset = header.last_offset
        if header.partition_leader_epoch != NO_PARTITION_LEADER_EPOCH:
            self.last_epoch = header.partition_leader_epoch
        self.last_file = file_name

    def describe(self) -> str:
        offsets = (
            "no offsets"
            if self.first_offset is None
            else f"offsets {self.first_offset}-{self.last_offset}"
        )
        counts = ", ".join(
            _plural(n, noun)
            for n, noun in (
                (self.segments, "segment"),
                (self.batches, "batch"),
                (self.records, "record"),
                (self.size_bytes, "byte"),
            )
        )
        gaps = (
            f"; {_plural(self.offset_gaps, 'gap')} between offsets (fine only if compacted)"
            if self.offset_gaps
            else ""
        )
        return f"ok: {counts}; {offsets}{gaps}"


@dataclass(slots=True)
class _SegmentState:
    """What the index checks need from the scan of one segment's .log file."""

    size_bytes: int = 0
    last_offset: int | None = None
    last_offsets_by_position: dict[int, int] = field(default_factory=dict)


def _plural(count: int, noun: str) -> str:
    if count == 1:
        return f"1 {noun}"
    return f"{count} {noun}es" if noun.endswith("ch") else f"{count} {noun}s"


def verify_log(segments: Sequence[SegmentFile], options: VerifyOptions) -> VerifySummary:
    """Check every segment; raises LogProblem at the first problem."""
    summary = VerifySummary()
    for segment in segments:
        offset_index = _load_index(segment, offset=True)
        time_index = _load_index(segment, offset=False)
        wanted = {e.second for e in offset_index.entries} if offset_index else set()
        state = _verify_batches(segment, summary, options, wanted)
        if offset_index is not None:
            _check_offset_index(offset_index, state)
        if time_index is not None:
            _check_time_index(time_index, segment, state)
        summary.segments += 1
        summary.size_bytes += state.size_bytes
    return summary


def _load_index(segment: SegmentFile, *, offset: bool) -> IndexContents | None:
    path = segment.offset_index_path if offset else segment.time_index_path
    if path is None or segment.base_offset is None or not path.exists():
        return None
    if offset:
        return read_offset_index(path, segment.base_offset)
    return read_time_index(path, segment.base_offset)


def _verify_batches(
    segment: SegmentFile, summary: VerifySummary, options: VerifyOptions, wanted: set[int]
) -> _SegmentState:
    state = _SegmentState()
    for item in scan_segment(segment.path):
        if isinstance(item, BrokenTail):
            raise LogProblem(segment.name, item.position, item.reason)
        _check_batch(segment, item, summary)
        if options.decode_records:
            _check_records(segment, item, options.max_decompressed_bytes)
        header = item.header
        if item.position in wanted:
            state.last_offsets_by_position[item.position] = header.last_offset
        state.last_offset = header.last_offset
        state.size_bytes = item.position + len(item.data)
        summary.count(segment.name, header)
    return state


def _check_batch(segment: SegmentFile, batch: ScannedBatch, summary: VerifySummary) -> None:
    detail = _batch_fault(segment, batch) or _order_fault(segment, batch, summary)
    if detail is not None:
        raise LogProblem(
            segment.name, batch.position, f"batch at offset {batch.header.base_offset}: {detail}"
        )


def _batch_fault(segment: SegmentFile, batch: ScannedBatch) -> str | None:
    """What is wrong with the batch on its own, if anything."""
    h = batch.header
    if not batch.crc_valid:
        return f"CRC mismatch (stored {h.crc:#010x}, computed {batch.computed_crc:#010x})"
    if h.base_offset < 0:
        return "negative base offset"
    if h.last_offset_delta < 0 or h.record_count < 0:
        return f"last offset delta {h.last_offset_delta}, record count {h.record_count}"
    if h.record_count > h.last_offset_delta + 1:
        return f"{h.record_count} records in a batch spanning {h.last_offset_delta + 1} offsets"
    codec = h.attributes & ATTR_COMPRESSION_MASK
    if not _known_codec(codec):
        return f"unknown compression codec id {codec}"
    base = segment.base_offset
    if base is not None and h.base_offset < base:
        return f"base offset is below the segment's base offset {base}"
    if base is not None and h.last_offset - base > _MAX_RELATIVE_OFFSET:
        return f"last offset {h.last_offset} is too far above the segment's base {base}"
    return None


def _known_codec(codec_id: int) -> bool:
    try:
        CompressionType(codec_id)
    except ValueError:
        return False
    return True


def _order_fault(segment: SegmentFile, batch: ScannedBatch, summary: VerifySummary) -> str | None:
    """What is wrong with the batch relative to the ones before it, if anything."""
    h = batch.header
    previous = summary.last_offset
    if previous is not None and h.base_offset <= previous:
        where = "" if summary.last_file == segment.name else f" in {summary.last_file}"
        return (
            f"offsets not increasing: batch starts at {h.base_offset} but the previous "
            f"batch{where} ended at {previous}"
        )
    epoch = h.partition_leader_epoch
    if epoch != NO_PARTITION_LEADER_EPOCH and epoch < summary.last_epoch:
        return f"leader epoch {epoch} is below the previous batch's epoch {summary.last_epoch}"
    return None


def _check_records(segment: SegmentFile, batch: ScannedBatch, max_bytes: int | None) -> None:
    try:
        batch.decode(max_bytes)
    except StorageError as e:
        raise LogProblem(
            segment.name,
            batch.position,
            f"batch at offset {batch.header.base_offset}: records do not decode: {e}",
        ) from None


def _check_offset_index(index: IndexContents, state: _SegmentState) -> None:
    name = index.path.name
    _check_whole_slots(index, OFFSET_ENTRY_BYTES)
    previous: int | None = None
    for entry in index.entries:
        detail = _offset_entry_fault(entry, previous, state)
        if detail is not None:
            raise LogProblem(
                name,
                entry.file_position,
                f"entry {entry.slot} (offset {entry.first} at position {entry.second}): {detail}",
            )
        previous = entry.first


def _offset_entry_fault(
    entry: IndexEntry, previous: int | None, state: _SegmentState
) -> str | None:
    offset, position = entry.first, entry.second
    if entry.relative_offset < 0:
        return "offset is below the segment's base offset"
    if previous is not None and offset <= previous:
        return f"offsets not increasing: follows an entry for offset {previous}"
    if not 0 <= position < state.size_bytes:
        return f"position is outside the {state.size_bytes} bytes of valid batches"
    last_offset = state.last_offsets_by_position.get(position)
    if last_offset is None:
        return "position is not the start of a batch"
    if last_offset != offset:
        return f"the batch at that position ends at offset {last_offset}, not {offset}"
    return None


def _check_time_index(index: IndexContents, segment: SegmentFile, state: _SegmentState) -> None:
    name = index.path.name
    _check_whole_slots(index, TIME_ENTRY_BYTES)
    previous: IndexEntry | None = None
    for entry in index.entries:
        detail = _time_entry_fault(entry, previous, segment, state)
        if detail is not None:
            raise LogProblem(
                name,
                entry.file_position,
                f"entry {entry.slot} (timestamp {entry.first} at offset {entry.second}): {detail}",
            )
        previous = entry


def _time_entry_fault(
    entry: IndexEntry, previous: IndexEntry | None, segment: SegmentFile, state: _SegmentState
) -> str | None:
    timestamp, offset = entry.first, entry.second
    if entry.relative_offset < 0:
        return f"offset is below the segment's base offset {segment.base_offset}"
    if state.last_offset is None:
        return "the segment holds no batches"
    if offset > state.last_offset:
        return f"offset is beyond the segment's last offset {state.last_offset}"
    if previous is not None and timestamp < previous.first:
        return f"timestamp went back from {previous.first}"
    if previous is not None and offset < previous.second:
        return f"offset went back from {previous.second}"
    return None


def _check_whole_slots(index: IndexContents, entry_bytes: int) -> None:
    if index.partial_bytes:
        raise LogProblem(
            index.path.name,
            index.size_bytes - index.partial_bytes,
            f"file size {index.size_bytes} is not a whole number of {entry_bytes}-byte entries",
        )
