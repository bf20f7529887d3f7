"""The sparse mmap'd indexes on real files: layout, lookup, truncation, trimming, reopening."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from storage.errors import InvariantViolation, OffsetOverflowError
from storage.index import CorruptIndexError, OffsetIndex, TimeIndex

BASE = 1000


def test_offset_index_entries_are_8_bytes_relative_to_the_base(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", BASE, 800)
    index.append(BASE + 5, 4100)
    index.append(BASE + 9, 8300)
    index.trim()
    raw = (tmp_path / "a.index").read_bytes()
    assert raw == struct.pack(">iiii", 5, 4100, 9, 8300)


def test_offset_index_lookup_finds_the_greatest_entry_at_or_below(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", BASE, 8000)
    for i in range(1, 101):
        index.append(BASE + 10 * i, 4096 * i)
    assert index.lookup(BASE) == (BASE, 0)  # below the first entry: the segment start
    assert index.lookup(BASE + 10) == (BASE + 10, 4096)
    assert index.lookup(BASE + 555) == (BASE + 550, 4096 * 55)
    assert index.lookup(BASE + 10_000) == (BASE + 1000, 4096 * 100)


@pytest.mark.parametrize("entries", [0, 1, 2, 3, 5, 8, 17, 64, 100])
def test_offset_index_lookup_agrees_with_a_linear_scan_everywhere(
    tmp_path: Path, entries: int
) -> None:
    # The search starts at the end and steps back in doubling strides: every size and every
    # offset, below, between, on and past the entries, against the plain definition.
    index = OffsetIndex(tmp_path / "a.index", BASE, 8 * 128)
    stored = [(BASE + 3 * i + 2, 100 * i + 50) for i in range(entries)]
    for offset, position in stored:
        index.append(offset, position)
    for offset in range(BASE, BASE + 3 * entries + 5):
        below = [entry for entry in stored if entry[0] <= offset]
        assert index.lookup(offset) == (below[-1] if below else (BASE, 0)), offset


def test_offset_index_refuses_non_increasing_offsets_and_overflow(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", BASE, 80)
    index.append(BASE + 3, 100)
    with pytest.raises(InvariantViolation):
        index.append(BASE + 3, 200)
    with pytest.raises(OffsetOverflowError):
        index.append(BASE + 2**31, 300)


def test_offset_index_is_full_at_its_preallocated_size(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 0, 8 * 3 + 5)  # rounds down to 3 entries
    for i in range(3):
        index.append(i + 1, 100 * (i + 1))
    assert index.is_full()
    assert (tmp_path / "a.index").stat().st_size == 24
    with pytest.raises(InvariantViolation):
        index.append(10, 1000)


def test_truncate_removes_entries_at_and_above_an_offset(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "a.index", 0, 800)
    for i in range(1, 11):
        index.append(10 * i, 100 * i)
    index.truncate_to(50)
    assert index.entries == 4 and index.last_entry() == (40, 400)
    index.truncate_to(45)
    assert index.entries == 4
    index.append(60, 600)  # appends continue after the cut
    assert index.lookup(70) == (60, 600)


def test_trim_cuts_the_file_and_reopening_keeps_it_trimmed(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    index = OffsetIndex(path, BASE, 10 * 1024 * 1024)
    index.append(BASE + 1, 4097)
    assert path.stat().st_size == 10 * 1024 * 1024  # pre-allocated while active
    index.trim()
    assert path.stat().st_size == 8
    reopened = OffsetIndex(path, BASE, 10 * 1024 * 1024)
    assert reopened.entries == 1 and reopened.lookup(BASE + 50) == (BASE + 1, 4097)
    assert path.stat().st_size == 8  # a lookup does not re-grow an old segment's index
    reopened.append(BASE + 2, 9000)  # the active segment's index grows again to append
    assert reopened.entries == 2
    reopened.trim()
    assert path.stat().st_size == 16


def test_an_index_whose_size_is_not_whole_entries_is_corrupt(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    path.write_bytes(b"\x00" * 13)
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path, 0, 800)


def test_sanity_check_catches_an_untrimmed_or_impossible_tail(tmp_path: Path) -> None:
    path = tmp_path / "a.index"
    path.write_bytes(struct.pack(">ii", 5, 4096) + bytes(8))  # a zero entry: not trimmed
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path, 0, 800).sanity_check(log_size=10_000)
    path.write_bytes(struct.pack(">ii", 5, 20_000))  # points past the end of the log
    with pytest.raises(CorruptIndexError):
        OffsetIndex(path, 0, 800).sanity_check(log_size=10_000)
    path.write_bytes(struct.pack(">ii", 5, 4096))
    OffsetIndex(path, 0, 800).sanity_check(log_size=10_000)


def test_time_index_keeps_only_growing_timestamps(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex", BASE, 12 * 10)
    index.maybe_append(100, BASE + 1)
    index.maybe_append(100, BASE + 2)  # same timestamp: ignored
    index.maybe_append(90, BASE + 3)  # older timestamp: ignored
    index.maybe_append(150, BASE + 4)
    assert index.entries == 2
    assert index.lookup(120) == (100, BASE + 1)
    assert index.lookup(50) == (-1, BASE)
    index.trim()
    assert (tmp_path / "a.timeindex").read_bytes() == struct.pack(">qiqi", 100, 1, 150, 4)


def test_time_index_reserves_its_last_slot_for_the_roll_entry(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "a.timeindex", 0, 12 * 3)
    index.maybe_append(10, 1)
    index.maybe_append(20, 2)
    assert index.is_full()
    index.maybe_append(30, 3, skip_full_check=True)
    assert index.entries == 3
    index.truncate_to(2)
    assert index.entries == 1 and index.last_entry() == (10, 1)
