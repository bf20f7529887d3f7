"""Atomic small-file writes and Kafka's plain-text checkpoint files.

Kafka keeps several tiny text files next to its logs. They share one layout (UTF-8, ``\\n``
line ends)::

    0                  <- format version, always 0 for the files handled here
    2                  <- number of entry lines that follow
    <entry line>
    <entry line>

Per-directory offset checkpoints (``recovery-point-offset-checkpoint``,
``replication-offset-checkpoint``, ``log-start-offset-checkpoint``) hold one
``<topic> <partition> <offset>`` line per partition; that is :class:`OffsetCheckpointFile`.
The per-partition ``leader-epoch-checkpoint`` holds ``<epoch> <start offset>`` lines and is
owned by ``epoch_cache.py``, which reuses :func:`read_checkpoint` and :func:`format_checkpoint`.

Writes go through :func:`write_file_atomic` (``<name>.tmp``, fsync, rename, fsync the
directory), so a reader sees either the old or the new file, never a torn one. An empty file
reads as no entries: Kafka creates its checkpoint files empty before first writing them.
Anything else that does not parse is an :class:`InconsistentLogError` naming the file and line.

Not thread-safe: each file has one owner (the log manager for the per-directory files, the
partition's log for its leader-epoch file) that serialises reads and writes.
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from storage.errors import InconsistentLogError
from storage.topic_partition import TopicPartition, is_legal_topic_name

T = TypeVar("T")

OFFSET_CHECKPOINT_VERSION = 0
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1

# Strict on purpose: Python's int() also accepts "+5", " 5" and "5_0", which Kafka would not.
_DECIMAL = re.compile(r"-?[0-9]+")


def fsync_path(path: Path) -> None:
    """fsync a file, or a directory (which makes a rename or unlink inside it durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_file_atomic(path: Path, data: bytes, *, fsync: bool = True) -> None:
    """Replace ``path`` with ``data`` so that a crash leaves the old or the new content.

    With ``fsync=False`` the rename is still atomic against concurrent readers, but the new
    content may be lost (the old one comes back) if the machine crashes soon after.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            if fsync:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    if fsync:
        fsync_path(path.parent)


def parse_int(token: str, *, minimum: int, maximum: int) -> int:
    """Parse a plain decimal integer in [minimum, maximum]; raises ValueError otherwise."""
    if not _DECIMAL.fullmatch(token):
        raise ValueError(f"{token!r} is not a decimal integer")
    value = int(token)
    if not minimum <= value <= maximum:
        raise ValueError(f"{value} is outside [{minimum}, {maximum}]")
    return value


def format_checkpoint(version: int, lines: Iterable[str]) -> bytes:
    """Render the version line, the count line and the entry lines."""
    body = list(lines)
    return "".join(f"{line}\n" for line in [str(version), str(len(body)), *body]).encode()


def read_checkpoint(path: Path, version: int, parse_line: Callable[[str], T]) -> list[T] | None:
    """Read a checkpoint file; None if it does not exist, [] if it is empty.

    ``parse_line`` turns one entry line into a value and raises ValueError if it cannot.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    return parse_checkpoint(path, data, version, parse_line)


def parse_checkpoint(
    path: Path, data: bytes, version: int, parse_line: Callable[[str], T]
) -> list[T]:
    """Parse checkpoint bytes; ``path`` only names the file in error messages."""
    if not data:
        return []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InconsistentLogError(f"{path}: not UTF-8 text: {e}") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final newline; a missing one is tolerated, as Kafka's reader does
    if len(lines) < 2:
        raise InconsistentLogError(f"{path}:{len(lines) + 1}: missing the entry count line")
    found_version = _parse_header_line(path, 1, lines[0])
    if found_version != version:
        raise InconsistentLogError(f"{path}:1: version {found_version}, expected {version}")
    count = _parse_header_line(path, 2, lines[1])
    entries = [_parse_entry(path, n, line, parse_line) for n, line in enumerate(lines[2:], 3)]
    if len(entries) != count:
        raise InconsistentLogError(f"{path}:2: declares {count} entries, file has {len(entries)}")
    return entries


def _parse_header_line(path: Path, line_no: int, line: str) -> int:
    try:
        return parse_int(line, minimum=0, maximum=INT32_MAX)
    except ValueError as e:
        raise InconsistentLogError(f"{path}:{line_no}: malformed line {line!r}: {e}") from None


def _parse_entry(path: Path, line_no: int, line: str, parse_line: Callable[[str], T]) -> T:
    try:
        return parse_line(line)
    except ValueError as e:
        raise InconsistentLogError(f"{path}:{line_no}: malformed line {line!r}: {e}") from None


def split_fields(line: str, count: int) -> list[str]:
    """Split an entry line on single spaces into exactly ``count`` fields."""
    fields = line.split(" ")
    if len(fields) != count or not all(fields):
        raise ValueError(f"expected {count} space-separated fields")
    return fields


class OffsetCheckpointFile:
    """One per-directory ``<topic> <partition> <offset>`` checkpoint file.

    Used for ``recovery-point-offset-checkpoint``, ``replication-offset-checkpoint`` and
    ``log-start-offset-checkpoint``. Offsets must be >= 0. Lines are written sorted by topic and
    partition so the bytes are deterministic; readers do not depend on the order.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync

    def write(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Atomically replace the file with ``offsets``; raises ValueError on a bad entry."""
        for tp, offset in offsets.items():
            _check_offset_entry(tp, offset)
        lines = [f"{tp.topic} {tp.partition} {offsets[tp]}" for tp in sorted(offsets)]
        write_file_atomic(
            self.path, format_checkpoint(OFFSET_CHECKPOINT_VERSION, lines), fsync=self._fsync
        )

    def read(self) -> dict[TopicPartition, int]:
        """Return the stored offsets; {} if the file is missing or empty."""
        entries = read_checkpoint(self.path, OFFSET_CHECKPOINT_VERSION, _parse_offset_line)
        result: dict[TopicPartition, int] = {}
        for n, (tp, offset) in enumerate(entries or [], 3):
            if tp in result:
                raise InconsistentLogError(f"{self.path}:{n}: {tp} appears twice")
            result[tp] = offset
        return result


def _check_offset_entry(tp: TopicPartition, offset: int) -> None:
    if not is_legal_topic_name(tp.topic):
        raise ValueError(f"illegal topic name {tp.topic!r}")
    if not 0 <= tp.partition <= INT32_MAX:
        raise ValueError(f"partition {tp.partition} of {tp.topic!r} out of range")
    if not 0 <= offset <= INT64_MAX:
        raise ValueError(f"offset {offset} for {tp} out of range")


def _parse_offset_line(line: str) -> tuple[TopicPartition, int]:
    topic, partition, offset = split_fields(line, 3)
    if not is_legal_topic_name(topic):
        raise ValueError(f"illegal topic name {topic!r}")
    tp = TopicPartition(topic, parse_int(partition, minimum=0, maximum=INT32_MAX))
    return tp, parse_int(offset, minimum=0, maximum=INT64_MAX)
