"""Followers and observers: they fetch from the leader (resending a long poll that got no
answer), append what it returns, truncate where their log diverged from the leader's, follow
its high watermark, and download a snapshot chunk by chunk when the leader has deleted the
records they need. An observer without a leader asks a random voter who leads.
"""

from __future__ import annotations

from raft._base import _CoreBase
from raft._roles import _NEVER, FOLLOWER, OBSERVER, UNATTACHED, _Follower, _Leader, _Role
from raft.messages import (
    NO_LEADER,
    Batch,
    DivergingEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    LogWrite,
    QuorumState,
    SnapshotId,
)


class _FollowerMixin(_CoreBase):
    """What followers and observers do; mixed into ``RaftCore``."""

    def _become_follower(self, epoch: int, leader_id: int) -> None:
        state = self._quorum
        if (epoch, leader_id) != (state.epoch, state.leader_id):
            self._leader_heard_ms = -_NEVER
        voted_for = state.voted_for if state.epoch == epoch else NO_LEADER
        self._persist(QuorumState(epoch, voted_for, leader_id))
        name = FOLLOWER if self.is_voter else OBSERVER
        role = _Follower(name, self._now + self.config.fetch_timeout_ms, leader_id)
        self._transition(name, role)
        self._send_fetch(role)

    def _send_fetch(self, role: _Follower, max_wait_ms: int | None = None) -> None:
        # A reply is due within the long poll's wait; resend once twice that has passed,
        # which is still before the fetch timeout (the config checks it exceeds both).
        role.fetch_resend_ms = self._now + 2 * self.config.fetch_max_wait_ms
        if role.snapshot is not None:
            self._send(
                role.leader_id,
                FetchSnapshotRequest(
                    self.epoch,
                    self.node_id,
                    role.snapshot,
                    role.snapshot_position,
                    self.config.snapshot_chunk_bytes,
                ),
            )
            return
        self._send(
            role.leader_id,
            FetchRequest(
                self.epoch,
                self.node_id,
                self._end,
                self._last_epoch(),
                self.config.fetch_max_wait_ms if max_wait_ms is None else max_wait_ms,
            ),
        )

    def _follower_tick(self, role: _Follower) -> None:
        if self._now >= role.deadline_ms:
            if self.is_voter:
                self._become_prospective()
            else:
                self._persist(QuorumState(self.epoch, NO_LEADER, NO_LEADER))
                self._transition(UNATTACHED, _Role(UNATTACHED, self._now))
                self._observer_discover()
            return
        if self._now >= role.fetch_resend_ms:
            self._send_fetch(role)

    def _observer_discover(self) -> None:
        """An observer without a leader asks a voter (any answer names the leader)."""
        voters = sorted(self.voters)
        target = voters[self._rng.below(len(voters))]
        self._send(target, FetchRequest(self.epoch, self.node_id, self._end, self._last_epoch(), 0))
        self._role.deadline_ms = self._now + self.config.request_timeout_ms

    def _on_fetch_response(self, source: int, response: FetchResponse) -> None:
        if response.epoch < self.epoch:
            return  # stale
        role = self._role
        if not isinstance(role, _Follower) or role.leader_id != response.leader_id:
            if response.leader_id not in (NO_LEADER, self.node_id) and not isinstance(
                role, (_Leader, _Follower)
            ):
                self._become_follower(response.epoch, response.leader_id)
            return
        if source != role.leader_id:
            return
        self._heard_from_leader(role)
        if (
            role.snapshot is not None
            or response.fetch_offset != self._end
            or response.last_fetched_epoch != self._last_epoch()
        ):
            return  # answers a position we are no longer at: a duplicate or a late reply
        if response.snapshot_id is not None:
            if response.snapshot_id.end_offset > self._hw:
                role.snapshot, role.snapshot_position = response.snapshot_id, 0
        elif response.diverging is not None:
            self._truncate_diverged(response.diverging)
        else:
            self._append_fetched(response.batches)
            self._update_follower_hw(response.high_watermark)
        self._send_fetch(role)

    def _heard_from_leader(self, role: _Follower) -> None:
        role.deadline_ms = self._now + self.config.fetch_timeout_ms
        role.leader_unreachable = False
        self._leader_heard_ms = self._now

    def _truncate_diverged(self, diverging: DivergingEpoch) -> None:
        """Kafka's truncateToEndOffset: cut where our log and the leader's agree, never
        below our HW (committed records are never removed)."""
        local_epoch, local_end = self._end_offset_for(diverging.epoch)
        if local_epoch == diverging.epoch:
            target = min(local_end, diverging.end_offset)
        else:
            target = local_end
        self._truncate(max(min(target, self._end), self._hw))

    def _append_fetched(self, batches: tuple[Batch, ...]) -> None:
        for batch in batches:
            if batch.base_offset != self._end:
                return  # a duplicate or reordered reply: the next fetch asks again
            self._append(batch)

    def _update_follower_hw(self, leader_hw: int) -> None:
        if leader_hw < 0:
            return
        candidate = min(self._end, leader_hw)
        if candidate > self._hw:
            self._hw = candidate
            self._out.commit_offset = candidate

    def _on_fetch_snapshot_response(self, source: int, response: FetchSnapshotResponse) -> None:
        role = self._role
        if (
            not isinstance(role, _Follower)
            or source != role.leader_id
            or response.epoch != self.epoch
            or role.snapshot != response.snapshot_id
            or response.position != role.snapshot_position
        ):
            return
        self._heard_from_leader(role)
        if response.missing:
            role.snapshot = None
            self._send_fetch(role)
            return
        self._out.snapshot_chunks.append((response.snapshot_id, response.position, response.chunk))
        role.snapshot_position += len(response.chunk)
        if role.snapshot_position >= response.size:
            if response.snapshot_id.end_offset > self._hw:  # never roll applied state back
                self._load_snapshot(response.snapshot_id)
            role.snapshot = None
        self._send_fetch(role)

    def _load_snapshot(self, snapshot: SnapshotId) -> None:
        out = self._out
        out.log_write = LogWrite(None, snapshot.end_offset, ())
        out.snapshot_loaded = snapshot
        self._snapshot = snapshot
        self._start = self._end = snapshot.end_offset
        self._epochs = [(snapshot.epoch, snapshot.end_offset)]
        if snapshot.end_offset > self._hw:
            self._hw = snapshot.end_offset
            out.commit_offset = snapshot.end_offset
