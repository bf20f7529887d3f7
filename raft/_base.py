"""What every role shares: the node's durable and volatile state, the effects collector, and
the machinery all roles use (sending, persisting the quorum state, checked role transitions,
randomised timeouts, and the log's metadata: append, truncate, epoch boundaries).

``_CoreBase`` declares the shared attributes (``RaftCore.__init__`` assigns them) and holds
that machinery; the role mixins (``_leader``, ``_follower``, ``_election``) build on it and
``RaftCore`` combines them. A role that starts another role's work calls one of the three
``_become_*`` hooks declared here; the mixin owning that role defines it.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from raft._roles import (
    _LEGAL,
    FOLLOWER,
    LEADER,
    OBSERVER,
    IllegalTransition,
    _Leader,
    _Random,
    _Role,
)
from raft.messages import (
    NO_EPOCH,
    NO_LEADER,
    Batch,
    Envelope,
    LogWrite,
    Payload,
    QuorumState,
    Ready,
    SnapshotId,
)

if TYPE_CHECKING:
    from raft.core import RaftConfig

_RECORD_LENGTH = struct.Struct(">I")
# What a record adds to a batch besides its bytes, at most: its 4-byte length in the core's
# framing, and at most 19 bytes in the Kafka v2 record the log store writes (length,
# attributes, timestamp and offset deltas, key and value lengths, header count: varints and
# a byte). Sizes of batches count each record as its bytes plus this, so a batch within
# ``max_batch_bytes`` stays within it however the record is framed.
RECORD_OVERHEAD_BYTES = 20


def record_bytes(record: bytes) -> int:
    """What one record counts towards a batch's size (see ``RECORD_OVERHEAD_BYTES``)."""
    return len(record) + RECORD_OVERHEAD_BYTES


def encode_records(records: Sequence[bytes]) -> bytes:
    """Frame records for a Batch's opaque data (the driver stores them as it likes)."""
    return b"".join(_RECORD_LENGTH.pack(len(r)) + r for r in records)


