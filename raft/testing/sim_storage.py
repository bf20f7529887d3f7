"""The simulated storage of one node: its log, snapshot files and state machine.

How this works. A ``SimLog`` holds a node's batches in offset order; the simulation applies each
``Ready``'s log operations to it in order, so between Readys it *is* the node's durable log (a
crash inside a Ready keeps only a prefix of them). Snapshots are complete files in
``SimNode.snapshots`` (partial ones being received are volatile), encoded with a checksum so a
torn or mixed-up transfer is caught. The ``StateMachine`` is volatile: a restart rebuilds it
from the latest snapshot. ``SimNode`` ties them to the node's ``RaftCore`` (None while crashed).
"""

from __future__ import annotations

import struct
import zlib
from bisect import bisect_right
from collections.abc import Iterator
from dataclasses import dataclass, field

from raft.core import RaftCore, decode_records
from raft.messages import Batch, QuorumState, SnapshotId

__all__ = [
    "Entry",
    "SimLog",
    "SimNode",
    "StateMachine",
    "decode_snapshot",
    "encode_snapshot",
    "entries_of",
]

Entry = tuple[int, bool, bytes]  # one offset of the log: (epoch, is control, record bytes)

_batch_entries: dict[int, tuple[Batch, list[Entry]]] = {}


def entries_of(batch: Batch) -> list[Entry]:
    """The per-offset entries of a batch (cached by identity: batches travel unchanged)."""
    cached = _batch_entries.get(id(batch))
    if cached is not None and cached[0] is batch:
        return cached[1]
    if batch.is_control:
        entries = [(batch.epoch, True, b"")] * (batch.last_offset - batch.base_offset + 1)
    else:
        entries = [(batch.epoch, False, r) for r in decode_records(batch.data)]
    if len(_batch_entries) > 200_000:
        _batch_entries.clear()
    _batch_entries[id(batch)] = (batch, entries)
    return entries


class SimLog:
    """A node's Raft log: batches in offset order; ``start_offset`` may fall inside the first.

    Not a copy of anything: the simulation applies each Ready's operations here and counts them
    durable once the Ready's fsync step is reached (a crash earlier keeps only a prefix)."""

    __slots__ = ("bases", "batches", "start_offset")

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.bases: list[int] = []
        self.start_offset = 0

    @property
    def end_offset(self) -> int:
        return self.batches[-1].next_offset if self.batches else self.start_offset

    def _index(self, offset: int) -> int:
        """Index of the batch holding ``offset`` (or -1)."""
        i = bisect_right(self.bases, offset) - 1
        if i >= 0 and self.batches[i].last_offset >= offset:
            return i
        return -1

    def entry(self, offset: int) -> Entry | None:
        if offset < self.start_offset:
            return None
        i = self._index(offset)
        if i < 0:
            return None
        batch = self.batches[i]
        return entries_of(batch)[offset - batch.base_offset]

    def entries(self, lo: int, hi: int) -> Iterator[tuple[int, Entry]]:
        lo = max(lo, self.start_offset)
        if lo >= hi:
            return
        i = max(bisect_right(self.bases, lo) - 1, 0)
        for batch in self.batches[i:]:
            if batch.base_offset >= hi:
                break
            for k, entry in enumerate(entries_of(batch)):
                offset = batch.base_offset + k
                if lo <= offset < hi:
                    yield offset, entry

    def is_boundary(self, offset: int) -> bool:
        return (
            offset >= self.end_offset
            or offset <= self.start_offset
            or self._index(offset) < 0
            or (self.batches[self._index(offset)].base_offset == offset)
        )

    def truncate(self, offset: int) -> None:
        """Drop every batch holding an offset at or above ``offset`` (Kafka's truncateTo)."""
        while self.batches and self.batches[-1].last_offset >= offset:
            self.batches.pop()
            self.bases.pop()
        self.start_offset = (
            min(self.start_offset, max(offset, 0)) if not self.batches else (self.start_offset)
        )

    def append(self, batch: Batch) -> None:
        self.batches.append(batch)
        self.bases.append(batch.base_offset)

    def restart(self, offset: int) -> None:
        self.batches.clear()
        self.bases.clear()
        self.start_offset = offset

    def delete_before(self, offset: int) -> None:
        keep = 0
        while keep < len(self.batches) and self.batches[keep].next_offset <= offset:
            keep += 1
        del self.batches[:keep]
        del self.bases[:keep]
        self.start_offset = max(self.start_offset, offset)

    def read(self, offset: int, max_bytes: int) -> tuple[Batch, ...]:
        """Batches from the one holding ``offset``: at least one, then up to ``max_bytes``."""
        i = bisect_right(self.bases, offset) - 1
        if i < 0 or self.batches[i].last_offset < offset:
            i += 1
        out: list[Batch] = []
        size = 0
        for batch in self.batches[max(i, 0) :]:
            if out and size + len(batch.data) > max_bytes:
                break
            out.append(batch)
            size += len(batch.data)
        return tuple(out)

    def epochs(self) -> tuple[tuple[int, int], ...]:
        """(epoch, start offset) ascending, as an epoch cache rebuilt from the batches."""
        out: list[tuple[int, int]] = []
        for batch in self.batches:
            if not out or batch.epoch > out[-1][0]:
                out.append((batch.epoch, max(batch.base_offset, self.start_offset)))
        return tuple(out)


