"""Idempotent-producer state of one partition: sequence checks, duplicate detection, snapshots.

For every producer id the manager remembers the producer's epoch and its last five batches
(first/last sequence, offsets, timestamp). A leader append checks each idempotent batch
against that: a retried batch that is already in the log is answered with its original
offsets instead of being written twice, a gap in the sequence is OUT_OF_ORDER_SEQUENCE and an
older epoch is a fenced zombie (INVALID_PRODUCER_EPOCH). Transactions are out of scope; the
coordinator epoch and current transaction first offset are carried only so snapshots keep
Kafka's layout (always -1 here).

Who calls what (all from the partition's single writer; nothing here is thread-safe):

* leader append: ``begin_leader_append()`` then ``session.check(header)`` per batch (pure,
  the session lets batches of one append be checked against each other), write the batches,
  then ``update(header)`` per batch at its final offsets. ``check_leader_append(header)`` is
  the one-batch shortcut.
* follower append and recovery replay: ``update(header)`` per batch, no checks (the leader
  already made them; the log is the truth). Plain (non-idempotent) batches may go through
  ``update`` too, or be skipped with ``update_map_end_offset(log_end)`` after the append, so
  that snapshots are named at the log end.
* log load / truncation: ``truncate_and_reload(log_start, log_end, now_ms)`` restores the
  newest usable snapshot; the caller then replays batches from ``map_end_offset`` to the log
  end with ``update``. Truncating the log to an offset is done the same way: there is no
  separate ``truncate_to``, because the snapshots above the new end are deleted and the state
  rebuilt from the newest one below it.
* segment roll: ``take_snapshot()``; log start moves: ``on_log_start_offset_incremented``.

Snapshot files are ``<20-digit offset>.snapshot`` in the log directory, where the offset is
``map_end_offset`` when taken (the state reflects every batch below it). Kafka's
ProducerSnapshot v1 layout, big-endian::

    0  version            int16   1
    2  crc                uint32  CRC-32C of bytes 6 .. end
    6  entry count        int32
   10  entries            46 bytes each:
         0 producer_id int64, 8 epoch int16, 10 last_sequence int32, 14 last_offset int64,
        22 offset_delta int32, 26 timestamp int64, 34 coordinator_epoch int32,
        38 current_txn_first_offset int64

Only each producer's last batch is stored (as in Kafka), so after a reload only that batch
can be recognised as a duplicate until the replay adds more. A snapshot that fails any check
is a CorruptSnapshotError; on reload it is deleted and the next older one tried.
"""

from __future__ import annotations

import re
import struct
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import crc32c

from storage.batch import NO_SEQUENCE, BatchHeader
from storage.checkpoint import fsync_path, write_file_atomic
from storage.errors import (
    CorruptSnapshotError,
    InvalidProducerEpochError,
    OutOfOrderSequenceError,
    invariant,
)

NUM_BATCHES_TO_RETAIN = 5
SNAPSHOT_VERSION = 1
SNAPSHOT_SUFFIX = ".snapshot"
NO_COORDINATOR_EPOCH = -1
NO_TXN_FIRST_OFFSET = -1
DEFAULT_PRODUCER_ID_EXPIRATION_MS = 86_400_000
INT32_MAX = 2**31 - 1

_SNAPSHOT_HEADER = struct.Struct(">hI")
_SNAPSHOT_COUNT = struct.Struct(">i")
_SNAPSHOT_ENTRY = struct.Struct(">qhiqiqiq")
_CRC_START = _SNAPSHOT_HEADER.size
_ENTRIES_START = _SNAPSHOT_HEADER.size + _SNAPSHOT_COUNT.size
_SNAPSHOT_NAME = re.compile(r"([0-9]{20})\.snapshot")


def in_sequence(last_seq: int, next_seq: int) -> bool:
    """Whether ``next_seq`` directly follows ``last_seq``; sequences wrap from 2**31-1 to 0."""
    return next_seq == last_seq + 1 or (next_seq == 0 and last_seq == INT32_MAX)


def decrement_sequence(seq: int, by: int) -> int:
    """``seq - by`` in the wrapping int32 sequence space."""
    return (seq - by) % (INT32_MAX + 1)


