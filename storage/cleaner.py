"""Compaction of keyed logs (``cleanup_policy`` containing "compact"): Kafka's LogCleaner,
simplified. After a pass, a compacted range holds for each key only its latest record, each
at its original offset; offsets, the high watermark, the log start and the log end never move.

How a pass works (:func:`compact`):

1. Plan, under the log's lock (a snapshot of segments, HW and producer state):
   * the *mapped range* is every inactive segment that lies entirely below the high
     watermark. The active segment and anything above the HW are never read or written:
     they may still change or be truncated.
   * the *cleanable range* is the prefix of the mapped range up to (not including) the first
     segment whose largest timestamp is newer than ``now - min_compaction_lag_ms``, so every
     record stays uncompacted for at least the lag (a lag of 0 disables the check, as in
     Kafka; an empty segment never stops the range). It always starts at the log's first
     segment.
   * the *dirty ratio* is bytes of cleanable segments at or after ``first_dirty_offset`` (what
     earlier passes left uncleaned: the LogManager passes ``Log.compacted_below``, which
     every group a pass cleans raises and which it persists, Kafka's cleaner checkpoint)
     over bytes of all cleanable segments. Without a previous pass everything is dirty (1.0).
     Below ``min_cleanable_dirty_ratio`` the pass does nothing. This is Kafka's measure, but
     by whole segments.
2. Map: read every record of the mapped range and keep, per key, its latest offset (keys are
   stored as 128-bit BLAKE2b digests, as Kafka stores MD5s, so memory per entry is bounded).
   Only keys of the cleanable range are added; later segments only raise existing entries,
   which is what lets a later update remove an older value. The map holds at most
   ``max_map_entries`` keys: the cleanable range is cut at the last segment whose keys all
   fit (a cut-off segment is still read to update entries). If not even the first segment
   fits, :class:`OffsetMapFullError` is raised.
3. Clean, group by group. Consecutive cleanable segments are grouped while their total size
   stays within ``segment_bytes``, their offsets within a 32-bit delta of the group's base and
   their index entries within one index. Each group's records are filtered:
   * a record with a null key is always kept (it cannot be compacted);
   * a keyed record is kept iff it is the latest for its key in the map;
   * a kept tombstone (null value) is dropped once the segment it was read from has a largest
     timestamp older than ``now - delete_retention_ms`` (the delete horizon), so consumers have
     had that long to see the delete. A tombstone carried into a merged, newer segment may
     therefore live longer than that; never shorter;
   * control batches are copied unchanged; transactional batches are treated as committed
     (this engine keeps no aborted-transaction index).
   A batch keeping all its records is copied byte for byte. One that lost some is rebuilt with
   its original base offset, records at their original offsets, codec, partition leader epoch,
   producer id/epoch, base sequence, timestamp type, attributes, max timestamp and last offset
   delta (so producer state and time indexes derived from the header do not change). A batch
   that lost every record disappears, unless it is the latest batch of a producer in the
   producer state: that one stays as an empty batch (header only, no records, uncompressed as
   Kafka writes empty batches), so the producer's dedup state survives any reload.
   A single segment in which nothing changes is not rewritten; a group of several always is,
   which merges the small (or empty) outputs of earlier passes. The output keeps the newest
   modification time of its sources, which ages segments that hold no timestamps.
4. Swap, crash-safely: the output is written to ``<base>.log.cleaned``, fsynced, the log's
   ``compacted_below`` raised to the group's end and persisted by the owner
   (``Log.note_compacted``: whoever compares replicas must know where one may have been
   rewritten, also after a crash mid-swap), and then,
   under the log's lock after checking that none of the segments the map and the group came
   from was deleted, truncated or replaced meanwhile (if one was, the output is thrown away
   and the pass stops), renamed to ``swap_file_name(base, end)`` (``end``: the base offset of
   the segment after the group), the directory fsynced, and handed to
   ``Log.replace_segments``. A crash leaves either a ``.cleaned`` file, which the loader
   deletes (the old segments are intact), or a ``.swap`` file, which the loader completes.

Concurrency: one pass at a time per log (the LogManager's maintenance). Reading and writing
happen without the log's lock, so appends continue; the lock is taken to plan and to swap.
The caller must not close the log during a pass. Decompression of any batch is bounded by
``config.max_decompressed_batch_bytes``.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from storage.batch import (
    ATTR_COMPRESSION_MASK,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC_V2,
    BatchHeader,
    compute_crc,
    peek_size,
    validate_batch,
)
from storage.checkpoint import fsync_path
from storage.errors import CorruptRecordError, LogDirOfflineError, StorageError, invariant
from storage.loader import swap_file_name
from storage.log import Log
from storage.records import DecodedBatch, Record, RecordInput, build_batch, decode_batch
from storage.segment import LOG_SUFFIX, LogSegment

__all__ = ["CLEANED_SUFFIX", "CleanStats", "OffsetMap", "OffsetMapFullError", "compact"]

CLEANED_SUFFIX = ".cleaned"
DEFAULT_MAX_MAP_ENTRIES = 1_000_000
_INT32_MAX = 2**31 - 1
_DIGEST_BYTES = 16
_WRITE_BUFFER_BYTES = 1024 * 1024
_HEADER = struct.Struct(">qiibIhiqqqhii")  # the v2 header layout documented in batch.py
_POS_CRC = 17
_POS_LAST_OFFSET_DELTA = 23
_CRC = struct.Struct(">I")
_INT32 = struct.Struct(">i")


class OffsetMapFullError(StorageError):
    """The first cleanable segment alone has more distinct keys than the offset map may hold."""


@dataclass(frozen=True, slots=True)
class CleanStats:
    """What a pass did. ``clean_end_offset`` is where the cleaned range ends (pass it back as
    ``first_dirty_offset`` next time), or -1 when the pass cleaned nothing."""

    segments_cleaned: int = 0
    bytes_before: int = 0
    bytes_after: int = 0
    records_removed: int = 0  # superseded records and expired tombstones
    tombstones_removed: int = 0  # the removed records that had a null value
    clean_end_offset: int = -1


class OffsetMap:
    """Key digest -> latest offset, holding at most ``max_entries`` keys."""

    def __init__(self, max_entries: int) -> None:
        if max_entries < 1:
            raise ValueError(f"max_entries must be at least 1, got {max_entries}")
        self.max_entries = max_entries
        self._offsets: dict[bytes, int] = {}

    def __len__(self) -> int:
        return len(self._offsets)

    def put(self, key: bytes, offset: int, added: list[bytes]) -> bool:
        """Map ``key`` to ``offset``; a new key is appended to ``added``. False when full."""
        digest = _digest(key)
        if digest not in self._offsets:
            if len(self._offsets) >= self.max_entries:
                return False
            added.append(digest)
        self._offsets[digest] = offset
        return True

    def update(self, key: bytes, offset: int) -> None:
        """Raise the offset of a key already mapped; unknown keys are ignored."""
        digest = _digest(key)
        if digest in self._offsets:
            self._offsets[digest] = offset

    def forget(self, digests: Sequence[bytes]) -> None:
        for digest in digests:
            del self._offsets[digest]

    def latest(self, key: bytes) -> int | None:
        return self._offsets.get(_digest(key))


def _digest(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=_DIGEST_BYTES).digest()


@dataclass(frozen=True, slots=True)
class _Plan:
    mapped: tuple[LogSegment, ...]  # inactive segments entirely below the HW
    cleanable: int  # how many of ``mapped`` (a prefix) may be cleaned
    run: tuple[LogSegment, ...]  # ``mapped`` plus the segment after it
    producers: Mapping[int, int]  # producer id -> last offset of its latest batch


@dataclass(slots=True)
class _Counts:
    records_removed: int = 0
    tombstones_removed: int = 0
    changed: bool = False


def compact(
    log: Log,
    now_ms: int,
    *,
    max_map_entries: int = DEFAULT_MAX_MAP_ENTRIES,
    first_dirty_offset: int | None = None,
) -> CleanStats:
    """Run one compaction pass over ``log`` (see the module docstring)."""
    invariant(log.config.compact, f"{log.dir}: cleanup policy {log.config.cleanup_policy!r}")
    plan = _plan(log, now_ms)
    if not plan.cleanable or _dirty_ratio(plan, first_dirty_offset) < (
        log.config.min_cleanable_dirty_ratio
    ):
        return CleanStats()
    offset_map = OffsetMap(max_map_entries)
    covered = _build_map(offset_map, plan, log.config.max_decompressed_batch_bytes)
    stats = CleanStats()
    start = 0
    for group in _groups(plan.run[: covered + 1], log.config.segment_bytes):
        outcome = _clean_group(log, plan, start, len(group), offset_map, now_ms)
        if outcome is None:
            break  # the log changed under the pass: stop, the next pass starts afresh
        stats = _add(stats, outcome, plan.run[start + len(group)].base_offset)
        start += len(group)
    return stats


def _plan(log: Log, now_ms: int) -> _Plan:
    with log._lock:
        if log.offline:
            raise LogDirOfflineError(f"{log.dir} is offline")
        segments = log.segments
        hw = log.high_watermark
        producers = {pid: e.last_offset for pid, e in log.producer_state.producers.items()}
    mapped = 0
    while mapped + 1 < len(segments) and segments[mapped + 1].base_offset <= hw:
        mapped += 1
    lag_ms = log.config.min_compaction_lag_ms
    cleanable = 0
    while cleanable < mapped and (
        lag_ms == 0
        or segments[cleanable].size == 0  # nothing in it to protect
        or segments[cleanable].largest_timestamp() <= now_ms - lag_ms
    ):
        cleanable += 1
    return _Plan(tuple(segments[:mapped]), cleanable, tuple(segments[: mapped + 1]), producers)


def _dirty_ratio(plan: _Plan, first_dirty_offset: int | None) -> float:
    cleanable = plan.mapped[: plan.cleanable]
    total = sum(s.size for s in cleanable)
    if first_dirty_offset is None or total == 0:
        return 1.0
    dirty = sum(s.size for s in cleanable if s.base_offset >= first_dirty_offset)
    return dirty / total


# -- mapping -------------------------------------------------------------------------------


def _build_map(offset_map: OffsetMap, plan: _Plan, max_batch_bytes: int) -> int:
    """Map the mapped range; returns how many leading cleanable segments the map covers."""
    covered = 0
    adding = True
    for index, segment in enumerate(plan.mapped):
        adding = adding and index < plan.cleanable
        adding = _map_segment(offset_map, segment, adding, max_batch_bytes)
        if adding:
            covered += 1
    if covered == 0:
        raise OffsetMapFullError(
            f"segment {plan.mapped[0].base_offset} has more than {offset_map.max_entries} "
            f"distinct keys; raise max_map_entries or lower segment_bytes"
        )
    return covered


def _map_segment(offset_map: OffsetMap, segment: LogSegment, adding: bool, limit: int) -> bool:
    """Map ``segment``'s keys; with ``adding``, new keys too. Returns whether every new key
    fitted; if one did not, the keys this segment added are forgotten again."""
    added: list[bytes] = []
    for _, batch in _read_batches(segment, limit):
        if batch.header.is_control:
            continue
        for record in batch.records:
            if record.key is None:
                continue
            if not adding:
                offset_map.update(record.key, record.offset)
            elif not offset_map.put(record.key, record.offset, added):
                offset_map.forget(added)
                adding = False
    return adding


def _read_batches(segment: LogSegment, limit: int) -> Iterator[tuple[bytes, DecodedBatch]]:
    """Every batch of an inactive segment: its bytes, validated and decoded."""
    fd, size, position = segment.handle.fd, segment.size, 0
    while position < size:
        _, batch_size = peek_size(os.pread(fd, LOG_OVERHEAD, position))
        if batch_size < HEADER_SIZE or position + batch_size > size:
            raise CorruptRecordError(
                f"{segment.log_path}: batch at byte {position} of {batch_size} bytes does not "
                f"fit the segment's {size} bytes"
            )
        raw = os.pread(fd, batch_size, position)
        yield raw, decode_batch(raw, max_uncompressed_bytes=limit)
        position += batch_size


# -- grouping ------------------------------------------------------------------------------


def _groups(run: Sequence[LogSegment], segment_bytes: int) -> Iterator[Sequence[LogSegment]]:
    """Split ``run[:-1]`` into groups; ``run[-1]`` only bounds the offsets of the last."""
    start = 0
    while start < len(run) - 1:
        end = start + 1
        while end < len(run) - 1 and _fits(run[start : end + 1], run[end + 1], segment_bytes):
            end += 1
        yield run[start:end]
        start = end


def _fits(group: Sequence[LogSegment], following: LogSegment, segment_bytes: int) -> bool:
    first = group[0]
    index_entries = sum(s.offset_index.entries + 1 for s in group)
    return (
        sum(s.size for s in group) <= segment_bytes
        and following.base_offset - 1 - first.base_offset <= _INT32_MAX
        and index_entries < first.offset_index.max_entries
        and index_entries < first.time_index.max_entries - 1
    )


# -- cleaning ------------------------------------------------------------------------------


def _clean_group(
    log: Log, plan: _Plan, start: int, count: int, offset_map: OffsetMap, now_ms: int
) -> CleanStats | None:
    """Clean ``plan.run[start : start + count]``; None if the log changed meanwhile."""
    group = plan.run[start : start + count]
    base, end = group[0].base_offset, plan.run[start + count].base_offset
    cleaned = log.dir / f"{base:020d}{LOG_SUFFIX}{CLEANED_SUFFIX}"
    try:
        counts, written = _write_cleaned(cleaned, group, offset_map, plan.producers, log, now_ms)
        before = sum(s.size for s in group)
        if not counts.changed and count == 1:
            log.note_compacted(end, rewritten=False)
            return CleanStats(clean_end_offset=end)
        _preserve_mtime(cleaned, group)
        fsync_path(cleaned)
        log.note_compacted(end)  # durable before the rewritten bytes are
        with log._lock:
            if not _still_in_log(log, plan.run[start:]):
                return None
            swap = log.dir / swap_file_name(base, end)
            os.replace(cleaned, swap)
            fsync_path(log.dir)
            segment = log.replace_segments([s.base_offset for s in group], swap)
        invariant(
            segment.size == written,
            f"{log.dir}: cleaned segment {base} holds {segment.size} bytes, wrote {written}",
        )
    finally:
        cleaned.unlink(missing_ok=True)
    return CleanStats(
        count, before, written, counts.records_removed, counts.tombstones_removed, end
    )


def _still_in_log(log: Log, run: Sequence[LogSegment]) -> bool:
    """Whether ``run`` is still a consecutive run of the log's segments (the very objects).

    A truncation into the run would have made one of them active and deleted the rest, a
    retention or swap would have removed some, so an unchanged run proves the mapped bytes
    and the group are as they were read.
    """
    current = log.segments
    for index, segment in enumerate(current):
        if segment is run[0]:
            window = current[index : index + len(run)]
            return len(window) == len(run) and all(a is b for a, b in zip(window, run, strict=True))
    return False


def _write_cleaned(
    path: Path,
    group: Sequence[LogSegment],
    offset_map: OffsetMap,
    producers: Mapping[int, int],
    log: Log,
    now_ms: int,
) -> tuple[_Counts, int]:
    """Write the retained batches of ``group`` to ``path``; returns the counts and bytes."""
    counts = _Counts()
    written, next_offset = 0, group[0].base_offset
    buffer = bytearray()
    limit = log.config.max_decompressed_batch_bytes
    with open(path, "wb") as out:
        for segment in group:
            expired = now_ms - segment.largest_timestamp() > log.config.delete_retention_ms
            for raw, batch in _read_batches(segment, limit):
                kept = _filter_batch(raw, batch, offset_map, producers, expired, counts)
                if kept is None:
                    continue
                header = validate_batch(kept)
                invariant(
                    header.base_offset >= next_offset,
                    f"{path}: cleaned batch at {header.base_offset} is below {next_offset}",
                )
                next_offset = header.next_offset
                buffer += kept
                written += len(kept)
                if len(buffer) >= _WRITE_BUFFER_BYTES:
                    out.write(buffer)
                    buffer.clear()
        out.write(buffer)
    return counts, written


def _preserve_mtime(path: Path, group: Sequence[LogSegment]) -> None:
    """Give the output its sources' newest modification time, as Kafka does: a segment
    without timestamps is aged (retention, lag, delete horizon) by it."""
    newest_ns = max(os.fstat(s.handle.fd).st_mtime_ns for s in group)
    os.utime(path, ns=(newest_ns, newest_ns))


def _filter_batch(
    raw: bytes,
    batch: DecodedBatch,
    offset_map: OffsetMap,
    producers: Mapping[int, int],
    drop_tombstones: bool,
    counts: _Counts,
) -> bytes | None:
    """The batch's bytes after compaction (``raw`` itself if unchanged), or None if it goes."""
    header = batch.header
    if header.is_control:
        return raw
    kept: list[Record] = []
    for record in batch.records:
        if _retain(record, offset_map, drop_tombstones):
            kept.append(record)
        else:
            counts.records_removed += 1
            counts.tombstones_removed += record.value is None
    if len(kept) == len(batch.records):
        return raw
    counts.changed = True
    if kept:
        return _rebuild(header, kept)
    if header.has_producer_id and producers.get(header.producer_id) == header.last_offset:
        return _empty_batch(header)
    return None


