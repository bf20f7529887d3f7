"""A partition log: offsets, high watermark, log start offset, epochs and producer state over
an ordered set of segments (Kafka's UnifiedLog and LocalLog in one class).

Offsets obey ``log_start_offset <= high_watermark <= log_end_offset`` at all times, and the
recovery point (the first offset not known to be fsynced) never exceeds the log end offset.

Concurrency: one writer per partition. Every mutation takes ``self._lock`` (a threading
lock, so a flush may run in a worker thread while the event loop appends). Readers hold it
only to copy the segment list and offsets, then read without it: that is safe because a
segment's bytes below the high watermark never change, and a slice keeps its file open even
if compaction or retention deletes the segment meanwhile.

I/O errors: any ``OSError`` during a mutation takes the log offline; every later call raises
``LogDirOfflineError`` and the owner (LogManager) marks the whole data directory offline.
"""

from __future__ import annotations

import bisect
import os
import random
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Concatenate, NamedTuple, ParamSpec, TypeVar

import crc32c

from storage.batch import (
    ATTR_COMPRESSION_MASK,
    ATTR_CONTROL,
    ATTR_TIMESTAMP_TYPE,
    CRC_START,
    HEADER_SIZE,
    LOG_OVERHEAD,
    NO_PARTITION_LEADER_EPOCH,
    NO_TIMESTAMP,
    NO_WALK,
    BatchHeader,
    TimestampType,
    checked_header,
    validate_batch,
)
from storage.checkpoint import fsync_path
from storage.config import LogConfig
from storage.epoch_cache import LeaderEpochCache
from storage.errors import (
    InvalidRecordError,
    InvalidTimestampError,
    LogDirOfflineError,
    OffsetOutOfRangeError,
    OutOfFileDescriptorsError,
    RecordTooLargeError,
    StorageError,
    invariant,
    out_of_descriptors,
)
from storage.producer_state import ProducerStateManager
from storage.records import check_record_framing, decode_batch
from storage.segment import BatchPosition, FileSlice, LogSegment, open_segment

LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
_PREFIX = struct.Struct(">qiib")  # base offset, batch length, leader epoch, magic
_ATTR_TS = struct.Struct(">hiqq")  # attributes, last offset delta, base ts, max ts

P = ParamSpec("P")
R = TypeVar("R")


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


class Isolation(Enum):
    """Which offset bounds a read: the log end (replicas) or the high watermark (consumers)."""

    LOG_END = "log_end"
    HIGH_WATERMARK = "high_watermark"


class AppendInfo(NamedTuple):
    """What an append did. For a duplicate idempotent batch, the original batch's offsets."""

    first_offset: int
    last_offset: int
    max_timestamp: int
    log_append_time_ms: int  # -1 unless the log stamps LogAppendTime
    record_count: int
    size_bytes: int
    duplicate: bool = False


@dataclass(frozen=True, slots=True)
class FetchData:
    """The result of a read: a zero-copy slice (None when nothing is available)."""

    slice: FileSlice | None
    start_offset: int
    high_watermark: int
    log_start_offset: int
    log_end_offset: int


_JITTER = random.Random()  # the roll jitter of logs given no seed