_SNAP_HEAD = struct.Struct(">qI")
_SNAP_CRC = struct.Struct(">I")


def encode_snapshot(end_offset: int, records: list[tuple[int, bytes]]) -> bytes:
    body = b"".join(_SNAP_HEAD.pack(o, len(d)) + d for o, d in records)
    payload = _SNAP_HEAD.pack(end_offset, len(records)) + body
    return payload + _SNAP_CRC.pack(zlib.crc32(payload))


def decode_snapshot(data: bytes) -> tuple[int, list[tuple[int, bytes]]]:
    payload, (crc,) = data[:-4], _SNAP_CRC.unpack_from(data, len(data) - 4)
    if zlib.crc32(payload) != crc:
        raise ValueError("snapshot checksum mismatch")
    end_offset, count = _SNAP_HEAD.unpack_from(payload, 0)
    pos, records = _SNAP_HEAD.size, []
    for _ in range(count):
        offset, length = _SNAP_HEAD.unpack_from(payload, pos)
        pos += _SNAP_HEAD.size
        records.append((offset, payload[pos : pos + length]))
        pos += length
    return end_offset, records


@dataclass(slots=True)
class StateMachine:
    """The applied records (volatile: rebuilt from the latest snapshot on restart)."""

    applied_end: int = 0  # next offset to apply
    records: list[tuple[int, bytes]] = field(default_factory=list)
    since_snapshot: int = 0
    snapshot: SnapshotId | None = None  # the last one taken or loaded


@dataclass(slots=True)
class SimNode:
    node_id: int
    is_voter: bool
    log: SimLog = field(default_factory=SimLog)
    quorum: QuorumState = field(default_factory=QuorumState)  # the durable file
    snapshots: dict[SnapshotId, bytes] = field(default_factory=dict)  # complete, durable
    partial: dict[SnapshotId, bytearray] = field(default_factory=dict)  # being received
    core: RaftCore | None = None  # None while crashed
    sm: StateMachine = field(default_factory=StateMachine)
    tick_gen: int = 0
    tick_at: int | None = None
    crash_in_ready: bool = False
    epoch_seen: int = 0  # highest epoch this node exposed (in memory or durable)
    hw_seen: int = 0  # while up
    verified_upto: int = 0  # log offsets below this were checked against the committed log
    snap_end: int = 0  # the latest complete snapshot's end offset (0: none)

    @property
    def up(self) -> bool:
        return self.core is not None

    def latest_snapshot(self) -> SnapshotId | None:
        return max(self.snapshots, key=lambda s: (s.end_offset, s.epoch), default=None)

    def snapshot_end(self) -> int:
        return self.snap_end
