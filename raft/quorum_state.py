"""The durable quorum state of one node: ``quorum-state`` in the Raft data directory.

The file is JSON in the spirit of Kafka's (``{"data_version": 0, "leaderEpoch": 3,
"leaderId": 1, "votedId": -1, "crc32c": ...}``), replaced atomically (temporary file, fsync,
rename, fsync of the directory) before any vote is answered or role changed. The checksum
covers the other fields; a file that fails it is an error, never silently reset: a voter that
forgot its vote could vote twice in one epoch.
"""

from __future__ import annotations

import json
from pathlib import Path

import crc32c

from raft.messages import QuorumState
from storage.checkpoint import write_file_atomic

QUORUM_STATE_FILE = "quorum-state"
_VERSION = 0


class QuorumStateError(Exception):
    """The quorum-state file is unreadable or corrupt; the node must not start on it."""


class QuorumStateStore:
    """Load and save one node's QuorumState. Not thread-safe; the driver owns it."""

    def __init__(self, directory: Path) -> None:
        self.path = directory / QUORUM_STATE_FILE

    def load(self) -> QuorumState:
        """The saved state, or the initial one (epoch 0) when no file exists yet."""
        if not self.path.exists():
            return QuorumState()
        try:
            doc = json.loads(self.path.read_text())
            fields = (int(doc["leaderEpoch"]), int(doc["votedId"]), int(doc["leaderId"]))
            version, crc = int(doc["data_version"]), int(doc["crc32c"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise QuorumStateError(f"{self.path}: unreadable quorum state: {e}") from e
        if version != _VERSION:
            raise QuorumStateError(f"{self.path}: unknown data_version {version}")
        if crc != _checksum(*fields):
            raise QuorumStateError(f"{self.path}: checksum mismatch, the file is corrupt")
        return QuorumState(*fields)

    def save(self, state: QuorumState) -> None:
        doc = {
            "data_version": _VERSION,
            "leaderEpoch": state.epoch,
            "votedId": state.voted_for,
            "leaderId": state.leader_id,
            "crc32c": _checksum(state.epoch, state.voted_for, state.leader_id),
        }
        write_file_atomic(self.path, (json.dumps(doc, sort_keys=True) + "\n").encode())


def _checksum(epoch: int, voted_for: int, leader_id: int) -> int:
    return int(crc32c.crc32c(f"{epoch} {voted_for} {leader_id}".encode()))