def _io_guarded(method: Callable[Concatenate[Log, P], R]) -> Callable[Concatenate[Log, P], R]:
    """Run a mutation under the lock; an OSError takes the log offline (running out of file
    descriptors does not: that is a limit, not a failed disk)."""

    def wrapper(self: Log, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self._lock:
            if self._offline is not None:
                self._check_online()  # raises
            try:
                return method(self, *args, **kwargs)
            except OSError as e:
                if out_of_descriptors(e):
                    raise _descriptors_error(self.dir, e) from e
                self._go_offline(e)
                raise LogDirOfflineError(f"{self.dir}: I/O error, log taken offline: {e}") from e

    wrapper.__name__ = method.__name__
    wrapper.__doc__ = method.__doc__
    return wrapper


def _descriptors_error(directory: Path, error: OSError) -> OutOfFileDescriptorsError:
    return OutOfFileDescriptorsError(
        f"{directory}: {error}; the log stays online (raise the open file limit, ulimit -n)"
    )


class Log:
    """One partition's log. Open an existing or new one with :func:`storage.loader.load_log`."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        high_watermark: int,
        recovery_point: int,
        epoch_cache: LeaderEpochCache,
        producer_state: ProducerStateManager,
        clock: Callable[[], int] = wall_clock_ms,
        on_offline: Callable[[Path, BaseException], None] | None = None,
        new_directory: bool = False,
        jitter_seed: int | None = None,
    ) -> None:
        """``jitter_seed`` seeds the draw of each segment's roll jitter (tests); None draws
        from one generator all such logs share (a generator's state is 2.5 KB: not one per
        partition)."""
        invariant(bool(segments), "a log always has an active segment")
        self.dir = directory
        self.config = config
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._lock = threading.RLock()
        self._clock = clock
        self._jitter_random = _JITTER if jitter_seed is None else random.Random(jitter_seed)
        for segment in segments:  # any of them becomes active again after a truncation
            segment.roll_jitter_ms = self._draw_roll_jitter_ms()
        self._on_offline = on_offline
        self._offline: BaseException | None = None
        self._closed = False  # by close() or abandon(): not an I/O error
        self.epoch_cache = epoch_cache
        self.producer_state = producer_state
        self._log_end_offset = segments[-1].read_next_offset()
        self._log_start_offset = log_start_offset
        self._high_watermark = high_watermark
        self._recovery_point = min(recovery_point, self._log_end_offset)
        self._unflushed_messages = 0
        self._last_flush_ms = clock()
        self.flush_count = 0  # fsync rounds done, for metrics and group-commit tests
        # Segment files created (a serial) and how many of them the last completed fsync of
        # the directory covered. An fsync of a file does not make its name durable: without
        # the directory's, a power loss can drop a flushed segment whole. Unknown at load,
        # so the first flush (or roll) syncs the directory once. ``_parent_dirty``: the log
        # directory itself was created by this process and the data directory not synced.
        self._names_created = 1
        self._names_synced = 0
        self._parent_dirty = new_directory
        # Set by the loader: the high watermark checkpointed before an unclean shutdown when
        # recovery ended the log below it (committed records lost with the page cache).
        self.committed_end_before_crash: int | None = None
        # Set by the owner, which writes the checkpoints: called when a truncation moved the
        # recovery point or the high watermark down. The checkpoints on disk may still name
        # the old ones. Once the log grows again over offsets that were flushed before the
        # truncation, a power loss with the old recovery point would pass unflushed data as
        # flushed (recovery skips it) or leave a gap between segments that makes the log
        # fail to load (Kafka's LogManager.truncateTo checkpoints the recovery points after
        # truncating); and a crash with the old high watermark (a truncation below it comes
        # only after an unclean election) would restart the log calling committed what it
        # appended since, which no leader committed (found by the replication simulation,
        # seed 41290 of its unclean shape). The owner must write the checkpoints before
        # anything is appended here again.
        self.on_offsets_lowered: Callable[[Log], None] | None = None
        # Offsets below this may hold batches that compaction rewrote or removed: this log's
        # cleaner (``note_compacted``, before it swaps a cleaned segment in) or, for a
        # follower, its leader's (a fetched batch holding fewer records than its offsets
        # span, or one after a gap in the offsets, comes from a cleaner: a leader's appends
        # always hold one record per offset, with no gaps). Replicas are compacted
        # independently, so they may differ below it; at and above it every batch is as the
        # leader appended it. Kafka's cleaner checkpoint: the owner persists it
        # (``on_compacted``) and sets it after loading.
        self.compacted_below = 0
        # Set by the owner: called by ``note_compacted`` after raising ``compacted_below``
        # and before the cleaner replaces any segment, so that the raised value is durable
        # before the rewritten bytes are.
        self.on_compacted: Callable[[Log], None] | None = None
        self._check_offsets()

    # -- offsets ---------------------------------------------------------------------------
    @property
    def log_start_offset(self) -> int:
        return self._log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def segments(self) -> Sequence[LogSegment]:
        return tuple(self._segments)

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    @property
    def offline(self) -> bool:
        return self._offline is not None

    @property
    def closed(self) -> bool:
        """Closed (shut down, or abandoned when its partition was deleted)."""
        return self._closed

    def _check_offsets(self) -> None:
        invariant(
            self._log_start_offset <= self._high_watermark <= self._log_end_offset,
            f"{self.dir}: offsets out of order: log start {self._log_start_offset}, "
            f"HW {self._high_watermark}, LEO {self._log_end_offset}",
        )

    def _check_online(self) -> None:
        if self._offline is not None:
            raise LogDirOfflineError(f"{self.dir} is offline after an I/O error: {self._offline}")

    def _go_offline(self, error: BaseException) -> None:
        self._offline = error
        if self._on_offline is not None:
            self._on_offline(self.dir, error)

    # -- appends ---------------------------------------------------------------------------
    @_io_guarded
    def append_as_leader(
        self, data: bytes | bytearray | memoryview, leader_epoch: int
    ) -> AppendInfo:
        """Assign offsets from the log end, stamp ``leader_epoch``, write. Data is one or more
        v2 batches from a client; an idempotent batch must come alone (as in Kafka's produce
        path) and a control batch is refused (only a transaction coordinator writes those)."""
        view = memoryview(data).cast("B")
        headers = self._validate(view, leader=True)
        now_ms = self._clock()
        if len(headers) > 1 and any(h.producer_id >= 0 for _, h in headers):
            raise InvalidRecordError("an idempotent producer batch must be appended alone")
        if headers[0][1].producer_id >= 0:
            duplicate = self.producer_state.check_leader_append(headers[0][1])
            if duplicate is not None:
                return AppendInfo(
                    duplicate.first_offset,
                    duplicate.last_offset,
                    duplicate.timestamp,
                    -1,
                    headers[0][1].record_count,
                    0,
                    duplicate=True,
                )
        restamp = self.config.message_timestamp_type is TimestampType.LOG_APPEND_TIME
        if not restamp:
            self._check_timestamps(headers, now_ms)
        buffers: list[bytes | memoryview] = []
        batches: list[BatchPosition] = []
        next_offset = self._log_end_offset
        for position, h in headers:
            # BatchHeader is a tuple: rebuild it with the log's offset and epoch.
            if restamp:
                final = BatchHeader(
                    next_offset, h[1], leader_epoch, h[3], h[4], h[5] | ATTR_TIMESTAMP_TYPE,
                    h[6], h[7], now_ms, *h[9:],
                )  # fmt: skip
            else:
                final = BatchHeader(next_offset, h[1], leader_epoch, *h[3:])
            buffers.extend(_patched(view, position, final, restamp=restamp))
            batches.append(BatchPosition(position, final))
            next_offset = final.base_offset + final.last_offset_delta + 1
        latest = self.epoch_cache.latest_epoch
        if latest is None or leader_epoch > latest:
            self.epoch_cache.assign(leader_epoch, self._log_end_offset)
        return self._write(len(view), buffers, batches, now_ms, now_ms if restamp else -1)

    def _check_timestamps(self, headers: list[tuple[int, BatchHeader]], now_ms: int) -> None:
        """A CreateTime log refuses a client batch whose first or largest timestamp lies
        further from ``now_ms`` than the config allows (KIP-937). Kafka checks every record;
        this reads the batch header only (records stay opaque): the largest timestamp is what
        retention, the time index and producer-id expiry go by. -1 (none) is not checked."""
        before, after = (
            self.config.message_timestamp_before_max_ms,
            self.config.message_timestamp_after_max_ms,
        )
        for _, h in headers:
            if after is not None and h.max_timestamp > now_ms + after:
                raise InvalidTimestampError(
                    f"timestamp {h.max_timestamp} is more than message.timestamp.after.max.ms "
                    f"({after}) after the broker's clock ({now_ms})"
                )
            if (
                before is not None
                and h.base_timestamp != NO_TIMESTAMP
                and h.base_timestamp < now_ms - before
            ):
                raise InvalidTimestampError(
                    f"timestamp {h.base_timestamp} is more than message.timestamp.before.max.ms "
                    f"({before}) before the broker's clock ({now_ms})"
                )

    @_io_guarded
    def append_as_follower(self, data: bytes | bytearray | memoryview) -> AppendInfo:
        """Append a leader's batches with their offsets and epochs verbatim."""
        view = memoryview(data).cast("B")
        headers = self._validate(view, leader=False)
        first = headers[0][1]
        if first.base_offset < self._log_end_offset:
            raise InvalidRecordError(
                f"follower append at offset {first.base_offset} is below the log end "
                f"offset {self._log_end_offset}"
            )
        batches = [BatchPosition(pos, h) for pos, h in headers]
        compacted_end = _compacted_end(headers, self._log_end_offset)
        info = self._write(len(view), [view], batches, self._clock(), -1)
        if compacted_end > self.compacted_below:
            self.compacted_below = compacted_end
        for _, header in headers:
            epoch, latest = header.partition_leader_epoch, self.epoch_cache.latest_epoch
            if epoch != NO_PARTITION_LEADER_EPOCH and (latest is None or epoch > latest):
                self.epoch_cache.assign(epoch, header.base_offset)
        return info

    def _validate(self, view: memoryview, *, leader: bool) -> list[tuple[int, BatchHeader]]:
        """Check every batch (framing, CRC, size, offsets; for a leader, Kafka's rules on
        client batches) before anything is written."""
        size = len(view)
        if not size:
            raise InvalidRecordError("an append needs at least one batch")
        if size > self.config.segment_bytes:
            raise RecordTooLargeError(
                f"append of {size} bytes exceeds segment_bytes {self.config.segment_bytes}"
            )
        max_bytes = self.config.max_message_bytes
        # A client batch's records are walked too, in the same compiled call when it can be.
        walk_max = NO_WALK
        if leader and not self.config.compact:
            walk_max = self.config.max_decompressed_batch_bytes
        headers: list[tuple[int, BatchHeader]] = []
        position, previous_last = 0, -1
        while position < size:
            header = checked_header(view, position, walk_max)
            # walked: the compiled check did check_record_framing's work
            walked = (
                walk_max != NO_WALK
                and header is not None
                and not header.attributes & ATTR_COMPRESSION_MASK
            )
            if header is None:
                header = validate_batch(view, position)
            batch_size = header.batch_length + LOG_OVERHEAD
            if batch_size > max_bytes:
                raise RecordTooLargeError(
                    f"batch of {batch_size} bytes exceeds max_message_bytes {max_bytes}"
                )
            if leader:
                if header.record_count != header.last_offset_delta + 1:
                    raise InvalidRecordError(
                        f"batch has {header.record_count} records but last offset delta "
                        f"{header.last_offset_delta}"
                    )
                if header.attributes & ATTR_CONTROL:  # a follower copies the leader's
                    raise InvalidRecordError("Clients are not allowed to write control records")
                if self.config.compact:
                    self._require_keys(view, position)  # decodes every record anyway
                elif not walked:
                    check_record_framing(
                        view,
                        position,
                        header,
                        max_uncompressed_bytes=self.config.max_decompressed_batch_bytes,
                    )
            elif header.base_offset <= previous_last:
                raise InvalidRecordError(
                    f"follower batch offsets not increasing: {header.base_offset} after "
                    f"{previous_last}"
                )
            previous_last = header.base_offset + header.last_offset_delta
            headers.append((position, header))
            position += batch_size
        return headers

    def _require_keys(self, view: memoryview, position: int) -> None:
        """Compaction keeps the latest record per key, so a compacted log needs keys; this
        is the one place the append path decodes records (as Kafka's validator does)."""
        batch = decode_batch(
            view, position, max_uncompressed_bytes=self.config.max_decompressed_batch_bytes
        )
        if not batch.header.is_control and any(r.key is None for r in batch.records):
            raise InvalidRecordError("a compacted topic cannot accept a record without a key")

    def _write(
        self,
        size: int,
        buffers: Sequence[bytes | memoryview],
        batches: Sequence[BatchPosition],
        now_ms: int,
        log_append_time_ms: int,
    ) -> AppendInfo:
        last = batches[-1].header
        if len(batches) == 1:
            records, max_timestamp = last.record_count, last.max_timestamp
        else:
            records = sum(b.header.record_count for b in batches)
            max_timestamp = max(b.header.max_timestamp for b in batches)
        self._maybe_roll(size, max_timestamp, last.base_offset + last.last_offset_delta, now_ms)
        self.active_segment.append(buffers, batches, size)
        if last.producer_id >= 0 or len(batches) > 1:
            for _, header in batches:
                if header.producer_id >= 0:
                    self.producer_state.update(header)
        first_offset = batches[0].header.base_offset
        self._log_end_offset = last.base_offset + last.last_offset_delta + 1
        self._unflushed_messages += records
        if self.config.fsync_each_append or self.config.flush_messages is not None:
            self._maybe_flush_after_append()
        return AppendInfo(
            first_offset, last.last_offset, max_timestamp, log_append_time_ms, records, size
        )

    def _maybe_flush_after_append(self) -> None:
        limit = self.config.flush_messages
        if self.config.fsync_each_append or (
            limit is not None and self._unflushed_messages >= limit
        ):
            self._flush_locked(self._log_end_offset)

    # -- rolling ---------------------------------------------------------------------------
    def _maybe_roll(self, size: int, max_timestamp: int, last_offset: int, now_ms: int) -> None:
        segment = self._segments[-1]
        cfg = self.config
        if (
            segment.size > cfg.segment_bytes - size
            or segment.indexes_full()
            or not segment.can_hold(last_offset)
            or (
                segment.size > 0
                and segment.time_waited_for_roll(now_ms, max_timestamp)
                > cfg.segment_ms - min(segment.roll_jitter_ms, cfg.segment_jitter_ms)
            )
        ):
            self._roll(now_ms)

    def _draw_roll_jitter_ms(self) -> int:
        """A segment's roll jitter, as Kafka's ``randomSegmentJitter``: uniform in
        [0, segment_jitter_ms), which the config keeps below ``segment_ms``. (The roll check
        caps it by the current setting, which may have been lowered since the draw.)"""
        jitter = self.config.segment_jitter_ms
        return self._jitter_random.randrange(jitter) if jitter > 0 else 0

    @_io_guarded
    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op on an empty segment)."""
        return self._roll(self._clock())

    def _roll(self, now_ms: int) -> LogSegment:
        old = self.active_segment
        if old.size == 0 and old.base_offset == self._log_end_offset:
            # KAFKA-6388: an empty active segment that reports full is recreated in place.
            if not old.indexes_full():
                return old
            old.delete()
            self._segments.pop()
            self._bases.pop()
        else:
            old.on_become_inactive()
            covered = self._names_created
            self._snapshot_producer_state()  # write_file_atomic fsyncs the directory too
            self._names_synced = max(self._names_synced, covered)
        # The older names must be durable before a newer one exists: a file system that does
        # not commit directory changes in order could otherwise keep the new segment and lose
        # an older one, and the log would reopen with offsets missing below its start or in
        # its middle. The snapshot's fsync did it, unless the old segment was empty.
        self._sync_names()
        segment = self._new_segment(self._log_end_offset, now_ms)
        self._segments.append(segment)
        self._bases.append(segment.base_offset)
        return segment

    def _snapshot_producer_state(self) -> None:
        # Producer state advances its map end only on idempotent batches; the snapshot is
        # named at the log end so a reload replays nothing it already covers.
        self.producer_state.update_map_end_offset(self._log_end_offset)
        self.producer_state.take_snapshot()

    def _new_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        self._names_created += 1
        jitter = self._draw_roll_jitter_ms()
        return open_segment(
            self.dir, base_offset, self.config, now_ms, create=True, roll_jitter_ms=jitter
        )

    # -- reads -----------------------------------------------------------------------------
    def read(
        self,
        start_offset: int,
        max_bytes: int,
        *,
        isolation: Isolation = Isolation.HIGH_WATERMARK,
        min_one_batch: bool = True,
    ) -> FetchData:
        """A zero-copy slice of batches from ``start_offset``, within one segment."""
        self._check_online()
        with self._lock:  # one consistent view; held only for the copy, never for I/O
            segments, bases = self._segments[:], self._bases[:]
            log_start, leo, hw = self._log_start_offset, self._log_end_offset, self._high_watermark
        bound = hw if isolation is Isolation.HIGH_WATERMARK else leo
        if start_offset < log_start or start_offset > leo:
            raise OffsetOutOfRangeError(
                f"offset {start_offset} is outside [{log_start}, {leo}] of {self.dir.name}"
            )
        result: FileSlice | None = None
        index = bisect.bisect_right(bases, start_offset) - 1
        while start_offset < bound and 0 <= index < len(segments) and result is None:
            segment = segments[index]
            max_position = segment.size
            if bound < leo and (index + 1 >= len(segments) or bases[index + 1] > bound):
                # The bound lies in this segment: end at its batch. (At the log end the
                # segment's end is the bound: no batch to find.)
                found = segment.translate_offset(bound)
                max_position = found[0] if found is not None else segment.size
            result = segment.read(
                start_offset, max_bytes, max_position, min_one_batch=min_one_batch
            )
            index += 1
        return FetchData(result, start_offset, hw, log_start, leo)

    def batches(
        self, start_offset: int = 0, end_offset: int | None = None
    ) -> Iterator[tuple[LogSegment, int, BatchHeader]]:
        """Headers of the batches overlapping [start_offset, end_offset) (for tools, replay)."""
        end = self._log_end_offset if end_offset is None else end_offset
        first = max(bisect.bisect_right(self._bases, start_offset) - 1, 0)
        for segment in self._segments[first:]:
            found = segment.translate_offset(start_offset)
            if found is None:
                continue
            for position, header in segment.headers(found[0]):
                if header.base_offset >= end:
                    return
                yield segment, position, header

    def offset_for_timestamp(self, timestamp: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch with max timestamp >= ``timestamp``."""
        self._check_online()
        for segment in self._segments[:]:
            if segment.max_timestamp >= timestamp or segment is self._segments[-1]:
                found = segment.find_offset_by_timestamp(timestamp, self._log_start_offset)
                if found is not None:
                    return found
        return None

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """(epoch, end offset) for a follower's OffsetsForLeaderEpoch / DivergingEpoch."""
        return self.epoch_cache.end_offset_for(epoch, self._log_end_offset)

    # -- offsets maintenance ---------------------------------------------------------------
    @_io_guarded
    def update_high_watermark(self, offset: int) -> int:
        """Set the HW, clamped to [log start, LEO]; returns the value set."""
        self._high_watermark = max(self._log_start_offset, min(offset, self._log_end_offset))
        return self._high_watermark

    @_io_guarded
    def maybe_increment_high_watermark(self, offset: int) -> bool:
        """Move the HW forward only (leaders); never past the LEO."""
        if offset > self._log_end_offset:
            raise OffsetOutOfRangeError(f"HW {offset} beyond LEO {self._log_end_offset}")
        if offset <= self._high_watermark:
            return False
        self._high_watermark = offset
        return True

    @_io_guarded
    def maybe_increment_log_start_offset(self, offset: int) -> bool:
        """Advance the log start (DeleteRecords, a follower told by its leader); it may not
        pass the HW. Under the lock: the maintenance thread's retention moves it too."""
        if offset > self._high_watermark:
            raise OffsetOutOfRangeError(
                f"log start {offset} would pass the high watermark {self._high_watermark}"
            )
        if offset <= self._log_start_offset:
            return False
        self._log_start_offset = offset
        self.epoch_cache.truncate_from_start(offset)
        self.producer_state.on_log_start_offset_incremented(offset)
        return True

    @_io_guarded
    def truncate_to(self, offset: int) -> bool:
        """Remove everything at and above ``offset`` (follower divergence). Returns whether the
        log changed. Below the log start the whole log restarts at ``offset``."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot truncate to negative offset {offset}")
        if offset >= self._log_end_offset:
            return False
        if offset < self._log_start_offset or self._batch_start(offset) < self._log_start_offset:
            # Below the log start, or inside the batch holding it (the log start may lie
            # mid-batch and truncation removes whole batches): restart at ``offset``.
            self._truncate_fully(offset)
            return True
        while len(self._segments) > 1 and self._bases[-1] > offset:
            self._segments.pop().delete()
            self._bases.pop()
        active = self.active_segment
        active.truncate_to(offset)
        self._log_end_offset = active.read_next_offset()
        self.epoch_cache.truncate_from_end(self._log_end_offset)
        self.reload_producer_state()
        self.compacted_below = min(self.compacted_below, self._log_end_offset)
        lowered = self._log_end_offset < self._high_watermark
        self._high_watermark = min(self._high_watermark, self._log_end_offset)
        if self._log_end_offset < self._recovery_point:
            self._recovery_point, lowered = self._log_end_offset, True
        if lowered:
            self._offsets_lowered()
        self._check_offsets()
        return True

    def _offsets_lowered(self) -> None:
        if self.on_offsets_lowered is not None:
            self.on_offsets_lowered(self)

    def _batch_start(self, offset: int) -> int:
        """Base offset of the batch holding ``offset`` (``offset`` itself in a gap)."""
        segment = self._segments[max(bisect.bisect_right(self._bases, offset) - 1, 0)]
        found = segment.translate_offset(offset)
        if found is None:
            return offset
        for _, header in segment.headers(found[0]):
            return min(header.base_offset, offset)
        return offset

    @_io_guarded
    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and restart empty at ``offset`` (e.g. a follower far behind)."""
        if offset < 0:
            raise OffsetOutOfRangeError(f"cannot restart at negative offset {offset}")
        self._truncate_fully(offset)

    def _truncate_fully(self, offset: int) -> None:
        for segment in self._segments:
            segment.delete()
        self._segments = [self._new_segment(offset, self._clock())]
        self._bases = [offset]
        # The recovery point moves to ``offset`` below: make the swap durable now, or a
        # power loss could bring back the old files without the new one.
        self._sync(())
        self.epoch_cache.clear()
        self.producer_state.truncate_fully_and_start_at(offset)
        lowered = offset < self._high_watermark or offset < self._recovery_point
        self._log_start_offset = self._high_watermark = self._log_end_offset = offset
        self._recovery_point = offset
        self.compacted_below = 0
        if lowered:
            self._offsets_lowered()

    def reload_producer_state(
        self, known: Sequence[BatchHeader] = (), known_from: int | None = None
    ) -> None:
        """Load the newest producer snapshot and replay the batches after it to the LEO.

        ``known`` (from recovery) lists every idempotent batch at or above ``known_from``, so
        that part of the log is not read again.
        """
        ps = self.producer_state
        ps.truncate_and_reload(self._log_start_offset, self._log_end_offset, self._clock())
        scan_end = self._log_end_offset if known_from is None else known_from
        if ps.map_end_offset < scan_end:
            for _, _, header in self.batches(ps.map_end_offset, scan_end):
                if header.producer_id >= 0:
                    ps.update(header)
        for header in known:
            if (
                header.base_offset >= ps.map_end_offset
                and header.base_offset < self._log_end_offset
            ):
                ps.update(header)
        ps.update_map_end_offset(self._log_end_offset)

    @_io_guarded
    def expire_producers(self, now_ms: int) -> None:
        """Forget idempotent producers silent for ``producer_id_expiration_ms`` (Kafka's
        removeExpiredProducers). The LogManager's maintenance thread calls it periodically;
        the lock keeps it apart from appends, which update producer state under it."""
        self.producer_state.remove_expired(now_ms)

    # -- compaction ------------------------------------------------------------------------
    def note_compacted(self, end_offset: int, *, rewritten: bool = True) -> None:
        """The cleaner is about to swap rewritten segments in below ``end_offset``
        (``rewritten``), or found the segments below it clean: raise ``compacted_below`` to
        it; for a rewrite, ``on_compacted`` persists it first. Raises LogDirOfflineError if
        the log is offline or closed by then (the owner's write failed, or the log was
        deleted): nothing may be swapped in."""
        with self._lock:
            if end_offset <= self.compacted_below:
                return
            self.compacted_below = end_offset
        if rewritten and self.on_compacted is not None:
            self.on_compacted(self)
        with self._lock:
            self._check_online()

    @_io_guarded
    def replace_segments(self, old_bases: Sequence[int], swap_path: Path) -> LogSegment:
        """Swap a finished compaction output in for the segments at ``old_bases``.

        ``swap_path`` is a fsynced ``<base>.<end>.log.swap`` file (see loader.swap_file_name):
        should the process die during the swap, the loader completes it. The old segments
        must be contiguous, inactive and still present; readers holding slices of them keep
        reading the old bytes.
        """
        first = bisect.bisect_left(self._bases, old_bases[0])
        chosen = self._segments[first : first + len(old_bases)]
        invariant(
            [s.base_offset for s in chosen] == list(old_bases)
            and first + len(old_bases) < len(self._segments),
            f"{self.dir}: segments {list(old_bases)} are not a run of inactive segments",
        )
        for segment in chosen:
            segment.delete()
        live = self.dir / f"{old_bases[0]:020d}.log"
        os.replace(swap_path, live)
        segment = open_segment(
            self.dir,
            old_bases[0],
            self.config,
            self._clock(),
            roll_jitter_ms=self._draw_roll_jitter_ms(),
        )
        segment.recover(lambda _: None, max_batch_bytes=segment.size + 1)
        segment.on_become_inactive()
        segment.flush()
        self._segments[first : first + len(old_bases)] = [segment]
        self._bases[first : first + len(old_bases)] = [segment.base_offset]
        return segment

    # -- retention -------------------------------------------------------------------------
    @_io_guarded
    def delete_old_segments(self, now_ms: int | None = None) -> int:
        """Delete whole segments past retention (time, size) or below the log start offset.
        Only segments entirely below the HW are eligible; the active segment never is.
        Returns the number of segments deleted."""
        now = self._clock() if now_ms is None else now_ms
        doomed = self._deletable_prefix(now)
        for segment in self._segments[:doomed]:
            segment.delete()
        if doomed:
            del self._segments[:doomed]
            del self._bases[:doomed]
            new_start = max(self._log_start_offset, self._bases[0])
            if new_start > self._log_start_offset:
                self._log_start_offset = new_start
                self._high_watermark = max(self._high_watermark, new_start)
                self.epoch_cache.truncate_from_start(new_start)
                self.producer_state.on_log_start_offset_incremented(new_start)
        return doomed

    def _deletable_prefix(self, now_ms: int) -> int:
        cfg = self.config
        excess = (
            self.size_bytes - cfg.retention_bytes
            if cfg.retention_bytes is not None and cfg.delete
            else 0
        )
        count = 0
        for segment, next_base in zip(self._segments, self._bases[1:], strict=False):
            if next_base > self._high_watermark:
                break
            below_start = next_base <= self._log_start_offset
            expired = (
                cfg.delete
                and cfg.retention_ms is not None
                and now_ms - segment.largest_timestamp() > cfg.retention_ms
            )
            too_big = excess >= segment.size and excess > 0
            if not (below_start or expired or too_big):
                break
            excess -= segment.size
            count += 1
        return count

    # -- durability ------------------------------------------------------------------------
    def flush(self, offset: int | None = None) -> None:
        """fsync every segment holding data below ``offset`` (default: the LEO) and advance
        the recovery point. Safe to call from a worker thread while appends continue."""
        with self._lock:
            self._check_online()
            target = self._log_end_offset if offset is None else min(offset, self._log_end_offset)
            if target <= self._recovery_point:
                return
            start = bisect.bisect_right(self._bases, self._recovery_point) - 1
            dirty = self._segments[max(start, 0) :]
        try:
            self._sync(dirty)
        except OSError as e:
            if out_of_descriptors(e):
                raise _descriptors_error(self.dir, e) from e
            with self._lock:
                if self._closed:  # deleted while this thread synced it: nothing is wrong
                    return
                self._go_offline(e)
            raise LogDirOfflineError(f"{self.dir}: fsync failed, log taken offline: {e}") from e
        with self._lock:
            self.flush_count += 1
            if target > self._recovery_point:
                self._recovery_point = target
                self._unflushed_messages = 0
                self._last_flush_ms = self._clock()

    def _flush_locked(self, offset: int) -> None:
        start = bisect.bisect_right(self._bases, self._recovery_point) - 1
        self._sync(self._segments[max(start, 0) :])
        self.flush_count += 1
        self._recovery_point = offset
        self._unflushed_messages = 0
        self._last_flush_ms = self._clock()

    def _sync(self, segments: Sequence[LogSegment]) -> None:
        """fsync the segments, then the directory if a segment file was created since its
        last fsync (and the data directory once, for a log directory made by this process),
        so that the recovery point never names data a power loss can take away."""
        for segment in segments:
            segment.flush()
        self._sync_names()
        if self._parent_dirty:
            self._parent_dirty = False
            fsync_path(self.dir.parent)

    def _sync_names(self) -> None:
        """fsync the directory if a segment file was created since the last completed sync.
        Runs on the writer (under the lock) and in the flush thread (outside it): the count
        covered is taken before the fsync and recorded after it, so a roll racing a flush's
        fsync syncs again rather than trusting one not finished (a race can only lower the
        record, which costs one more fsync later)."""
        covered = self._names_created
        if covered > self._names_synced:
            fsync_path(self.dir)
            self._names_synced = max(self._names_synced, covered)

    def maybe_flush(self, now_ms: int) -> bool:
        """Periodic flush for ``flush_ms``; called by the LogManager's scheduler."""
        limit = self.config.flush_ms
        if limit is None or self._recovery_point >= self._log_end_offset:
            return False
        if now_ms - self._last_flush_ms < limit:
            return False
        self.flush()
        return True

    @_io_guarded
    def close(self) -> None:
        """Flush, snapshot producer state at the LEO and trim indexes: a clean shutdown."""
        self._flush_locked(self._log_end_offset)
        self._snapshot_producer_state()
        for segment in self._segments:
            segment.close()
        self._offline = StorageError("closed")
        self._closed = True

    def abandon(self) -> None:
        """Close file handles without flushing (tests simulating a crash; directory deletion)."""
        with self._lock:
            for segment in self._segments:
                segment.close()
            self._offline = StorageError("closed")
            self._closed = True


