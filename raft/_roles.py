"""The roles' state: their names, the table of legal transitions between them, and a small
dataclass per role holding what only that role needs (a leader's replicas and parked fetches,
a follower's leader and snapshot download, an election's tallies). ``RaftCore`` keeps the
current one in ``_role``; a change goes through ``_CoreBase._transition``, which checks the
table. Plain data: the logic that reads and writes these lives in the per-role modules.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from raft.messages import NO_LEADER, FetchRequest, SnapshotId

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
_NEVER = 2**62


class IllegalTransition(Exception):
    """A role change the transition table does not allow: a bug in the core."""


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
    hw_sent: int = -1  # the high watermark in the last fetch answer sent to it


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
    pending: list[Sequence[bytes]] = field(default_factory=list)  # proposals, not yet written
    pending_records: int = 0
    pending_bytes: int = 0  # as ``_base.record_bytes`` counts them
    linger_deadline_ms: int = _NEVER
    parked: list[_Parked] = field(default_factory=list)


@dataclass(slots=True)
class _Follower(_Role):
    leader_id: int = NO_LEADER
    fetch_resend_ms: int = _NEVER  # resend a Fetch that got no answer
    leader_unreachable: bool = False  # the transport reported the leader down since its reply
    snapshot: SnapshotId | None = None  # being fetched
    snapshot_position: int = 0
