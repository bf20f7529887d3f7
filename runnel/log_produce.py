"""Appending lines of text to a partition log through the engine (``runnel log produce``).

Unlike dump and verify this goes through the real write path: ``storage.loader.load_log``
(which recovers the log first, cutting off any torn tail, since the tool cannot know whether
the last shutdown was clean), then ``Log.append_as_leader`` once per batch of lines, then
``Log.close`` for a clean shutdown (flush, producer-state snapshot, trimmed indexes).

Each input line becomes one record: no key, the line without its terminator (``\\n`` or
``\\r\\n``) as the value, the wall-clock time it was read as the timestamp. Input is read
and appended a batch at a time, so any amount of it fits in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from storage.batch import CompressionType
from storage.config import LogConfig
from storage.loader import load_log
from storage.log import AppendInfo, Log, wall_clock_ms
from storage.records import RecordInput, build_batch


@dataclass(frozen=True, slots=True)
class ProduceOptions:
    directory: Path
    codec_name: str  # a CompressionType name, any case
    batch_records: int
    leader_epoch: int | None = None  # None: the log's latest epoch, 0 for a new log
    segment_bytes: int | None = None  # None: the engine's default

    @property
    def codec(self) -> CompressionType:
        return CompressionType[self.codec_name.upper()]


@dataclass(frozen=True, slots=True)
class ProduceResult:
    records: int
    batches: int
    first_offset: int | None
    last_offset: int | None
    log_end_offset: int
    leader_epoch: int

    def describe(self, directory: Path) -> str:
        if self.first_offset is None:
            return (
                f"no input lines: nothing appended to {directory}; "
                f"log end offset {self.log_end_offset}"
            )
        return (
            f"produced {self.records} records in {self.batches} batches to {directory}: "
            f"offsets {self.first_offset}-{self.last_offset}, leader epoch "
            f"{self.leader_epoch}; log end offset {self.log_end_offset}"
        )


class EpochWentBack(ValueError):
    """The requested leader epoch is below one the log already holds."""


def log_config(options: ProduceOptions) -> LogConfig:
    """The engine's config for the tool; raises ValueError for bad settings."""
    if options.segment_bytes is None:
        return LogConfig()
    return LogConfig(segment_bytes=options.segment_bytes)


def describe_append(info: AppendInfo) -> str:
    return (
        f"appended offsets {info.first_offset}-{info.last_offset}: "
        f"{info.record_count} records, {info.size_bytes} bytes"
    )


def produce(
    lines: Iterable[bytes],
    options: ProduceOptions,
    *,
    report: Callable[[str], object] | None = None,
    clock: Callable[[], int] = wall_clock_ms,
) -> ProduceResult:
    """Append ``lines`` in batches, telling ``report`` about each, and close the log cleanly,
    also when an append fails."""
    log = load_log(options.directory, log_config(options), clock=clock)
    try:
        epoch = _leader_epoch(log, options.leader_epoch)
        return _append_all(log, lines, options, epoch, report, clock)
    finally:
        if log.offline:
            log.abandon()  # an I/O error already took it offline: nothing can be flushed
        else:
            log.close()


def _leader_epoch(log: Log, requested: int | None) -> int:
    latest = log.epoch_cache.latest_epoch
    if requested is None:
        return latest if latest is not None else 0
    if latest is not None and requested < latest:
        raise EpochWentBack(
            f"leader epoch {requested} is below the log's latest epoch {latest}; "
            f"leader epochs never go back"
        )
    return requested


def _append_all(
    log: Log,
    lines: Iterable[bytes],
    options: ProduceOptions,
    epoch: int,
    report: Callable[[str], object] | None,
    clock: Callable[[], int],
) -> ProduceResult:
    records = batches = 0
    first: int | None = None
    last: int | None = None
    for chunk in _record_chunks(lines, options.batch_records, clock):
        batch = build_batch(chunk, compression=options.codec)
        info = log.append_as_leader(batch, leader_epoch=epoch)
        if report is not None:
            report(describe_append(info))
        first = info.first_offset if first is None else first
        last = info.last_offset
        records += info.record_count
        batches += 1
    return ProduceResult(records, batches, first, last, log.log_end_offset, epoch)


def _record_chunks(
    lines: Iterable[bytes], size: int, clock: Callable[[], int]
) -> Iterator[list[RecordInput]]:
    chunk: list[RecordInput] = []
    for line in lines:
        chunk.append(RecordInput(None, _strip_terminator(line), clock()))
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _strip_terminator(line: bytes) -> bytes:
    if line.endswith(b"\n"):
        line = line[:-1]
        if line.endswith(b"\r"):
            line = line[:-1]
    return line