def snapshot_path(log_dir: Path, offset: int) -> Path:
    """The snapshot file name for state up to (not including) ``offset``."""
    return log_dir / f"{offset:020d}{SNAPSHOT_SUFFIX}"


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    """What is kept of one appended batch: enough to recognise and answer a retry."""

    first_seq: int
    last_seq: int
    last_offset: int
    offset_delta: int
    timestamp: int

    @property
    def first_offset(self) -> int:
        return self.last_offset - self.offset_delta

    @staticmethod
    def of(header: BatchHeader) -> BatchMetadata:
        return BatchMetadata(
            first_seq=header.base_sequence,
            last_seq=header.last_sequence,
            last_offset=header.last_offset,
            offset_delta=header.last_offset_delta,
            timestamp=header.max_timestamp,
        )


@dataclass(slots=True)
class ProducerStateEntry:
    """One producer's epoch and last batches. Owned by the manager: callers only read it."""

    producer_id: int
    producer_epoch: int
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=NUM_BATCHES_TO_RETAIN)
    )
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int = NO_TXN_FIRST_OFFSET
    last_timestamp: int = -1

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else NO_SEQUENCE

    @property
    def last_offset(self) -> int:
        return self.batches[-1].last_offset if self.batches else -1

    def find_duplicate(self, header: BatchHeader) -> BatchMetadata | None:
        """The retained batch with the same epoch and sequence range as ``header``, if any."""
        if header.producer_epoch != self.producer_epoch:
            return None
        first, last = header.base_sequence, header.last_sequence
        return next((b for b in self.batches if b.first_seq == first and b.last_seq == last), None)

    def add_batch(self, epoch: int, batch: BatchMetadata) -> None:
        """Append ``batch``; a new epoch starts the retained history afresh."""
        if epoch != self.producer_epoch:
            self.producer_epoch = epoch
            self.batches.clear()
        self.batches.append(batch)  # the deque's maxlen drops the oldest beyond five
        self.last_timestamp = batch.timestamp


@dataclass(frozen=True, slots=True)
class _Pending:
    epoch: int
    last_seq: int


class LeaderAppendSession:
    """Checks the idempotent batches of one leader append, in order, without changing state.

    Batches accepted by :meth:`check` are remembered in the session so that a later batch of
    the same producer in the same append must follow them. Discard the session after the
    append; apply the written batches with :meth:`ProducerStateManager.update`.
    """

    def __init__(self, producers: Mapping[int, ProducerStateEntry]) -> None:
        self._producers = producers
        self._pending: dict[int, _Pending] = {}

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """None: append the batch. A BatchMetadata: it duplicates that already-written batch.

        Raises InvalidProducerEpochError for an epoch below the producer's current one and
        OutOfOrderSequenceError for a sequence that does not continue the producer's last.
        """
        if not header.has_producer_id:
            return None
        pid = header.producer_id
        entry = self._producers.get(pid)
        if entry is not None:
            duplicate = entry.find_duplicate(header)
            if duplicate is not None:
                return duplicate
        current = self._pending.get(pid) or _current_of(entry)
        if current is not None:
            _check_epoch_and_sequence(pid, current, header)
        self._pending[pid] = _Pending(header.producer_epoch, header.last_sequence)
        return None


def _current_of(entry: ProducerStateEntry | None) -> _Pending | None:
    return None if entry is None else _Pending(entry.producer_epoch, entry.last_seq)


def _check_epoch_and_sequence(pid: int, current: _Pending, header: BatchHeader) -> None:
    epoch, first_seq = header.producer_epoch, header.base_sequence
    if epoch < current.epoch:
        raise InvalidProducerEpochError(
            f"producer {pid} epoch {epoch} is older than the current epoch {current.epoch}"
        )
    if epoch > current.epoch:
        if first_seq != 0:
            raise OutOfOrderSequenceError(
                f"producer {pid} new epoch {epoch} must start at sequence 0, got {first_seq}"
            )
        return
    if not in_sequence(current.last_seq, first_seq):
        raise OutOfOrderSequenceError(
            f"producer {pid} epoch {epoch}: sequence {first_seq} does not follow {current.last_seq}"
        )


