"""Idempotent producer state: sequence checks, dedup, snapshots and expiry, on real files."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import crc32c
import pytest

from storage.batch import BatchHeader
from storage.errors import (
    CorruptSnapshotError,
    InvalidProducerEpochError,
    InvariantViolation,
    OutOfOrderSequenceError,
)
from storage.producer_state import (
    NUM_BATCHES_TO_RETAIN,
    BatchMetadata,
    ProducerStateEntry,
    ProducerStateManager,
    decode_snapshot,
    encode_snapshot,
    read_snapshot,
    snapshot_path,
)

INT32_MAX = 2**31 - 1
HOUR_MS = 3_600_000


def batch(
    base_offset: int,
    *,
    pid: int = 7,
    epoch: int = 0,
    seq: int = 0,
    count: int = 1,
    ts: int = 1_000,
) -> BatchHeader:
    return BatchHeader(
        base_offset=base_offset,
        batch_length=49,
        partition_leader_epoch=0,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=count - 1,
        base_timestamp=ts,
        max_timestamp=ts,
        producer_id=pid,
        producer_epoch=epoch,
        base_sequence=seq,
        record_count=count,
    )


def plain(base_offset: int, count: int = 1) -> BatchHeader:
    return batch(base_offset, pid=-1, epoch=-1, seq=-1, count=count)


def psm(tmp_path: Path, expiration_ms: int = HOUR_MS) -> ProducerStateManager:
    return ProducerStateManager(tmp_path, producer_id_expiration_ms=expiration_ms)


def append(manager: ProducerStateManager, header: BatchHeader) -> None:
    """What a leader append does: check, then apply."""
    assert manager.check_leader_append(header) is None
    manager.update(header)


def five_batches(manager: ProducerStateManager) -> list[BatchHeader]:
    """Sequences 0-1, 2-3, ... at offsets 0-1, 2-3, ..."""
    headers = [batch(2 * i, seq=2 * i, count=2) for i in range(NUM_BATCHES_TO_RETAIN + 1)]
    for h in headers:
        append(manager, h)
    return headers


# -- leader append checks ------------------------------------------------------------------


def test_non_idempotent_batches_pass_and_advance_map_end(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    assert manager.check_leader_append(plain(0, 3)) is None
    manager.update(plain(0, 3))
    assert manager.map_end_offset == 3
    assert dict(manager.producers) == {}


def test_unknown_producer_accepts_any_sequence_and_epoch(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    assert manager.check_leader_append(batch(0, seq=1234, epoch=9)) is None
    append(manager, batch(0, seq=1234, epoch=9))
    assert manager.producers[7].producer_epoch == 9
    assert manager.producers[7].last_seq == 1234


def test_in_sequence_accepted_gap_and_repeat_rejected(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0, seq=0, count=3))
    append(manager, batch(3, seq=3))
    with pytest.raises(OutOfOrderSequenceError):
        manager.check_leader_append(batch(4, seq=5))
    with pytest.raises(OutOfOrderSequenceError):
        manager.check_leader_append(batch(4, seq=3, count=2))  # overlaps, not a duplicate


def test_each_of_last_five_batches_is_a_duplicate_with_original_offsets(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    headers = five_batches(manager)
    for original in headers[1:]:
        retry = batch(100, seq=original.base_sequence, count=2)
        duplicate = manager.check_leader_append(retry)
        assert duplicate is not None
        assert (duplicate.first_offset, duplicate.last_offset) == (
            original.base_offset,
            original.last_offset,
        )
        assert (duplicate.first_seq, duplicate.last_seq) == (
            original.base_sequence,
            original.last_sequence,
        )


def test_sixth_oldest_batch_is_not_deduplicated(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    oldest = five_batches(manager)[0]
    assert len(manager.producers[7].batches) == NUM_BATCHES_TO_RETAIN
    with pytest.raises(OutOfOrderSequenceError):
        manager.check_leader_append(batch(100, seq=oldest.base_sequence, count=2))


def test_duplicate_needs_the_same_sequence_range_and_epoch(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0, seq=0, count=2))
    with pytest.raises(OutOfOrderSequenceError):
        manager.check_leader_append(batch(2, seq=0, count=1))  # same start, other end
    # The same sequences under a new epoch are a new batch, not a retry.
    assert manager.check_leader_append(batch(2, seq=0, count=2, epoch=1)) is None


def test_check_does_not_mutate(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0))
    assert manager.check_leader_append(batch(1, seq=1)) is None
    assert manager.check_leader_append(batch(1, seq=1)) is None  # still expected next
    assert manager.map_end_offset == 1
    assert manager.producers[7].last_seq == 0


def test_new_epoch_must_start_at_sequence_zero(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0, seq=0, count=5))
    with pytest.raises(OutOfOrderSequenceError):
        manager.check_leader_append(batch(5, epoch=1, seq=5))
    append(manager, batch(5, epoch=1, seq=0))
    entry = manager.producers[7]
    assert entry.producer_epoch == 1
    assert [b.first_seq for b in entry.batches] == [0]  # older epoch's batches forgotten


def test_older_epoch_is_fenced(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0, epoch=3))
    with pytest.raises(InvalidProducerEpochError):
        manager.check_leader_append(batch(1, epoch=2, seq=1))
    with pytest.raises(InvalidProducerEpochError):
        manager.check_leader_append(batch(1, epoch=2, seq=0))


def test_retry_from_before_an_epoch_bump_is_fenced_not_deduplicated(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    first = batch(0, epoch=0, seq=0)
    append(manager, first)
    append(manager, batch(1, epoch=1, seq=0))
    with pytest.raises(InvalidProducerEpochError):
        manager.check_leader_append(first)


def test_sequence_wraps_after_int32_max(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0, seq=INT32_MAX))
    append(manager, batch(1, seq=0))
    spanning = batch(2, seq=INT32_MAX - 1, count=3, pid=8)  # INT32_MAX-1, INT32_MAX, 0
    append(manager, spanning)
    assert manager.producers[8].last_seq == 0
    assert manager.check_leader_append(spanning) is not None
    assert manager.check_leader_append(batch(5, seq=1, pid=8)) is None
    with pytest.raises(OutOfOrderSequenceError):
        manager.check_leader_append(batch(5, seq=INT32_MAX, pid=8))


def test_session_checks_batches_of_one_append_against_each_other(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    append(manager, batch(0, seq=0, count=2))
    session = manager.begin_leader_append()
    assert session.check(batch(2, seq=2, count=2)) is None
    assert session.check(plain(4)) is None
    assert session.check(batch(5, seq=4)) is None
    with pytest.raises(OutOfOrderSequenceError):
        session.check(batch(6, seq=2, count=2))  # follows the manager's state, not the session
    assert manager.producers[7].last_seq == 1  # nothing applied yet


def test_session_checks_new_producer_batches_against_each_other(tmp_path: Path) -> None:
    session = psm(tmp_path).begin_leader_append()
    assert session.check(batch(0, seq=40)) is None
    with pytest.raises(OutOfOrderSequenceError):
        session.check(batch(1, seq=40))
    assert session.check(batch(1, seq=41)) is None
    assert session.check(batch(2, epoch=1, seq=0)) is None
    with pytest.raises(InvalidProducerEpochError):
        session.check(batch(3, epoch=0, seq=42))


# -- update --------------------------------------------------------------------------------


def test_update_keeps_five_batches_and_tracks_offsets(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    for i in range(8):
        manager.update(batch(10 * i, seq=i, ts=100 + i))
    entry = manager.producers[7]
    assert [b.first_seq for b in entry.batches] == [3, 4, 5, 6, 7]
    assert entry.last_offset == 70
    assert entry.last_timestamp == 107
    assert manager.map_end_offset == 71


def test_update_below_map_end_is_a_programmer_error(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(10, count=5))
    with pytest.raises(InvariantViolation):
        manager.update(batch(3, seq=1, count=2))


def test_producers_view_is_read_only(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0))
    with pytest.raises(TypeError):
        manager.producers[8] = manager.producers[7]  # type: ignore[index]


# -- snapshots -----------------------------------------------------------------------------


def test_snapshot_byte_layout(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, pid=9, epoch=2, seq=10, count=3, ts=5_000))
    manager.update(batch(3, pid=4, epoch=1, seq=0, count=1, ts=6_000))
    path = manager.take_snapshot(fsync=False)
    assert path.name == "00000000000000000004.snapshot"
    data = path.read_bytes()
    assert len(data) == 10 + 46 * 2
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count) == (1, 2)
    assert crc == crc32c.crc32c(data[6:])
    entries = [struct.unpack_from(">qhiqiqiq", data, 10 + 46 * i) for i in range(2)]
    assert entries == [
        (4, 1, 0, 3, 0, 6_000, -1, -1),
        (9, 2, 12, 2, 2, 5_000, -1, -1),
    ]


def test_empty_snapshot_is_ten_bytes(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(plain(0, 5))
    data = manager.take_snapshot().read_bytes()
    assert len(data) == 10
    assert decode_snapshot(data) == []


def test_snapshot_round_trip_keeps_last_batch(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    headers = five_batches(manager)
    manager.update(batch(12, pid=8, epoch=3, seq=INT32_MAX, count=2, ts=2_000))
    manager.take_snapshot()

    reloaded = psm(tmp_path)
    reloaded.truncate_and_reload(0, 14, now_ms=3_000)
    assert reloaded.map_end_offset == 14
    assert sorted(reloaded.producers) == [7, 8]
    entry = reloaded.producers[7]
    assert list(entry.batches) == [BatchMetadata(10, 11, 11, 1, 1_000)]
    wrapped = reloaded.producers[8].batches[-1]
    assert (wrapped.first_seq, wrapped.last_seq, wrapped.first_offset) == (INT32_MAX, 0, 12)
    # Only the last batch survives a snapshot, so only it is recognised as a retry.
    assert reloaded.check_leader_append(batch(99, seq=10, count=2)) is not None
    with pytest.raises(OutOfOrderSequenceError):
        reloaded.check_leader_append(batch(99, seq=headers[-2].base_sequence, count=2))
    assert reloaded.check_leader_append(batch(14, seq=12)) is None


def test_reload_picks_newest_snapshot_in_range_and_deletes_others(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    for offset in range(0, 50, 10):
        manager.update(batch(offset, seq=offset, count=10))
        manager.take_snapshot(fsync=False)
    assert manager.snapshot_offsets() == [10, 20, 30, 40, 50]
    manager.truncate_and_reload(15, 35, now_ms=1_000)
    assert manager.snapshot_offsets() == [20, 30]
    assert manager.map_end_offset == 30
    assert manager.producers[7].last_offset == 29
    assert manager.latest_snapshot_offset() == 30


def test_reload_without_snapshot_starts_at_log_start(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, count=10))
    manager.take_snapshot()
    manager.truncate_and_reload(0, 5, now_ms=1_000)  # truncated below the snapshot
    assert manager.snapshot_offsets() == []
    assert manager.map_end_offset == 0
    assert dict(manager.producers) == {}
    manager.truncate_and_reload(3, 5, now_ms=1_000)
    assert manager.map_end_offset == 3


def _corrupt_crc(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[20] ^= 0xFF
    path.write_bytes(bytes(data))


def _bad_version(path: Path) -> None:
    data = bytearray(path.read_bytes())
    struct.pack_into(">h", data, 0, 2)
    path.write_bytes(bytes(data))


def _bad_length(path: Path) -> None:
    data = path.read_bytes()[:-1]
    crc = crc32c.crc32c(data[6:])  # a valid CRC, so only the length is wrong
    path.write_bytes(data[:2] + struct.pack(">I", crc) + data[6:])


def _too_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:7])


@pytest.mark.parametrize("corrupt", [_corrupt_crc, _bad_version, _bad_length, _too_short])
def test_corrupt_snapshot_falls_back_to_older(
    tmp_path: Path, corrupt: Callable[[Path], None]
) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, seq=0))
    older = manager.take_snapshot()
    manager.update(batch(1, seq=1))
    newer = manager.take_snapshot()
    corrupt(newer)
    with pytest.raises(CorruptSnapshotError):
        read_snapshot(newer)

    manager.truncate_and_reload(0, 2, now_ms=1_000)
    assert not newer.exists()
    assert older.exists()
    assert manager.map_end_offset == 1
    assert manager.producers[7].last_seq == 0


def test_all_snapshots_corrupt_means_empty_state(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0))
    _corrupt_crc(manager.take_snapshot())
    manager.truncate_and_reload(0, 1, now_ms=1_000)
    assert manager.snapshot_offsets() == []
    assert manager.map_end_offset == 0
    assert dict(manager.producers) == {}


def test_snapshot_listing_ignores_other_files(tmp_path: Path) -> None:
    (tmp_path / "00000000000000000000.log").write_bytes(b"")
    (tmp_path / "00000000000000000005.snapshot.tmp").write_bytes(b"")
    (tmp_path / "5.snapshot").write_bytes(b"")
    snapshot_path(tmp_path, 7).write_bytes(b"")
    assert psm(tmp_path).snapshot_offsets() == [7]


def test_decode_entry_without_batch(tmp_path: Path) -> None:
    entry = ProducerStateEntry(5, 2, last_timestamp=77)
    (decoded,) = decode_snapshot(encode_snapshot([entry]))
    assert (decoded.producer_id, decoded.producer_epoch, decoded.last_timestamp) == (5, 2, 77)
    assert list(decoded.batches) == []
    assert decoded.last_seq == -1


def test_duplicate_producer_in_snapshot_is_corrupt() -> None:
    entry = ProducerStateEntry(5, 2, last_timestamp=77)
    with pytest.raises(CorruptSnapshotError, match="twice"):
        decode_snapshot(encode_snapshot([entry, entry]))


def test_truncate_fully_and_start_at(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, count=10))
    manager.take_snapshot()
    manager.truncate_fully_and_start_at(500)
    assert manager.snapshot_offsets() == []
    assert dict(manager.producers) == {}
    assert manager.map_end_offset == 500
    manager.update(batch(500, seq=77))  # a fresh start: any sequence
    assert manager.map_end_offset == 501


def test_delete_snapshots_below(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    for offset in range(3):
        manager.update(batch(offset, seq=offset))
        manager.take_snapshot(fsync=False)
    manager.delete_snapshots_below(2)
    assert manager.snapshot_offsets() == [2, 3]


def test_log_start_increment_drops_producers_and_snapshots_below(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, pid=1))
    manager.take_snapshot()
    manager.update(batch(1, pid=2, count=4))
    manager.take_snapshot()
    manager.on_log_start_offset_incremented(3)
    assert sorted(manager.producers) == [2]
    assert manager.snapshot_offsets() == [5]
    assert manager.map_end_offset == 5


def test_reload_drops_producers_below_log_start(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, pid=1))
    manager.update(batch(1, pid=2, count=4))
    manager.take_snapshot()
    manager.truncate_and_reload(3, 5, now_ms=1_000)
    assert sorted(manager.producers) == [2]


# -- expiry --------------------------------------------------------------------------------


def test_remove_expired(tmp_path: Path) -> None:
    manager = psm(tmp_path, expiration_ms=HOUR_MS)
    manager.update(batch(0, pid=1, ts=0))
    manager.update(batch(1, pid=2, ts=HOUR_MS))
    manager.remove_expired(now_ms=HOUR_MS - 1)
    assert sorted(manager.producers) == [1, 2]
    manager.remove_expired(now_ms=HOUR_MS)  # silent for exactly the limit: gone
    assert sorted(manager.producers) == [2]


def test_reload_drops_expired_producers(tmp_path: Path) -> None:
    manager = psm(tmp_path, expiration_ms=HOUR_MS)
    manager.update(batch(0, pid=1, ts=0))
    manager.update(batch(1, pid=2, ts=HOUR_MS))
    manager.take_snapshot()
    manager.truncate_and_reload(0, 2, now_ms=HOUR_MS + 5)
    assert sorted(manager.producers) == [2]
    assert manager.map_end_offset == 2


def test_expiration_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        ProducerStateManager(tmp_path, producer_id_expiration_ms=0)


def test_update_map_end_offset_names_the_next_snapshot(tmp_path: Path) -> None:
    manager = psm(tmp_path)
    manager.update(batch(0, seq=0))
    manager.update_map_end_offset(40)  # plain batches up to 40 were appended
    assert manager.take_snapshot().name == "00000000000000000040.snapshot"
    with pytest.raises(InvariantViolation):
        manager.update_map_end_offset(39)
