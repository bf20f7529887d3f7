"""Compaction (storage.cleaner) on real files: what survives, where it lives, what is never
touched, codecs, idempotent producers, crashes between the steps of a swap, reopening, and a
property test against a dictionary model."""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from conftest import OpenLog
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support import FakeClock

import storage.cleaner as cleaner
import storage.log
from storage.batch import CompressionType, validate_batch
from storage.cleaner import CleanStats, OffsetMapFullError, compact
from storage.config import LogConfig
from storage.errors import InconsistentLogError, LogDirOfflineError
from storage.loader import load_log, swap_file_name
from storage.log import Isolation, Log
from storage.log_manager import LogManager
from storage.records import DecodedBatch, RecordInput, build_batch, iter_decoded
from storage.segment import LogSegment
from storage.topic_partition import TopicPartition

Item = tuple[bytes | None, bytes | None]  # key, value (None: a tombstone)
Row = tuple[int, bytes | None, bytes | None]  # offset, key, value

CONFIG = LogConfig(
    cleanup_policy="compact", segment_bytes=1024, index_interval_bytes=128, retention_ms=None
)


# -- helpers -------------------------------------------------------------------------------


def append(
    log: Log,
    items: Sequence[Item],
    *,
    timestamp_ms: int = 1_700_000_000_000,
    compression: CompressionType = CompressionType.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
) -> None:
    """Append one batch of ``items`` (as a follower when a key is null: leaders refuse it)."""
    records = [RecordInput(k, v, timestamp_ms) for k, v in items]
    if any(k is None for k, _ in items):
        batch = build_batch(records, base_offset=log.log_end_offset, compression=compression)
        log.append_as_follower(batch)
    else:
        batch = build_batch(
            records,
            compression=compression,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            base_sequence=base_sequence,
        )
        log.append_as_leader(batch, leader_epoch=0)


def commit_and_roll(log: Log) -> None:
    """Make everything inactive and committed: the whole log becomes cleanable."""
    log.roll()
    log.update_high_watermark(log.log_end_offset)


def batches(log: Log) -> list[DecodedBatch]:
    """Every batch from the log start to the log end, through the read path."""
    out: list[DecodedBatch] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read(offset, 1 << 30, isolation=Isolation.LOG_END)
        if data.slice is None:
            break
        out.extend(iter_decoded(data.slice.read()))
        offset = out[-1].header.next_offset
    return out


def rows(log: Log) -> list[Row]:
    return [
        (r.offset, r.key, r.value)
        for b in batches(log)
        if not b.header.is_control
        for r in b.records
    ]


def compacted_model(appended: Sequence[Row], mapped_end: int, clean_end: int) -> list[Row]:
    """Kafka's rule: below ``clean_end`` keep a keyed record only if it is the latest for its
    key below ``mapped_end`` (tombstones kept); everything else stays as written."""
    latest = {k: o for o, k, _ in appended if k is not None and o < mapped_end}
    return [(o, k, v) for o, k, v in appended if o >= clean_end or k is None or latest[k] == o]


def view(result: Sequence[Row]) -> dict[bytes, bytes]:
    """The key -> value table a consumer builds by reading the log from the start."""
    table: dict[bytes, bytes] = {}
    for _, key, value in result:
        if key is None:
            continue
        if value is None:
            table.pop(key, None)
        else:
            table[key] = value
    return table


def fill(log: Log, count: int, keys: int, *, timestamp_ms: int = 1_700_000_000_000) -> list[Row]:
    """``count`` single-record batches cycling over ``keys`` keys; returns what was written."""
    written: list[Row] = []
    for i in range(count):
        key, value = b"k%d" % (i % keys), b"v%03d-" % i + b"x" * 40
        written.append((log.log_end_offset, key, value))
        append(log, [(key, value)], timestamp_ms=timestamp_ms)
    return written


def check_files_valid(log: Log) -> None:
    """`runnel log verify` in miniature: every segment file is CRC-valid batches with strictly
    increasing offsets, within the segment's offset range."""
    bases = [s.base_offset for s in log.segments] + [log.log_end_offset]
    for segment, end in zip(log.segments, bases[1:], strict=True):
        data = segment.log_path.read_bytes()
        position, next_offset = 0, segment.base_offset
        while position < len(data):
            header = validate_batch(data, position)
            assert next_offset <= header.base_offset <= header.last_offset < end
            next_offset = header.next_offset
            position += header.size_bytes


