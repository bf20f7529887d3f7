"""The leader: it appends proposals in batches (``pack_batches``: within ``max_batch_bytes``,
except that a proposal the log can store in one batch is never split across two, so it
commits whole or not at all), answers Fetch
and FetchSnapshot requests (long polls park until data arrives, the HW moves or the wait
runs out; a fetcher not yet told the current HW is answered at once, else a commit that
happened between two of its fetches would reach it only when its next long poll runs out),
advances the high watermark once a majority of voters hold a record of its own epoch,
announces itself with BeginQuorumEpoch until each voter fetches, and resigns when a majority
stops fetching (check-quorum).
"""

from __future__ import annotations

from collections.abc import Sequence

from raft._base import _CoreBase, encode_records, record_bytes
from raft._roles import _NEVER, LEADER, RESIGNED, _Leader, _Parked, _Replica, _Role
from raft.messages import (
    NO_EPOCH,
    Batch,
    BeginQuorumEpochRequest,
    DivergingEpoch,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    QuorumState,
    SnapshotId,
)


class _LeaderMixin(_CoreBase):
    """What only a leader does; mixed into ``RaftCore``."""

    def _become_leader(self) -> None:
        self._persist(QuorumState(self.epoch, self.node_id, self.node_id))
        self._election_failures = 0
        role = _Leader(LEADER, epoch_start_offset=self._end)
        for voter in self.voters:
            role.replicas[voter] = _Replica(0, self._now)
        self._transition(LEADER, role)
        for voter in self.voters - {self.node_id}:
            role.begin_quorum_due[voter] = self._now
        self._leader_tick(role)
        # A record of our own epoch: the HW may only advance past it.
        self._append(Batch(self._end, self._end, self.epoch, encode_records([b""]), True))

    def _check_quorum_due(self, role: _Leader) -> int:
        if len(self.voters) == 1:
            return _NEVER
        window = self.config.fetch_timeout_ms * 3 // 2
        times = sorted(
            (r.last_fetch_ms for v, r in role.replicas.items() if v in self.voters), reverse=True
        )
        # The majority-th most recent fetch (counting ours as now) must stay within the window.
        others = [t for t in times[: self._majority()]]
        return min(others) + window if others else _NEVER

    def _leader_tick(self, role: _Leader) -> None:
        now = self._now
        role.deadline_ms = _NEVER
        role.replicas[self.node_id].last_fetch_ms = now
        if now >= self._check_quorum_due(role):
            self._transition(RESIGNED, _Role(RESIGNED, now + self._election_timeout()))
            self._out.events.append("check-quorum failed")
            return
        if role.pending and now >= role.linger_deadline_ms:
            self._flush_pending(role)
        for voter, due in list(role.begin_quorum_due.items()):
            if now >= due:
                self._send(voter, BeginQuorumEpochRequest(self.epoch, self.node_id))
                role.begin_quorum_due[voter] = now + self.config.fetch_timeout_ms // 2
        for parked in [p for p in role.parked if now >= p.deadline_ms]:
            role.parked.remove(parked)
            self._answer_fetch(role, parked.source, parked.request)
        self._maybe_advance_hw(role)

    def _preferred_successors(self, role: _Leader) -> tuple[int, ...]:
        """The other voters, most caught-up first: by the offset each last fetched from
        (what it holds durably, as far as we know), then by id. KRaft's order for
        EndQuorumEpoch, so the voter likeliest to win campaigns first."""
        others = self.voters - {self.node_id}
        return tuple(sorted(others, key=lambda v: (-role.replicas[v].fetch_offset, v)))

    def _flush_pending(self, role: _Leader) -> None:
        proposals, role.pending = role.pending, []
        role.pending_records = role.pending_bytes = 0
        role.linger_deadline_ms = _NEVER
        for records in pack_batches(proposals, self._batch_limit, self._log_batch_limit):
            base = self._end
            self._append(Batch(base, base + len(records) - 1, self.epoch, encode_records(records)))
        self._complete_parked(role)

    def _complete_parked(self, role: _Leader) -> None:
        parked, role.parked = role.parked, []
        for item in parked:
            self._answer_fetch(role, item.source, item.request)

    def _maybe_advance_hw(self, role: _Leader) -> None:
        durable_end = self._end - sum(
            b.next_offset - b.base_offset for b in self._out.log_write.batches
        )
        role.replicas[self.node_id].fetch_offset = durable_end
        offsets = sorted(
            (r.fetch_offset for v, r in role.replicas.items() if v in self.voters), reverse=True
        )
        candidate = offsets[self._majority() - 1]
        if candidate > self._hw and candidate > role.epoch_start_offset:
            self._hw = candidate
            self._out.commit_offset = candidate
            if role.pending and self._hw >= durable_end:
                self._flush_pending(role)  # what was in flight is committed: send the next
            self._complete_parked(role)

    def _leader_reply(
        self,
        request: FetchRequest,
        *,
        read_from: int | None = None,
        diverging: DivergingEpoch | None = None,
        snapshot_id: SnapshotId | None = None,
    ) -> FetchResponse:
        return FetchResponse(
            self.epoch,
            self.node_id,
            self._hw,
            self._start,
            diverging=diverging,
            snapshot_id=snapshot_id,
            read_from=read_from,
            read_max_bytes=self.config.fetch_max_bytes if read_from is not None else 0,
            fetch_offset=request.fetch_offset,
            last_fetched_epoch=request.last_fetched_epoch,
        )

    def _answer_fetch(self, role: _Leader, source: int, request: FetchRequest) -> None:
        replica = role.replicas.get(source)
        if replica is not None:
            replica.hw_sent = self._hw
        if request.fetch_offset < self._end:
            self._send(source, self._leader_reply(request, read_from=request.fetch_offset))
        else:
            self._send(source, self._leader_reply(request))

    def _on_fetch(self, source: int, request: FetchRequest) -> None:
        role = self._role
        if not isinstance(role, _Leader) or request.epoch != self.epoch:
            # Only who leads which epoch: no HW, since the position was not checked.
            reply = FetchResponse(
                self.epoch,
                self._known_leader(),
                -1,
                self._start,
                fetch_offset=request.fetch_offset,
                last_fetched_epoch=request.last_fetched_epoch,
            )
            self._send(source, reply)
            return
        replica = role.replicas.setdefault(source, _Replica())
        replica.last_fetch_ms = self._now
        role.begin_quorum_due.pop(source, None)  # it fetches in our epoch: it knows us
        problem = self._check_fetch_position(request)
        if problem is not None:
            self._send(source, problem)
            return
        replica.fetch_offset = max(replica.fetch_offset, request.fetch_offset)
        self._maybe_advance_hw(role)
        if (
            request.fetch_offset < self._end
            or request.max_wait_ms <= 0
            or self._hw > replica.hw_sent  # it moved since our last answer: tell it now
        ):
            self._answer_fetch(role, source, request)
        else:
            # Long poll: answered when data arrives, the HW moves, or the wait runs out.
            role.parked = [p for p in role.parked if p.source != source]
            wait = min(request.max_wait_ms, self.config.fetch_max_wait_ms)
            role.parked.append(_Parked(source, request, self._now + wait))

    def _check_fetch_position(self, request: FetchRequest) -> FetchResponse | None:
        """A reply redirecting the fetcher (snapshot or divergence), or None if its
        (fetch offset, last fetched epoch) is consistent with our log (Kafka's
        ReplicatedLog.validateOffsetAndEpoch)."""
        offset, last_epoch, snapshot = (
            request.fetch_offset,
            request.last_fetched_epoch,
            self._snapshot,
        )
        if snapshot is not None and (
            offset < self._start
            or (offset == self._start and last_epoch != snapshot.epoch)
            or last_epoch < snapshot.epoch
        ):
            return self._leader_reply(request, snapshot_id=snapshot)
        if offset == 0 and last_epoch == NO_EPOCH:
            return None
        epoch, end = self._end_offset_for(last_epoch)
        if epoch == last_epoch and end >= offset:
            return None
        return self._leader_reply(request, diverging=DivergingEpoch(epoch, max(end, 0)))

    def _on_fetch_snapshot(self, source: int, request: FetchSnapshotRequest) -> None:
        role = self._role
        if not isinstance(role, _Leader) or request.epoch != self.epoch:
            self._send(
                source,
                FetchSnapshotResponse(
                    self.epoch,
                    self._known_leader(),
                    request.snapshot_id,
                    request.position,
                    0,
                    missing=True,
                ),
            )
            return
        role.replicas.setdefault(source, _Replica()).last_fetch_ms = self._now
        if request.snapshot_id != self._snapshot:
            self._send(
                source,
                FetchSnapshotResponse(
                    self.epoch, self.node_id, request.snapshot_id, request.position, 0, missing=True
                ),
            )
            return
        self._send(
            source,
            FetchSnapshotResponse(
                self.epoch,
                self.node_id,
                request.snapshot_id,
                request.position,
                size=-1,
                read_position=request.position,
                read_max_bytes=min(request.max_bytes, self.config.snapshot_chunk_bytes),
            ),
        )


