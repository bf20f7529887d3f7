"""One log segment: a ``.log`` file of record batches plus its ``.index`` and ``.timeindex``.

Files, named by the segment's 20-digit zero-padded base offset::

    00000000000000147001.log        v2 record batches, back to back, strictly increasing offsets
    00000000000000147001.index      sparse offset index (see index.py)
    00000000000000147001.timeindex  sparse time index (see index.py)

Appends go through ``os.writev`` of caller-supplied buffers, so the batch bytes are never
copied in Python; an index entry (batch last offset -> batch position) is added once more than
``index_interval_bytes`` have been written since the previous one. Reads return a
:class:`FileSlice` (file descriptor, position, length) for ``sendfile``; the descriptor stays
valid for as long as any slice refers to it, even after the segment is deleted or closed
(a closed segment lets go of its handle, which closes the descriptor once no slice holds it:
closing it at once would let the number be reused by another file while a fetch answer
still sends from it).

``translate_offset`` (which batch holds an offset) looks the offset up in the offset index and
reads batch headers from there on. Reads near the end (followers, consumers at the head) skip
that: the segment remembers where its most recent batches are (``_tail``: up to
``TAIL_BATCHES`` to ``2 * TAIL_BATCHES`` of them, each (last offset, position, size, base
offset), noted by ``_index_batch`` as appends and recovery pass them, forgotten by a
truncation or a new recovery), and an offset at or after the first of them is found there
with a bisection, no read.

Not thread-safe for mutation: the owning Log's single writer calls append/truncate/recover/
roll. ``read`` and ``translate_offset`` may run concurrently with an append: ``_tail`` only
grows in place (a batch is noted after its bytes are written), and is trimmed or emptied by
replacing the list, so a reader's reference stays consistent.
"""

from __future__ import annotations

