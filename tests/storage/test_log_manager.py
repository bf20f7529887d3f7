"""LogManager on real data directories: checkpoints, the clean-shutdown marker, recovery,
offline directories; and group commit."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import pytest
from support import FakeClock, make_batch

from storage.checkpoint import OffsetCheckpointFile
from storage.config import LogConfig
from storage.dir_lock import DataDirInUseError
from storage.errors import LogDirOfflineError
from storage.group_commit import GroupCommit
from storage.log import Isolation
from storage.log_manager import (
    CLEAN_SHUTDOWN_FILE,
    LOG_START_CHECKPOINT,
    PRODUCER_EXPIRATION_CHECK_INTERVAL_MS,
    RECOVERY_POINT_CHECKPOINT,
    REPLICATION_CHECKPOINT,
    LogManager,
)
from storage.records import iter_decoded
from storage.topic_partition import TopicPartition

TP = TopicPartition("orders", 2)


def test_clean_shutdown_writes_checkpoints_and_the_marker(tmp_path: Path) -> None:
    manager = LogManager([tmp_path], LogConfig(segment_bytes=500), clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(TP)
    for i in range(10):
        log.append_as_leader(make_batch([b"%d" % i * 50]), leader_epoch=1)
    log.update_high_watermark(8)
    log.maybe_increment_log_start_offset(2)
    manager.shutdown()
    assert (tmp_path / CLEAN_SHUTDOWN_FILE).exists()
    assert (tmp_path / "orders-2" / "leader-epoch-checkpoint").read_text() == "0\n1\n1 2\n"
    assert OffsetCheckpointFile(tmp_path / REPLICATION_CHECKPOINT).read() == {TP: 8}
    assert OffsetCheckpointFile(tmp_path / LOG_START_CHECKPOINT).read() == {TP: 2}
    assert OffsetCheckpointFile(tmp_path / RECOVERY_POINT_CHECKPOINT).read() == {TP: 10}
    text = (tmp_path / REPLICATION_CHECKPOINT).read_text()
    assert text == "0\n1\norders 2 8\n"

    again = LogManager([tmp_path], LogConfig(segment_bytes=500), clock=FakeClock())
    again.startup()
    assert again.had_clean_shutdown[tmp_path]
    assert not (tmp_path / CLEAN_SHUTDOWN_FILE).exists()  # a crash from now on is detected
    reopened = again.get_log(TP)
    assert reopened is not None
    assert (reopened.log_start_offset, reopened.high_watermark, reopened.log_end_offset) == (
        2,
        8,
        10,
    )
    again.shutdown()


def test_unclean_restart_recovers_from_the_recovery_point(tmp_path: Path) -> None:
    manager = LogManager([tmp_path], LogConfig(segment_bytes=400), clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(TP)
    for i in range(20):
        log.append_as_leader(make_batch([b"v%02d" % i + b"-" * 40]), leader_epoch=0)
    log.flush(5)
    manager.checkpoint(tmp_path)
    last_segment = log.segments[-1].log_path
    log.abandon()  # crash: no marker, no final checkpoint
    manager.release_locks()  # as the process's death does
    with last_segment.open("ab") as f:
        f.write(b"\x00\x00\x00\x00garbage-from-a-torn-write")
    again = LogManager([tmp_path], LogConfig(segment_bytes=400), clock=FakeClock())
    again.startup()
    assert not again.had_clean_shutdown[tmp_path]
    reopened = again.get_log(TP)
    assert reopened is not None and reopened.log_end_offset == 20
    assert reopened.recovery_point == 20  # recovered segments were flushed
    data = reopened.read(0, 1 << 30, isolation=Isolation.LOG_END)
    assert data.slice is not None
    values = [r.value for b in iter_decoded(data.slice.read()) for r in b.records]
    assert values[0] == b"v00" + b"-" * 40
    again.shutdown()


def test_partitions_spread_over_data_dirs(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = LogManager(dirs, LogConfig())
    manager.startup()
    for p in range(4):
        manager.get_or_create_log(TopicPartition("t", p))
    assert len(list(dirs[0].glob("t-*"))) == 2
    assert len(list(dirs[1].glob("t-*"))) == 2
    manager.delete_log(TopicPartition("t", 0))
    assert manager.get_log(TopicPartition("t", 0)) is None
    assert len(list(tmp_path.glob("*/t-0"))) == 0
    manager.shutdown()


def test_an_io_error_takes_only_its_data_dir_offline(tmp_path: Path) -> None:
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = LogManager(dirs, LogConfig())
    manager.startup()
    broken = manager.get_or_create_log(TopicPartition("t", 0))
    healthy = manager.get_or_create_log(TopicPartition("t", 1))
    fd = broken.active_segment.handle.fd
    broken.active_segment.handle._finalizer.detach()
    os.close(fd)  # every write to this segment now fails with EBADF
    with pytest.raises(LogDirOfflineError):
        broken.append_as_leader(make_batch([b"x"]), leader_epoch=0)
    assert dirs[0] in manager.offline_dirs
    healthy.append_as_leader(make_batch([b"y"]), leader_epoch=0)
    assert healthy.log_end_offset == 1
    # New partitions go to the directory that still works.
    assert manager.get_or_create_log(TopicPartition("t", 2)).dir.parent == dirs[1]
    manager.shutdown()
    assert not (dirs[0] / CLEAN_SHUTDOWN_FILE).exists()
    assert (dirs[1] / CLEAN_SHUTDOWN_FILE).exists()


def test_a_log_deleted_while_maintenance_syncs_it_does_not_take_its_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The maintenance thread fsyncs a log the event loop deletes meanwhile: the fsync meets
    a closed file (EBADF). That is the deletion, not a failing disk."""
    manager = LogManager([tmp_path], LogConfig())
    manager.startup()
    log = manager.get_or_create_log(TopicPartition("t", 0))
    log.append_as_leader(make_batch([b"x"]), leader_epoch=0)
    segment = log.active_segment
    log.roll()  # maintenance fsyncs rolled segments
    real_flush = segment.flush
    synced: list[bool] = []

    def deleted_then_flushed() -> None:
        manager.delete_log(TopicPartition("t", 0))  # what the loop does, mid-sync
        synced.append(True)
        real_flush()  # the handle is closed now: OSError (EBADF)

    monkeypatch.setattr(segment, "flush", deleted_then_flushed)
    manager.run_maintenance()
    assert synced == [True]
    assert manager.offline_dirs == {}
    other = manager.get_or_create_log(TopicPartition("t", 1))
    other.append_as_leader(make_batch([b"y"]), leader_epoch=0)
    manager.shutdown()


