"""A segment finds its recent batches without reading the file (``LogSegment._tail``,
storage/segment.py): the answers are those of the offset-index scan it replaces, for every
offset (gaps between batches included), after the tail was trimmed, after a truncation and
from a start position; and an offset among the recent batches costs no ``pread``.

The reference is the same log loaded again from its files: a segment opened after a clean
shutdown remembers no recent batches, so it answers from its index and headers.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import OpenLog
from support import make_batch

from storage import segment as segment_module
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import Log
from storage.segment import TAIL_BATCHES, LogSegment

CONFIG = LogConfig(segment_bytes=64 << 20)  # one segment for everything here


def append_gapped(log: Log, count: int, rng: random.Random) -> None:
    """``count`` batches of 1-4 records as a follower appends them, each after a gap of 0-3
    offsets (a compacted leader's batches have such gaps)."""
    offset = log.log_end_offset
    for _ in range(count):
        offset += rng.randrange(4)
        values = [b"v" * rng.randrange(1, 300) for _ in range(rng.randrange(1, 5))]
        log.append_as_follower(make_batch(values, base_offset=offset, partition_leader_epoch=0))
        offset += len(values)


def every_answer(segment: LogSegment, end: int) -> list[tuple[int, int] | None]:
    return [segment.translate_offset(offset) for offset in range(end + 2)]


def reference(tmp_path: Path, log: Log) -> list[tuple[int, int] | None]:
    """The answers of the same files opened afresh (no tail), for every offset."""
    end = log.log_end_offset
    log.close()
    again = load_log(tmp_path / "topic-0", CONFIG, had_clean_shutdown=True, recovery_point=end)
    try:
        assert not again.active_segment._tail, "a cleanly loaded segment remembered batches"
        return every_answer(again.active_segment, end)
    finally:
        again.close()


@pytest.fixture
def preads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Counts the segment module's ``os.pread`` calls."""
    calls: list[int] = []
    real = os.pread

    def counting(fd: int, length: int, offset: int) -> bytes:
        calls.append(offset)
        return real(fd, length, offset)

    monkeypatch.setattr(segment_module.os, "pread", counting)
    yield calls


@pytest.mark.parametrize("seed", range(3))
def test_answers_match_the_index_scan_once_the_tail_was_trimmed(
    open_log: OpenLog, tmp_path: Path, seed: int
) -> None:
    log = open_log(CONFIG)
    append_gapped(log, 3 * TAIL_BATCHES + 7, random.Random(seed))
    tail = log.active_segment._tail
    assert TAIL_BATCHES <= len(tail) < 2 * TAIL_BATCHES, len(tail)
    assert tail[0][3] > 0, "the tail was never trimmed: the test would not cover it"
    live = every_answer(log.active_segment, log.log_end_offset)
    assert live == reference(tmp_path, log)


def test_an_offset_among_the_recent_batches_costs_no_read(
    open_log: OpenLog, preads: list[int]
) -> None:
    log = open_log(CONFIG)
    append_gapped(log, 2 * TAIL_BATCHES + 10, random.Random(7))
    segment = log.active_segment
    recent, older = segment._tail[-1], segment._tail[0]
    preads.clear()
    assert segment.translate_offset(recent[3]) == (recent[1], recent[2])
    assert segment.translate_offset(log.log_end_offset) is None  # after the last batch
    assert preads == []
    assert older[3] > 0, "the tail was never trimmed: the test would not cover it"
    found = segment.translate_offset(0)  # before the recent batches: index and headers
    assert preads, "an offset before the recent batches was answered without a read"
    assert found is not None and found[0] == 0


def test_a_truncation_forgets_the_removed_batches(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(CONFIG)
    rng = random.Random(11)
    append_gapped(log, TAIL_BATCHES, rng)
    middle = log.active_segment._tail[TAIL_BATCHES // 2]
    log.truncate_to(middle[3])
    assert log.active_segment.translate_offset(middle[3]) is None
    append_gapped(log, TAIL_BATCHES // 4, rng)  # new batches where the removed ones were
    live = every_answer(log.active_segment, log.log_end_offset)
    assert live == reference(tmp_path, log)


def test_a_start_position_past_the_recent_batch_is_honoured(open_log: OpenLog) -> None:
    log = open_log(CONFIG)
    append_gapped(log, 8, random.Random(3))
    segment = log.active_segment
    first, second = segment._tail[0], segment._tail[1]
    assert segment.translate_offset(first[3], start_position=second[1]) == (second[1], second[2])


def test_recovery_notes_the_batches_it_keeps(open_log: OpenLog, tmp_path: Path) -> None:
    log = open_log(CONFIG)
    append_gapped(log, TAIL_BATCHES + 5, random.Random(5))
    end = log.log_end_offset
    log.abandon()  # no clean shutdown: the active segment is recovered at load
    again = open_log(CONFIG)
    assert again.active_segment._tail, "recovery noted no batch"
    assert every_answer(again.active_segment, end) == reference(tmp_path, again)