class ProducerStateManager:
    """Producer state of the partition whose files are in ``log_dir``.

    Starts empty at offset 0 and reads no files until :meth:`truncate_and_reload`.
    """

    def __init__(
        self,
        log_dir: Path,
        *,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
    ) -> None:
        if producer_id_expiration_ms <= 0:
            raise ValueError(f"producer_id_expiration_ms must be > 0: {producer_id_expiration_ms}")
        self.log_dir = log_dir
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self._producers: dict[int, ProducerStateEntry] = {}
        self._map_end_offset = 0

    @property
    def map_end_offset(self) -> int:
        """One past the last offset whose batch has been applied."""
        return self._map_end_offset

    @property
    def producers(self) -> Mapping[int, ProducerStateEntry]:
        """Read-only view of the live producers by id."""
        return MappingProxyType(self._producers)

    # -- append path -----------------------------------------------------------------------

    def begin_leader_append(self) -> LeaderAppendSession:
        """A checker for the batches of one leader append (see :class:`LeaderAppendSession`)."""
        return LeaderAppendSession(self._producers)

    def check_leader_append(self, header: BatchHeader) -> BatchMetadata | None:
        """Check a single-batch leader append; same contract as LeaderAppendSession.check."""
        return self.begin_leader_append().check(header)

    def update(self, header: BatchHeader) -> None:
        """Apply a batch already written at its final offsets (leader, follower, replay)."""
        invariant(
            header.next_offset > self._map_end_offset,
            f"batch ending at {header.last_offset} applied below map end {self._map_end_offset}",
        )
        if header.has_producer_id:
            entry = self._producers.get(header.producer_id)
            if entry is None:
                entry = ProducerStateEntry(header.producer_id, header.producer_epoch)
                self._producers[header.producer_id] = entry
            entry.add_batch(header.producer_epoch, BatchMetadata.of(header))
        self._map_end_offset = header.next_offset

    def update_map_end_offset(self, offset: int) -> None:
        """Note that the log now ends at ``offset`` (for callers that skip plain batches).

        Keeps snapshots named at the log end (e.g. the new segment's base offset on a roll)
        rather than after the last idempotent batch, so a reload replays less.
        """
        invariant(
            offset >= self._map_end_offset,
            f"map end offset moving back from {self._map_end_offset} to {offset}",
        )
        self._map_end_offset = offset

    # -- expiry and log start --------------------------------------------------------------

    def remove_expired(self, now_ms: int) -> None:
        """Forget producers silent for at least ``producer_id_expiration_ms``."""
        for pid in [p for p, e in self._producers.items() if self._is_expired(e, now_ms)]:
            del self._producers[pid]

    def on_log_start_offset_incremented(self, offset: int) -> None:
        """Forget producers whose last batch is now below the log start, and older snapshots."""
        for pid in [p for p, e in self._producers.items() if e.last_offset < offset]:
            del self._producers[pid]
        self.delete_snapshots_below(offset)
        self._map_end_offset = max(self._map_end_offset, offset)

    def _is_expired(self, entry: ProducerStateEntry, now_ms: int) -> bool:
        return now_ms - entry.last_timestamp >= self.producer_id_expiration_ms

    # -- snapshots -------------------------------------------------------------------------

    def take_snapshot(self, *, fsync: bool = True) -> Path:
        """Write the state as ``<map_end_offset>.snapshot`` (replacing one already there)."""
        path = snapshot_path(self.log_dir, self._map_end_offset)
        entries = sorted(self._producers.values(), key=lambda e: e.producer_id)
        write_file_atomic(path, encode_snapshot(entries), fsync=fsync)
        return path

    def snapshot_offsets(self) -> list[int]:
        """Offsets of the snapshot files in the log directory, ascending."""
        names = (_SNAPSHOT_NAME.fullmatch(p.name) for p in self.log_dir.iterdir())
        return sorted(int(m.group(1)) for m in names if m is not None)

    def latest_snapshot_offset(self) -> int | None:
        offsets = self.snapshot_offsets()
        return offsets[-1] if offsets else None

    def delete_snapshots_below(self, offset: int) -> None:
        self._delete_snapshots([o for o in self.snapshot_offsets() if o < offset])

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Forget everything, delete every snapshot, and continue at ``offset``."""
        self._producers.clear()
        self._delete_snapshots(self.snapshot_offsets())
        self._map_end_offset = offset

    def truncate_and_reload(self, log_start_offset: int, log_end_offset: int, now_ms: int) -> None:
        """Rebuild from the newest usable snapshot within [log start, log end].

        Snapshots outside that range are deleted, corrupt ones too. Loaded producers that
        expired by ``now_ms`` or whose last batch is below the log start are dropped.
        ``map_end_offset`` ends at the loaded snapshot's offset (or the log start if none);
        the caller replays the batches from there to the log end with :meth:`update`.
        """
        invariant(log_start_offset <= log_end_offset, "log start beyond log end")
        # Kafka also deletes a snapshot exactly at the log start. Keeping it is harmless:
        # every producer in it ends below the log start, so loading it yields no producers.
        offsets = self.snapshot_offsets()
        outside = [o for o in offsets if o < log_start_offset or o > log_end_offset]
        self._delete_snapshots(outside)
        self._producers.clear()
        self._map_end_offset = log_start_offset
        for offset in reversed([o for o in offsets if o not in outside]):
            try:
                entries = read_snapshot(snapshot_path(self.log_dir, offset))
            except CorruptSnapshotError:
                self._delete_snapshots([offset])
                continue
            self._load(entries, log_start_offset, now_ms)
            self._map_end_offset = offset
            return

    def _load(self, entries: list[ProducerStateEntry], log_start: int, now_ms: int) -> None:
        for entry in entries:
            if not self._is_expired(entry, now_ms) and entry.last_offset >= log_start:
                self._producers[entry.producer_id] = entry

    def _delete_snapshots(self, offsets: list[int]) -> None:
        # fsync the directory: a deleted snapshot that reappears after a crash could hold
        # state from a log that has since been truncated and rewritten.
        for offset in offsets:
            snapshot_path(self.log_dir, offset).unlink(missing_ok=True)
        if offsets:
            fsync_path(self.log_dir)


# -- snapshot codec ------------------------------------------------------------------------


def encode_snapshot(entries: list[ProducerStateEntry]) -> bytes:
    """Serialise producers (last batch of each) in the ProducerSnapshot v1 layout."""
    body = bytearray(_SNAPSHOT_COUNT.pack(len(entries)))
    for entry in entries:
        body += _SNAPSHOT_ENTRY.pack(*_snapshot_fields(entry))
    crc = crc32c.crc32c(bytes(body))
    return _SNAPSHOT_HEADER.pack(SNAPSHOT_VERSION, crc) + bytes(body)


def _snapshot_fields(entry: ProducerStateEntry) -> tuple[int, ...]:
    last = entry.batches[-1] if entry.batches else None
    return (
        entry.producer_id,
        entry.producer_epoch,
        last.last_seq if last else NO_SEQUENCE,
        last.last_offset if last else -1,
        last.offset_delta if last else 0,
        entry.last_timestamp,
        entry.coordinator_epoch,
        entry.current_txn_first_offset,
    )


def read_snapshot(path: Path) -> list[ProducerStateEntry]:
    """Read and verify one snapshot file; raises CorruptSnapshotError."""
    return decode_snapshot(path.read_bytes(), str(path))


def decode_snapshot(data: bytes, name: str = "snapshot") -> list[ProducerStateEntry]:
    """Parse ProducerSnapshot v1 bytes; ``name`` only labels errors."""
    if len(data) < _ENTRIES_START:
        raise CorruptSnapshotError(f"{name}: {len(data)} bytes, shorter than the header")
    version, crc = _SNAPSHOT_HEADER.unpack_from(data)
    if version != SNAPSHOT_VERSION:
        raise CorruptSnapshotError(f"{name}: version {version}, expected {SNAPSHOT_VERSION}")
    actual = crc32c.crc32c(data[_CRC_START:])
    if actual != crc:
        raise CorruptSnapshotError(f"{name}: CRC {crc:#010x}, computed {actual:#010x}")
    (count,) = _SNAPSHOT_COUNT.unpack_from(data, _CRC_START)
    if count < 0 or len(data) != _ENTRIES_START + count * _SNAPSHOT_ENTRY.size:
        raise CorruptSnapshotError(f"{name}: {len(data)} bytes do not hold {count} entries")
    entries = [
        _entry_from_fields(*fields) for fields in _SNAPSHOT_ENTRY.iter_unpack(data[_ENTRIES_START:])
    ]
    if len({e.producer_id for e in entries}) != len(entries):
        raise CorruptSnapshotError(f"{name}: a producer id appears twice")
    return entries


def _entry_from_fields(
    producer_id: int,
    epoch: int,
    last_seq: int,
    last_offset: int,
    offset_delta: int,
    timestamp: int,
    coordinator_epoch: int,
    txn_first_offset: int,
) -> ProducerStateEntry:
    entry = ProducerStateEntry(
        producer_id,
        epoch,
        coordinator_epoch=coordinator_epoch,
        current_txn_first_offset=txn_first_offset,
        last_timestamp=timestamp,
    )
    # Kafka writes an entry with no batch (e.g. only a transaction marker) as last offset -1.
    if last_offset >= 0:
        first_seq = (
            NO_SEQUENCE if last_seq == NO_SEQUENCE else decrement_sequence(last_seq, offset_delta)
        )
        entry.batches.append(
            BatchMetadata(first_seq, last_seq, last_offset, offset_delta, timestamp)
        )
    return entry