def test_group_commit_covers_concurrent_appends_with_few_fsyncs(tmp_path: Path) -> None:
    manager = LogManager([tmp_path], LogConfig())
    manager.startup()
    log = manager.get_or_create_log(TP)
    commit = GroupCommit(log)

    async def producer(i: int) -> int:
        info = log.append_as_leader(make_batch([b"%d" % i]), leader_epoch=0)
        await commit.durable(info.last_offset + 1)
        assert log.recovery_point > info.last_offset
        return info.last_offset

    async def main() -> list[int]:
        return await asyncio.wait_for(asyncio.gather(*(producer(i) for i in range(50))), 30)

    offsets = asyncio.run(main())
    assert sorted(offsets) == list(range(50))
    assert log.recovery_point == 50
    assert 1 <= log.flush_count < 10  # 50 durable appends, a handful of fsyncs
    manager.shutdown()


def test_the_periodic_pass_flushes_after_flush_ms(tmp_path: Path) -> None:
    manager = LogManager([tmp_path], LogConfig(flush_ms=20))
    manager.startup()
    log = manager.get_or_create_log(TP)
    log.append_as_leader(make_batch([b"a", b"b"]), leader_epoch=0)
    assert log.recovery_point == 0

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(manager.run_periodically(10, stop))
        try:
            async with asyncio.timeout(10):
                while log.recovery_point < 2:
                    await asyncio.sleep(0.01)
        finally:
            stop.set()
            await asyncio.wait_for(task, 10)

    asyncio.run(main())
    assert log.recovery_point == 2
    assert log.flush_count >= 1
    manager.shutdown()


def test_maintenance_expires_producer_ids_every_check_interval(tmp_path: Path) -> None:
    """As Kafka's PeriodicProducerExpirationCheck: a running broker forgets producer ids
    silent for producer_id_expiration_ms, checking at most once per interval."""
    clock = FakeClock()
    hour_ms = 60 * 60 * 1000
    manager = LogManager([tmp_path], LogConfig(producer_id_expiration_ms=hour_ms), clock=clock)
    manager.startup()
    log = manager.get_or_create_log(TP)

    def produce(producer_id: int) -> None:
        batch = make_batch(
            [b"x"],
            timestamp_ms=clock.now_ms,
            producer_id=producer_id,
            producer_epoch=0,
            base_sequence=0,
        )
        log.append_as_leader(batch, leader_epoch=0)

    produce(1)
    manager.run_maintenance()  # the first pass starts the interval
    clock.advance(hour_ms - 1)
    produce(2)
    manager.run_maintenance()  # a check, one millisecond too early for producer 1
    assert set(log.producer_state.producers) == {1, 2}
    clock.advance(2)
    manager.run_maintenance()  # producer 1 has expired, but no check is due yet
    assert set(log.producer_state.producers) == {1, 2}
    clock.advance(PRODUCER_EXPIRATION_CHECK_INTERVAL_MS - 2)
    manager.run_maintenance()
    assert set(log.producer_state.producers) == {2}
    manager.shutdown()


