"""A sans-I/O Raft core in the style of Kafka's KRaft: pre-vote, votes, pull-based Fetch with
divergence detection, a high watermark that needs a record of the leader's own epoch,
check-quorum, BeginQuorumEpoch / EndQuorumEpoch, snapshots and observers.

How it works. The core is a plain object: the driver feeds it time (``tick``), inbound
messages (``step``), proposals and snapshot notices, and gets back a ``Ready`` of effects
(see ``raft.messages.Ready`` for their order). It never touches files, sockets, clocks or
randomness: time is an argument, randomness comes from a small seeded generator, and the log
is known only by its metadata (start, end, epoch boundaries); bytes travel in lazy replies that
the driver fills. The driver completes each Ready before the next call, so at every entry the
core may treat everything it asked to write earlier as durable.

Roles and their legal transitions (anything else raises ``IllegalTransition``):

    from \\ to     unattached prospective candidate leader follower resigned observer
    unattached      yes        yes(voter)   -        -      yes(voter)  -     yes(observer)
    prospective     yes        yes          yes      -      yes         -        -
    candidate       yes        yes          -        yes    yes         -        -
    leader          yes        -            -        -      yes         yes      -
    follower        yes        yes          -        -      yes         -        -
    resigned        yes        yes          -        -      yes         -        -
    observer        yes        -            -        -      -           -      yes

``unattached`` knows no leader for its epoch; ``prospective`` runs a pre-vote (no epoch bump);
``candidate`` has bumped the epoch and voted for itself; ``follower`` and ``observer`` fetch
from a known leader (observers are not voters and never campaign); ``resigned`` is a former
leader that stepped down (graceful shutdown or lost quorum) and waits for a new election.
A change of epoch or vote is put in ``Ready.quorum_state``, which the driver persists before
it sends anything.
"""

from __future__ import annotations

import bisect
import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from raft.messages import (
    NO_EPOCH,
    NO_LEADER,
    Batch,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DivergingEpoch,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    LogWrite,
    Payload,
    QuorumState,
    Ready,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)

__all__ = [
    "IllegalTransition",
    "LogMeta",
    "NotLeader",
    "RaftConfig",
    "RaftCore",
    "decode_records",
    "encode_records",
]

UNATTACHED = "unattached"
PROSPECTIVE = "prospective"
CANDIDATE = "candidate"
LEADER = "leader"
FOLLOWER = "follower"
RESIGNED = "resigned"
OBSERVER = "observer"

_LEGAL: dict[str, frozenset[str]] = {
    UNATTACHED: frozenset({UNATTACHED, PROSPECTIVE, FOLLOWER, OBSERVER}),
    PROSPECTIVE: frozenset({UNATTACHED, PROSPECTIVE, CANDIDATE, FOLLOWER}),
    CANDIDATE: frozenset({UNATTACHED, PROSPECTIVE, LEADER, FOLLOWER}),
    LEADER: frozenset({UNATTACHED, FOLLOWER, RESIGNED}),
    FOLLOWER: frozenset({UNATTACHED, PROSPECTIVE, FOLLOWER}),
    RESIGNED: frozenset({UNATTACHED, PROSPECTIVE, FOLLOWER}),
    OBSERVER: frozenset({UNATTACHED, OBSERVER}),
}

_RECORD_LENGTH = struct.Struct(">I")
_NEVER = 2**62


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


class IllegalTransition(Exception):
    """A role change the transition table does not allow: a bug in the core."""


