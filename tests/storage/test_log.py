"""The partition log on real files: offsets, reads, rolling, truncation, retention, epochs,
idempotent producers, bad input and I/O failure."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import OpenLog
from support import FakeClock, make_batch

from storage.batch import CompressionType, TimestampType, parse_header, validate_batch
from storage.config import CleanupPolicy, LogConfig
from storage.errors import (
    CorruptRecordError,
    InvalidProducerEpochError,
    InvalidRecordError,
    InvalidTimestampError,
    LogDirOfflineError,
    OffsetOutOfRangeError,
    OutOfOrderSequenceError,
    RecordTooLargeError,
)
from storage.loader import load_log
from storage.log import Isolation, Log
from storage.records import RecordInput, build_batch, iter_decoded


def read_all(log: Log, start: int = 0, isolation: Isolation = Isolation.LOG_END) -> bytes:
    out = bytearray()
    offset = start
    while offset < (log.log_end_offset if isolation is Isolation.LOG_END else log.high_watermark):
        data = log.read(offset, 1 << 20, isolation=isolation)
        assert data.slice is not None
        chunk = data.slice.read()
        out += chunk
        last = None
        for _, header in _headers(chunk):
            last = header
        assert last is not None
        offset = last.next_offset
    return bytes(out)


def _headers(buf: bytes) -> list[tuple[int, object]]:
    result, pos = [], 0
    while pos < len(buf):
        header = validate_batch(buf, pos)
        result.append((pos, header))
        pos += header.size_bytes
    return result


def values_of(buf: bytes) -> list[bytes | None]:
    return [r.value for batch in iter_decoded(buf) for r in batch.records]


def test_leader_append_assigns_offsets_and_stamps_the_epoch(open_log: OpenLog) -> None:
    log = open_log()
    first = log.append_as_leader(make_batch([b"a", b"b", b"c"]), leader_epoch=3)
    second = log.append_as_leader(make_batch([b"d"]), leader_epoch=3)
    assert (first.first_offset, first.last_offset, first.record_count) == (0, 2, 3)
    assert (second.first_offset, second.last_offset) == (3, 3)
    assert log.log_end_offset == 4
    data = read_all(log)
    headers = [h for _, h in _headers(data)]
    assert [h.base_offset for h in headers] == [0, 3]
    assert all(h.partition_leader_epoch == 3 for h in headers)
    assert values_of(data) == [b"a", b"b", b"c", b"d"]
    assert log.epoch_cache.entries()[0].epoch == 3


def test_reads_stop_at_the_high_watermark_for_consumers(open_log: OpenLog) -> None:
    log = open_log()
    for i in range(5):
        log.append_as_leader(make_batch([b"v%d" % i]), leader_epoch=0)
    assert log.read(0, 1 << 20).slice is None  # HW is 0: nothing visible
    log.update_high_watermark(3)
    visible = read_all(log, isolation=Isolation.HIGH_WATERMARK)
    assert values_of(visible) == [b"v0", b"v1", b"v2"]
    assert values_of(read_all(log)) == [b"v0", b"v1", b"v2", b"v3", b"v4"]
    with pytest.raises(OffsetOutOfRangeError):
        log.read(6, 100)


def test_read_returns_at_least_one_batch_even_if_larger_than_max_bytes(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_leader(make_batch([b"x" * 5000]), leader_epoch=0)
    data = log.read(0, 10, isolation=Isolation.LOG_END)
    assert data.slice is not None and data.slice.length > 5000
    assert log.read(0, 10, isolation=Isolation.LOG_END, min_one_batch=False).slice is not None
    assert log.read(0, 10, isolation=Isolation.LOG_END, min_one_batch=False).slice.length == 10


def test_read_of_an_offset_inside_a_batch_returns_that_batch(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_leader(make_batch([b"a", b"b", b"c"]), leader_epoch=0)
    log.append_as_leader(make_batch([b"d", b"e"]), leader_epoch=0)
    data = log.read(4, 1 << 20, isolation=Isolation.LOG_END)
    assert data.slice is not None
    assert parse_header(data.slice.read()).base_offset == 3


def test_segments_roll_by_size_and_reads_cross_them(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_bytes=1024, index_interval_bytes=100))
    for i in range(40):
        log.append_as_leader(make_batch([b"%04d" % i + b"x" * 100]), leader_epoch=0)
    assert len(log.segments) > 4
    assert all(s.size <= 1024 for s in log.segments)
    assert [s.base_offset for s in log.segments] == sorted({s.base_offset for s in log.segments})
    values = values_of(read_all(log))
    assert values == [b"%04d" % i + b"x" * 100 for i in range(40)]
    for name in (
        "00000000000000000000.log",
        "00000000000000000000.index",
        "00000000000000000000.timeindex",
    ):
        assert (log.dir / name).exists()
    # Rolled segments' indexes are trimmed to whole, valid entries.
    rolled = log.segments[0]
    assert rolled.offset_index.path.stat().st_size == 8 * rolled.offset_index.entries
    assert rolled.offset_index.entries >= 1


def test_offset_index_is_sparse_every_index_interval_bytes(open_log: OpenLog) -> None:
    log = open_log(LogConfig(index_interval_bytes=4096))
    for _ in range(100):
        log.append_as_leader(make_batch([b"y" * 1000]), leader_epoch=0)
    index = log.active_segment.offset_index
    # ~1070-byte batches: one entry after every 4 batches crossing 4096 bytes.
    assert 20 <= index.entries <= 25
    for n in range(index.entries):
        offset, position = index.entry(n)
        data = os.pread(log.active_segment.handle.fd, 61, position)
        assert int.from_bytes(data[:8], "big") == offset  # one record per batch: base == last


def test_roll_by_time(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_ms=1000))
    log.append_as_leader(make_batch([b"a"], timestamp_ms=clock.now_ms), leader_epoch=0)
    log.append_as_leader(make_batch([b"b"], timestamp_ms=clock.now_ms + 500), leader_epoch=0)
    assert len(log.segments) == 1
    log.append_as_leader(make_batch([b"c"], timestamp_ms=clock.now_ms + 1500), leader_epoch=0)
    assert [s.base_offset for s in log.segments] == [0, 2]


def _roll_ages_ms(log: Log, clock: FakeClock, rolls: int) -> list[int]:
    """Append one batch per millisecond of record time; for each of ``rolls`` rolls, how old
    the segment's first batch was when the next append rolled it."""
    ages: list[int] = []
    first = timestamp = clock.now_ms
    while len(ages) < rolls:
        segments = len(log.segments)
        log.append_as_leader(make_batch([b"x"], timestamp_ms=timestamp), leader_epoch=0)
        if len(log.segments) > segments:
            ages.append(timestamp - first)
            first = timestamp
        timestamp += 1
    return ages


