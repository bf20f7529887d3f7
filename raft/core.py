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

The code is split by concern. ``RaftCore`` (here) is the public surface plus the epoch rules
every message passes; it combines one mixin per concern (``_election``, ``_leader``,
``_follower``) over ``_base._CoreBase``, which declares the shared state and holds the common
machinery (effects, checked transitions, the log's metadata); ``_roles`` holds each role's
state and the table above as ``_LEGAL``. Names once defined here are re-exported (``X as X``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from raft._base import _RECORD_LENGTH as _RECORD_LENGTH
from raft._base import RECORD_OVERHEAD_BYTES as RECORD_OVERHEAD_BYTES
from raft._base import _Out, decode_records, encode_records
from raft._base import record_bytes as record_bytes
from raft._election import _ElectionMixin
from raft._follower import _FollowerMixin
from raft._leader import _LeaderMixin
from raft._roles import _LEGAL as _LEGAL
from raft._roles import (
    _NEVER,
    FOLLOWER,
    RESIGNED,
    UNATTACHED,
    IllegalTransition,
    _Election,
    _Follower,
    _Leader,
    _Random,
)
from raft._roles import CANDIDATE as CANDIDATE
from raft._roles import LEADER as LEADER
from raft._roles import OBSERVER as OBSERVER
from raft._roles import PROSPECTIVE as PROSPECTIVE
from raft._roles import _Parked as _Parked
from raft._roles import _Replica as _Replica
from raft._roles import _Role as _Role
from raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    Envelope,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    Payload,
    QuorumState,
    Ready,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)

__all__ = [
    "RECORD_OVERHEAD_BYTES",
    "IllegalTransition",
    "LogMeta",
    "NotLeader",
    "RaftConfig",
    "RaftCore",
    "RecordTooLarge",
    "decode_records",
    "encode_records",
    "record_bytes",
]


class NotLeader(Exception):
    """A proposal reached a node that is not the leader; says who is, if known."""

    def __init__(self, leader_id: int, epoch: int) -> None:
        super().__init__(f"not the leader; leader is {leader_id} in epoch {epoch}")
        self.leader_id = leader_id
        self.epoch = epoch


class RecordTooLarge(ValueError):
    """A proposal holds a record the log cannot store even alone in a batch (the metadata
    log's ``max_message_bytes``). Nothing of the proposal was queued; a retry cannot help."""

    retriable = False

    def __init__(self, size_bytes: int, max_record_bytes: int) -> None:
        super().__init__(
            f"a record of {size_bytes} bytes is larger than the {max_record_bytes} bytes "
            "the metadata log can store"
        )
        self.size_bytes = size_bytes
        self.max_record_bytes = max_record_bytes


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Timeouts and limits (KRaft's defaults); units in the names."""

    election_timeout_ms: int = 1000
    election_backoff_max_ms: int = 1000
    fetch_timeout_ms: int = 2000
    fetch_max_wait_ms: int = 500
    append_linger_ms: int = 25
    # A batch of several records stays within this (records counted with their framing,
    # RECORD_OVERHEAD_BYTES each); a larger record is written alone in its batch.
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
    """What the durable log holds when the core starts, and the largest batch it can store
    (counted as ``max_batch_bytes`` counts: a record's bytes plus RECORD_OVERHEAD_BYTES). Batches
    stay within it whatever ``max_batch_bytes`` says, and a proposal holding a record that
    would not fit alone is refused (``RecordTooLarge``)."""

    start_offset: int = 0
    end_offset: int = 0
    epochs: tuple[tuple[int, int], ...] = ()  # (epoch, start offset), ascending
    snapshot: SnapshotId | None = None
    max_batch_bytes: int = 2**62  # the default: no limit


class RaftCore(_ElectionMixin, _LeaderMixin, _FollowerMixin):
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
        self._epochs = list(log.epochs)
        self._snapshot = log.snapshot
        self._batch_limit = min(config.max_batch_bytes, log.max_batch_bytes)
        self._log_batch_limit = log.max_batch_bytes
        self._record_limit = log.max_batch_bytes - RECORD_OVERHEAD_BYTES
        if self._record_limit < 1:
            raise ValueError(
                f"a log storing batches of {log.max_batch_bytes} bytes holds no record"
            )
        self._hw = log.snapshot.end_offset if log.snapshot is not None else log.start_offset
        self._election_failures = 0
        self._out = _Out()
        self._role = _Role(UNATTACHED)
        self._seen_leader = (state.epoch, NO_LEADER)
        self._leader_heard_ms = -_NEVER  # when our current leader last answered us
        self._start_role(state)
        self._out = _Out()  # the start-up role change is not an event to report
        if isinstance(self._role, _Follower):
            self._role.fetch_resend_ms = now_ms  # the start-up Fetch was just dropped

    # ``epoch`` is on _CoreBase, since every role reads it.
    # -- read-only view --------------------------------------------------------------------
    @property
    def role(self) -> str:
        return self._role.name

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
    def max_record_bytes(self) -> int:
        """The largest record a proposal may hold: it fits the log alone in a batch."""
        return self._record_limit

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
        """Queue one proposal on the leader; returns the offset its last record will have."""
        lasts, ready = self.propose_all([records], now_ms)
        return lasts[0], ready

    def propose_all(
        self, proposals: Sequence[Sequence[bytes]], now_ms: int
    ) -> tuple[list[int], Ready]:
        """Queue proposals on the leader in order; returns the offset each one's last record
        will have. They are written in batches within ``max_batch_bytes`` (``pack_batches``):
        a proposal the log can store in one batch goes in one (so it commits whole or not at
        all), beyond ``max_batch_bytes`` if it must; a larger one spans several. Raises NotLeader,
        ValueError for an empty proposal or RecordTooLarge (``check_proposal``), and then
        queues none of them."""
        for records in proposals:
            self.check_proposal(records)  # first: a refusal changes nothing, not even time
        self._enter(now_ms)
        role = self._role
        if not isinstance(role, _Leader):
            raise NotLeader(self._known_leader(), self._quorum.epoch)
        lasts = []
        for records in proposals:
            role.pending.append(tuple(records))
            role.pending_records += len(records)
            role.pending_bytes += sum(record_bytes(r) for r in records)
            lasts.append(self._end + role.pending_records - 1)
        if role.linger_deadline_ms == _NEVER:
            role.linger_deadline_ms = now_ms + self.config.append_linger_ms
        # Nagle's rule: with nothing uncommitted in flight, write at once (low latency);
        # otherwise gather records until the HW catches up, the linger runs out or a batch
        # is full.
        if role.pending_bytes >= self._batch_limit or self._hw >= self._end:
            self._flush_pending(role)
        return lasts, self._ready()

    def check_proposal(self, records: Sequence[bytes]) -> None:
        """Raise what ``propose`` would refuse these records with: ValueError if there are
        none, RecordTooLarge if one exceeds ``max_record_bytes``. A driver that hands the
        core many proposals at once checks each first, so one bad proposal fails alone."""
        if not records:
            raise ValueError("a proposal needs at least one record")
        largest = max(len(r) for r in records)
        if largest > self._record_limit:
            raise RecordTooLarge(largest, self._record_limit)

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
        """Graceful shutdown of a leader: tell the voters so they elect at once, naming the
        most caught-up of them first (it campaigns first, as in KRaft)."""
        self._enter(now_ms)
        role = self._role
        if isinstance(role, _Leader):
            request = EndQuorumEpochRequest(
                self.epoch, self.node_id, self._preferred_successors(role)
            )
            self._transition(RESIGNED, _Role(RESIGNED, now_ms + self._election_timeout()))
            for voter in self.voters - {self.node_id}:
                self._send(voter, request)
        return self._ready()

    # -- set-up ----------------------------------------------------------------------------
    def _enter(self, now_ms: int) -> None:
        self._now = max(self._now, now_ms)
        role = self._role
        if isinstance(role, _Leader):
            # Everything written in earlier Readys is durable now: count the leader's own log.
            self._maybe_advance_hw(role)

    def _start_role(self, state: QuorumState) -> None:
        if state.leader_id == self.node_id:
            # We led this epoch before a restart: step aside and let a new election run.
            self._role = _Role(RESIGNED, self._now + self._election_timeout())
        elif state.leader_id != NO_LEADER:
            self._role = _Role(UNATTACHED)
            self._become_follower(state.epoch, state.leader_id)
        else:
            self._role = _Role(UNATTACHED, self._now + self._election_timeout())

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


def _leader_in(payload: Payload) -> int:
    if isinstance(payload, (BeginQuorumEpochRequest, EndQuorumEpochRequest)):
        return NO_LEADER if isinstance(payload, EndQuorumEpochRequest) else payload.leader_id
    if isinstance(payload, (FetchResponse, FetchSnapshotResponse, VoteResponse)):
        return payload.leader_id
    return NO_LEADER


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
