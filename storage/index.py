"""Sparse, memory-mapped segment indexes: the offset index and the time index.

Both files are arrays of fixed-size big-endian entries, sorted ascending, holding offsets
relative to the segment's base offset so that a 64-bit offset fits in 4 bytes:

    .index      8-byte entries: relative offset int32 @0, position in .log int32 @4
    .timeindex 12-byte entries: timestamp int64 @0, relative offset int32 @8
                (an entry (T, O) says: the largest timestamp at or before offset O is T)

While a segment is active its index files are pre-allocated to ``max_index_bytes`` (rounded
down to whole entries) and memory-mapped; entries beyond ``entries`` are zeros. When the
segment rolls, :meth:`trim` cuts each file to its valid entries. Indexes carry no checksum:
after an unclean shutdown the loader rebuilds them from the log rather than trusting them.

Pre-allocation leaves the file sparse (an index of 10 MiB would otherwise cost 10 MiB of
disk per partition), but a store into a page of a memory map that the disk has no room for
kills the process with SIGBUS instead of raising. So blocks are reserved with
``posix_fallocate`` ahead of the entries, ``RESERVE_BYTES`` at a time: a full disk then fails
an append with an OSError (ENOSPC), which the log turns into an offline directory.

The mmap is opened lazily on first use, so a log with many old segments starts quickly.
Concurrency: one writer (the partition's single writer) mutates; readers call ``lookup``
concurrently, which is safe because entries are written before ``entries`` is advanced.
"""

from __future__ import annotations

import itertools
import mmap
import os
import struct
from pathlib import Path

from storage.errors import InvariantViolation, OffsetOverflowError, invariant

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")
_MAX_RELATIVE = 2**31 - 1
RESERVE_BYTES = 64 * 1024  # blocks reserved ahead of the entries (module doc)


class CorruptIndexError(Exception):
    """An index file's contents contradict its segment; the loader rebuilds it."""