def test_each_segment_rolls_at_its_own_random_jitter(clock: FakeClock, tmp_path: Path) -> None:
    """As Kafka's randomSegmentJitter: each segment draws a jitter in [0, segment_jitter_ms)
    and rolls once its first batch is older than segment_ms minus that jitter, so that
    partitions created together do not all roll at once."""
    config = LogConfig(segment_ms=1000, segment_jitter_ms=400, retention_ms=None)
    ages: dict[int, list[int]] = {}
    for seed in (1, 2):
        log = load_log(tmp_path / f"topic-{seed}", config, clock=clock, jitter_seed=seed)
        ages[seed] = _roll_ages_ms(log, clock, rolls=4)
        log.abandon()
    every_age = ages[1] + ages[2]
    assert all(1000 - 400 < age <= 1000 for age in every_age), ages
    assert ages[1] != ages[2]  # logs with different seeds roll at different times
    assert len(set(ages[1])) > 1  # and each segment draws its own jitter


def test_without_jitter_a_segment_rolls_exactly_at_segment_ms(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log(LogConfig(segment_ms=1000, retention_ms=None), jitter_seed=1)
    assert _roll_ages_ms(log, clock, rolls=3) == [1001, 1001, 1001]
    assert {segment.roll_jitter_ms for segment in log.segments} == {0}


def test_roll_when_the_index_is_full(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_index_bytes=24, index_interval_bytes=0))
    for i in range(10):
        log.append_as_leader(make_batch([b"%d" % i]), leader_epoch=0)
    assert len(log.segments) > 2
    assert values_of(read_all(log)) == [b"%d" % i for i in range(10)]