class NotLeader(Exception):
    """A proposal reached a node that is not the leader; says who is, if known."""

    def __init__(self, leader_id: int, epoch: int) -> None:
        super().__init__(f"not the leader; leader is {leader_id} in epoch {epoch}")
        self.leader_id = leader_id
        self.epoch = epoch


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timeouts and limits (KRaft's defaults); units in the names."""

    election_timeout_ms: int = 1000
    election_backoff_max_ms: int = 1000
    fetch_timeout_ms: int = 2000
    fetch_max_wait_ms: int = 500
    append_linger_ms: int = 25
    max_batch_bytes: int = 8 * 1024 * 1024
    fetch_max_bytes: int = 8 * 1024 * 1024
    snapshot_chunk_bytes: int = 1024 * 1024
    request_timeout_ms: int = 2000

    def __post_init__(self) -> None:
        for name in self.__slots__:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.fetch_timeout_ms <= 2 * self.fetch_max_wait_ms:
            raise ValueError("fetch_timeout_ms must exceed twice fetch_max_wait_ms")


@dataclass(frozen=True, slots=True)
class LogMeta:
    """What the durable log holds when the core starts."""

    start_offset: int = 0
    end_offset: int = 0
    epochs: tuple[tuple[int, int], ...] = ()  # (epoch, start offset), ascending
    snapshot: SnapshotId | None = None


class _Random:
    """xorshift64*: deterministic, seedable, and no import of ``random`` in the core."""

    def __init__(self, seed: int) -> None:
        self._state = (seed * 0x9E3779B97F4A7C15 + 1) & 0xFFFFFFFFFFFFFFFF or 1

    def below(self, bound: int) -> int:
        x = self._state
        x ^= x >> 12
        x ^= (x << 25) & 0xFFFFFFFFFFFFFFFF
        x ^= x >> 27
        self._state = x
        return ((x * 0x2545F4914F6CDD1D) & 0xFFFFFFFFFFFFFFFF) % max(bound, 1)


# -- role state --------------------------------------------------------------------------------


@dataclass(slots=True)
class _Replica:
    fetch_offset: int = 0  # everything below is durable on that replica
    last_fetch_ms: int = -_NEVER


@dataclass(slots=True)
class _Parked:
    source: int
    request: FetchRequest
    deadline_ms: int


@dataclass(slots=True)
class _Role:
    name: str
    deadline_ms: int = _NEVER  # election / fetch timeout, whichever the role uses


@dataclass(slots=True)
class _Election(_Role):
    granted: set[int] = field(default_factory=set)
    rejected: set[int] = field(default_factory=set)


@dataclass(slots=True)
class _Leader(_Role):
    epoch_start_offset: int = 0
    replicas: dict[int, _Replica] = field(default_factory=dict)  # voters and observers
    begin_quorum_due: dict[int, int] = field(default_factory=dict)  # voter -> next send
    pending: list[bytes] = field(default_factory=list)
    pending_bytes: int = 0
    linger_deadline_ms: int = _NEVER
    parked: list[_Parked] = field(default_factory=list)


@dataclass(slots=True)
class _Follower(_Role):
    leader_id: int = NO_LEADER
    fetch_resend_ms: int = _NEVER  # resend a Fetch that got no answer
    leader_unreachable: bool = False  # the transport reported the leader down since its reply
    snapshot: SnapshotId | None = None  # being fetched
    snapshot_position: int = 0


class RaftCore:
    """The Raft state machine of one node. Not thread-safe; one driver calls it."""

    def __init__(
        self,
        config: RaftConfig,
        node_id: int,
        voters: frozenset[int],
        *,
        state: QuorumState,
        log: LogMeta,
        seed: int,
        now_ms: int,
    ) -> None:
        if not voters:
            raise ValueError("a quorum needs at least one voter")
        self.config = config
        self.node_id = node_id
        self.voters = voters
        self.is_voter = node_id in voters
        self._rng = _Random(seed ^ node_id)
        self._now = now_ms
        self._quorum = state
        self._start = log.start_offset
        self._end = log.end_offset
        self._epochs: list[tuple[int, int]] = list(log.epochs)
        self._snapshot = log.snapshot
        self._hw = log.snapshot.end_offset if log.snapshot is not None else log.start_offset
        self._election_failures = 0
        self._out = _Out()
        self._role: _Role = _Role(UNATTACHED)
        self._seen_leader = (state.epoch, NO_LEADER)
        self._leader_heard_ms = -_NEVER  # when our current leader last answered us
        self._start_role(state)
        self._out = _Out()  # the start-up role change is not an event to report
        if isinstance(self._role, _Follower):
            self._role.fetch_resend_ms = now_ms  # the start-up Fetch was just dropped

    # -- read-only view --------------------------------------------------------------------
    @property
    def role(self) -> str:
        return self._role.name

    @property
    def epoch(self) -> int:
        return self._quorum.epoch

    @property
    def leader_id(self) -> int:
        return self._quorum.leader_id

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def log_end_offset(self) -> int:
        return self._end

    @property
    def log_start_offset(self) -> int:
        return self._start

    @property
    def leader_epoch_start_offset(self) -> int | None:
        """On the leader, the offset of its leader-change record (a read barrier waits for
        the HW to pass it); None elsewhere."""
        role = self._role
        return role.epoch_start_offset if isinstance(role, _Leader) else None

    @property
    def next_deadline_ms(self) -> int:
        role = self._role
        deadline = role.deadline_ms
        if isinstance(role, _Leader):
            deadline = min(
                deadline,
                role.linger_deadline_ms,
                *role.begin_quorum_due.values(),
                *(p.deadline_ms for p in role.parked),
                self._check_quorum_due(role),
            )
        elif isinstance(role, _Follower):
            deadline = min(deadline, role.fetch_resend_ms)
        return deadline

    # -- entry points ----------------------------------------------------------------------
    def tick(self, now_ms: int) -> Ready:
        self._enter(now_ms)
        role = self._role
        if isinstance(role, _Leader):
            self._leader_tick(role)
        elif isinstance(role, _Follower):
            self._follower_tick(role)
        elif isinstance(role, _Election):
            if now_ms >= role.deadline_ms:
                self._election_failures += 1
                self._become_prospective()
        elif now_ms >= role.deadline_ms and self.is_voter:
            self._become_prospective()  # unattached or resigned: time to campaign
        elif now_ms >= role.deadline_ms:
            self._observer_discover()
        return self._ready()

    def step(self, envelope: Envelope, now_ms: int) -> Ready:
        self._enter(now_ms)
        source, payload = envelope.source, envelope.payload
        if self._handle_epoch(source, payload):
            handler = _HANDLERS[type(payload)]
            handler(self, source, payload)
        return self._ready()

    def propose(self, records: Sequence[bytes], now_ms: int) -> tuple[int, Ready]:
        """Queue records on the leader; returns the offset the last one will have."""
        self._enter(now_ms)
        role = self._role
        if not isinstance(role, _Leader):
            raise NotLeader(self._known_leader(), self._quorum.epoch)
        if not records:
            raise ValueError("a proposal needs at least one record")
        role.pending.extend(records)
        role.pending_bytes += sum(len(r) + 4 for r in records)
        last = self._end + len(role.pending) - 1
        if role.linger_deadline_ms == _NEVER:
            role.linger_deadline_ms = now_ms + self.config.append_linger_ms
        # Nagle's rule: with nothing uncommitted in flight, write at once (low latency);
        # otherwise gather records until the HW catches up or the linger runs out.
        if role.pending_bytes >= self.config.max_batch_bytes or self._hw >= self._end:
            self._flush_pending(role)
        return last, self._ready()

    def peer_unreachable(self, node_id: int, now_ms: int) -> Ready:
        """The transport has evidence that ``node_id`` is down: its connection was reset or
        refused. The fetch timeout exists for silence, which may be a long poll; evidence
        lets a voter following that node campaign after a random part of one election
        timeout instead. It probes the leader with an immediate Fetch first, whose answer
        cancels all this. A wrong report costs little: pre-vote keeps the epoch, and voters
        still hearing from the leader refuse it."""
        self._enter(now_ms)
        role = self._role
        if (
            isinstance(role, _Follower)
            and role.name == FOLLOWER
            and role.leader_id == node_id
            and not role.leader_unreachable
        ):
            role.leader_unreachable = True
            campaign_at = now_ms + self._rng.below(self.config.election_timeout_ms)
            role.deadline_ms = min(role.deadline_ms, campaign_at)
            self._send_fetch(role, max_wait_ms=0)
        return self._ready()

    def snapshot_taken(self, snapshot_id: SnapshotId, now_ms: int) -> Ready:
        """The state machine saved a snapshot below ``snapshot_id.end_offset`` (committed):
        the log before it may go."""
        self._enter(now_ms)
        if snapshot_id.end_offset > self._hw:
            raise ValueError(f"snapshot at {snapshot_id.end_offset} is beyond the HW {self._hw}")
        if self._snapshot is None or snapshot_id.end_offset > self._snapshot.end_offset:
            self._snapshot = snapshot_id
            self._start = max(self._start, snapshot_id.end_offset)
            self._truncate_epochs_from_start(self._start)
            self._out.delete_before = self._start
        return self._ready()

    def resign(self, now_ms: int) -> Ready:
        """Graceful shutdown of a leader: tell the voters so they elect at once."""
        self._enter(now_ms)
        if isinstance(self._role, _Leader):
            self._transition(RESIGNED, _Role(RESIGNED, now_ms + self._election_timeout()))
            for voter in self.voters - {self.node_id}:
                self._send(voter, EndQuorumEpochRequest(self.epoch, self.node_id))
        return self._ready()

    # -- common machinery ------------------------------------------------------------------
    def _enter(self, now_ms: int) -> None:
        self._now = max(self._now, now_ms)
        role = self._role
        if isinstance(role, _Leader):
            # Everything written in earlier Readys is durable now: count the leader's own log.
            self._maybe_advance_hw(role)

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

    def _start_role(self, state: QuorumState) -> None:
        if state.leader_id == self.node_id:
            # We led this epoch before a restart: step aside and let a new election run.
            self._role = _Role(RESIGNED, self._now + self._election_timeout())
        elif state.leader_id != NO_LEADER:
            self._role = _Role(UNATTACHED)
            self._become_follower(state.epoch, state.leader_id)
        else:
            self._role = _Role(UNATTACHED, self._now + self._election_timeout())

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

    # -- epochs ----------------------------------------------------------------------------
    def _handle_epoch(self, source: int, payload: Payload) -> bool:
        """Apply the epoch rules common to every message; False: drop the message."""
        epoch = payload.epoch
        if isinstance(payload, VoteRequest) and payload.pre_vote:
            return True  # a pre-vote never moves epochs
        if isinstance(payload, VoteResponse) and payload.pre_vote and epoch <= self.epoch:
            return True
        if epoch > self.epoch:
            leader = _leader_in(payload)
            if leader != NO_LEADER and leader != self.node_id:
                self._become_follower(epoch, leader)
            else:
                self._become_unattached(epoch)
        return True

    def _become_unattached(self, epoch: int) -> None:
        self._persist(QuorumState(epoch))
        self._transition(UNATTACHED, _Role(UNATTACHED, self._now + self._election_timeout()))

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

    def _become_prospective(self) -> None:
        if not self.is_voter:
            return
        deadline = self._now + self._election_timeout() + self._backoff()
        role = _Election(PROSPECTIVE, deadline, granted={self.node_id})
        self._transition(PROSPECTIVE, role)
        if len(role.granted) >= self._majority():
            self._become_candidate()
            return
        request = VoteRequest(
            self.epoch + 1, self.node_id, self._last_epoch(), self._end, pre_vote=True
        )
        for voter in self.voters - {self.node_id}:
            self._send(voter, request)

    def _become_candidate(self) -> None:
        epoch = self.epoch + 1
        self._persist(QuorumState(epoch, self.node_id, NO_LEADER))
        deadline = self._now + self._election_timeout() + self._backoff()
        role = _Election(CANDIDATE, deadline, granted={self.node_id})
        self._transition(CANDIDATE, role)
        if len(role.granted) >= self._majority():
            self._become_leader()
            return
        request = VoteRequest(epoch, self.node_id, self._last_epoch(), self._end, pre_vote=False)
        for voter in self.voters - {self.node_id}:
            self._send(voter, request)

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

    # -- leader ----------------------------------------------------------------------------
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

    def _flush_pending(self, role: _Leader) -> None:
        records, role.pending, role.pending_bytes = role.pending, [], 0
        role.linger_deadline_ms = _NEVER
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
        del role
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
        hw_before = self._hw
        self._maybe_advance_hw(role)
        if request.fetch_offset < self._end or request.max_wait_ms <= 0 or self._hw > hw_before:
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

    # -- followers and observers -----------------------------------------------------------
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

    # -- votes -----------------------------------------------------------------------------
    def _log_up_to_date(self, last_epoch: int, end_offset: int) -> bool:
        return (last_epoch, end_offset) >= (self._last_epoch(), self._end)

    def _on_vote(self, source: int, request: VoteRequest) -> None:
        if request.pre_vote:
            self._send(
                source,
                VoteResponse(self.epoch, self._grant_pre_vote(request), True, self._known_leader()),
            )
            return
        state, granted = self._quorum, False
        if (
            self.is_voter
            and request.epoch == state.epoch
            and state.leader_id == NO_LEADER
            and state.voted_for in (NO_LEADER, request.candidate_id)
            and self._log_up_to_date(request.last_epoch, request.last_epoch_end_offset)
        ):
            granted = True
            self._persist(QuorumState(state.epoch, request.candidate_id, NO_LEADER))
            if self._role.name == UNATTACHED:
                self._role.deadline_ms = self._now + self._election_timeout()
        self._send(source, VoteResponse(self.epoch, granted, False, self._known_leader()))

    def _grant_pre_vote(self, request: VoteRequest) -> bool:
        role = self._role
        if not self.is_voter or request.epoch <= self.epoch or isinstance(role, _Leader):
            return False
        if (
            isinstance(role, _Follower)
            and self._now - self._leader_heard_ms < self.config.fetch_timeout_ms
            and not role.leader_unreachable
        ):
            # Our leader answered within the fetch timeout: no reason to elect another. What
            # counts is an answer, not our deadline: a voter that went back to following
            # after a failed pre-vote has a fresh deadline but no news of the leader.
            return False
        return self._log_up_to_date(request.last_epoch, request.last_epoch_end_offset)

    def _on_vote_response(self, source: int, response: VoteResponse) -> None:
        role = self._role
        if not isinstance(role, _Election) or source not in self.voters:
            return
        if response.pre_vote != (role.name == PROSPECTIVE):
            return
        if not response.pre_vote and response.epoch != self.epoch:
            return
        (role.granted if response.granted else role.rejected).add(source)
        if len(role.granted) >= self._majority():
            if role.name == PROSPECTIVE:
                self._become_candidate()
            else:
                self._become_leader()
        elif len(role.rejected) >= self._majority():
            self._election_failures += 1
            if response.leader_id not in (NO_LEADER, self.node_id) and response.epoch == self.epoch:
                self._become_follower(self.epoch, response.leader_id)
            else:
                self._transition(
                    UNATTACHED,
                    _Role(UNATTACHED, self._now + self._election_timeout() + self._backoff()),
                )

    # -- quorum epoch announcements --------------------------------------------------------
    def _on_begin_quorum_epoch(self, source: int, request: BeginQuorumEpochRequest) -> None:
        if request.epoch == self.epoch and self._quorum.leader_id == NO_LEADER:
            self._become_follower(request.epoch, request.leader_id)
            if source == request.leader_id:
                self._leader_heard_ms = self._now
        self._send(source, BeginQuorumEpochResponse(self.epoch))

    def _on_begin_quorum_epoch_response(
        self, source: int, response: BeginQuorumEpochResponse
    ) -> None:
        role = self._role
        if isinstance(role, _Leader) and response.epoch == self.epoch:
            role.begin_quorum_due.pop(source, None)

    def _on_end_quorum_epoch(self, source: int, request: EndQuorumEpochRequest) -> None:
        role = self._role
        if (
            request.epoch == self.epoch
            and isinstance(role, _Follower)
            and role.leader_id == request.leader_id
            and self.is_voter
        ):
            # Successors named first go first; the others wait a little longer.
            rank = (
                request.preferred_successors.index(self.node_id)
                if self.node_id in request.preferred_successors
                else len(self.voters)
            )
            role.deadline_ms = min(role.deadline_ms, self._now + rank * 50 + self._backoff())
        self._send(source, EndQuorumEpochResponse(self.epoch))

    def _on_end_quorum_epoch_response(self, source: int, response: EndQuorumEpochResponse) -> None:
        del source, response  # nothing to do: resignation is best effort


def _leader_in(payload: Payload) -> int:
    if isinstance(payload, (BeginQuorumEpochRequest, EndQuorumEpochRequest)):
        return NO_LEADER if isinstance(payload, EndQuorumEpochRequest) else payload.leader_id
    if isinstance(payload, (FetchResponse, FetchSnapshotResponse, VoteResponse)):
        return payload.leader_id
    return NO_LEADER


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


_HANDLERS: dict[type, Callable[[RaftCore, int, Any], None]] = {
    VoteRequest: RaftCore._on_vote,
    VoteResponse: RaftCore._on_vote_response,
    BeginQuorumEpochRequest: RaftCore._on_begin_quorum_epoch,
    BeginQuorumEpochResponse: RaftCore._on_begin_quorum_epoch_response,
    EndQuorumEpochRequest: RaftCore._on_end_quorum_epoch,
    EndQuorumEpochResponse: RaftCore._on_end_quorum_epoch_response,
    FetchRequest: RaftCore._on_fetch,
    FetchResponse: RaftCore._on_fetch_response,
    FetchSnapshotRequest: RaftCore._on_fetch_snapshot,
    FetchSnapshotResponse: RaftCore._on_fetch_snapshot_response,
}