def _retain(record: Record, offset_map: OffsetMap, drop_tombstones: bool) -> bool:
    if record.key is None:
        return True
    latest = offset_map.latest(record.key)
    if latest is not None and latest > record.offset:
        return False
    return record.value is not None or not drop_tombstones


def _rebuild(header: BatchHeader, kept: Sequence[Record]) -> bytes:
    """A batch of ``kept`` with ``header``'s fields, each record at its original offset."""
    built = build_batch(
        [
            RecordInput(r.key, r.value, r.timestamp, r.headers, r.offset - header.base_offset)
            for r in kept
        ],
        base_offset=header.base_offset,
        compression=header.compression,
        timestamp_type=header.timestamp_type,
        producer_id=header.producer_id,
        producer_epoch=header.producer_epoch,
        base_sequence=header.base_sequence,
        partition_leader_epoch=header.partition_leader_epoch,
        is_transactional=header.is_transactional,
        is_control=header.is_control,
        max_timestamp=header.max_timestamp,
    )
    out = bytearray(built)
    # Keep the original last offset delta: the batch still spans the same offsets, and the
    # producer's last sequence (base sequence + delta) must read the same after compaction.
    _INT32.pack_into(out, _POS_LAST_OFFSET_DELTA, header.last_offset_delta)
    _CRC.pack_into(out, _POS_CRC, compute_crc(out, 0, len(out)))
    return bytes(out)


def _empty_batch(header: BatchHeader) -> bytes:
    """``header`` with no records: what Kafka keeps of a producer's emptied latest batch."""
    out = bytearray(
        _HEADER.pack(
            header.base_offset,
            HEADER_SIZE - LOG_OVERHEAD,
            header.partition_leader_epoch,
            MAGIC_V2,
            0,  # CRC, set below
            header.attributes & ~ATTR_COMPRESSION_MASK,
            header.last_offset_delta,
            header.base_timestamp,
            header.max_timestamp,
            header.producer_id,
            header.producer_epoch,
            header.base_sequence,
            0,
        )
    )
    _CRC.pack_into(out, _POS_CRC, compute_crc(out, 0, len(out)))
    return bytes(out)


def _add(total: CleanStats, group: CleanStats, end_offset: int) -> CleanStats:
    return CleanStats(
        total.segments_cleaned + group.segments_cleaned,
        total.bytes_before + group.bytes_before,
        total.bytes_after + group.bytes_after,
        total.records_removed + group.records_removed,
        total.tombstones_removed + group.tombstones_removed,
        end_offset,
    )