def decode_records(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        (length,) = _RECORD_LENGTH.unpack_from(data, pos)
        out.append(data[pos + 4 : pos + 4 + length])
        pos += 4 + length
    return out


@dataclass(slots=True)
class _Out:
    """Effects gathered during one core call."""

    quorum_state: QuorumState | None = None
    log_write: LogWrite = field(default_factory=LogWrite)
    snapshot_chunks: list[tuple[SnapshotId, int, bytes]] = field(default_factory=list)
    snapshot_loaded: SnapshotId | None = None
    messages: list[Envelope] = field(default_factory=list)
    commit_offset: int | None = None
    delete_before: int | None = None
    leader_changed: tuple[int, int] | None = None
    events: list[str] = field(default_factory=list)

    def ready(self) -> Ready:
        write = self.log_write
        empty = write.truncate_to is None and write.restart_at is None and not write.batches
        return Ready(
            quorum_state=self.quorum_state,
            log_write=None if empty else write,
            snapshot_chunks=tuple(self.snapshot_chunks),
            snapshot_loaded=self.snapshot_loaded,
            messages=tuple(self.messages),
            commit_offset=self.commit_offset,
            delete_before=self.delete_before,
            leader_changed=self.leader_changed,
            events=tuple(self.events),
        )


class _CoreBase:
    """State and machinery shared by the roles; see the module docstring."""

    config: RaftConfig
    node_id: int
    voters: frozenset[int]
    is_voter: bool
    _rng: _Random
    _now: int  # the latest time the driver gave us
    _quorum: QuorumState  # durable: epoch, vote, leader
    _start: int  # log start offset
    _end: int  # log end offset, counting writes still in _out
    _epochs: list[tuple[int, int]]  # (epoch, start offset), ascending
    _snapshot: SnapshotId | None
    _hw: int
    _batch_limit: int  # batches of several proposals stay within this many bytes
    _log_batch_limit: int  # the largest batch the log stores: a proposal within it is whole
    _record_limit: int  # the largest record the log can store (alone in a batch)
    _election_failures: int
    _out: _Out
    _role: _Role
    _seen_leader: tuple[int, int]  # (epoch, leader) last put in Ready.leader_changed
    _leader_heard_ms: int  # when our current leader last answered us

    @property
    def epoch(self) -> int:
        return self._quorum.epoch

    # -- effects and transitions -----------------------------------------------------------
    def _ready(self) -> Ready:
        out, self._out = self._out, _Out()
        return out.ready()

    def _send(self, destination: int, payload: Payload) -> None:
        self._out.messages.append(Envelope(self.node_id, destination, payload))

    def _persist(self, state: QuorumState) -> None:
        if state != self._quorum:
            self._quorum = state
            self._out.quorum_state = state

    def _transition(self, name: str, role: _Role) -> None:
        if name not in _LEGAL[self._role.name]:
            raise IllegalTransition(f"node {self.node_id}: {self._role.name} -> {name}")
        self._role = role
        self._out.events.append(f"{self._role.name}@{self.epoch}")
        seen = (self.epoch, self._known_leader())
        if seen != self._seen_leader:
            self._seen_leader = seen
            self._out.leader_changed = seen

    def _known_leader(self) -> int:
        """The leader this node currently follows or is; NO_LEADER while there is none."""
        if self._role.name in (LEADER, FOLLOWER, OBSERVER):
            return self._quorum.leader_id
        return NO_LEADER

    def _election_timeout(self) -> int:
        base = self.config.election_timeout_ms
        return base + self._rng.below(base)

    def _backoff(self) -> int:
        limit = self.config.election_backoff_max_ms
        exponent = min(self._election_failures, 16)
        return self._rng.below(min(limit, 50 * (2**exponent))) + 1

    def _majority(self) -> int:
        return len(self.voters) // 2 + 1

    def _last_epoch(self) -> int:
        if self._epochs:
            return self._epochs[-1][0]
        return self._snapshot.epoch if self._snapshot is not None else NO_EPOCH

    def _end_offset_for(self, epoch: int) -> tuple[int, int]:
        """Kafka's LeaderEpochFileCache.endOffsetFor over this node's log."""
        if epoch == NO_EPOCH:
            return NO_EPOCH, -1
        if epoch == self._last_epoch():
            return epoch, self._end
        epochs = [e for e, _ in self._epochs]
        above = bisect.bisect_right(epochs, epoch)
        if above >= len(epochs):
            return NO_EPOCH, -1
        if above == 0:
            return epoch, self._epochs[0][1]  # older than every entry: ends where they start
        return self._epochs[above - 1][0], self._epochs[above][1]

    # -- the log ---------------------------------------------------------------------------
    def _append(self, batch: Batch) -> None:
        out = self._out
        out.log_write = LogWrite(
            out.log_write.truncate_to, out.log_write.restart_at, (*out.log_write.batches, batch)
        )
        if not self._epochs or batch.epoch > self._epochs[-1][0]:
            self._epochs.append((batch.epoch, batch.base_offset))
        self._end = batch.next_offset
        if isinstance(self._role, _Leader):
            # Come back as soon as this write is durable: it may move the HW.
            self._role.deadline_ms = self._now

    def _truncate(self, offset: int) -> None:
        if offset >= self._end:
            return
        out = self._out
        cut = (
            offset if out.log_write.truncate_to is None else min(offset, out.log_write.truncate_to)
        )
        kept = tuple(b for b in out.log_write.batches if b.next_offset <= offset)
        out.log_write = LogWrite(cut, out.log_write.restart_at, kept)
        self._end = offset
        while self._epochs and self._epochs[-1][1] >= offset:
            self._epochs.pop()

    def _truncate_epochs_from_start(self, start: int) -> None:
        """Drop epochs that end at or before ``start``; the one covering it starts there."""
        while len(self._epochs) > 1 and self._epochs[1][1] <= start:
            self._epochs.pop(0)
        if self._epochs and self._epochs[0][1] < start:
            self._epochs[0] = (self._epochs[0][0], start)

    # -- hooks the role mixins define ------------------------------------------------------
    def _become_follower(self, epoch: int, leader_id: int) -> None:
        raise NotImplementedError  # _follower._FollowerMixin

    def _become_prospective(self) -> None:
        raise NotImplementedError  # _election._ElectionMixin

    def _become_leader(self) -> None:
        raise NotImplementedError  # _leader._LeaderMixin