def test_roll_when_offsets_overflow_the_relative_index(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_follower(make_batch([b"a"], base_offset=0, partition_leader_epoch=0))
    far = 2**31 + 10
    log.append_as_follower(make_batch([b"b"], base_offset=far, partition_leader_epoch=0))
    assert [s.base_offset for s in log.segments] == [0, 1]
    assert log.log_end_offset == far + 1


def test_follower_append_keeps_offsets_and_epochs(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_follower(make_batch([b"a", b"b"], base_offset=0, partition_leader_epoch=1))
    log.append_as_follower(make_batch([b"c"], base_offset=2, partition_leader_epoch=4))
    assert log.log_end_offset == 3
    assert [(e.epoch, e.start_offset) for e in log.epoch_cache.entries()] == [(1, 0), (4, 2)]
    assert log.end_offset_for_epoch(1) == (1, 2)
    assert log.end_offset_for_epoch(4) == (4, 3)
    assert log.end_offset_for_epoch(2) == (1, 2)


@pytest.mark.parametrize(
    "damage",
    ["crc", "magic", "truncated", "too_large", "count"],
)
def test_bad_input_raises_a_typed_error_and_leaves_the_log_unchanged(
    open_log: OpenLog, damage: str
) -> None:
    log = open_log(LogConfig(max_message_bytes=2000))
    log.append_as_leader(make_batch([b"ok"]), leader_epoch=0)
    before = (log.log_end_offset, log.size_bytes, read_all(log))
    batch = bytearray(make_batch([b"payload"] * 3))
    expected: type[Exception]
    if damage == "crc":
        batch[-1] ^= 0xFF
        expected = CorruptRecordError
    elif damage == "magic":
        batch[16] = 1
        expected = CorruptRecordError
    elif damage == "truncated":
        batch = batch[:-3]
        expected = CorruptRecordError
    elif damage == "too_large":
        batch = bytearray(make_batch([b"z" * 3000]))
        expected = RecordTooLargeError
    else:
        # A record count that disagrees with the last offset delta (CRC fixed up).
        from storage.batch import compute_crc

        batch[57:61] = (7).to_bytes(4, "big")
        batch[17:21] = compute_crc(batch, 0, len(batch)).to_bytes(4, "big")
        expected = InvalidRecordError
    with pytest.raises(expected):
        log.append_as_leader(bytes(batch), leader_epoch=0)
    assert (log.log_end_offset, log.size_bytes, read_all(log)) == before


def test_a_control_batch_is_refused_from_a_client_but_replicated_verbatim(
    open_log: OpenLog,
) -> None:
    """Kafka's LogValidator: only a transaction coordinator writes control records; a
    follower copies whatever its leader's log holds."""
    marker = build_batch([RecordInput(b"\x00\x00\x00\x00", b"", 1)], is_control=True)
    transactional = build_batch(
        [RecordInput(None, b"t", 1)],
        producer_id=9, producer_epoch=0, base_sequence=0, is_transactional=True,
    )  # fmt: skip
    log = open_log()
    with pytest.raises(InvalidRecordError, match="control records"):
        log.append_as_leader(marker, leader_epoch=0)
    with pytest.raises(InvalidRecordError, match="control records"):  # nor among others
        log.append_as_leader(make_batch([b"a"]) + marker, leader_epoch=0)
    assert (log.log_end_offset, log.size_bytes) == (0, 0)
    log.append_as_follower(transactional)
    log.append_as_follower(build_batch(
        [RecordInput(b"\x00\x00\x00\x00", b"", 1)], base_offset=1, is_control=True,
        producer_id=9, producer_epoch=0, is_transactional=True,
    ))  # fmt: skip
    assert log.log_end_offset == 2


def test_follower_rejects_offsets_that_do_not_increase(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_follower(make_batch([b"a", b"b"], base_offset=0))
    with pytest.raises(InvalidRecordError):
        log.append_as_follower(make_batch([b"c"], base_offset=1))
    pair = make_batch([b"d"], base_offset=5) + make_batch([b"e"], base_offset=5)
    with pytest.raises(InvalidRecordError):
        log.append_as_follower(pair)
    assert log.log_end_offset == 2


def test_truncate_to_removes_the_tail_and_later_segments(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_bytes=600))
    for i in range(20):
        log.append_as_leader(make_batch([b"r%02d" % i + b"." * 60]), leader_epoch=i // 10)
    log.update_high_watermark(15)
    assert log.truncate_to(7)
    assert log.log_end_offset == 7
    assert log.high_watermark == 7
    assert values_of(read_all(log)) == [b"r%02d" % i + b"." * 60 for i in range(7)]
    assert [e.epoch for e in log.epoch_cache.entries()] == [0]
    assert not log.truncate_to(9)
    info = log.append_as_leader(make_batch([b"new"]), leader_epoch=2)
    assert info.first_offset == 7


def test_truncate_fully_and_start_at(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_leader(make_batch([b"a", b"b"]), leader_epoch=0)
    log.truncate_fully_and_start_at(100)
    assert (log.log_start_offset, log.high_watermark, log.log_end_offset) == (100, 100, 100)
    assert log.append_as_leader(make_batch([b"c"]), leader_epoch=1).first_offset == 100
    assert [s.base_offset for s in log.segments] == [100]


def test_log_start_offset_cannot_pass_the_high_watermark(open_log: OpenLog) -> None:
    log = open_log()
    for _ in range(4):
        log.append_as_leader(make_batch([b"a"]), leader_epoch=0)
    log.update_high_watermark(2)
    with pytest.raises(OffsetOutOfRangeError):
        log.maybe_increment_log_start_offset(3)
    assert log.maybe_increment_log_start_offset(2)
    assert log.log_start_offset == 2
    with pytest.raises(OffsetOutOfRangeError):
        log.read(1, 100)


def test_retention_by_time_deletes_whole_old_segments(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(LogConfig(segment_bytes=500, retention_ms=10_000))
    old_ts = clock.now_ms - 60_000
    for i in range(10):
        log.append_as_leader(make_batch([b"o" * 100], timestamp_ms=old_ts + i), leader_epoch=0)
    for _ in range(3):
        log.append_as_leader(make_batch([b"n" * 100], timestamp_ms=clock.now_ms), leader_epoch=0)
    log.update_high_watermark(log.log_end_offset)
    deleted = log.delete_old_segments()
    assert deleted >= 2
    assert log.log_start_offset == log.segments[0].base_offset > 0
    assert all(s.max_timestamp >= old_ts for s in log.segments)
    assert not (log.dir / "00000000000000000000.log").exists()


def test_retention_by_size(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_bytes=500, retention_bytes=1000, retention_ms=None))
    for _ in range(20):
        log.append_as_leader(make_batch([b"s" * 100]), leader_epoch=0)
    log.update_high_watermark(log.log_end_offset)
    log.delete_old_segments()
    assert log.size_bytes - log.active_segment.size <= 1000
    assert log.size_bytes > 500


def test_retention_never_deletes_above_the_high_watermark(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_bytes=500, retention_bytes=1, retention_ms=None))
    for _ in range(20):
        log.append_as_leader(make_batch([b"s" * 100]), leader_epoch=0)
    assert log.delete_old_segments() == 0
    assert log.log_start_offset == 0


def test_idempotent_producer_duplicates_return_the_original_offsets(open_log: OpenLog) -> None:
    log = open_log()
    first = make_batch([b"a", b"b"], producer_id=7, producer_epoch=0, base_sequence=0)
    info = log.append_as_leader(first, leader_epoch=0)
    log.append_as_leader(make_batch([b"x"]), leader_epoch=0)
    again = log.append_as_leader(first, leader_epoch=0)
    assert again.duplicate and (again.first_offset, again.last_offset) == (0, 1)
    assert info.first_offset == 0 and log.log_end_offset == 3
    with pytest.raises(OutOfOrderSequenceError):
        log.append_as_leader(
            make_batch([b"c"], producer_id=7, producer_epoch=0, base_sequence=5), leader_epoch=0
        )
    log.append_as_leader(
        make_batch([b"c"], producer_id=9, producer_epoch=3, base_sequence=0), leader_epoch=0
    )
    with pytest.raises(InvalidProducerEpochError):
        log.append_as_leader(
            make_batch([b"d"], producer_id=9, producer_epoch=2, base_sequence=1), leader_epoch=0
        )
    assert log.log_end_offset == 4


def test_producer_state_survives_reopen_so_retries_stay_deduplicated(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_bytes=400))
    batches = [
        make_batch([b"v" * 50], producer_id=1, producer_epoch=0, base_sequence=i) for i in range(12)
    ]
    for batch in batches:
        log.append_as_leader(batch, leader_epoch=0)
    log.close()
    for clean in (True, False):
        reopened = open_log(LogConfig(segment_bytes=400), had_clean_shutdown=clean)
        dup = reopened.append_as_leader(batches[-1], leader_epoch=0)
        assert dup.duplicate and dup.first_offset == 11
        reopened.abandon()


def test_log_append_time_restamps_max_timestamp_with_a_valid_crc(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log(LogConfig(message_timestamp_type=TimestampType.LOG_APPEND_TIME))
    info = log.append_as_leader(make_batch([b"a", b"b"], timestamp_ms=5), leader_epoch=0)
    assert info.log_append_time_ms == clock.now_ms
    raw = read_all(log)
    header = validate_batch(raw)  # raises if the CRC were wrong
    assert header.max_timestamp == clock.now_ms
    assert header.timestamp_type is TimestampType.LOG_APPEND_TIME


def test_create_time_batches_stamped_over_an_hour_ahead_are_refused_by_default(
    open_log: OpenLog, clock: FakeClock
) -> None:
    """KIP-937, Kafka 4's defaults: a batch stamped more than an hour ahead of the clock is
    refused (a clock far ahead would keep its segment from time retention); one stamped long
    ago is not. Nothing refused is written."""
    now, hour = clock.now_ms, 3_600_000
    log = open_log()
    log.append_as_leader(make_batch([b"ok"], timestamp_ms=now + hour), leader_epoch=0)
    log.append_as_leader(make_batch([b"old"], timestamp_ms=now - 100 * hour), leader_epoch=0)
    with pytest.raises(InvalidTimestampError, match=r"after\.max\.ms"):
        log.append_as_leader(make_batch([b"x"], timestamp_ms=now + hour + 1), leader_epoch=0)
    # The largest timestamp counts, not only the first record's (make_batch adds i ms).
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(make_batch([b"y", b"z"], timestamp_ms=now + hour), leader_epoch=0)
    assert log.log_end_offset == 2


def test_both_timestamp_bounds_are_inclusive(open_log: OpenLog, clock: FakeClock) -> None:
    now = clock.now_ms
    log = open_log(
        LogConfig(message_timestamp_before_max_ms=1000, message_timestamp_after_max_ms=0)
    )
    log.append_as_leader(make_batch([b"a"], timestamp_ms=now - 1000), leader_epoch=0)
    log.append_as_leader(make_batch([b"b"], timestamp_ms=now), leader_epoch=0)
    with pytest.raises(InvalidTimestampError, match=r"before\.max\.ms"):
        log.append_as_leader(make_batch([b"c"], timestamp_ms=now - 1001), leader_epoch=0)
    with pytest.raises(InvalidTimestampError):
        log.append_as_leader(make_batch([b"d"], timestamp_ms=now + 1), leader_epoch=0)
    assert log.log_end_offset == 2


def test_log_append_time_logs_take_any_client_timestamp(
    open_log: OpenLog, clock: FakeClock
) -> None:
    log = open_log(LogConfig(message_timestamp_type=TimestampType.LOG_APPEND_TIME))
    log.append_as_leader(make_batch([b"a"], timestamp_ms=clock.now_ms + 10**9), leader_epoch=0)
    assert log.log_end_offset == 1


def test_a_follower_copies_batches_whatever_their_timestamps(
    open_log: OpenLog, clock: FakeClock
) -> None:
    """The leader judged them by its own clock; the follower's may differ."""
    log = open_log()
    far = make_batch([b"a"], timestamp_ms=clock.now_ms + 10**9, partition_leader_epoch=0)
    log.append_as_follower(far)
    assert log.log_end_offset == 1


def test_offset_for_timestamp(open_log: OpenLog) -> None:
    log = open_log(LogConfig(segment_bytes=400, index_interval_bytes=50))
    for i in range(30):
        log.append_as_leader(make_batch([b"t" * 40], timestamp_ms=1000 + 10 * i), leader_epoch=0)
    assert log.offset_for_timestamp(0) == (0, 1000)
    assert log.offset_for_timestamp(1000 + 10 * 17) == (17, 1170)
    assert log.offset_for_timestamp(1000 + 10 * 17 - 3) == (17, 1170)
    assert log.offset_for_timestamp(10_000) is None


def test_an_io_error_takes_the_log_offline(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_leader(make_batch([b"a"]), leader_epoch=0)
    os.close(log.active_segment.handle.fd)  # the disk "fails": writes now get EBADF
    try:
        with pytest.raises(LogDirOfflineError):
            log.append_as_leader(make_batch([b"b"]), leader_epoch=0)
        assert log.offline
        with pytest.raises(LogDirOfflineError):
            log.read(0, 100)
        with pytest.raises(LogDirOfflineError):
            log.append_as_leader(make_batch([b"c"]), leader_epoch=0)
    finally:
        log.active_segment.handle._finalizer.detach()


def test_fsync_each_append_moves_the_recovery_point(open_log: OpenLog) -> None:
    log = open_log(LogConfig(fsync_each_append=True))
    log.append_as_leader(make_batch([b"a"]), leader_epoch=0)
    assert log.recovery_point == 1
    log.append_as_leader(make_batch([b"b", b"c"]), leader_epoch=0)
    assert log.recovery_point == 3


def test_flush_messages_and_flush_ms(open_log: OpenLog, clock: FakeClock) -> None:
    log = open_log(LogConfig(flush_messages=3, flush_ms=1000))
    log.append_as_leader(make_batch([b"a", b"b"]), leader_epoch=0)
    assert log.recovery_point == 0
    log.append_as_leader(make_batch([b"c"]), leader_epoch=0)
    assert log.recovery_point == 3
    log.append_as_leader(make_batch([b"d"]), leader_epoch=0)
    assert not log.maybe_flush(clock.now_ms + 10)
    clock.advance(1500)
    assert log.maybe_flush(clock.now_ms)
    assert log.recovery_point == 4


def test_a_compacted_log_refuses_records_without_a_key(open_log: OpenLog) -> None:
    log = open_log(LogConfig(cleanup_policy="compact"))
    with pytest.raises(InvalidRecordError):
        log.append_as_leader(make_batch([b"v"], keys=[None]), leader_epoch=0)
    info = log.append_as_leader(make_batch([b"v"], keys=[b"k"]), leader_epoch=0)
    assert info.first_offset == 0 and log.log_end_offset == 1


_COMPRESSED = [c for c in CompressionType if c is not CompressionType.NONE]


@pytest.mark.parametrize("cleanup_policy", ["delete", "compact"])
@pytest.mark.parametrize("codec", _COMPRESSED, ids=lambda c: c.name.lower())
def test_a_leader_refuses_a_batch_decompressing_beyond_the_limit(
    open_log: OpenLog, codec: CompressionType, cleanup_policy: CleanupPolicy
) -> None:
    """A small compressed batch may expand enormously (a decompression bomb): the leader
    decompresses at most max_decompressed_batch_bytes, when it checks the record framing
    or, for a compacted topic, when it decodes records to require keys."""
    config = LogConfig(max_decompressed_batch_bytes=4096, cleanup_policy=cleanup_policy)
    log = open_log(config)
    log.append_as_leader(make_batch([b"ok"], keys=[b"k"]), leader_epoch=0)
    before = (log.log_end_offset, log.size_bytes, read_all(log))
    bomb = make_batch([b"\0" * 100_000], keys=[b"k"], compression=codec)
    assert len(bomb) < config.max_message_bytes  # only its decompressed size is too large
    with pytest.raises(CorruptRecordError, match="decompresses to more than 4096 bytes"):
        log.append_as_leader(bomb, leader_epoch=0)
    assert (log.log_end_offset, log.size_bytes, read_all(log)) == before
    within = make_batch([b"\0" * 3000], keys=[b"k"], compression=codec)
    assert log.append_as_leader(within, leader_epoch=0).first_offset == before[0]


def test_appends_after_a_reopen_go_to_the_end_of_the_segment(open_log: OpenLog) -> None:
    log = open_log()
    log.append_as_leader(make_batch([b"first"]), leader_epoch=0)
    log.close()
    for clean in (True, False):
        log = open_log(had_clean_shutdown=clean)
        log.append_as_leader(make_batch([b"more"]), leader_epoch=0)
        log.close()
    log = open_log()
    assert values_of(read_all(log)) == [b"first", b"more", b"more"]


def test_appends_after_truncation_leave_no_hole(open_log: OpenLog) -> None:
    log = open_log()
    for value in (b"a", b"b", b"c"):
        log.append_as_leader(make_batch([value]), leader_epoch=0)
    log.truncate_to(1)
    log.append_as_leader(make_batch([b"d"]), leader_epoch=0)
    assert log.active_segment.log_path.stat().st_size == log.active_segment.size
    log.abandon()
    assert values_of(read_all(open_log())) == [b"a", b"d"]
