"""Leader epoch cache semantics and its leader-epoch-checkpoint file, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from storage.epoch_cache import (
    UNDEFINED_EPOCH,
    UNDEFINED_OFFSET,
    EpochEntry,
    LeaderEpochCache,
)
from storage.errors import InconsistentLogError


def cache_with(tmp_path: Path, *pairs: tuple[int, int]) -> LeaderEpochCache:
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint", fsync=False)
    for epoch, start in pairs:
        assert cache.assign(epoch, start)
    return cache


def pairs(cache: LeaderEpochCache) -> list[tuple[int, int]]:
    return [(e.epoch, e.start_offset) for e in cache.entries()]


# -- loading and the file ------------------------------------------------------------------


def test_missing_file_is_an_empty_cache_and_is_not_created(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.entries() == []
    assert cache.latest_epoch is None
    assert cache.latest_entry is None
    assert cache.earliest_entry is None
    assert not cache.path.exists()


def test_file_text_is_byte_exact(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (0, 0), (3, 1200))
    assert cache.path.read_bytes() == b"0\n2\n0 0\n3 1200\n"
    cache.clear()
    assert cache.path.read_bytes() == b"0\n0\n"


def test_reopen_restores_entries(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (5, 30))
    cache.truncate_from_end(30)
    reopened = LeaderEpochCache(cache.path)
    assert reopened.entries() == [EpochEntry(1, 0), EpochEntry(2, 10)]
    assert reopened.latest_entry == EpochEntry(2, 10)
    assert reopened.earliest_entry == EpochEntry(1, 0)


def test_reads_kafka_written_file_and_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n3\n0 0\n1 0\n4 77\n")  # Kafka <= 2.0 could repeat a start offset
    assert pairs(LeaderEpochCache(path)) == [(0, 0), (1, 0), (4, 77)]
    path.write_bytes(b"")  # Kafka creates the file empty
    assert LeaderEpochCache(path).entries() == []


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ("1\n0\n", 1),  # version
        ("0\n2\n0 0\n", 2),  # count mismatch
        ("0\n1\n0\n", 3),
        ("0\n1\n0 x\n", 3),
        ("0\n1\n-1 0\n", 3),  # negative epoch
        ("0\n1\n0 -5\n", 3),  # negative offset
        ("0\n2\n3 10\n2 20\n", 4),  # epochs go backwards
        ("0\n2\n2 10\n2 20\n", 4),  # epoch repeated
        ("0\n2\n2 10\n3 5\n", 4),  # start offsets go backwards
    ],
)
def test_malformed_file_raises(tmp_path: Path, content: str, line: int) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text(content)
    with pytest.raises(InconsistentLogError, match=rf"{path}:{line}:"):
        LeaderEpochCache(path)


# -- assign --------------------------------------------------------------------------------


def test_assign_same_epoch_later_offset_is_a_noop_without_write(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (2, 10))
    cache.path.unlink()
    assert not cache.assign(2, 10)
    assert not cache.assign(2, 50)
    assert not cache.path.exists()
    assert pairs(cache) == [(2, 10)]


def test_assign_same_epoch_earlier_offset_moves_its_start(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.assign(2, 5)
    assert pairs(LeaderEpochCache(cache.path)) == [(1, 0), (2, 5)]


def test_assign_lower_epoch_drops_later_epochs(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (3, 10), (4, 20))
    assert cache.assign(2, 15)
    assert pairs(cache) == [(1, 0), (2, 15)]


def test_assign_new_epoch_below_previous_start_drops_conflicts(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    assert cache.assign(7, 10)
    assert pairs(cache) == [(1, 0), (7, 10)]


def test_assign_new_epoch_at_same_start_replaces_latest(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.assign(3, 10)
    assert pairs(cache) == [(1, 0), (3, 10)]


def test_assign_rejects_negative_arguments(tmp_path: Path) -> None:
    cache = cache_with(tmp_path)
    with pytest.raises(ValueError):
        cache.assign(-1, 0)
    with pytest.raises(ValueError):
        cache.assign(0, -1)
    assert cache.entries() == []


# -- queries -------------------------------------------------------------------------------


def test_end_offset_for_every_branch(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (2, 10), (4, 20), (6, 30))
    log_end = 45
    assert cache.end_offset_for(UNDEFINED_EPOCH, log_end) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for(6, log_end) == (6, 45)  # latest epoch: the log end
    assert cache.end_offset_for(7, log_end) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)  # no higher
    assert cache.end_offset_for(1, log_end) == (1, 10)  # older than all: no floor
    assert cache.end_offset_for(2, log_end) == (2, 20)  # known epoch
    assert cache.end_offset_for(3, log_end) == (2, 20)  # gap: floor epoch, next start
    assert cache.end_offset_for(5, log_end) == (4, 30)


def test_end_offset_for_empty_cache(tmp_path: Path) -> None:
    cache = cache_with(tmp_path)
    assert cache.end_offset_for(0, 10) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
    assert cache.end_offset_for(UNDEFINED_EPOCH, 10) == (UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def test_epoch_for_offset(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (2, 10), (4, 20))
    assert cache.epoch_for_offset(9) is None
    assert cache.epoch_for_offset(10) == 2
    assert cache.epoch_for_offset(19) == 2
    assert cache.epoch_for_offset(20) == 4
    assert cache.epoch_for_offset(1_000_000) == 4
    cache.clear()
    assert cache.epoch_for_offset(0) is None


def test_epoch_for_offset_with_repeated_start_prefers_earlier_epoch(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    path.write_text("0\n2\n1 5\n2 5\n")
    cache = LeaderEpochCache(path)
    assert cache.epoch_for_offset(5) == 1
    assert cache.epoch_for_offset(6) == 2


# -- truncation ----------------------------------------------------------------------------


def test_truncate_from_end(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    assert cache.truncate_from_end(10)
    assert pairs(LeaderEpochCache(cache.path)) == [(1, 0)]


def test_truncate_from_end_without_change_does_not_write(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    cache.path.unlink()
    assert not cache.truncate_from_end(11)
    assert not cache.truncate_from_end(-1)  # ignored, as in Kafka
    assert not cache.path.exists()
    assert pairs(cache) == [(1, 0), (2, 10)]


def test_truncate_from_end_to_zero_empties(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.truncate_from_end(0)
    assert LeaderEpochCache(cache.path).entries() == []


def test_truncate_from_start_moves_covering_entry_up(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    assert cache.truncate_from_start(15)
    assert pairs(LeaderEpochCache(cache.path)) == [(2, 15), (3, 20)]


def test_truncate_from_start_at_an_entry_start(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10), (3, 20))
    assert cache.truncate_from_start(10)
    assert pairs(cache) == [(2, 10), (3, 20)]
    cache.path.unlink()
    assert not cache.truncate_from_start(10)  # nothing left to change: no write
    assert not cache.path.exists()


def test_truncate_from_start_beyond_last_start_keeps_latest_epoch(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0), (2, 10))
    assert cache.truncate_from_start(99)
    assert pairs(cache) == [(2, 99)]


def test_truncate_from_start_below_first_entry_is_noop(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 5), (2, 10))
    assert not cache.truncate_from_start(3)
    assert pairs(cache) == [(1, 5), (2, 10)]


def test_clear(tmp_path: Path) -> None:
    cache = cache_with(tmp_path, (1, 0))
    assert cache.clear()
    assert not cache.clear()
    assert LeaderEpochCache(cache.path).entries() == []


# -- model check ---------------------------------------------------------------------------

_op = st.one_of(
    st.tuples(st.just("assign"), st.integers(0, 8), st.integers(0, 60)),
    st.tuples(st.just("end"), st.integers(-1, 60), st.just(0)),
    st.tuples(st.just("start"), st.integers(0, 60), st.just(0)),
)


def _model_apply(model: list[tuple[int, int]], op: tuple[str, int, int]) -> list[tuple[int, int]]:
    kind, a, b = op
    if kind == "assign":
        if model and model[-1][0] == a and b >= model[-1][1]:
            return model
        return [(e, s) for e, s in model if e < a and s < b] + [(a, b)]
    if kind == "end":
        return model if a < 0 else [(e, s) for e, s in model if s < a]
    below = [(e, s) for e, s in model if s <= a]
    return [(below[-1][0], a)] + [(e, s) for e, s in model if s > a] if below else model


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_op, max_size=25), probe=st.integers(-1, 9))
def test_matches_a_simple_model_and_survives_reopen(
    tmp_path_factory: pytest.TempPathFactory, ops: list[tuple[str, int, int]], probe: int
) -> None:
    path = tmp_path_factory.mktemp("epochs") / "leader-epoch-checkpoint"
    cache = LeaderEpochCache(path, fsync=False)
    model: list[tuple[int, int]] = []
    for op in ops:
        kind, a, b = op
        if kind == "assign":
            cache.assign(a, b)
        elif kind == "end":
            cache.truncate_from_end(a)
        else:
            cache.truncate_from_start(a)
        model = _model_apply(model, op)
        assert pairs(cache) == model
    if cache.entries() or path.exists():
        assert pairs(LeaderEpochCache(path)) == model
    assert cache.end_offset_for(probe, 1000) == _model_end_offset(model, probe, 1000)


def _model_end_offset(
    model: list[tuple[int, int]], requested: int, log_end: int
) -> tuple[int, int]:
    if requested == UNDEFINED_EPOCH:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    if model and model[-1][0] == requested:
        return requested, log_end
    higher = [(e, s) for e, s in model if e > requested]
    floor = [(e, s) for e, s in model if e <= requested]
    if not higher:
        return UNDEFINED_EPOCH, UNDEFINED_OFFSET
    return (floor[-1][0] if floor else requested), higher[0][1]