def reopen(log: Log, clock: FakeClock, *, clean: bool) -> Log:
    hw, recovery = log.high_watermark, log.recovery_point
    if clean:
        log.close()
    else:
        log.abandon()
    return load_log(
        log.dir,
        log.config,
        recovery_point=recovery if clean else 0,
        high_watermark=hw,
        had_clean_shutdown=clean,
        clock=clock,
    )


# -- what survives -------------------------------------------------------------------------


def test_latest_value_per_key_survives_at_its_original_offset(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    written = fill(log, 60, keys=5)
    commit_and_roll(log)
    tail = fill(log, 6, keys=5)  # the active segment, above the HW
    before = (log.log_start_offset, log.high_watermark, log.log_end_offset)
    segments_before = len(log.segments)

    stats = compact(log, 1_700_000_000_000)

    assert stats.segments_cleaned == segments_before - 2  # the last one is all latest
    assert stats.records_removed == 55
    assert stats.bytes_after < stats.bytes_before
    assert stats.clean_end_offset == 60
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == before
    assert rows(log) == compacted_model(written, 60, 60) + tail
    assert [o for o, _, _ in rows(log)][:5] == [55, 56, 57, 58, 59]
    check_files_valid(log)
    # Each surviving record is read at its own offset; a removed offset reads the next one.
    assert batches_at(log, 57)[0].records[0].offset == 57
    assert batches_at(log, 3)[0].records[0].offset == 55

    merged = compact(log, 1_700_000_000_000)  # the small outputs are merged into one
    assert merged.records_removed == 0 and merged.segments_cleaned == segments_before - 1
    assert len(log.segments) == 2
    assert rows(log) == compacted_model(written, 60, 60) + tail
    assert all(s.size <= CONFIG.segment_bytes for s in log.segments)
    check_files_valid(log)


def batches_at(log: Log, offset: int) -> list[DecodedBatch]:
    data = log.read(offset, 1 << 20, isolation=Isolation.LOG_END)
    assert data.slice is not None
    return list(iter_decoded(data.slice.read()))


def test_records_with_null_keys_are_kept(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    written: list[Row] = []
    for i in range(12):
        items: list[Item] = [(b"k", b"v%d" % i), (None, b"n%d" % i), (b"k%d" % (i % 2), b"w")]
        written += [(log.log_end_offset + j, k, v) for j, (k, v) in enumerate(items)]
        append(log, items)
    commit_and_roll(log)

    compact(log, 1_700_000_000_000)

    result = rows(log)
    assert result == compacted_model(written, 36, 36)
    assert [v for _, k, v in result if k is None] == [b"n%d" % i for i in range(12)]


def test_a_second_pass_finds_nothing_and_a_low_dirty_ratio_skips(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    fill(log, 40, keys=4)
    commit_and_roll(log)
    first = compact(log, 1_700_000_000_000)
    assert first.segments_cleaned > 0
    merge = compact(log, 1_700_000_000_000)  # merges the small outputs, removes nothing
    assert merge.records_removed == 0 and len(log.segments) == 2
    again = compact(log, 1_700_000_000_000)
    assert (again.segments_cleaned, again.records_removed) == (0, 0)
    # A little new data after the cleaned range: dirty ratio far below 0.5, nothing happens.
    fill(log, 2, keys=4)
    commit_and_roll(log)
    content = rows(log)
    skipped = compact(log, 1_700_000_000_000, first_dirty_offset=first.clean_end_offset)
    assert skipped == CleanStats()
    assert rows(log) == content
    # Without a previous pass to go by, everything is dirty: the pass runs.
    assert compact(log, 1_700_000_000_000).records_removed == 2


# -- tombstones, lag, what is never touched ------------------------------------------------


def test_tombstones_stay_until_delete_retention_has_passed(
    open_log: OpenLog, clock: FakeClock
) -> None:
    config = LogConfig(cleanup_policy="compact", segment_bytes=1024, delete_retention_ms=60_000)
    log = open_log(config)
    now = clock.now_ms
    append(log, [(b"a", b"1"), (b"b", b"1")], timestamp_ms=now)
    append(log, [(b"a", None)], timestamp_ms=now)
    commit_and_roll(log)

    first = compact(log, now + 60_000)  # exactly at the horizon: not yet past it
    assert rows(log) == [(1, b"b", b"1"), (2, b"a", None)]
    assert (first.records_removed, first.tombstones_removed) == (1, 0)

    clock.advance(60_001)
    second = compact(log, clock.now_ms)
    assert rows(log) == [(1, b"b", b"1")]
    assert (second.records_removed, second.tombstones_removed) == (1, 1)
    assert log.log_end_offset == 3


def test_min_compaction_lag_protects_recent_segments(open_log: OpenLog, clock: FakeClock) -> None:
    config = LogConfig(cleanup_policy="compact", segment_bytes=1024, min_compaction_lag_ms=10_000)
    log = open_log(config)
    old = fill(log, 10, keys=2, timestamp_ms=clock.now_ms - 20_000)
    log.roll()
    recent = fill(log, 10, keys=2, timestamp_ms=clock.now_ms)
    commit_and_roll(log)

    compact(log, clock.now_ms)

    # The old segment lost everything (its keys are updated later); the recent one is intact.
    assert rows(log) == recent
    assert old and log.segments[0].size == 0
    clock.advance(10_000)
    compact(log, clock.now_ms)
    assert rows(log) == recent[-2:]


def test_the_active_segment_and_data_above_the_hw_are_never_touched(open_log: OpenLog) -> None:
    log = open_log(LogConfig(cleanup_policy="compact", segment_bytes=2048))
    below = fill(log, 10, keys=2)
    log.roll()
    above = fill(log, 10, keys=2)  # inactive but not committed
    log.roll()
    active = fill(log, 10, keys=2)
    log.update_high_watermark(15)  # inside the second segment
    active_bytes = log.active_segment.log_path.read_bytes()
    second_bytes = log.segments[1].log_path.read_bytes()

    stats = compact(log, 1_700_000_000_000)

    # Only the first segment is cleaned, and only by updates below the HW: the later ones
    # may yet be truncated away.
    assert stats.segments_cleaned == 1 and stats.clean_end_offset == 10
    assert rows(log) == below[-2:] + above + active
    assert log.segments[1].log_path.read_bytes() == second_bytes
    assert log.active_segment.log_path.read_bytes() == active_bytes
    assert log.high_watermark == 15


# -- batches: codecs, attributes, producers ------------------------------------------------


@pytest.mark.parametrize("codec", list(CompressionType))
def test_compressed_batches_stay_compressed_with_their_codec(
    open_log: OpenLog, codec: CompressionType
) -> None:
    log = open_log(LogConfig(cleanup_policy="compact", segment_bytes=4096))
    written: list[Row] = []
    for i in range(6):
        items: list[Item] = [(b"k%d" % j, b"v%d-%d" % (i, j) * 10) for j in range(i % 3, 5)]
        written += [(log.log_end_offset + j, k, v) for j, (k, v) in enumerate(items)]
        append(log, items, compression=codec)
    commit_and_roll(log)

    compact(log, 1_700_000_000_000)

    assert rows(log) == compacted_model(written, len(written), len(written))
    survivors = batches(log)
    assert survivors and all(b.header.compression is codec for b in survivors)
    partly_removed = [
        b for b in survivors if b.header.record_count < b.header.last_offset_delta + 1
    ]
    assert partly_removed, "some batch should have lost records and been rebuilt"
    check_files_valid(log)


def test_rebuilt_batches_keep_their_header_fields(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    append(log, [(b"a", b"1"), (b"b", b"1"), (b"c", b"1")], timestamp_ms=1_000)
    append(log, [(b"a", b"2")], timestamp_ms=2_000)
    commit_and_roll(log)
    original = batches(log)[0].header

    compact(log, 1_700_000_000_000)

    rebuilt = batches(log)[0]
    assert [r.offset for r in rebuilt.records] == [1, 2]
    header = rebuilt.header
    assert header.record_count == 2
    for field in (
        "base_offset",
        "last_offset_delta",
        "max_timestamp",
        "partition_leader_epoch",
        "producer_id",
        "producer_epoch",
        "base_sequence",
        "attributes",
    ):
        assert getattr(header, field) == getattr(original, field), field


def test_a_producers_latest_batch_still_deduplicates_after_compaction(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log(CONFIG)
    append(log, [(b"a", b"1")], producer_id=7, producer_epoch=0, base_sequence=0)  # superseded
    append(log, [(b"a", b"2")])  # offset 1, a plain producer
    append(log, [(b"b", b"1")], producer_id=9, producer_epoch=0, base_sequence=0)
    append(log, [(b"b", b"2")], producer_id=9, producer_epoch=0, base_sequence=1)
    commit_and_roll(log)

    compact(log, clock.now_ms)

    kept = batches(log)
    # Producer 7's only batch lost its record but stays as an empty header; producer 9's
    # first batch is not its latest, so it goes entirely.
    assert [(b.header.base_offset, b.header.record_count) for b in kept] == [
        (0, 0),
        (1, 1),
        (3, 1),
    ]
    assert kept[0].header.producer_id == 7 and kept[0].header.base_sequence == 0
    for snapshot in log.dir.glob("*.snapshot"):
        snapshot.unlink()  # force the producer state to be rebuilt from the log itself
    log = reopen(log, clock, clean=False)
    retry = build_batch(
        [RecordInput(b"a", b"1", 0)], producer_id=7, producer_epoch=0, base_sequence=0
    )
    info = log.append_as_leader(retry, leader_epoch=0)
    assert info.duplicate and (info.first_offset, info.last_offset) == (0, 0)
    retry9 = build_batch(
        [RecordInput(b"b", b"2", 0)], producer_id=9, producer_epoch=0, base_sequence=1
    )
    assert log.append_as_leader(retry9, leader_epoch=0).duplicate
    follow_up = build_batch(
        [RecordInput(b"a", b"3", 0)], producer_id=7, producer_epoch=0, base_sequence=1
    )
    assert not log.append_as_leader(follow_up, leader_epoch=0).duplicate
    log.abandon()


# -- crash safety and reopening ------------------------------------------------------------


class _Crash(Exception):
    """Stands for the process dying at this point."""


def test_a_leftover_cleaned_file_is_removed_on_load(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(CONFIG)
    written = fill(log, 30, keys=3)
    commit_and_roll(log)
    first = log.segments[0]
    # A crash while writing the output leaves a partial .cleaned file behind.
    partial = first.log_path.read_bytes()[:100]
    leftover = log.dir / f"{first.base_offset:020d}.log.cleaned"
    leftover.write_bytes(partial)

    log = reopen(log, clock, clean=False)

    assert not leftover.exists()
    assert rows(log) == written
    check_files_valid(log)
    log.abandon()


@pytest.mark.parametrize("old_segments_deleted", [False, True])
def test_a_swap_file_is_completed_on_load(
    open_log: OpenLog,
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
    old_segments_deleted: bool,
) -> None:
    log = open_log(CONFIG)
    written = fill(log, 40, keys=4)
    commit_and_roll(log)
    groups: list[tuple[Sequence[int], Path]] = []

    def crash(old_bases: Sequence[int], swap_path: Path) -> LogSegment:
        groups.append((list(old_bases), swap_path))
        raise _Crash  # the output is fsynced and renamed to .swap; nothing else happened

    monkeypatch.setattr(log, "replace_segments", crash)
    with pytest.raises(_Crash):
        compact(log, clock.now_ms)
    [(old_bases, swap)] = groups
    assert swap.name == swap_file_name(old_bases[0], _next_base(log, old_bases[-1]))
    assert swap.exists() and not list(log.dir.glob("*.cleaned"))
    if old_segments_deleted:  # died inside replace_segments, after deleting the old files
        for segment in log.segments:
            if segment.base_offset in old_bases:
                segment.delete()

    log = reopen(log, clock, clean=False)

    assert not list(log.dir.glob("*.swap"))
    covered_end = _next_base(log, old_bases[0])
    assert rows(log) == compacted_model(written, 40, covered_end)
    assert log.segments[0].base_offset == old_bases[0]
    assert log.log_end_offset == 40
    check_files_valid(log)
    # The pass can then simply run again.
    compact(log, clock.now_ms)
    assert rows(log) == compacted_model(written, 40, 40)
    log.abandon()


def _kafka_swap_of_second_segment(log: Log) -> tuple[Log, list[int]]:
    """A log whose first two segments a Kafka-style compaction replaced by the second one's
    batches alone, before the crash: ``<first base>.log.swap`` plus index swap files (of
    garbage: they must not be trusted). Returns the log, closed, and the segment bases."""
    bases = [s.base_offset for s in log.segments]
    kept = log.segments[1].log_path.read_bytes()
    log.abandon()
    name = f"{bases[0]:020d}"
    (log.dir / f"{name}.log.swap").write_bytes(kept)
    for suffix in ("index", "timeindex", "txnindex"):
        (log.dir / f"{name}.{suffix}.swap").write_bytes(b"\xff" * 24)
    return log, bases


@pytest.mark.parametrize("clean", [True, False])
def test_a_kafka_named_swap_file_is_completed_on_load(
    open_log: OpenLog, clock: FakeClock, clean: bool
) -> None:
    """Kafka names a compaction's swap files <base>.log.swap (.index.swap, ...): the log
    swap replaces the segments with bases from its own up to the offset after its last
    batch, as Kafka's LogLoader does; the index swaps are rebuilt from it."""
    log = open_log(CONFIG)
    written = fill(log, 40, keys=4)
    commit_and_roll(log)
    if clean:
        log.close()
    log, bases = _kafka_swap_of_second_segment(log)

    reopened = load_log(
        log.dir, CONFIG, recovery_point=40, high_watermark=40, had_clean_shutdown=clean, clock=clock
    )

    assert not list(reopened.dir.glob("*.swap"))
    assert [s.base_offset for s in reopened.segments] == [bases[0], *bases[2:]]
    assert rows(reopened) == [row for row in written if row[0] >= bases[1]]
    assert reopened.read(bases[1], 1 << 20).start_offset == bases[1]
    check_files_valid(reopened)
    reopened.abandon()


def test_a_kafka_named_swap_file_above_a_cleaned_file_is_discarded(
    open_log: OpenLog, clock: FakeClock
) -> None:
    """KAFKA-6264: a .swap at or above the lowest .cleaned offset belongs to an operation
    that never finished writing its outputs; the live segments stay."""
    log = open_log(CONFIG)
    written = fill(log, 40, keys=4)
    commit_and_roll(log)
    log, bases = _kafka_swap_of_second_segment(log)
    (log.dir / f"{bases[0]:020d}.log.cleaned").write_bytes(b"half written")

    reopened = load_log(log.dir, CONFIG, high_watermark=40, clock=clock)

    assert not list(reopened.dir.glob("*.swap")) and not list(reopened.dir.glob("*.cleaned"))
    assert rows(reopened) == written
    reopened.abandon()


def test_a_swap_file_of_unknown_name_is_refused_by_name(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log(CONFIG)
    fill(log, 5, keys=2)
    log.abandon()
    odd = log.dir / "00000000000000000000.snapshot.swap"
    odd.write_bytes(b"")
    with pytest.raises(InconsistentLogError, match=str(odd)):
        load_log(log.dir, CONFIG, clock=clock)


def _next_base(log: Log, base: int) -> int:
    bases = [s.base_offset for s in log.segments]
    return bases[bases.index(base) + 1]


@pytest.mark.parametrize("clean", [True, False])
def test_a_compacted_log_reopens_with_identical_contents(
    open_log: OpenLog, clock: FakeClock, clean: bool
) -> None:
    log = open_log(CONFIG)
    fill(log, 50, keys=7)
    append(log, [(None, b"no key"), (b"k1", None)])
    commit_and_roll(log)
    fill(log, 3, keys=7)
    compact(log, clock.now_ms)
    before = rows(log)
    offsets = (log.log_start_offset, log.high_watermark, log.log_end_offset)

    log = reopen(log, clock, clean=clean)

    assert rows(log) == before
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == offsets
    check_files_valid(log)
    log.abandon()


def test_a_pass_racing_a_truncation_throws_its_output_away(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(CONFIG)
    fill(log, 40, keys=4)
    commit_and_roll(log)
    real_write = cleaner._write_cleaned

    def write_then_truncate(*args: Any, **kwargs: Any) -> Any:
        result = real_write(*args, **kwargs)
        log.truncate_to(20)  # an unclean leader change cuts into the mapped range
        return result

    monkeypatch.setattr(cleaner, "_write_cleaned", write_then_truncate)

    stats = compact(log, 1_700_000_000_000)

    truncated = rows(log)
    assert stats.segments_cleaned == 0
    assert [o for o, _, _ in truncated] == list(range(20))
    assert not list(log.dir.glob("*.cleaned")) and not list(log.dir.glob("*.swap"))


def test_an_io_error_in_the_swap_takes_the_log_offline(
    open_log: OpenLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = open_log(CONFIG)
    fill(log, 40, keys=4)
    commit_and_roll(log)

    def failing_open(*args: Any, **kwargs: Any) -> LogSegment:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(storage.log, "open_segment", failing_open)

    with pytest.raises(LogDirOfflineError, match="I/O error, log taken offline"):
        compact(log, 1_700_000_000_000)
    assert log.offline


# -- limits and wiring ---------------------------------------------------------------------


def test_the_offset_map_bound_limits_the_cleaned_range(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    written: list[Row] = []
    for i in range(60):  # keys 0-29 then their updates: new keys in every early segment
        key, value = b"k%d" % (i % 30), b"v%03d-" % i + b"x" * 40
        written.append((log.log_end_offset, key, value))
        append(log, [(key, value)])
    commit_and_roll(log)
    bases = [s.base_offset for s in log.segments]
    with pytest.raises(OffsetMapFullError):  # the first segment alone has 8 keys
        compact(log, 1_700_000_000_000, max_map_entries=7)
    assert rows(log) == written

    stats = compact(log, 1_700_000_000_000, max_map_entries=20)

    # Only the segments whose keys all fit were cleaned, using updates from the whole log.
    assert 0 < stats.clean_end_offset < 60 and stats.clean_end_offset in bases
    assert rows(log) == compacted_model(written, 60, stats.clean_end_offset)


def test_log_manager_maintenance_compacts_compacted_logs(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = LogManager([tmp_path], CONFIG, clock=clock)
    manager.startup()
    log = manager.get_or_create_log(TopicPartition("table", 0))
    written = fill(log, 40, keys=4)
    commit_and_roll(log)
    plain = manager.get_or_create_log(TopicPartition("events", 0), LogConfig(segment_bytes=1024))
    for i in range(20):
        plain.append_as_leader(
            build_batch([RecordInput(b"k", b"v%d" % i + b"x" * 50, clock.now_ms)]), 0
        )
    plain.roll()
    plain.update_high_watermark(plain.log_end_offset)
    plain_rows = rows(plain)

    manager.run_maintenance()

    assert rows(log) == compacted_model(written, 40, 40)
    assert rows(plain) == plain_rows
    manager.shutdown()


# -- property ------------------------------------------------------------------------------

_ops = st.lists(
    st.lists(
        st.tuples(st.sampled_from([b"a", b"b", b"c", b"d"]), st.none() | st.binary(max_size=30)),
        min_size=1,
        max_size=4,
    ),
    min_size=1,
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=_ops, expire_tombstones=st.booleans(), codec=st.sampled_from(list(CompressionType)))
def test_compaction_preserves_the_key_value_view(
    ops: list[list[Item]], expire_tombstones: bool, codec: CompressionType
) -> None:
    clock = FakeClock()
    config = LogConfig(cleanup_policy="compact", segment_bytes=300, delete_retention_ms=1000)
    directory = Path(tempfile.mkdtemp())
    try:
        log = load_log(directory / "t-0", config, clock=clock)
        written: list[Row] = []
        for items in ops:
            written += [(log.log_end_offset + i, k, v) for i, (k, v) in enumerate(items)]
            append(log, items, timestamp_ms=clock.now_ms, compression=codec)
        commit_and_roll(log)
        if expire_tombstones:
            clock.advance(1001)

        compact(log, clock.now_ms)

        result = rows(log)
        assert view(result) == view(written)
        offsets = [o for o, _, _ in result]
        assert set(result) <= set(written) and offsets == sorted(offsets)
        keys = [k for _, k, _ in result]
        assert len(keys) == len(set(keys)), "at most one record per key"
        if expire_tombstones:
            assert all(v is not None for _, _, v in result)
        check_files_valid(log)
        log.abandon()
    finally:
        shutil.rmtree(directory)