import bisect
import errno
import os
import struct
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from storage.batch import HEADER_SIZE, LOG_OVERHEAD, BatchHeader, unpack_header, validate_batch
from storage.config import LogConfig
from storage.errors import CorruptRecordError, InvalidRecordError, invariant
from storage.index import CorruptIndexError, OffsetIndex, TimeIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
_SCAN_HEADER = struct.Struct(">qi")  # base offset, batch length
_LAST_DELTA = struct.Struct(">i")
_POS_LAST_DELTA = 23
_RECOVERY_CHUNK_BYTES = 8 * 1024 * 1024
_IOV_MAX = 1024
TAIL_BATCHES = 64  # recent batches whose positions a segment keeps at least (module doc)


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class FileHandle:
    """An open read-write descriptor of a segment's .log file, closed when unreferenced."""

    __slots__ = ("__weakref__", "_finalizer", "fd", "path")

    def __init__(self, path: Path, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        self.fd = os.open(path, flags, 0o644)
        self.path = path
        self._finalizer = weakref.finalize(self, os.close, self.fd)

    def close(self) -> None:
        """Close now, whoever still refers to it (a slice of it then reads a closed number,
        or another file's: only for handles nothing else can hold)."""
        self._finalizer()

    @staticmethod
    def closed(path: Path) -> FileHandle:
        """A stand-in for a segment that let go of its handle: every use fails with EBADF."""
        return _ClosedHandle(path)


class _ClosedHandle(FileHandle):
    __slots__ = ()

    def __init__(self, path: Path) -> None:  # opens nothing, so has nothing to close
        self.path = path

    @property
    def fd(self) -> int:  # type: ignore[override]
        raise OSError(errno.EBADF, f"{self.path}: the segment is closed")

    def close(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class FileSlice:
    """A zero-copy view of part of a segment file: send it with ``os.sendfile``."""

    handle: FileHandle
    position: int
    length: int

    @property
    def fd(self) -> int:
        return self.handle.fd

    def read(self) -> bytes:
        return os.pread(self.handle.fd, self.length, self.position)


class BatchPosition(NamedTuple):
    """Where a batch begins in the data being appended (relative byte position)."""

    position: int
    header: BatchHeader


class LogSegment:
    """A .log file with its indexes. See the module docstring for the contract."""

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        created_ms: int,
        create: bool = False,
        roll_jitter_ms: int = 0,
    ) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        self.handle = FileHandle(self.log_path, create=create)
        self.size = os.fstat(self.handle.fd).st_size
        self.offset_index = OffsetIndex(
            directory / segment_file_name(base_offset, INDEX_SUFFIX), base_offset, max_index_bytes
        )
        self.time_index = TimeIndex(
            directory / segment_file_name(base_offset, TIME_INDEX_SUFFIX),
            base_offset,
            max_index_bytes,
        )
        self.created_ms = created_ms
        # How much sooner than ``segment_ms`` this segment rolls: drawn per segment by the
        # owning Log (``segment_jitter_ms``), so partitions do not all roll at once.
        self.roll_jitter_ms = roll_jitter_ms
        self.rolling_base_timestamp: int | None = None
        self.max_timestamp = -1
        self.offset_of_max_timestamp = base_offset
        self._bytes_since_index_entry = 0
        self._tail: list[tuple[int, int, int, int]] = []  # (last, position, size, base)
        if not create and self.time_index.entries:
            self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry()

    # -- appends -------------------------------------------------------------------------
    def append(
        self,
        buffers: Sequence[bytes | bytearray | memoryview],
        batches: Sequence[BatchPosition],
        size_bytes: int,
    ) -> None:
        """Write ``buffers`` (``size_bytes`` in all: the concatenated batches described by
        ``batches``) at the end."""
        start = self.size
        written = _writev_all(self.handle.fd, buffers, start, size_bytes)
        for item in batches:
            self._index_batch(start + item.position, item.header)
        self.size = start + written
        if self.rolling_base_timestamp is None and batches:
            self.rolling_base_timestamp = batches[0].header.max_timestamp

    def _index_batch(self, file_position: int, header: BatchHeader) -> None:
        last_offset = header.base_offset + header.last_offset_delta
        tail = self._tail
        if len(tail) >= 2 * TAIL_BATCHES:
            tail = self._tail = tail[TAIL_BATCHES:]  # a new list: readers keep theirs
        tail.append(
            (last_offset, file_position, header.batch_length + LOG_OVERHEAD, header.base_offset)
        )
        if header.max_timestamp > self.max_timestamp:
            self.max_timestamp = header.max_timestamp
            self.offset_of_max_timestamp = last_offset
        # A full index only happens in recovery (appends roll first), which counts bytes from
        # the segment start and may want more entries than the live log had: the index just
        # gets sparser at the end.
        if self._bytes_since_index_entry > self.index_interval_bytes and not self.indexes_full():
            self.offset_index.append(last_offset, file_position)
            self.time_index.maybe_append(self.max_timestamp, self.offset_of_max_timestamp)
            self._bytes_since_index_entry = 0
        self._bytes_since_index_entry += header.batch_length + LOG_OVERHEAD

    def can_hold(self, next_offset: int) -> bool:
        """Whether ``next_offset`` is expressible relative to this segment's base."""
        return 0 <= next_offset - self.base_offset <= 2**31 - 1

    def indexes_full(self) -> bool:
        # The time index keeps its last slot for the entry written when the segment rolls.
        return (
            self.offset_index.entries >= self.offset_index.max_entries
            or self.time_index.entries >= self.time_index.max_entries - 1
        )

    def time_waited_for_roll(self, now_ms: int, batch_max_timestamp: int) -> int:
        if self.rolling_base_timestamp is not None and self.rolling_base_timestamp >= 0:
            return batch_max_timestamp - self.rolling_base_timestamp
        return now_ms - self.created_ms

    # -- reads ---------------------------------------------------------------------------
    def _batch_at(self, position: int) -> tuple[int, int, int] | None:
        """(base offset, last offset, size) of the batch at ``position``, or None at a tail."""
        raw = os.pread(self.handle.fd, _POS_LAST_DELTA + 4, position)
        if len(raw) < _POS_LAST_DELTA + 4:
            return None
        base_offset, length = _SCAN_HEADER.unpack_from(raw)
        (delta,) = _LAST_DELTA.unpack_from(raw, _POS_LAST_DELTA)
        return base_offset, base_offset + delta, length + LOG_OVERHEAD

    def translate_offset(self, offset: int, start_position: int = 0) -> tuple[int, int] | None:
        """(position, size) of the first batch whose last offset is >= ``offset``."""
        tail = self._tail
        if tail and offset >= tail[0][3]:  # among the recent batches, or after them all
            i = bisect.bisect_left(tail, (offset,))
            if i == len(tail):
                return None
            _, position, size, _ = tail[i]
            if position >= start_position:
                return position, size
        _, position = self.offset_index.lookup(offset)
        position = max(position, start_position)
        size = self.size
        while position < size:
            found = self._batch_at(position)
            if found is None:
                return None
            _, last_offset, batch_size = found
            if last_offset >= offset:
                return position, batch_size
            position += batch_size
        return None

    def read(
        self, start_offset: int, max_bytes: int, max_position: int, *, min_one_batch: bool
    ) -> FileSlice | None:
        """A slice from the batch holding ``start_offset`` up to ``max_position``/``max_bytes``."""
        found = self.translate_offset(start_offset)
        if found is None:
            return None
        position, first_batch_size = found
        limit = max(max_bytes, first_batch_size) if min_one_batch else max_bytes
        length = min(max_position - position, limit)
        if length <= 0:
            return None
        return FileSlice(self.handle, position, length)

    def find_offset_by_timestamp(self, timestamp: int, start_offset: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first batch at/after ``start_offset`` with max ts >= ts."""
        _, indexed_offset = self.time_index.lookup(timestamp)
        _, position = self.offset_index.lookup(max(indexed_offset, start_offset))
        size = self.size
        while position < size:
            raw = os.pread(self.handle.fd, 43, position)
            if len(raw) < 43:
                return None
            base_offset, length = _SCAN_HEADER.unpack_from(raw)
            (delta,) = _LAST_DELTA.unpack_from(raw, _POS_LAST_DELTA)
            (max_ts,) = struct.unpack_from(">q", raw, 35)
            if max_ts >= timestamp and base_offset + delta >= start_offset:
                return max(base_offset, start_offset), max_ts
            position += length + LOG_OVERHEAD
        return None

    def sanity_check_indexes(self) -> None:
        """Raise CorruptIndexError unless both indexes look trustworthy: their sampled
        entries are ordered, the last offset-index entry points at the start of a batch ending
        at that offset, and the last time-index entry names a batch with that max timestamp."""
        self.offset_index.sanity_check(self.size)
        if self.offset_index.entries:
            offset, position = self.offset_index.last_entry()
            found = self._batch_at(position)
            if found is None or found[1] != offset:
                raise CorruptIndexError(
                    f"{self.offset_index.path}: last entry ({offset}, {position}) is not the "
                    f"start of the batch ending at offset {offset}"
                )
        # The offset index is trusted from here on, so the scan for the log end is short.
        self.time_index.sanity_check(max(self.read_next_offset(), self.base_offset + 1))
        if self.time_index.entries:
            timestamp, offset = self.time_index.last_entry()
            located = self.translate_offset(offset)
            raw = os.pread(self.handle.fd, 43, located[0]) if located is not None else b""
            if len(raw) < 43 or struct.unpack_from(">q", raw, 35)[0] != timestamp:
                raise CorruptIndexError(
                    f"{self.time_index.path}: last entry ({timestamp}, {offset}) does not match "
                    f"the batch holding offset {offset}"
                )

    def headers(self, position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of every batch from ``position`` on, trusted (no CRC check)."""
        return _scan_batches(self.handle.fd, position, self.size, self.size, validate=False)

    def read_next_offset(self) -> int:
        """The offset after the last batch (base offset if empty), from the index + a scan."""
        _, position = self.offset_index.last_entry()
        next_offset = self.base_offset
        size = self.size
        while position < size:
            found = self._batch_at(position)
            if found is None:
                break
            _, last_offset, batch_size = found
            next_offset = last_offset + 1
            position += batch_size
        return max(next_offset, self.base_offset)

    # -- recovery, truncation, lifecycle ---------------------------------------------------
    def recover(
        self,
        on_batch: Callable[[BatchHeader], None],
        *,
        max_batch_bytes: int,
        expected_next_offset: int | None = None,
    ) -> int:
        """Re-validate every batch, rebuild both indexes, cut the file at the first bad byte.

        ``on_batch`` sees each valid header in order (epoch cache, producer state). Returns the
        number of bytes truncated.
        """
        self.offset_index.reset()
        self.time_index.reset()
        self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
        self._bytes_since_index_entry = 0
        self.rolling_base_timestamp = None
        self._tail = []
        valid = 0
        next_offset = self.base_offset if expected_next_offset is None else expected_next_offset
        for position, header in _scan_batches(
            self.handle.fd, 0, self.size, max_batch_bytes, validate=True
        ):
            if header.base_offset < next_offset or header.last_offset < header.base_offset:
                break  # offsets must strictly increase: anything else is garbage
            self._index_batch(position, header)
            if self.rolling_base_timestamp is None:
                self.rolling_base_timestamp = header.max_timestamp
            on_batch(header)
            next_offset = header.next_offset
            valid = position + header.size_bytes
        truncated = self.size - valid
        if truncated:
            os.ftruncate(self.handle.fd, valid)
            self.size = valid
        return truncated

    def truncate_to(self, offset: int) -> int:
        """Remove every batch whose last offset is >= ``offset``; returns bytes removed."""
        found = self.translate_offset(offset)
        if found is None:
            return 0
        position = found[0]
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        removed = self.size - position
        self._tail = []  # before the bytes go: a reader must not find them here
        os.ftruncate(self.handle.fd, position)
        self.size = position
        self._bytes_since_index_entry = 0
        if self.time_index.entries:
            self.max_timestamp, self.offset_of_max_timestamp = self.time_index.last_entry()
        else:
            self.max_timestamp, self.offset_of_max_timestamp = -1, self.base_offset
        if self.size == 0:
            self.rolling_base_timestamp = None
        return removed

    def on_become_inactive(self) -> None:
        """Record the final max timestamp and trim the pre-allocated index files."""
        if self.max_timestamp >= 0:
            self.time_index.maybe_append(
                self.max_timestamp, self.offset_of_max_timestamp, skip_full_check=True
            )
        self.offset_index.trim()
        self.time_index.trim()

    def flush(self) -> None:
        os.fdatasync(self.handle.fd)
        self.offset_index.flush()
        self.time_index.flush()

    def close(self) -> None:
        """Close the indexes and let go of the .log descriptor: it closes now unless a
        FileSlice still refers to it (a fetch answer being sent), then with the last one."""
        self.offset_index.close()
        self.time_index.close()
        self.handle = FileHandle.closed(self.log_path)

    def delete(self) -> None:
        """Unlink the files. The descriptor is not closed here: open slices (and a flush in
        another thread) keep using it until the last reference is dropped."""
        self.offset_index.delete()
        self.time_index.delete()
        self.log_path.unlink(missing_ok=True)

    def last_modified_ms(self) -> int:
        return int(os.fstat(self.handle.fd).st_mtime * 1000)

    def largest_timestamp(self) -> int:
        return self.max_timestamp if self.max_timestamp >= 0 else self.last_modified_ms()


def open_segment(
    directory: Path,
    base_offset: int,
    config: LogConfig,
    now_ms: int,
    *,
    create: bool = False,
    roll_jitter_ms: int = 0,
) -> LogSegment:
    """Open (or with ``create``, start) the segment at ``base_offset`` with ``config``."""
    return LogSegment(
        directory,
        base_offset,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
        created_ms=now_ms,
        create=create,
        roll_jitter_ms=roll_jitter_ms,
    )


def next_offset_of_file(path: Path, base_offset: int) -> int:
    """The offset after the last valid batch of the segment file at ``path`` (``base_offset``
    when it holds none), scanning every batch header: for a file no segment has open, such
    as a compaction's ``.swap`` output."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        next_offset = base_offset
        for _, header in _scan_batches(fd, 0, size, size, validate=True):
            next_offset = max(next_offset, header.next_offset)
        return next_offset
    finally:
        os.close(fd)


def _writev_all(
    fd: int, buffers: Sequence[bytes | bytearray | memoryview], position: int, expected: int
) -> int:
    """Write every buffer at byte ``position`` of ``fd`` (positional, so the descriptor's own
    offset never matters: not after a reopen, not after a truncation); returns bytes written."""
    if len(buffers) <= _IOV_MAX:
        total = os.pwritev(fd, buffers, position)
        if total == expected:
            return total  # the common case: one system call wrote everything
    else:
        total = 0
    pending = [memoryview(b).cast("B") for b in buffers if len(b)]
    _drop_written(pending, total)
    while pending:
        n = os.pwritev(fd, pending[:_IOV_MAX], position + total)
        invariant(n > 0, "pwritev wrote nothing")
        total += n
        _drop_written(pending, n)
    return total


def _drop_written(pending: list[memoryview], n: int) -> None:
    """Drop fully written buffers; keep the unwritten part of a partial one."""
    while n:
        head = pending[0]
        if n >= len(head):
            n -= len(head)
            pending.pop(0)
        else:
            pending[0] = head[n:]
            n = 0


def _scan_batches(
    fd: int, position: int, size: int, max_batch_bytes: int, *, validate: bool
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield (position, header) of the batches from ``position`` to ``size``, reading the file
    in large chunks. Stops silently at a truncated batch, and with ``validate`` also at the
    first one failing its checks (framing, CRC) - the caller decides what that means."""
    buf = b""
    buf_start = position
    while position < size:
        rel = position - buf_start
        if len(buf) - rel < HEADER_SIZE:
            buf = os.pread(fd, _RECOVERY_CHUNK_BYTES, position)
            buf_start, rel = position, 0
            if len(buf) < HEADER_SIZE:
                return
        _, length = _SCAN_HEADER.unpack_from(buf, rel)
        batch_size = length + LOG_OVERHEAD
        if length < 0 or batch_size > max_batch_bytes or position + batch_size > size:
            return
        if validate:
            if len(buf) - rel < batch_size:
                buf = os.pread(fd, max(_RECOVERY_CHUNK_BYTES, batch_size), position)
                buf_start, rel = position, 0
            try:
                header = validate_batch(buf, rel)
            except (CorruptRecordError, InvalidRecordError):
                return
        else:
            header = unpack_header(buf, rel)
        yield position, header
        position += batch_size
