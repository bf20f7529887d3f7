"""The leader epoch cache: which leader epoch wrote which range of a partition's offsets.

Each entry says "epoch E started writing at offset S"; epoch E's range runs up to the next
entry's start (or the log end for the latest epoch). Followers use it to find where their log
diverged from the leader's (``end_offset_for``, the OffsetsForLeaderEpoch / DivergingEpoch
answer) and truncate there instead of at a possibly stale high watermark (KIP-101, KIP-279).

On disk it is the partition's ``leader-epoch-checkpoint`` file, Kafka's text checkpoint layout
(see ``checkpoint.py``) with version 0 and one ``<epoch> <start offset>`` line per entry,
ascending::

    0
    2
    0 0
    3 1200

Invariants, checked on load and kept by every mutation: epochs strictly increase and start
offsets never decrease (Kafka <= 2.0 could write two epochs at one start offset; ``assign``
never does). Every change is persisted atomically before the method returns; with
``fsync=False`` it survives a process crash but maybe not a machine crash, which is safe
because recovery re-derives the tail of the cache from the batches' epochs.

Not thread-safe: owned by the partition's log, which calls it under its single-writer lock.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass
from pathlib import Path

from storage.checkpoint import (
    INT32_MAX,
    INT64_MAX,
    format_checkpoint,
    parse_int,
    read_checkpoint,
    split_fields,
    write_file_atomic,
)
from storage.errors import InconsistentLogError, invariant

LEADER_EPOCH_CHECKPOINT_FILE = "leader-epoch-checkpoint"
LEADER_EPOCH_CHECKPOINT_VERSION = 0
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


@dataclass(frozen=True, slots=True)
class EpochEntry:
    """Leader ``epoch`` wrote its first batch at ``start_offset``."""

    epoch: int
    start_offset: int


class LeaderEpochCache:
    """The (epoch -> start offset) map of one partition, backed by its checkpoint file."""

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        """Load ``path`` (missing or empty file: empty cache); raises InconsistentLogError."""
        self.path = path
        self._fsync = fsync
        self._entries: list[EpochEntry] = []
        loaded = read_checkpoint(path, LEADER_EPOCH_CHECKPOINT_VERSION, _parse_epoch_line)
        for line_no, entry in enumerate(loaded or [], 3):
            if self._entries and not _follows(self._entries[-1], entry):
                raise InconsistentLogError(
                    f"{path}:{line_no}: entry {entry} does not follow {self._entries[-1]}"
                )
            self._entries.append(entry)

    # -- queries ---------------------------------------------------------------------------

    def entries(self) -> list[EpochEntry]:
        """A copy of all entries, oldest first."""
        return list(self._entries)

    @property
    def latest_entry(self) -> EpochEntry | None:
        return self._entries[-1] if self._entries else None

    @property
    def earliest_entry(self) -> EpochEntry | None:
        return self._entries[0] if self._entries else None

    @property
    def latest_epoch(self) -> int | None:
        return self._entries[-1].epoch if self._entries else None

    def epoch_for_offset(self, offset: int) -> int | None:
        """The epoch whose range contains ``offset``; None if it precedes the first entry.

        Offsets past the latest entry's start belong to the latest epoch. Where two epochs
        share a start offset (old files only) the earlier epoch wins, as in Kafka.
        """
        starts = [e.start_offset for e in self._entries]
        exact = bisect.bisect_left(starts, offset)
        if exact < len(starts) and starts[exact] == offset:
            return self._entries[exact].epoch
        return self._entries[exact - 1].epoch if exact > 0 else None

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Answer OffsetsForLeaderEpoch: (largest known epoch <= requested, its end offset).

        The end offset is the start of the first epoch above ``requested_epoch``, or the log
        end for the latest epoch. (-1, -1) when the epoch is undefined or above all known
        ones; (requested_epoch, first start above) when it is older than every entry, since
        that data is gone and the follower should start from what the leader still has.
        """
        if requested_epoch == UNDEFINED_EPOCH:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self.latest_epoch:
            return requested_epoch, log_end_offset
        epochs = [e.epoch for e in self._entries]
        higher_idx = bisect.bisect_right(epochs, requested_epoch)
        if higher_idx == len(epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        higher = self._entries[higher_idx]
        if higher_idx == 0:
            return requested_epoch, higher.start_offset
        return self._entries[higher_idx - 1].epoch, higher.start_offset

    # -- mutations -------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset``; returns whether the cache changed.

        Called for every appended batch, so the common case (same epoch as the latest, at or
        after its start) is a cheap no-op. Otherwise entries that conflict with the new one
        (epoch >= ``epoch`` or start >= ``start_offset``) are dropped from the end first, so a
        leader that re-assigns an epoch lower in the log wins over stale history.
        """
        if epoch < 0 or start_offset < 0:
            raise ValueError(f"invalid leader epoch entry: epoch {epoch}, offset {start_offset}")
        latest = self.latest_entry
        if latest is not None and latest.epoch == epoch and start_offset >= latest.start_offset:
            return False
        while self._entries and (
            self._entries[-1].epoch >= epoch or self._entries[-1].start_offset >= start_offset
        ):
            self._entries.pop()
        self._entries.append(EpochEntry(epoch, start_offset))
        self.flush()
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries starting at or after ``end_offset`` (log truncated to it).

        A negative ``end_offset`` is ignored, as in Kafka. Returns whether anything changed.
        """
        if end_offset < 0:
            return False
        keep = bisect.bisect_left([e.start_offset for e in self._entries], end_offset)
        return self._replace(self._entries[:keep])

    def truncate_from_start(self, start_offset: int) -> bool:
        """Forget offsets below ``start_offset`` (the log start moved up to it).

        Entries whose range ends at or before ``start_offset`` go; the last entry starting
        at or below it is kept, moved up to start at ``start_offset``, so the earliest entry
        still covers the log start. Returns whether anything changed.
        """
        starts = [e.start_offset for e in self._entries]
        first_above = bisect.bisect_right(starts, start_offset)
        if first_above == 0:
            return False
        covering = EpochEntry(self._entries[first_above - 1].epoch, start_offset)
        return self._replace([covering, *self._entries[first_above:]])

    def clear(self) -> bool:
        """Drop every entry; returns whether anything changed."""
        return self._replace([])

    def flush(self) -> None:
        """Write the whole cache to its checkpoint file atomically."""
        lines = [f"{e.epoch} {e.start_offset}" for e in self._entries]
        data = format_checkpoint(LEADER_EPOCH_CHECKPOINT_VERSION, lines)
        write_file_atomic(self.path, data, fsync=self._fsync)

    def _replace(self, entries: list[EpochEntry]) -> bool:
        if entries == self._entries:
            return False
        for before, after in itertools.pairwise(entries):
            invariant(_follows(before, after), f"epoch cache out of order: {before}, {after}")
        self._entries = entries
        self.flush()
        return True


def _follows(before: EpochEntry, after: EpochEntry) -> bool:
    return after.epoch > before.epoch and after.start_offset >= before.start_offset


def _parse_epoch_line(line: str) -> EpochEntry:
    epoch, start_offset = split_fields(line, 2)
    return EpochEntry(
        parse_int(epoch, minimum=0, maximum=INT32_MAX),
        parse_int(start_offset, minimum=0, maximum=INT64_MAX),
    )
