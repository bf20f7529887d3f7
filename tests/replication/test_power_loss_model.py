"""The simulation's power-loss model (replication/testing/power_loss.py) on real logs: after
any loss it draws, recovery opens the log with every flushed offset, holds nothing but a
prefix of what was written, and the model really does lose data in each of its ways."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

from support import FakeClock

from replication.testing.power_loss import lose_page_cache
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Isolation, Log
from storage.records import RecordInput, build_batch, decode_batch

CONFIG = LogConfig(segment_bytes=700, index_interval_bytes=64, retention_ms=None)
SEEDS = range(60)


def _value(offset: int) -> bytes:
    return b"value-%d-" % offset + bytes([97 + offset % 26]) * (offset % 17)


def _append(log: Log, batches: int) -> None:
    for _ in range(batches):
        base = log.log_end_offset
        records = [RecordInput(None, _value(base + i), 1_700_000_000_000) for i in range(2)]
        log.append_as_leader(build_batch(records), leader_epoch=0)


def _offsets_and_values(log: Log) -> list[tuple[int, bytes | None]]:
    out: list[tuple[int, bytes | None]] = []
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        fetched = log.read(offset, 1 << 20, isolation=Isolation.LOG_END)
        assert fetched.slice is not None
        data, position = fetched.slice.read(), 0
        while position < len(data):
            batch = decode_batch(data, position)
            out += [(r.offset, r.value) for r in batch.records]
            position += batch.header.size_bytes
        offset = out[-1][0] + 1
    return out


def _written_log(directory: Path, flushed_batches: int, more_batches: int) -> tuple[int, int]:
    """A log of 2-record batches, flushed after ``flushed_batches`` (as the maintenance pass
    does: rolled segments), then more, then a crash; returns (recovery point, LEO)."""
    log = load_log(directory, CONFIG, clock=FakeClock())
    _append(log, flushed_batches)
    log.flush(log.active_segment.base_offset)
    _append(log, more_batches)
    recovery_point, end = log.recovery_point, log.log_end_offset
    log.abandon()
    return recovery_point, end


def test_every_drawn_power_loss_keeps_the_flushed_prefix_and_only_written_data(
    tmp_path: Path,
) -> None:
    """Only the newest segment's file can vanish (every roll syncs the directory before it
    makes a newer file); the older ones lose unflushed bytes at most, and recovery ends the
    log at the first gap that leaves (``storage.loader._lost_unflushed_tail``)."""
    template = tmp_path / "template" / "topic-0"
    recovery_point, end = _written_log(template, 40, 25)
    assert 0 < recovery_point < end and len(list(template.glob("*.log"))) >= 6
    shortest, kinds = end, set()
    for seed in SEEDS:
        directory = tmp_path / f"seed-{seed}" / "topic-0"
        shutil.copytree(template, directory)
        bases_before = sorted(int(p.name[:20]) for p in directory.glob("*.log"))
        changes = lose_page_cache(directory, recovery_point, random.Random(seed))
        kinds |= {
            "gone" if c.endswith("gone") else "zeros" if "zeros" in c else "cut" for c in changes
        }
        gone = [int(c.split(":")[0]) for c in changes if c.endswith("gone")]
        assert gone in ([], bases_before[-1:]), f"seed {seed}: {changes}"
        log = load_log(
            directory,
            CONFIG,
            recovery_point=recovery_point,
            high_watermark=end,
            had_clean_shutdown=False,
            clock=FakeClock(),
        )
        try:
            records = _offsets_and_values(log)
            context = f"seed {seed}: {changes}"
            assert log.log_end_offset >= recovery_point, context
            assert records == [(o, _value(o)) for o in range(log.log_end_offset)], context
            assert log.high_watermark == min(end, log.log_end_offset), context
            shortest = min(shortest, log.log_end_offset)
        finally:
            log.abandon()
        shutil.rmtree(directory.parent)
    assert shortest == recovery_point or shortest < end - 10, "the model hardly lost anything"
    assert kinds == {"gone", "cut", "zeros"}, f"the model never drew some losses: {kinds}"


def test_a_log_never_flushed_may_lose_its_newest_file_and_still_opens(tmp_path: Path) -> None:
    """With one segment that is every file; with more, the older ones stay (their names were
    synced by the rolls) with whatever bytes reached the disk."""
    for batches in (3, 20):
        template = tmp_path / f"template-{batches}" / "topic-0"
        log = load_log(template, CONFIG, clock=FakeClock())
        _append(log, batches)
        end, segments = log.log_end_offset, len(log.segments)
        assert (segments == 1) == (batches == 3), segments
        log.abandon()
        vanished = 0
        for seed in SEEDS:
            directory = tmp_path / f"seed-{seed}" / "topic-0"
            shutil.copytree(template, directory)
            lose_page_cache(directory, 0, random.Random(seed))
            left = len(list(directory.glob("*.log")))
            vanished += left < segments
            assert left >= segments - 1
            reopened = load_log(directory, CONFIG, high_watermark=end, clock=FakeClock())
            try:
                records = _offsets_and_values(reopened)
                assert records == [(o, _value(o)) for o in range(reopened.log_end_offset)]
            finally:
                reopened.abandon()
            shutil.rmtree(directory.parent)
        assert vanished, f"no drawn loss took the newest of {segments} segment files"