def _compacted_end(headers: Sequence[tuple[int, BatchHeader]], log_end_offset: int) -> int:
    """For a follower's append at ``log_end_offset``: the offset after the last batch that
    compaction rewrote (it holds fewer records than its offsets span: some were removed, or
    it is an empty batch kept for its producer) or that follows a gap in the offsets (whole
    batches were removed before it); 0 if none did."""
    end, expected = 0, log_end_offset
    for _, h in headers:
        following = h.base_offset + h.last_offset_delta + 1
        if h.base_offset > expected or h.record_count != h.last_offset_delta + 1:
            end = following
        expected = following
    return end


def _patched(
    view: memoryview, position: int, header: BatchHeader, *, restamp: bool
) -> list[bytes | memoryview]:
    """Buffers holding the batch at ``position`` with the header fields of ``header``.

    Base offset and leader epoch lie outside the CRC, so only a 17-byte prefix is new and the
    rest is the caller's memory, unchanged. LogAppendTime changes CRC-covered fields, so then
    the whole 61-byte header is rebuilt and the CRC recomputed incrementally.
    """
    end = position + header.batch_length + LOG_OVERHEAD
    prefix = _PREFIX.pack(
        header.base_offset, header.batch_length, header.partition_leader_epoch, header.magic
    )
    if not restamp:
        return [prefix, view[position + 17 : end]]
    middle = bytearray(view[position + CRC_START : position + HEADER_SIZE])
    _ATTR_TS.pack_into(
        middle,
        0,
        header.attributes,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
    )
    crc = crc32c.crc32c(view[position + HEADER_SIZE : end], crc32c.crc32c(middle))
    return [prefix + struct.pack(">I", crc), bytes(middle), view[position + HEADER_SIZE : end]]
