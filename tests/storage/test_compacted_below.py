"""``Log.compacted_below``: where a replica may hold batches that compaction rewrote or
removed (its own cleaner's, or its leader's for a follower), raised before a rewritten
segment is swapped in, lowered by truncation, persisted by the LogManager in
``cleaner-offset-checkpoint`` (before the swap, so a crash mid-swap keeps it) and loaded
again. ``runnel replicas verify`` compares replicas only above the largest of them."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import pytest
from conftest import OpenLog, stored_batches
from support import FakeClock
from test_cleaner import CONFIG, append, commit_and_roll, fill, rows

import storage.cleaner as cleaner
from storage.checkpoint import OffsetCheckpointFile
from storage.cleaner import compact
from storage.errors import LogDirOfflineError
from storage.log import Log
from storage.log_manager import CLEANER_CHECKPOINT, LogManager
from storage.records import RecordInput, build_batch, iter_decoded
from storage.topic_partition import TopicPartition

NOW = 1_700_000_000_000
TP = TopicPartition("table", 0)


def test_a_pass_raises_it_to_its_clean_end_before_swapping(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    fill(log, 60, keys=5)
    commit_and_roll(log)
    fill(log, 6, keys=5)  # the active segment: never cleaned
    seen: list[tuple[int, bool, list[Path]]] = []
    old_segments = log.segments

    def on_compacted(changed: Log) -> None:
        assert changed is log
        still_old = all(s in log.segments for s in old_segments)
        seen.append((log.compacted_below, still_old, list(log.dir.glob("*.swap"))))

    log.on_compacted = on_compacted
    assert log.compacted_below == 0

    stats = compact(log, NOW)

    assert stats.clean_end_offset == 60 and log.compacted_below == 60
    # The owner heard of the first rewritten group before anything was swapped in, and of
    # each later one before its own swap (no swap file yet), with the value raised.
    assert seen and seen[0][1]
    assert all(not swaps for _, _, swaps in seen)
    raised = [value for value, _, _ in seen]
    assert raised == sorted(set(raised)) and 0 < raised[-1] <= 60


def test_a_segment_found_clean_raises_it_without_the_owner(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    fill(log, 40, keys=4)
    commit_and_roll(log)
    compact(log, NOW)
    compact(log, NOW)  # merges the small outputs: one rewritten segment below the active
    calls: list[int] = []
    log.on_compacted = lambda changed: calls.append(changed.compacted_below)
    log.compacted_below = 0  # as if no pass had been recorded

    stats = compact(log, NOW)

    assert stats.segments_cleaned == 0  # nothing rewritten
    assert log.compacted_below == stats.clean_end_offset == 40
    assert calls == []


def test_a_failed_persist_refuses_the_swap(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    written = fill(log, 40, keys=4)
    commit_and_roll(log)

    def failing_owner(changed: Log) -> None:
        changed.abandon()  # what the LogManager does when the checkpoint write fails

    log.on_compacted = failing_owner

    with pytest.raises(LogDirOfflineError):
        compact(log, NOW)

    assert not list(log.dir.glob("*.swap"))
    reopened = open_log(CONFIG, high_watermark=40)
    assert rows(reopened) == written  # nothing was swapped in


def test_truncation_lowers_it(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    fill(log, 60, keys=5)
    commit_and_roll(log)
    compact(log, NOW)
    assert log.compacted_below == 60
    fill(log, 10, keys=5)

    log.truncate_to(65)  # above it: unchanged
    assert log.compacted_below == 60
    log.truncate_to(50)  # an unclean leader change cut into the cleaned range
    assert log.compacted_below == log.log_end_offset <= 50
    log.truncate_fully_and_start_at(200)
    assert log.compacted_below == 0


def _leader_with_compacted_history(open_log: OpenLog, tmp_path: Path) -> Log:
    from storage.loader import load_log

    leader = load_log(tmp_path / "leader-0", CONFIG, clock=FakeClock())
    fill(leader, 60, keys=5)
    commit_and_roll(leader)
    compact(leader, NOW)
    compact(leader, NOW)
    fill(leader, 6, keys=5)  # uncompacted batches after the cleaned range
    return leader


def test_a_follower_copying_compacted_batches_raises_it(open_log: OpenLog, tmp_path: Path) -> None:
    leader = _leader_with_compacted_history(open_log, tmp_path)
    try:
        fetched = list(stored_batches(leader).values())
        follower = open_log(CONFIG)
        follower.append_as_follower(b"".join(fetched[:1]))  # the merged, rewritten segment's
        first_end = follower.log_end_offset
        assert follower.compacted_below == first_end > 0
        for batch in fetched[1:]:
            follower.append_as_follower(batch)
        # It ends after the last rewritten batch: from there on every batch holds one record
        # per offset with no gap, as appended, so it may lie below the leader's clean end.
        assert 0 < follower.compacted_below <= leader.compacted_below == 60
        expected = follower.compacted_below
        for batch in fetched:
            header = next(iter_decoded(batch)).header
            if header.base_offset >= follower.compacted_below:
                assert header.base_offset == expected
                assert header.record_count == header.last_offset_delta + 1
                expected = header.next_offset
        assert expected == leader.log_end_offset
        assert rows(follower) == rows(leader)
    finally:
        leader.abandon()


def test_a_follower_sees_a_gap_or_a_short_batch_as_compaction(open_log: OpenLog) -> None:
    follower = open_log(CONFIG)
    plain = build_batch([RecordInput(b"k", b"v", NOW)] * 3, base_offset=0)
    follower.append_as_follower(plain)  # 0-2, three records: as appended
    assert follower.compacted_below == 0
    gap = build_batch([RecordInput(b"k", b"v", NOW)] * 2, base_offset=10)
    follower.append_as_follower(gap)  # 10-11 after 3: batches 3-9 were removed
    assert follower.compacted_below == 12
    # A batch spanning offsets 12-16 that holds two records: some were removed.
    short = build_batch(
        [
            RecordInput(b"a", b"v", NOW, offset_delta=0),
            RecordInput(b"b", b"v", NOW, offset_delta=4),
        ],
        base_offset=12,
    )
    follower.append_as_follower(short)
    assert follower.compacted_below == 17
    follower.append_as_follower(build_batch([RecordInput(b"c", b"v", NOW)], base_offset=17))
    assert follower.compacted_below == 17


def _manager(tmp_path: Path, clock: FakeClock) -> LogManager:
    manager = LogManager([tmp_path], CONFIG, clock=clock)
    manager.startup()
    return manager


def test_the_log_manager_persists_it_before_the_swap_and_loads_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    manager = _manager(tmp_path, clock)
    log = manager.get_or_create_log(TP)
    fill(log, 60, keys=5)
    commit_and_roll(log)
    checkpoint = OffsetCheckpointFile(tmp_path / CLEANER_CHECKPOINT)
    on_disk_at_swap: list[dict[TopicPartition, int]] = []
    real_replace = Log.replace_segments

    def crash_at_the_swap(self: Log, *args: Any) -> Any:
        on_disk_at_swap.append(checkpoint.read())
        raise SystemExit("the process dies mid-swap")

    monkeypatch.setattr(Log, "replace_segments", crash_at_the_swap)
    with pytest.raises(SystemExit):
        manager.run_maintenance()
    monkeypatch.setattr(Log, "replace_segments", real_replace)

    assert on_disk_at_swap and on_disk_at_swap[0][TP] > 0
    raised = on_disk_at_swap[0][TP]
    # A crash: nothing closed, nothing else written; the loader completes the swap.
    for held in manager.logs().values():
        held.abandon()
    manager.release_locks()
    again = _manager(tmp_path, clock)
    reloaded = again.get_log(TP)
    assert reloaded is not None and reloaded.compacted_below == raised
    again.run_maintenance()
    assert reloaded.compacted_below == 60 == checkpoint.read()[TP]
    again.shutdown()
    last = _manager(tmp_path, clock)
    loaded = last.get_log(TP)
    assert loaded is not None and loaded.compacted_below == 60
    last.shutdown()


def test_after_a_restart_the_dirty_ratio_goes_by_the_checkpoint(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = _manager(tmp_path, clock)
    log = manager.get_or_create_log(TP)
    fill(log, 60, keys=5)
    commit_and_roll(log)
    manager.run_maintenance()
    manager.run_maintenance()  # merges the outputs
    fill(log, 2, keys=5)  # a little dirt: far below min_cleanable_dirty_ratio 0.5
    commit_and_roll(log)
    manager.shutdown()
    manager = _manager(tmp_path, clock)
    log = manager.get_log(TP)  # type: ignore[assignment]
    before = rows(log)
    passes: list[Any] = []
    real = cleaner._clean_group

    def counting(*args: Any) -> Any:
        passes.append(args)
        return real(*args)

    try:
        cleaner._clean_group = counting  # type: ignore[assignment]
        manager.run_maintenance()
    finally:
        cleaner._clean_group = real  # type: ignore[assignment]
    assert passes == []  # without the checkpoint the whole log would count as dirty
    assert rows(log) == before
    manager.shutdown()


def test_a_failed_checkpoint_write_takes_the_directory_offline_and_swaps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    manager = _manager(tmp_path, clock)
    log = manager.get_or_create_log(TP)
    written = fill(log, 40, keys=4)
    commit_and_roll(log)
    real_write = OffsetCheckpointFile.write

    def failing(self: OffsetCheckpointFile, offsets: Any) -> None:
        if self.path.name == CLEANER_CHECKPOINT and any(offsets.values()):
            raise OSError(errno.EIO, "disk failed")
        real_write(self, offsets)

    monkeypatch.setattr(OffsetCheckpointFile, "write", failing)
    manager.run_maintenance()

    assert tmp_path in manager.offline_dirs
    assert not list(log.dir.glob("*.swap"))
    monkeypatch.setattr(OffsetCheckpointFile, "write", real_write)
    manager.release_locks()
    again = _manager(tmp_path, clock)
    reloaded = again.get_log(TP)
    assert reloaded is not None and rows(reloaded) == written
    again.shutdown()


def test_a_loaded_value_above_the_log_end_is_cut_to_it(tmp_path: Path) -> None:
    clock = FakeClock()
    manager = _manager(tmp_path, clock)
    log = manager.get_or_create_log(TP)
    append(log, [(b"k", b"v")])
    manager.shutdown()
    OffsetCheckpointFile(tmp_path / CLEANER_CHECKPOINT).write({TP: 500})
    again = _manager(tmp_path, clock)
    loaded = again.get_log(TP)
    assert loaded is not None and loaded.compacted_below == loaded.log_end_offset == 1
    again.shutdown()
