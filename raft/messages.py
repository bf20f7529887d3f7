"""The messages and effects of the Raft core (KRaft-style: pull-based Fetch, epochs).

Everything here is a frozen, slotted value. The core (``core.py``) consumes ``Envelope``s and
returns a ``Ready`` of effects; the driver (asyncio + gRPC, or the deterministic simulation in
``raft/testing``) carries them out in the order ``Ready`` documents.

Record data is opaque to the core: a ``Batch`` is one Raft log batch (in the real log, one
Kafka v2 record batch whose partition leader epoch is the Raft epoch) described by its first
and last offset, its epoch and its bytes.

Replies that carry log data are *lazy*: the leader's core knows what to send (offsets) but not
the bytes, so a ``FetchResponse`` with ``read_from`` set asks the driver to fill ``batches``
from its log (at most ``read_max_bytes`` from ``read_from``) before sending; a
``FetchSnapshotResponse`` with ``read_position`` asks it to fill ``chunk`` and ``size`` from
the snapshot.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NO_LEADER = -1
NO_EPOCH = -1


@dataclass(frozen=True, slots=True)
class Batch:
    """One log batch: offsets ``base_offset .. last_offset`` written in ``epoch``."""

    base_offset: int
    last_offset: int
    epoch: int
    data: bytes
    is_control: bool = (
        False  # leader-change records: replicated but not handed to the state machine
    )

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True, slots=True)
class SnapshotId:
    """A snapshot covers every record below ``end_offset``; ``epoch`` is that record's epoch."""

    end_offset: int
    epoch: int


# -- requests and responses ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class VoteRequest:
    epoch: int  # the candidate's epoch (for a pre-vote: the epoch it would campaign in)
    candidate_id: int
    last_epoch: int
    last_epoch_end_offset: int
    pre_vote: bool


@dataclass(frozen=True, slots=True)
class VoteResponse:
    epoch: int  # the responder's current epoch
    granted: bool
    pre_vote: bool
    leader_id: int = NO_LEADER


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochRequest:
    epoch: int
    leader_id: int


@dataclass(frozen=True, slots=True)
class BeginQuorumEpochResponse:
    epoch: int


@dataclass(frozen=True, slots=True)
class EndQuorumEpochRequest:
    epoch: int
    leader_id: int
    preferred_successors: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class EndQuorumEpochResponse:
    epoch: int


@dataclass(frozen=True, slots=True)
class FetchRequest:
    epoch: int  # the fetcher's current epoch
    replica_id: int
    fetch_offset: int
    last_fetched_epoch: int
    max_wait_ms: int


@dataclass(frozen=True, slots=True)
class DivergingEpoch:
    epoch: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class FetchResponse:
    """A leader's answer to a Fetch. It echoes the request's position (``fetch_offset``,
    ``last_fetched_epoch``) so a follower can drop duplicated or stale replies; a node that is
    not the leader answers with ``high_watermark`` -1 (nothing to trust)."""

    epoch: int
    leader_id: int
    high_watermark: int
    log_start_offset: int
    batches: tuple[Batch, ...] = ()
    diverging: DivergingEpoch | None = None
    snapshot_id: SnapshotId | None = None  # fetch this snapshot first
    read_from: int | None = None  # lazy: the driver fills ``batches`` from here
    read_max_bytes: int = 0
    fetch_offset: int = -1  # the position this reply answers (echoed from the request)
    last_fetched_epoch: int = NO_EPOCH


@dataclass(frozen=True, slots=True)
class FetchSnapshotRequest:
    epoch: int
    replica_id: int
    snapshot_id: SnapshotId
    position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class FetchSnapshotResponse:
    epoch: int
    leader_id: int
    snapshot_id: SnapshotId
    position: int
    size: int  # the whole snapshot's size in bytes
    chunk: bytes = b""
    read_position: int | None = None  # lazy: the driver fills ``chunk`` from here
    read_max_bytes: int = 0
    missing: bool = False  # the leader no longer has that snapshot


Payload = (
    VoteRequest
    | VoteResponse
    | BeginQuorumEpochRequest
    | BeginQuorumEpochResponse
    | EndQuorumEpochRequest
    | EndQuorumEpochResponse
    | FetchRequest
    | FetchResponse
    | FetchSnapshotRequest
    | FetchSnapshotResponse
)


@dataclass(frozen=True, slots=True)
class Envelope:
    source: int
    destination: int
    payload: Payload


# -- durable state and effects ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class QuorumState:
    """What must survive a restart before any vote is answered or role changed."""

    epoch: int = 0
    voted_for: int = NO_LEADER
    leader_id: int = NO_LEADER


@dataclass(frozen=True, slots=True)
class LogWrite:
    """Change the log: first truncate to ``truncate_to`` (if set), then append ``batches``.
    ``restart_at`` (a snapshot was loaded) replaces the whole log with an empty one there."""

    truncate_to: int | None = None
    restart_at: int | None = None
    batches: tuple[Batch, ...] = ()


@dataclass(frozen=True, slots=True)
class Ready:
    """Effects of one core call, to be carried out in this order:

    1. persist ``quorum_state`` (atomically, fsynced);
    2. apply ``log_write`` to the log and fsync it, and write ``snapshot_chunks`` (a follower
       receiving a snapshot), loading ``snapshot_loaded`` once complete;
    3. send ``messages`` (filling lazy replies from the log or snapshot);
    4. hand committed records below ``commit_offset`` (and ``snapshot_loaded``) to the state
       machine, in offset order;
    5. delete log before ``delete_before`` (a snapshot covers it).

    Persisting before sending is what makes votes and fetch acknowledgements durable.
    The driver completes one Ready before calling the core again.
    """

    quorum_state: QuorumState | None = None
    log_write: LogWrite | None = None
    snapshot_chunks: tuple[tuple[SnapshotId, int, bytes], ...] = ()
    snapshot_loaded: SnapshotId | None = None
    messages: tuple[Envelope, ...] = ()
    commit_offset: int | None = None
    delete_before: int | None = None
    leader_changed: tuple[int, int] | None = None  # (epoch, leader id) for listeners
    events: tuple[str, ...] = field(default=())  # human-readable trace for tests and logs
