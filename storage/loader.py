"""Opening a partition log from disk, with crash recovery (Kafka's LogLoader, condensed).

Passes, in order:
  1. Remove leftovers of interrupted operations: ``*.tmp``, ``*.cleaned``, ``*.deleted``;
     complete an interrupted compaction swap (``*.log.swap`` replaces the segments it covers,
     in runnel's naming or Kafka's: see ``_complete_swaps``).
  2. Open every ``.log`` segment; delete index files that have no ``.log``.
  3. After an unclean shutdown (no clean-shutdown marker), recover every segment from the one
     holding the recovery point: re-validate each batch (framing, CRC, increasing offsets),
     rebuild both indexes, cut the file at the first bad byte and delete all later segments.
     After a clean shutdown, only segments whose indexes are missing or fail a sanity check
     are recovered. Recovered segments are fsynced, and the directory with them (their names
     may never have been synced), before the recovery point moves to the log end.
  4. Check the segments against each other and against the checkpoints: a gap between
     segments of a non-compacted log, or a log start offset beyond the log end, means files
     were deleted behind the engine's back; that is reported (InconsistentLogError), never
     silently wiped. The exception is a log start above the recovery point after an unclean
     shutdown: the log start moves without an fsync, so a machine crash may have lost the
     data under it; the log restarts empty at the log start, with a warning.
  5. Restore the leader-epoch cache (from its checkpoint plus recovered batches, truncated to
     the log's range) and producer state (newest snapshot, then replay to the log end).
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from storage.batch import NO_PARTITION_LEADER_EPOCH, BatchHeader
from storage.checkpoint import fsync_path
from storage.config import LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import InconsistentLogError
from storage.index import CorruptIndexError
from storage.log import LEADER_EPOCH_CHECKPOINT, Log, wall_clock_ms
from storage.producer_state import ProducerStateManager
from storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    next_offset_of_file,
    open_segment,
)

SWAP_SUFFIX = ".swap"
_log = logging.getLogger(__name__)
_CLEANED_SUFFIX = ".cleaned"
_LEFTOVER_SUFFIXES = (".tmp", _CLEANED_SUFFIX, ".deleted")
# runnel's cleaner names its output <base>.<end>.log.swap; Kafka's names each of a segment's
# files <base>.<suffix>.swap.
_RUNNEL_SWAP = re.compile(r"([0-9]{20})\.([0-9]{20})\.log\.swap")
_KAFKA_SWAP = re.compile(r"([0-9]{20})\.(log|index|timeindex|txnindex)\.swap")
_OFFSET_PREFIX = re.compile(r"([0-9]{20})\.")


def load_log(
    directory: Path,
    config: LogConfig,
    *,
    recovery_point: int = 0,
    log_start_offset: int | None = None,
    high_watermark: int | None = None,
    compacted_below: int = 0,
    had_clean_shutdown: bool = False,
    clock: Callable[[], int] = wall_clock_ms,
    on_offline: Callable[[Path, BaseException], None] | None = None,
    jitter_seed: int | None = None,
) -> Log:
    """Open (creating if needed) the log in ``directory``, recovering it if necessary.
    ``compacted_below``: from the cleaner checkpoint, cut to the log end (recovery may have
    cut the log below it; nothing above the log end is rewritten).
    ``jitter_seed``: see :class:`Log` (tests; None seeds from the operating system)."""
    new_directory = not directory.is_dir()
    directory.mkdir(parents=True, exist_ok=True)
    first_cleaned = _remove_leftovers(directory)
    _complete_swaps(directory, first_cleaned)
    epoch_cache = LeaderEpochCache(directory / LEADER_EPOCH_CHECKPOINT)
    segments = _open_segments(directory, config, clock())
    if not segments:
        if recovery_point > 0:
            raise InconsistentLogError(
                f"{directory}: the recovery point says offsets below {recovery_point} were "
                f"flushed, but no segment files exist; they were deleted behind the engine's back"
            )
        # The HW and the log start move without a flush: a power loss before the log's first
        # flush can take every segment file (their names were never made durable).
        first = log_start_offset or 0
        if first or high_watermark:
            _log.warning(
                "%s: no segment files but checkpoints name offset %d; nothing was flushed, so "
                "a machine crash lost the log: starting it empty at offset %d",
                directory,
                max(first, high_watermark or 0),
                first,
            )
        segments = [open_segment(directory, first, config, clock(), create=True)]
    recovered = _recover(segments, config, epoch_cache, recovery_point, had_clean_shutdown)
    _check_contiguous(directory, segments, config)
    log_end = segments[-1].read_next_offset()
    start = max(log_start_offset if log_start_offset is not None else 0, segments[0].base_offset)
    if start > log_end:
        if had_clean_shutdown or recovery_point >= start:
            raise InconsistentLogError(
                f"{directory}: log start offset {start} is beyond the log end offset "
                f"{log_end}; segments were deleted behind the engine's back"
            )
        # The log start passed the recovery point (it moves without an fsync) and a machine
        # crash lost the unflushed data: all that survived lies below the log start.
        _log.warning(
            "%s: the log start offset %d is beyond the log end offset %d found after an "
            "unclean shutdown: a machine crash lost unflushed data under the log start; "
            "restarting the log empty at offset %d",
            directory,
            start,
            log_end,
            start,
        )
        for segment in segments:
            segment.delete()
        segments[:] = [open_segment(directory, start, config, clock(), create=True)]
        epoch_cache.clear()
        log_end = start
    epoch_cache.truncate_from_end(log_end)
    epoch_cache.truncate_from_start(start)
    if recovered.segments:
        for segment in recovered.segments:
            segment.flush()
        # The recovery point moves to the log end: the segments' names, which the crashed
        # process may never have synced, must be durable with their data (Log._sync).
        fsync_path(directory)
        recovery_point = log_end
    hw = min(max(high_watermark if high_watermark is not None else start, start), log_end)
    producer_state = ProducerStateManager(
        directory, producer_id_expiration_ms=config.producer_id_expiration_ms
    )
    log = Log(
        directory,
        config,
        segments,
        log_start_offset=start,
        high_watermark=hw,
        recovery_point=recovery_point,
        epoch_cache=epoch_cache,
        producer_state=producer_state,
        clock=clock,
        on_offline=on_offline,
        new_directory=new_directory,
        jitter_seed=jitter_seed,
    )
    log.reload_producer_state(recovered.producer_batches, recovered.suffix_start)
    log.compacted_below = min(compacted_below, log_end)
    if not had_clean_shutdown and high_watermark is not None and high_watermark > log_end:
        log.committed_end_before_crash = high_watermark
        _log.warning(
            "%s: recovered to offset %d, below the high watermark %d checkpointed before the "
            "unclean shutdown: committed records [%d, %d) were lost with the page cache; they "
            "come back from the leader if another in-sync replica has them",
            directory,
            log_end,
            high_watermark,
            log_end,
            high_watermark,
        )
    return log


def _remove_leftovers(directory: Path) -> int | None:
    """Delete the leftovers of interrupted operations; the lowest base offset a ``.cleaned``
    one named (an unfinished compaction output), or None (``_complete_swaps`` needs it)."""
    first_cleaned: int | None = None
    for path in directory.iterdir():
        if path.name.endswith(_LEFTOVER_SUFFIXES):
            match = _OFFSET_PREFIX.match(path.name)
            if path.name.endswith(_CLEANED_SUFFIX) and match is not None:
                offset = int(match.group(1))
                first_cleaned = offset if first_cleaned is None else min(first_cleaned, offset)
            path.unlink()
    return first_cleaned


def swap_file_name(base_offset: int, end_offset: int) -> str:
    """Name of a finished compaction output replacing segments with bases in [base, end)."""
    return f"{base_offset:020d}.{end_offset:020d}{LOG_SUFFIX}{SWAP_SUFFIX}"


def _complete_swaps(directory: Path, first_cleaned: int | None) -> None:
    """A ``.log.swap`` file is a fully written, fsynced compaction output. Finish what the
    cleaner started: delete the live segments it covers, then rename it into place (its
    indexes are rebuilt by recovery).

    Two namings are known. runnel's ``<base>.<end>.log.swap`` covers the segments whose base
    offsets lie in [base, end). Kafka's ``<base>.log.swap`` covers, as Kafka's LogLoader
    computes, those in [base, the offset after its last batch); its ``.index.swap``,
    ``.timeindex.swap`` and ``.txnindex.swap`` companions are deleted, since an index
    carries no checksum and recovery rebuilds it from the log. Either way the swap replaces
    the segment at its own base. As in Kafka (KAFKA-6264), a Kafka swap file at or above the
    lowest ``.cleaned`` offset belongs to an operation that had not finished writing its
    outputs: it is deleted and the live segments stay. (runnel's cleaner renames one output
    at a time and replaces its segments before it writes the next: its swap is always
    completed.) A ``.swap`` file of any other name
    is an InconsistentLogError naming it."""
    for swap in sorted(directory.glob(f"*{SWAP_SUFFIX}")):
        runnel = _RUNNEL_SWAP.fullmatch(swap.name)
        kafka = _KAFKA_SWAP.fullmatch(swap.name)
        if runnel is not None:
            base, end = int(runnel.group(1)), int(runnel.group(2))
        elif kafka is not None and kafka.group(2) == "log":
            base = int(kafka.group(1))
            end = next_offset_of_file(swap, base)
        elif kafka is not None:
            swap.unlink()  # an index: rebuilt from the log
            continue
        else:
            raise InconsistentLogError(
                f"{swap}: unknown swap file name; expected <base>.<end>.log.swap (runnel) or "
                f"<base>.log.swap, .index.swap, .timeindex.swap, .txnindex.swap (Kafka)"
            )
        if kafka is not None and first_cleaned is not None and base >= first_cleaned:
            _log.warning("%s: deleting a swap file of an unfinished compaction", swap)
            swap.unlink()
            continue
        _replace_segments_with(directory, swap, base, max(end, base + 1))


def _replace_segments_with(directory: Path, swap: Path, base: int, end: int) -> None:
    """Delete the segments with base offsets in [base, end), then rename ``swap`` to the
    segment at ``base``."""
    for path in directory.glob(f"*{LOG_SUFFIX}"):
        match = _OFFSET_PREFIX.match(path.name)
        if match is not None and base <= int(match.group(1)) < end:
            _delete_segment_files(directory, int(match.group(1)))
    os.replace(swap, directory / f"{base:020d}{LOG_SUFFIX}")


def _delete_segment_files(directory: Path, base: int) -> None:
    for suffix in (LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX):
        (directory / f"{base:020d}{suffix}").unlink(missing_ok=True)


def _open_segments(directory: Path, config: LogConfig, now_ms: int) -> list[LogSegment]:
    bases: set[int] = set()
    for path in directory.iterdir():
        stem, _, suffix = path.name.partition(".")
        if not stem.isdigit() or len(stem) != 20:
            continue
        if "." + suffix == LOG_SUFFIX:
            bases.add(int(stem))
    for path in directory.iterdir():
        stem, _, suffix = path.name.partition(".")
        orphan = stem.isdigit() and int(stem) not in bases
        if "." + suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX) and orphan:
            path.unlink()  # an orphan index has nothing to index
    segments = []
    for base in sorted(bases):
        segments.append(_open_segment(directory, config, base, now_ms))
    return segments


def _open_segment(directory: Path, config: LogConfig, base: int, now_ms: int) -> LogSegment:
    try:
        return open_segment(directory, base, config, now_ms)
    except CorruptIndexError:
        for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
            (directory / f"{base:020d}{suffix}").unlink(missing_ok=True)
        return _open_segment(directory, config, base, now_ms)


def _needs_index_rebuild(segment: LogSegment) -> bool:
    if not segment.offset_index.path.exists() or not segment.time_index.path.exists():
        return segment.size > 0
    try:
        segment.sanity_check_indexes()
    except CorruptIndexError:
        return True
    return False


@dataclass(slots=True)
class _Recovery:
    """What recovery did: the segments it rebuilt and, when it re-read a whole suffix of the
    log (unclean shutdown), the idempotent batch headers it saw there, from ``suffix_start``
    on, so producer state need not read those segments again."""

    segments: list[LogSegment] = field(default_factory=list)
    suffix_start: int | None = None
    producer_batches: list[BatchHeader] = field(default_factory=list)


def _recover(
    segments: list[LogSegment],
    config: LogConfig,
    epoch_cache: LeaderEpochCache,
    recovery_point: int,
    had_clean_shutdown: bool,
) -> _Recovery:
    """Recover the segments that need it (see the module docstring)."""
    first = 0
    if not had_clean_shutdown:
        while first + 1 < len(segments) and segments[first + 1].base_offset <= recovery_point:
            first += 1
    result = _Recovery()
    if not had_clean_shutdown:
        result.suffix_start = segments[first].base_offset

    def on_batch(header: BatchHeader) -> None:
        # As Kafka: only an epoch above the cache's latest starts an entry, so replaying the
        # middle of an epoch (or one segment of many) never moves an epoch's start.
        epoch = header.partition_leader_epoch
        latest = epoch_cache.latest_epoch
        if epoch != NO_PARTITION_LEADER_EPOCH and (latest is None or epoch > latest):
            epoch_cache.assign(epoch, header.base_offset)
        if header.producer_id >= 0:
            result.producer_batches.append(header)

    index = 0
    while index < len(segments):
        segment = segments[index]
        unclean = not had_clean_shutdown and index >= first
        if unclean or _needs_index_rebuild(segment):
            truncated = segment.recover(on_batch, max_batch_bytes=_max_batch(config))
            result.segments.append(segment)
            lost_tail = _lost_unflushed_tail(segments, index, recovery_point, config)
            if unclean and (truncated or lost_tail) and segments[index + 1 :]:
                _log.warning(
                    "%s: recovery cut the log at offset %d (unflushed data lost in a crash); "
                    "deleting the segments after it: %s",
                    segment.directory,
                    segment.read_next_offset(),
                    [later.base_offset for later in segments[index + 1 :]],
                )
                for later in segments[index + 1 :]:
                    later.delete()
                del segments[index + 1 :]
        index += 1
    if result.suffix_start is None:
        result.producer_batches.clear()  # scattered index rebuilds: not a complete suffix
    return result


def _lost_unflushed_tail(
    segments: list[LogSegment], index: int, recovery_point: int, config: LogConfig
) -> bool:
    """Whether a recovered segment ends short of the next one above the recovery point: a
    roll does not fsync the old segment, so a power loss can drop its unflushed end while
    the next file survives. What follows the gap is unreachable and goes too. (A gap below
    the recovery point lost fsynced data: the contiguity check reports that.)"""
    if index + 1 >= len(segments) or config.compact:
        return False
    end = segments[index].read_next_offset()
    return recovery_point <= end < segments[index + 1].base_offset


def _max_batch(config: LogConfig) -> int:
    # A batch can never exceed a segment; a length above this is garbage, not data.
    return max(config.max_message_bytes, config.segment_bytes)


def _check_contiguous(directory: Path, segments: list[LogSegment], config: LogConfig) -> None:
    if config.compact:
        return  # compaction leaves legitimate gaps between segments
    for segment, following in itertools.pairwise(segments):
        end = segment.read_next_offset()
        if end != following.base_offset and segment.size > 0:
            raise InconsistentLogError(
                f"{directory}: segment {segment.base_offset} ends at offset {end} but the next "
                f"segment starts at {following.base_offset}; segments are missing"
            )