def test_checkpoints_written_from_two_threads_at_once_keep_the_dir_online(
    tmp_path: Path,
) -> None:
    """The broker writes high-watermark checkpoints on its event loop while the maintenance
    thread writes them too; both go through the same temp file names."""
    manager = LogManager([tmp_path / "d0"], LogConfig(), clock=FakeClock())
    manager.startup()
    for p in range(20):
        manager.get_or_create_log(TopicPartition("t", p)).append_as_leader(make_batch([b"x"]), 0)
    data_dir = tmp_path / "d0"

    def write_many() -> None:
        for _ in range(50):
            manager.checkpoint(data_dir)

    threads = [threading.Thread(target=write_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert manager.offline_dirs == {}
    written = OffsetCheckpointFile(data_dir / "replication-offset-checkpoint").read()
    assert len(written) == 20
    manager.shutdown()


def test_a_slice_read_before_its_log_is_deleted_keeps_its_own_bytes(tmp_path: Path) -> None:
    """A fetch answer may still be sending a slice when its partition is deleted: the slice's
    descriptor must stay its file's. Closed at the deletion, the number would go to the next
    file opened, and the answer would carry that file's bytes."""
    manager = LogManager([tmp_path], LogConfig(), clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(TP)
    log.append_as_leader(make_batch([b"mine" * 100]), leader_epoch=1)
    data = log.read(0, 1 << 20, isolation=Isolation.LOG_END)
    assert data.slice is not None
    expected = data.slice.read()
    manager.delete_log(TP)
    other = tmp_path / "other"
    other.write_bytes(b"SECRET" * 1000)
    fd = os.open(other, os.O_RDONLY)  # takes the lowest free number
    try:
        assert data.slice.read() == expected
    finally:
        os.close(fd)
    number = data.slice.fd
    del data  # the last reference: now the descriptor closes
    with pytest.raises(OSError):
        os.fstat(number)
    manager.shutdown()


def test_closing_a_log_nobody_reads_closes_its_descriptors_at_once(tmp_path: Path) -> None:
    manager = LogManager([tmp_path], LogConfig(), clock=FakeClock())
    manager.startup()
    log = manager.get_or_create_log(TP)
    log.append_as_leader(make_batch([b"x"]), leader_epoch=1)
    numbers = [segment.handle.fd for segment in log.segments]
    manager.delete_log(TP)
    for number in numbers:
        with pytest.raises(OSError):
            os.fstat(number)
    manager.shutdown()


def test_a_maintenance_pass_ends_before_its_next_log_once_stopping(tmp_path: Path) -> None:
    """A stopping broker must not wait for a whole pass (compaction of every log): the pass
    checks ``stopping`` before each log."""
    clock = FakeClock()
    manager = LogManager([tmp_path], LogConfig(segment_bytes=200, retention_ms=1), clock=clock)
    manager.startup()
    logs = [manager.get_or_create_log(TopicPartition("orders", p)) for p in (0, 1)]
    for log in logs:
        for i in range(5):
            log.append_as_leader(make_batch([b"%d" % i * 100]), leader_epoch=1)
        log.update_high_watermark(log.log_end_offset)
    clock.advance(60_000)
    asked = []

    def stopping() -> bool:
        asked.append(True)
        return len(asked) > 1  # stop is asked for once the first log is done

    manager.run_maintenance(stopping=stopping)
    first, second = (log.log_start_offset for log in logs)
    assert first > 0, "the first log was not maintained"
    assert second == 0, "the pass went on to the next log after stop was asked"
    manager.shutdown()


def test_a_data_dir_is_one_manager_s_until_it_shuts_down(tmp_path: Path) -> None:
    """Two managers on one data directory would each append to the other's logs: the second
    start fails, loading and locking nothing (not even its other directories), and the
    first goes on. After the first shuts down, the directory can be used again."""
    first = LogManager([tmp_path / "shared"], LogConfig())
    first.startup()
    first.get_or_create_log(TP).append_as_leader(make_batch([b"kept"]), leader_epoch=0)
    second = LogManager([tmp_path / "own", tmp_path / "shared"], LogConfig())
    with pytest.raises(
        DataDirInUseError, match=rf"shared is in use by another process \(pid {os.getpid()}\)"
    ):
        second.startup()
    assert second.logs() == {} and not second.offline_dirs
    third = LogManager([tmp_path / "own"], LogConfig())
    third.startup()  # the failed start let go of the directory it had locked
    third.shutdown()
    first.shutdown()
    again = LogManager([tmp_path / "shared"], LogConfig())
    again.startup()
    reopened = again.get_log(TP)
    assert reopened is not None and reopened.log_end_offset == 1
    again.shutdown()