def pack_batches(
    proposals: Sequence[Sequence[bytes]], max_bytes: int, log_max_bytes: int
) -> list[list[bytes]]:
    """The records of ``proposals``, in order, cut into batches (sizes as ``record_bytes``
    counts). A batch is appended, fetched and committed whole, so a proposal the log can
    store in one batch (``log_max_bytes``) is never split: it joins the open batch if that
    stays within ``max_bytes``, else it starts one of its own, beyond ``max_bytes`` if it
    must (a controller decision is one proposal, and it must commit whole or not at all).
    Only a proposal larger than any batch the log stores fills batches of at most
    ``max_bytes`` record by record (it may then commit in part if the leader fails midway;
    before, such a proposal stopped every node); a record larger than ``max_bytes`` is alone
    in its batch."""
    batches: list[list[bytes]] = []
    size = max_bytes  # no batch open: the next record opens one
    for records in proposals:
        total = sum(record_bytes(r) for r in records)
        if total <= log_max_bytes:
            if size + total > max_bytes:
                batches.append([])
                size = 0
            batches[-1].extend(records)
            size += total
            continue
        for record in records:
            cost = record_bytes(record)
            if size + cost > max_bytes:
                batches.append([])
                size = 0
            batches[-1].append(record)
            size += cost
    return batches
