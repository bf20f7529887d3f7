"""Raft snapshots on disk: ``<end offset, 20 digits>-<epoch, 10 digits>.checkpoint`` files.

Each file is a small header, then the state machine's bytes::

    magic   4 bytes  b"RNSN"
    version int16    0
    crc32c  uint32   of the payload
    length  int64    payload bytes
    payload

A snapshot is written to ``<name>.partial`` (by the state machine at once, or chunk by chunk
when fetched from the leader), fsynced, checked, then renamed into place, so a crash never
leaves a half snapshot under a real name. Older snapshots are deleted once a newer one is in
place. Not thread-safe: the driver owns it.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path

import crc32c

from raft.messages import SnapshotId
from storage.checkpoint import fsync_path

SUFFIX = ".checkpoint"
PARTIAL = ".partial"
_HEADER = struct.Struct(">4shIq")
_MAGIC = b"RNSN"


class SnapshotError(Exception):
    """A snapshot file is corrupt or missing."""


def file_name(snapshot_id: SnapshotId) -> str:
    return f"{snapshot_id.end_offset:020d}-{snapshot_id.epoch:010d}{SUFFIX}"


def encode(payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, 0, crc32c.crc32c(payload), len(payload)) + payload


def decode(data: bytes, name: str = "snapshot") -> bytes:
    if len(data) < _HEADER.size:
        raise SnapshotError(f"{name}: shorter than its header")
    magic, version, crc, length = _HEADER.unpack_from(data)
    payload = data[_HEADER.size :]
    if magic != _MAGIC or version != 0 or length != len(payload):
        raise SnapshotError(f"{name}: bad header (magic {magic!r}, version {version})")
    if crc32c.crc32c(payload) != crc:
        raise SnapshotError(f"{name}: checksum mismatch")
    return payload


class SnapshotStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        for partial in directory.glob(f"*{SUFFIX}{PARTIAL}"):
            partial.unlink()  # an interrupted write or fetch: start over

    def latest(self) -> SnapshotId | None:
        ids = sorted(self._ids(), key=lambda s: s.end_offset)
        return ids[-1] if ids else None

    def _ids(self) -> list[SnapshotId]:
        out = []
        for path in self.directory.glob(f"*{SUFFIX}"):
            offset, _, epoch = path.name[: -len(SUFFIX)].partition("-")
            if offset.isdigit() and epoch.isdigit():
                out.append(SnapshotId(int(offset), int(epoch)))
        return out

    def path(self, snapshot_id: SnapshotId) -> Path:
        return self.directory / file_name(snapshot_id)

    def save(self, snapshot_id: SnapshotId, payload: bytes) -> None:
        """Write a snapshot the local state machine produced."""
        self.begin(snapshot_id)
        self.write_chunk(snapshot_id, 0, encode(payload))
        self.finish(snapshot_id)

    def load(self, snapshot_id: SnapshotId) -> bytes:
        path = self.path(snapshot_id)
        try:
            return decode(path.read_bytes(), path.name)
        except OSError as e:
            raise SnapshotError(f"{path}: {e}") from e

    def size(self, snapshot_id: SnapshotId) -> int:
        return self.path(snapshot_id).stat().st_size

    def read(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        """A chunk of the snapshot file as stored (header included), for FetchSnapshot."""
        with open(self.path(snapshot_id), "rb") as f:
            f.seek(position)
            return f.read(max_bytes)

    # -- receiving a snapshot in chunks ------------------------------------------------------
    def begin(self, snapshot_id: SnapshotId) -> None:
        self._partial(snapshot_id).write_bytes(b"")

    def write_chunk(self, snapshot_id: SnapshotId, position: int, chunk: bytes) -> None:
        partial = self._partial(snapshot_id)
        if position == 0 and not partial.exists():
            self.begin(snapshot_id)
        with open(partial, "r+b") as f:
            f.seek(position)
            f.write(chunk)

    def finish(self, snapshot_id: SnapshotId) -> None:
        """Check, fsync and publish a received snapshot; delete older ones."""
        partial = self._partial(snapshot_id)
        decode(partial.read_bytes(), partial.name)  # raises on a corrupt transfer
        fsync_path(partial)
        os.replace(partial, self.path(snapshot_id))
        fsync_path(self.directory)
        for older in self._ids():
            if older.end_offset < snapshot_id.end_offset:
                self.path(older).unlink(missing_ok=True)

    def _partial(self, snapshot_id: SnapshotId) -> Path:
        return self.directory / (file_name(snapshot_id) + PARTIAL)