class _MappedIndex:
    """Shared mechanics: the file, its lazily opened mmap, pre-allocation and trimming."""

    entry_size: int

    def __init__(self, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self._max_bytes = max_index_bytes - max_index_bytes % self.entry_size
        invariant(self._max_bytes >= self.entry_size, "index must hold at least one entry")
        self._fd = -1
        self._mm: mmap.mmap | None = None
        self._capacity = 0
        self._reserved = 0  # bytes from the start known to have disk blocks
        self.entries = 0
        # A new index grows to its pre-allocated size; an existing one is mapped at its size
        # until something appends to it (a reopened active segment), so lookups on old
        # segments never re-grow trimmed files.
        self._growable = not path.exists()
        if path.exists():
            size = path.stat().st_size
            if size % self.entry_size:
                raise CorruptIndexError(f"{path}: size {size} is not a multiple of entries")
            self.entries = size // self.entry_size
        self.max_entries = max(self._max_bytes // self.entry_size, self.entries)
        self._last: tuple[int, int] | None = None  # cached last entry; None: read it

    # -- file handling -------------------------------------------------------------------
    def _open(self) -> mmap.mmap:
        if self._mm is None:
            self._close_map()  # a read-only descriptor of ``_read``'s
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            used = self.entries * self.entry_size
            self._capacity = max(self._max_bytes, used) if self._growable else used
            if self._growable:
                os.ftruncate(self._fd, self._capacity)
            self._reserved = _backed_prefix(self._fd, used)
            self._mm = mmap.mmap(self._fd, self._capacity)
        return self._mm

    def _reserve(self, end: int) -> None:
        """Make sure bytes up to ``end`` have disk blocks (module doc); OSError if the disk
        is full."""
        start = self._reserved
        stop = min(self._capacity, max(end, start + RESERVE_BYTES))
        if stop > start:
            os.posix_fallocate(self._fd, start, stop - start)
        self._reserved = max(stop, end)

    def _read(self, n: int) -> mmap.mmap | bytes:
        """The map, or entry ``n`` alone when the file is not mapped yet: a load's checks
        read a few entries with ``pread``, because on tmpfs even a read fault on a hole of
        a shared map needs a free page, and a full disk answers it with SIGBUS."""
        if self._mm is not None:
            return self._mm
        if self._fd < 0:  # kept, as a map's would be, until the index is mapped or closed
            self._fd = os.open(self.path, os.O_RDONLY)
        data = os.pread(self._fd, self.entry_size, n * self.entry_size)
        if len(data) != self.entry_size:
            raise CorruptIndexError(f"{self.path}: entry {n} lies past the end of the file")
        return data

    def _open_for_append(self) -> mmap.mmap:
        if not self._growable:
            self._close_map()
            self._growable = True
        return self._open()

    def is_full(self) -> bool:
        return self.entries >= self.max_entries

    def truncate_entries(self, entries: int) -> None:
        """Forget entries past ``entries`` (zeroing them, so a crash cannot revive them)."""
        if entries >= self.entries:
            return
        mm = self._open()
        keep, end = entries * self.entry_size, self.entries * self.entry_size
        self.entries = entries
        self._last = None
        if end <= self._reserved:
            # Entries written here, so backed: zero them in place. (Readers in other threads
            # may still look at them: the file keeps its size.)
            mm[keep:end] = bytes(end - keep)
        else:
            # A tail with holes (an index left pre-allocated by a crash, seen at load, when
            # nothing else reads it): cut the file and extend it again, so the tail reads as
            # zeros with no page touched (storing zeros into holes needs blocks that a full
            # disk does not have, and a map answers that with SIGBUS).
            os.ftruncate(self._fd, keep)
            os.ftruncate(self._fd, self._capacity)
            self._reserved = min(self._reserved, keep)

    def reset(self) -> None:
        self.truncate_entries(0)

    def trim(self) -> None:
        """Cut the file to its valid entries (on roll and close); unmaps it."""
        self._close_map()
        self._growable = False
        with open(self.path, "r+b" if self.path.exists() else "w+b") as f:
            f.truncate(self.entries * self.entry_size)

    def flush(self) -> None:
        if self._mm is not None:
            self._mm.flush()

    def _close_map(self) -> None:
        if self._mm is not None:
            self._mm.close()
            self._mm = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def close(self) -> None:
        self.trim()

    def delete(self) -> None:
        self._close_map()
        self.entries = 0
        self._last = None
        self.path.unlink(missing_ok=True)

    def relative(self, offset: int) -> int:
        rel = offset - self.base_offset
        if rel < 0 or rel > _MAX_RELATIVE:
            raise OffsetOverflowError(
                f"offset {offset} cannot be stored relative to base offset {self.base_offset}"
            )
        return rel


class OffsetIndex(_MappedIndex):
    """Maps relative offset -> byte position in the segment's .log file."""

    entry_size = 8

    def entry(self, n: int) -> tuple[int, int]:
        """The n-th entry as (absolute offset, position)."""
        rel, pos = _OFFSET_ENTRY.unpack_from(self._read(n), 0 if self._mm is None else n * 8)
        return self.base_offset + rel, pos

    def last_entry(self) -> tuple[int, int]:
        if self._last is None:
            self._last = self.entry(self.entries - 1) if self.entries else (self.base_offset, 0)
        return self._last

    def append(self, offset: int, position: int) -> None:
        entries = self.entries
        if entries and offset <= (self._last or self.last_entry())[0]:
            raise InvariantViolation(f"{self.path}: offset index append {offset} not increasing")
        if entries >= self.max_entries:
            raise InvariantViolation(f"{self.path}: offset index is full")
        rel = offset - self.base_offset
        if rel > _MAX_RELATIVE:  # (rel >= 0 follows from the increasing check and the base)
            self.relative(offset)  # raises OffsetOverflowError
        mm = self._mm
        if mm is None or not self._growable:
            mm = self._open_for_append()
        if (entries + 1) * 8 > self._reserved:
            self._reserve((entries + 1) * 8)
        _OFFSET_ENTRY.pack_into(mm, entries * 8, rel, position)
        self.entries = entries + 1
        self._last = (offset, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """Greatest entry with offset <= ``offset``, or (base offset, 0) if there is none."""
        n = self._floor_slot(offset)
        return self.entry(n) if n >= 0 else (self.base_offset, 0)

    def _floor_slot(self, offset: int) -> int:
        """The last slot whose offset is <= ``offset``, -1 if none. Searched from the end
        (followers and consumers that keep up read near it: a few probes instead of a
        binary search of the whole index), back in doubling steps, then by halving."""
        hi = self.entries - 1  # invariant below: entry(hi) > offset
        if hi < 0:
            return -1
        if self.entry(hi)[0] <= offset:  # not _last: a reader may see it lag ``entries``
            return hi
        step = 1
        while True:
            lo = hi - step
            if lo <= 0:
                if self.entry(0)[0] > offset:
                    return -1
                lo = 0
                break
            if self.entry(lo)[0] <= offset:
                break
            hi, step = lo, step * 2
        while hi - lo > 1:  # entry(lo) <= offset < entry(hi)
            mid = (lo + hi) // 2
            if self.entry(mid)[0] <= offset:
                lo = mid
            else:
                hi = mid
        return lo

    def truncate_to(self, offset: int) -> None:
        """Remove entries with offset >= ``offset``."""
        n = self._floor_slot(offset)
        if n >= 0 and self.entry(n)[0] == offset:
            n -= 1
        self.truncate_entries(n + 1)

    def sanity_check(self, log_size: int) -> None:
        """Cheap checks on an index the loader is about to trust: sampled entries increase,
        and the last one points inside the log. The segment checks that it hits a batch."""
        if not self.entries:
            return
        samples = [self.entry(n) for n in _sample_slots(self.entries)]
        for (offset_a, pos_a), (offset_b, pos_b) in itertools.pairwise(samples):
            if offset_b <= offset_a or pos_b <= pos_a:
                raise CorruptIndexError(f"{self.path}: entries do not increase")
        first_offset, first_pos = samples[0]
        last_offset, last_pos = samples[-1]
        if first_pos <= 0 or first_offset < self.base_offset or last_pos >= log_size:
            raise CorruptIndexError(
                f"{self.path}: entries ({first_offset}, {first_pos}) .. ({last_offset}, "
                f"{last_pos}) do not fit a {log_size}-byte log"
            )


class TimeIndex(_MappedIndex):
    """Maps max timestamp so far -> relative offset; one slot is kept for the roll entry."""

    entry_size = 12

    def entry(self, n: int) -> tuple[int, int]:
        """The n-th entry as (timestamp, absolute offset)."""
        ts, rel = _TIME_ENTRY.unpack_from(self._read(n), 0 if self._mm is None else n * 12)
        return ts, self.base_offset + rel

    def last_entry(self) -> tuple[int, int]:
        if self._last is None:
            self._last = self.entry(self.entries - 1) if self.entries else (-1, self.base_offset)
        return self._last

    def is_full(self) -> bool:
        # The last slot is reserved for the entry written when the segment rolls.
        return self.entries >= self.max_entries - 1

    def maybe_append(self, timestamp: int, offset: int, *, skip_full_check: bool = False) -> None:
        """Append (timestamp, offset) if the timestamp grew; duplicates are ignored."""
        entries = self.entries
        if entries:
            last_ts, last_offset = self._last or self.last_entry()
            if timestamp <= last_ts:
                return  # the common case on the append path: no newer timestamp
            if offset < last_offset:
                raise InvariantViolation(f"{self.path}: time index offset {offset} went back")
        if not skip_full_check and entries >= self.max_entries - 1:
            raise InvariantViolation(f"{self.path}: time index is full")
        if entries >= self.max_entries:
            return  # only reachable with skip_full_check on a completely full file
        mm = self._mm
        if mm is None or not self._growable:
            mm = self._open_for_append()
        if (entries + 1) * 12 > self._reserved:
            self._reserve((entries + 1) * 12)
        _TIME_ENTRY.pack_into(mm, entries * 12, timestamp, self.relative(offset))
        self.entries = entries + 1
        self._last = (timestamp, offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """Greatest entry with timestamp <= ``timestamp``, or (-1, base offset)."""
        lo, hi = 0, self.entries - 1
        if hi < 0 or self.entry(0)[0] > timestamp:
            return -1, self.base_offset
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.entry(mid)[0] <= timestamp:
                lo = mid
            else:
                hi = mid - 1
        return self.entry(lo)

    def truncate_to(self, offset: int) -> None:
        """Remove entries whose offset is >= ``offset``."""
        n = self.entries
        while n > 0 and self.entry(n - 1)[1] >= offset:
            n -= 1
        self.truncate_entries(n)

    def sanity_check(self, next_offset: int) -> None:
        """Sampled entries increase (timestamps strictly) and stay inside the segment's
        offsets. The segment checks the last entry against its batch."""
        if not self.entries:
            return
        samples = [self.entry(n) for n in _sample_slots(self.entries)]
        for (ts_a, offset_a), (ts_b, offset_b) in itertools.pairwise(samples):
            if ts_b <= ts_a or offset_b < offset_a:
                raise CorruptIndexError(f"{self.path}: entries do not increase")
        if samples[0][1] < self.base_offset or samples[-1][1] >= next_offset:
            raise CorruptIndexError(f"{self.path}: entries lie outside the segment's offsets")


def _sample_slots(entries: int, samples: int = 16) -> list[int]:
    """Up to ``samples`` evenly spaced slots including the first and the last."""
    if entries <= samples:
        return list(range(entries))
    step = (entries - 1) / (samples - 1)
    return sorted({round(i * step) for i in range(samples)})


def _backed_prefix(fd: int, size: int) -> int:
    """How much of the file's first ``size`` bytes surely has disk blocks: up to its first
    hole (``SEEK_HOLE``; a file system that cannot tell reports none)."""
    try:
        return min(size, os.lseek(fd, 0, os.SEEK_HOLE))
    except OSError:  # not expected on Linux (no hole support reads as all data): trust it
        return size
