"""Offset checkpoint files and atomic writes, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.checkpoint import OffsetCheckpointFile, write_file_atomic
from storage.errors import InconsistentLogError
from storage.topic_partition import TopicPartition


def test_round_trip_and_exact_bytes(tmp_path: Path) -> None:
    path = tmp_path / "recovery-point-offset-checkpoint"
    offsets = {
        TopicPartition("orders", 1): 42,
        TopicPartition("events", 0): 0,
        TopicPartition("orders", 0): 9_000_000_000,
    }
    OffsetCheckpointFile(path).write(offsets)
    assert path.read_text() == "0\n3\nevents 0 0\norders 0 9000000000\norders 1 42\n"
    assert OffsetCheckpointFile(path).read() == offsets


def test_empty_mapping_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "log-start-offset-checkpoint"
    OffsetCheckpointFile(path).write({})
    assert path.read_text() == "0\n0\n"
    assert OffsetCheckpointFile(path).read() == {}


def test_missing_and_empty_files_read_as_empty(tmp_path: Path) -> None:
    assert OffsetCheckpointFile(tmp_path / "absent").read() == {}
    empty = tmp_path / "empty"
    empty.write_bytes(b"")  # Kafka creates checkpoint files empty before their first write
    assert OffsetCheckpointFile(empty).read() == {}


def test_rewrite_replaces_content_and_leaves_no_tmp(tmp_path: Path) -> None:
    path = tmp_path / "replication-offset-checkpoint"
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write({TopicPartition("a", 0): 1})
    checkpoint.write({TopicPartition("b", 2): 7})
    assert checkpoint.read() == {TopicPartition("b", 2): 7}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replication-offset-checkpoint"]


def test_missing_final_newline_is_tolerated(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_text("0\n1\nt 0 5")
    assert OffsetCheckpointFile(path).read() == {TopicPartition("t", 0): 5}


@pytest.mark.parametrize(
    ("content", "line"),
    [
        ("1\n1\nt 0 5\n", 1),  # unknown version
        ("x\n1\nt 0 5\n", 1),
        ("0\n", 2),  # no count line
        ("0\n2\nt 0 5\n", 2),  # fewer entries than declared
        ("0\n0\nt 0 5\n", 2),  # more entries than declared
        ("0\n1\nt 0\n", 3),  # too few fields
        ("0\n1\nt 0 5 6\n", 3),  # too many fields
        ("0\n1\nt  0 5\n", 3),  # double space
        ("0\n1\nt 0 abc\n", 3),
        ("0\n1\nt 0 +5\n", 3),  # int() would take it, Kafka would not
        ("0\n1\nt 0 5_0\n", 3),
        ("0\n1\nt 0 -1\n", 3),  # negative offset
        ("0\n1\nt -1 5\n", 3),  # negative partition
        ("0\n1\nt 0 99999999999999999999\n", 3),  # beyond int64
        ("0\n1\nbad/topic 0 5\n", 3),
        ("0\n2\nt 0 5\n\n", 4),  # blank line
        ("0\n2\nt 0 5\nt 0 6\n", 4),  # same partition twice
    ],
)
def test_malformed_files_raise_naming_file_and_line(
    tmp_path: Path, content: str, line: int
) -> None:
    path = tmp_path / "cp"
    path.write_text(content)
    with pytest.raises(InconsistentLogError, match=rf"{path}:{line}:"):
        OffsetCheckpointFile(path).read()


def test_non_utf8_raises(tmp_path: Path) -> None:
    path = tmp_path / "cp"
    path.write_bytes(b"0\n1\n\xff 0 5\n")
    with pytest.raises(InconsistentLogError, match="UTF-8"):
        OffsetCheckpointFile(path).read()


@pytest.mark.parametrize(
    "offsets",
    [
        {TopicPartition("t", 0): -1},
        {TopicPartition("t", -1): 0},
        {TopicPartition("bad topic", 0): 0},
        {TopicPartition("t", 0): 2**63},
    ],
)
def test_write_rejects_bad_entries_and_keeps_old_file(
    tmp_path: Path, offsets: dict[TopicPartition, int]
) -> None:
    path = tmp_path / "cp"
    checkpoint = OffsetCheckpointFile(path)
    checkpoint.write({TopicPartition("t", 0): 3})
    with pytest.raises(ValueError):
        checkpoint.write(offsets)
    assert checkpoint.read() == {TopicPartition("t", 0): 3}


def test_write_file_atomic_creates_and_replaces(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_file_atomic(path, b"one")
    write_file_atomic(path, b"two", fsync=False)
    assert path.read_bytes() == b"two"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_write_file_atomic_failure_keeps_old_content_and_removes_tmp(tmp_path: Path) -> None:
    path = tmp_path / "f"
    write_file_atomic(path, b"old")
    with pytest.raises(TypeError):
        write_file_atomic(path, "not bytes")  # type: ignore[arg-type]
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]


def test_write_file_atomic_overwrites_stale_tmp(tmp_path: Path) -> None:
    path = tmp_path / "f"
    (tmp_path / "f.tmp").write_bytes(b"left over from a crash, longer than the new data")
    write_file_atomic(path, b"new")
    assert path.read_bytes() == b"new"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
