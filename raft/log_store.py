"""The Raft log on the storage engine: a storage/ partition log whose batch partition leader
epoch is the Raft epoch.

The core describes batches as ``raft.messages.Batch`` (offsets, epoch, framed records); here
each becomes one Kafka v2 record batch at exactly its offsets (``append_as_follower``: the
core, not the log, assigns Raft offsets), so the metadata log is an ordinary segment log that
``runnel log dump`` can read. Timestamps are 0 so every replica writes identical bytes, which
is also why time-based retention and rolling are off for this log (snapshots bound it).

The log refuses a batch over its ``max_message_bytes``, so ``meta`` tells the core the
largest batch it stores (the core keeps its batches within it and refuses a record that would
not fit alone), and one LogWrite's batches are appended in groups within that size (a burst
of proposals is many batches in one Ready, and one append may not exceed a segment). A read
returns whole batches within ``max_bytes`` past the first, so a large batch travels alone.

Recent batches are also kept in memory as the core wrote them (``tail_cache_bytes`` of
them, ending at the log end): the leader's fetch replies and every node's state machine read
the tail, and decoding it back from Kafka batches would cost more than the rest of a commit.

Not thread-safe: the driver calls it from one worker at a time.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from raft.core import LogMeta, decode_records, encode_records
from raft.messages import Batch, LogWrite, SnapshotId
from storage.batch import HEADER_SIZE, validate_batch
from storage.config import LogConfig
from storage.errors import CorruptRecordError
from storage.loader import load_log
from storage.log import Isolation, Log
from storage.records import DecodedBatch, RecordInput, build_batch, iter_decoded

METADATA_LOG_DIR = "__cluster_metadata-0"
LEADER_CHANGE_KEY = b"\x00\x00\x00\x02"  # Kafka's control record key: version 0, LEADER_CHANGE

DEFAULT_LOG_CONFIG = LogConfig(
    segment_bytes=64 * 1024 * 1024,
    retention_ms=None,
    retention_bytes=None,
    max_message_bytes=16 * 1024 * 1024,
)
DEFAULT_TAIL_CACHE_BYTES = 32 * 1024 * 1024


class RaftLogStore:
    """Reads and writes the Raft log; ``meta`` describes it to a restarting core."""

    def __init__(
        self,
        directory: Path,
        config: LogConfig = DEFAULT_LOG_CONFIG,
        tail_cache_bytes: int = DEFAULT_TAIL_CACHE_BYTES,
    ) -> None:
        if tail_cache_bytes < 0:
            raise ValueError(f"tail_cache_bytes must be >= 0, got {tail_cache_bytes}")
        self.log: Log = load_log(directory / METADATA_LOG_DIR, config)
        self._tail = _TailCache(tail_cache_bytes)

    def meta(self, snapshot: SnapshotId | None) -> LogMeta:
        log = self.log
        epochs = tuple((e.epoch, e.start_offset) for e in log.epoch_cache.entries())
        return LogMeta(
            log.log_start_offset, log.log_end_offset, epochs, snapshot, self.max_batch_bytes
        )

    @property
    def max_batch_bytes(self) -> int:
        """The largest batch the log stores, as the core counts a batch's bytes: with each
        record counted as its bytes plus RECORD_OVERHEAD_BYTES (which bounds a Kafka v2
        record's framing), a batch's Kafka form adds only its header."""
        return self.log.config.max_message_bytes - HEADER_SIZE

    def apply(self, write: LogWrite) -> None:
        """Carry out a core LogWrite and fsync it (Raft acknowledges only durable data)."""
        log = self.log
        if write.restart_at is not None:
            log.truncate_fully_and_start_at(write.restart_at)
        if write.truncate_to is not None:
            log.truncate_to(write.truncate_to)
        for group in _appends(write.batches, log.config.max_message_bytes):
            log.append_as_follower(b"".join(group))
        log.flush()
        self._tail.update(write, log.log_end_offset)

    def read(self, offset: int, max_bytes: int) -> tuple[Batch, ...]:
        """Batches from ``offset`` (at least one if any), about ``max_bytes`` in all."""
        cached = self._tail.read(offset, max_bytes)
        if cached is not None:
            return cached
        log, size = self.log, 0
        out: list[Batch] = []
        while offset < log.log_end_offset and (size < max_bytes or not out):
            # Past the first batch, only whole batches within max_bytes: a large batch next
            # would take the reply beyond what the transport carries.
            fetched = log.read(
                offset, max_bytes - size, isolation=Isolation.LOG_END, min_one_batch=not out
            )
            if fetched.slice is None:
                break
            data = fetched.slice.read()
            for decoded in iter_decoded(_whole_batches(data)):
                out.append(from_kafka_batch(decoded))
                size += decoded.header.batch_length + 12
            if not out or out[-1].next_offset <= offset:
                break
            offset = out[-1].next_offset
        return tuple(out)

    def set_high_watermark(self, offset: int) -> None:
        self.log.update_high_watermark(offset)

    def delete_before(self, offset: int) -> None:
        """Drop whole segments below ``offset`` (a snapshot covers them)."""
        log = self.log
        log.update_high_watermark(max(log.high_watermark, min(offset, log.log_end_offset)))
        if offset <= log.high_watermark:
            log.maybe_increment_log_start_offset(offset)
            log.delete_old_segments()
        self._tail.drop_below(log.log_start_offset)

    def close(self) -> None:
        self.log.close()


class _TailCache:
    """The newest batches, contiguous and ending at the log end, within a byte budget."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._batches: list[Batch] = []
        self._bytes = 0

    def update(self, write: LogWrite, log_end: int) -> None:
        batches = self._batches
        if write.restart_at is not None:
            self._clear()
        if write.truncate_to is not None:
            while batches and batches[-1].next_offset > write.truncate_to:
                self._bytes -= len(batches.pop().data)
        for batch in write.batches:
            if batches and batches[-1].next_offset != batch.base_offset:
                self._clear()
            batches.append(batch)
            self._bytes += len(batch.data)
        if self._bytes > self.max_bytes:
            self._evict(self.max_bytes * 3 // 4)  # in bulk: deleting from a list's front copies
        if batches and batches[-1].next_offset != log_end:
            self._clear()  # the log did something else than the write said: trust the log

    def read(self, offset: int, max_bytes: int) -> tuple[Batch, ...] | None:
        """Batches from the one holding ``offset``, or None when the cache does not reach it."""
        batches = self._batches
        if not batches or not batches[0].base_offset <= offset < batches[-1].next_offset:
            return None
        first = bisect.bisect_right(batches, offset, key=lambda b: b.base_offset) - 1
        out: list[Batch] = []
        size = 0
        for index in range(first, len(batches)):
            if out and size + len(batches[index].data) > max_bytes:
                break
            out.append(batches[index])
            size += len(batches[index].data)
        return tuple(out)

    def drop_below(self, offset: int) -> None:
        batches = self._batches
        count = bisect.bisect_right(batches, offset, key=lambda b: b.next_offset)
        self._bytes -= sum(len(b.data) for b in batches[:count])
        del batches[:count]

    def _evict(self, target_bytes: int) -> None:
        count, size = 0, self._bytes
        for batch in self._batches:
            if size <= target_bytes:
                break
            size -= len(batch.data)
            count += 1
        del self._batches[:count]
        self._bytes = size

    def _clear(self) -> None:
        self._batches.clear()
        self._bytes = 0


def _appends(batches: tuple[Batch, ...], max_bytes: int) -> list[list[bytes]]:
    """The batches as Kafka batches, in groups of at most ``max_bytes`` (one append each;
    the log refuses an append larger than a segment)."""
    groups: list[list[bytes]] = []
    size = max_bytes
    for batch in batches:
        data = to_kafka_batch(batch)
        if size + len(data) > max_bytes:
            groups.append([])
            size = 0
        groups[-1].append(data)
        size += len(data)
    return groups


def to_kafka_batch(batch: Batch) -> bytes:
    records = decode_records(batch.data)
    key = LEADER_CHANGE_KEY if batch.is_control else None
    return build_batch(
        [RecordInput(key, value, 0) for value in records],
        base_offset=batch.base_offset,
        partition_leader_epoch=batch.epoch,
        is_control=batch.is_control,
    )


def from_kafka_batch(decoded: DecodedBatch) -> Batch:
    header = decoded.header
    values = [r.value or b"" for r in decoded.records]
    return Batch(
        header.base_offset,
        header.last_offset,
        header.partition_leader_epoch,
        encode_records(values),
        header.is_control,
    )


def _whole_batches(data: bytes) -> bytes:
    """Drop a partial batch at the end of a read slice."""
    position = 0
    while position < len(data):
        try:
            header = validate_batch(data, position)
        except CorruptRecordError:
            break  # a partial batch at the end of the slice
        position += header.size_bytes
    return data[:position]
